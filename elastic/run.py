"""``elasticrun``: start this node's workers of an elastic PyTorch job; a torchrun replacement.

``elasticrun`` (or ``python -m elastic.run``) takes torchrun's command line: every flag of
torchrun 2.13, with the same defaults, both spellings (``--nproc-per-node`` and
``--nproc_per_node``) and the same ``PET_*`` environment twins. Nodes meet through a rendezvous
on **etcd v3** or on the **built-in store** (no external service); a node that dies is noticed by
every survivor within the lease TTL and the job restarts into the new world without spending a
restart. The launcher never imports torch. ``elasticrun --help`` lists every flag.

Usage
-----

One node, four workers (like torchrun, a single node runs on a private store on a free port,
so several jobs can share a host)::

    elasticrun --nproc-per-node=4 train.py --lr 0.1

One worker per visible GPU (``gpu``), per usable CPU (``cpu``), or GPUs if any else CPUs
(``auto``); GPUs are counted without torch, honouring ``CUDA_VISIBLE_DEVICES``::

    elasticrun --nproc-per-node=auto train.py

Standalone, explicitly (a random run id; ``--rdzv-*`` flags are ignored with a warning)::

    elasticrun --standalone --nnodes=1 --nproc-per-node=8 train.py

A module, or a program that is not Python::

    elasticrun --nproc-per-node=2 -m mypkg.train --epochs 3
    elasticrun --nproc-per-node=2 --no-python ./train.sh

Several nodes on etcd, a fixed size, three restarts after worker failures (start the same
command on every node)::

    elasticrun --nnodes=4 --nproc-per-node=8 --max-restarts=3 \\
        --rdzv-backend=etcd --rdzv-endpoint=etcd-0:2379,etcd-1:2379,etcd-2:2379 \\
        --rdzv-id=job-42 train.py

Elastic, between 2 and 8 nodes: the job starts once 2 nodes have joined and ``last_call_timeout``
has passed; nodes that arrive later join at the next round, and a node whose lease expires is
dropped (membership changes never count against ``--max-restarts``)::

    elasticrun --nnodes=2:8 --nproc-per-node=8 --max-restarts=3 \\
        --rdzv-backend=etcd-v3 --rdzv-endpoint=etcd-0:2379 --rdzv-id=job-42 \\
        --rdzv-conf=lease_ttl=5,last_call_timeout=30 \\
        --rdzv-conf=cacert=/etc/elastic/ca.pem,user=elastic,password_file=/etc/elastic/etcd-pass \\
        train.py

Without etcd: the built-in store, hosted by the node whose address is the endpoint (``c10d``,
as torchrun users expect), or a separately run ``elastic-store`` (``tcp``)::

    elasticrun --nnodes=1:4 --nproc-per-node=8 --rdzv-backend=c10d \\
        --rdzv-endpoint=node0:29400 --rdzv-id=job-42 train.py

Static ranks, torchrun's default backend: no elasticity, each node names its rank::

    elasticrun --nnodes=2 --node-rank=0 --master-addr=node0 --master-port=29500 \\
        --nproc-per-node=8 train.py

Draw the event logs of a run's nodes as one HTML page (a lane per machine, training and stalls,
restarts, heals and worker exits with their cause, the world size, the downtime per fault; see
:mod:`elastic.timeline`)::

    elasticrun timeline node-a.jsonl node-b.jsonl -o timeline.html

``timeline`` is a subcommand only as the first word, and only when torchrun would fail on that
command line: with a file ``timeline`` in the working directory (or ``PET_NO_PYTHON``/
``PET_MODULE`` set) it is the training command, as in torchrun, and a line says so.
``elastic-timeline`` and ``python -m elastic.timeline`` are the same command without the rule.

Check what a command line resolves to, without starting anything::

    elasticrun --dry-run --nnodes=2:8 --nproc-per-node=auto --rdzv-backend=etcd \\
        --rdzv-endpoint=etcd-0:2379 --rdzv-id=job-42 train.py

Environment twins
-----------------

Every flag torchrun reads from the environment can be set as ``PET_`` + its name in capitals
with underscores: ``PET_NNODES=2:8``, ``PET_NPROC_PER_NODE=auto``, ``PET_RDZV_BACKEND=etcd``,
``PET_RDZV_ENDPOINT=...``, ``PET_RDZV_ID=job-42``, ``PET_RDZV_CONF=lease_ttl=5``,
``PET_STANDALONE=1``, ``PET_MAX_RESTARTS=3``, ... A flag on the command line wins over its
variable (a repeated ``--rdzv-conf`` replaces ``PET_RDZV_CONF`` as a whole); an empty variable
counts as unset. Switches take ``1``/``0`` (or true/false). ``--logs-specs`` and
``--numa-binding`` have no twin, as in torchrun, nor has ``--dry-run``. Our flags have twins
too: ``PET_EXIT_BARRIER_TIMEOUT``, ``PET_METRICS_PORT``, ``PET_EVENT_LOG``, ``PET_VERBOSE``.
``--shutdown-timeout`` also falls back to ``TORCH_ELASTIC_SHUTDOWN_TIMEOUT``, as in torch.

The training command
--------------------

Everything from the first word that is not a launcher flag (or everything after ``--``) is the
training command; it reaches the workers untouched, including words that look like our flags
and any ``--`` of its own::

    elasticrun --nproc-per-node=2 -- train.py --nnodes 7 -- --raw

Workers get torchrun's environment: ``LOCAL_RANK``, ``RANK``, ``GROUP_RANK``, ``ROLE_RANK``,
``LOCAL_WORLD_SIZE``, ``WORLD_SIZE``, ``ROLE_WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``,
``TORCHELASTIC_RESTART_COUNT``, ``TORCHELASTIC_MAX_RESTARTS``, ``TORCHELASTIC_RUN_ID`` and
``TORCHELASTIC_ERROR_FILE`` (so torch's ``@record`` works unchanged).

Output
------

``-r/--redirects`` sends worker streams to log files and ``-t/--tee`` to log files and the
console: ``0`` none, ``1`` stdout, ``2`` stderr, ``3`` both, for all local ranks, or per local
rank (``-t 0:3,1:2``). Files live under ``--log-dir``. ``--local-ranks-filter 0`` shows only
local rank 0 on the console. A tee'd line is prefixed ``[default0]:`` (role and local rank),
or as ``TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE`` says, with ``${role_name}``, ``${rank}`` and
``${local_rank}`` substituted as torchrun does::

    TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE='[rank${rank}]:' elasticrun -r 3 -t 3 train.py

``--logs-specs NAME`` hands the layout to a ``torchrun.logs_specs`` plugin (a torch
``LogsSpecs`` class, such as torch's own ``default``): it decides where each rank's files go,
as under torchrun. A name no installed package registers is refused at once.

Not in torchrun
---------------

``--exit-barrier-timeout SECONDS`` (300): how long a node whose workers are done waits for the
other nodes'. ``--metrics-port PORT``: ``/healthz`` and Prometheus ``/metrics``. ``--event-log
FILE``: structured events as JSON lines. ``--dry-run``: print the resolved configuration.

Differences from torchrun
-------------------------

* Accepted but without effect (a warning says so when set): ``--start-method`` (workers are
  always fresh processes), ``--event-log-handler``, ``--numa-binding``,
  ``--duplicate-stdout-filters``, ``--duplicate-stderr-filters``, ``--virtual-local-rank``.
* ``--rdzv-backend`` is ``etcd``/``etcd-v3`` (etcd's v3 API; never v2), ``tcp``, ``c10d`` or
  ``static``.
* ``--rdzv-conf`` takes every key torch 2.13's rendezvous handlers read. ``ca_cert``,
  ``ssl_cert``, ``ssl_cert_key`` are our ``cacert``, ``cert``, ``key``; ``timeout`` is
  ``join_timeout`` with etcd and tcp (torch's etcd handler reads it as its join deadline) and, as
  in torch, has no effect with c10d, static or a standalone run. ``heartbeat_timeout``,
  ``heartbeat``, ``rank``, ``use_libuv`` and ``store_type=tcp`` change nothing here (liveness
  is the lease; ``--node-rank`` gives the rank; the built-in store is TCP): each given is said
  once, at start, with the reason. ``store_type=file`` is refused (no file store). Keys no torch
  handler reads are errors listing the valid ones, where torchrun ignores them silently.
* Flags abbreviate as in torchrun's argparse parser: any prefix that matches one spelling
  (``--nproc-per=2``, ``--max_re=3``, ``--redirect=3``). A prefix of both spellings of one flag
  is ambiguous there too (``--nproc``), and is refused with one line naming the matches and the
  flag meant. Our own flags (``--metrics-port``, ...) abbreviate where no torchrun flag shares
  the prefix (``--event-l`` stays ``--event-log-handler``). Words after the script are never
  read as flags: torchrun refuses an ambiguous prefix even there (``train.py --nproc=3``).
* ``--logs-specs``: the plugin runs in a helper process started with the launch under the
  workers' interpreter (``$PYTHON_EXEC``), since the launcher does not import torch; the launch
  waits for that helper's torch import before joining the rendezvous. The name is checked
  against the launcher's own installed packages, the class loaded from the workers'.
* ``--nproc-per-node`` counts NVIDIA GPUs without torch, and XPUs by asking torch in the
  workers' interpreter (for ``xpu``, and for ``auto`` on a host with an Intel GPU); give other
  accelerators (MPS, out-of-tree devices) a number.
* A bad command line prints one line, ``elasticrun: error: <flag>: <what is accepted>``, and
  exits with status 2.
* Workers die with the agent even when it is SIGKILLed or OOM-killed (on Linux by the
  parent-death signal; their subprocesses, and everything off Linux, by a watchdog process). A
  restarted agent of the same run and log directory first stops what a dead one left. See
  ``elastic.agent.lifeline.keeper`` and docs/failure-behaviour.md.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
from typing import TYPE_CHECKING, Mapping, NoReturn, Sequence

from elastic.launch.cli import PROG, parse_or_exit
from elastic.launch.values import ConfigError, truth
from elastic.launch.describe import describe

if TYPE_CHECKING:
    from elastic.agent.lifeline.watchdog_process import Watchdog


def main(argv: Sequence[str] | None = None) -> int | None:
    """Parse the command line, then print the configuration (``--dry-run``) or run the agent;
    or, for ``timeline ...`` with no file ``timeline`` here, draw event logs (:mod:`elastic.timeline.cli`).

    Returns the agent's exit status (None counts as 0). Raises SystemExit(2) after one error
    line for a bad command line, SystemExit(0) after ``--help``.
    """
    args = sys.argv[1:] if argv is None else list(argv)
    if args[:1] == ["timeline"]:
        if timeline_is_the_subcommand(os.environ):
            from elastic.timeline.cli import main as timeline

            return timeline(args[1:], prog=f"{PROG} timeline")
        print(f"{PROG}: running timeline as the training command, as torchrun would; to draw event logs, use "
              "elastic-timeline", file=sys.stderr)
    config = parse_or_exit(args, os.environ)
    if config.dry_run:
        sys.stdout.write(describe(config))
        return 0
    watchdog = _early_watchdog()
    try:
        from elastic.launch.runner import run
    except ModuleNotFoundError as error:
        if watchdog is not None:
            watchdog.close()
        if not (error.name or "").startswith("elastic.agent"):
            raise
        print(f"{PROG}: error: the agent (elastic.launch.runner) is not installed in this build", file=sys.stderr)
        return 1
    return run(config, watchdog=watchdog)


def _early_watchdog() -> Watchdog | None:
    """The agent's lifeline watchdog, started before the agent's modules are imported so that
    its own start runs beside that import (:mod:`elastic.agent.lifeline.watchdog_process`);
    None when the agent is not installed, or when it cannot start (the runner then tries
    again, and says why if it fails)."""
    try:
        from elastic.agent.lifeline.watchdog_process import Watchdog
    except ModuleNotFoundError:
        return None
    from elastic.rendezvous.secret_sources import without_inline_secrets

    try:
        return Watchdog.start(without_inline_secrets(os.environ))  # no helper inherits an inline secret
    except OSError:
        return None


def timeline_is_the_subcommand(environ: Mapping[str, str]) -> bool:
    """Whether a command line starting with ``timeline`` draws event logs: not when torchrun
    would run something of that name (a file ``timeline``, or a directory with ``__main__.py``,
    in the working directory; a program or module with ``PET_NO_PYTHON``/``PET_MODULE`` set)."""
    for variable in ("PET_NO_PYTHON", "PET_MODULE"):
        try:
            if environ.get(variable, "").strip() and truth(environ[variable], variable):
                return False
        except ConfigError:
            return False  # the launcher's parser says what is wrong with it
    return not (os.path.isfile("timeline") or os.path.isfile(os.path.join("timeline", "__main__.py")))


def program() -> NoReturn:
    """The ``elasticrun`` command (and ``python -m elastic.run``): :func:`main`, then exit.

    By the time :func:`main` returns, the agent has stopped everything it started and closed
    every file it opened; what the interpreter would still do on its way out is free every
    module and object one by one, a cost every run would pay after its workers are done. So
    the process leaves with ``os._exit`` once ``atexit`` handlers (logging's, a coverage
    tool's) have run and the standard streams are flushed, as the interpreter would do; a
    flush that fails makes the status 120, as the interpreter's does. The interpreter exits the
    usual way while a non-daemon thread still runs (the agent starts none), and under a profiler
    or a tracer (``python -m cProfile -m elastic.run`` writes its profile after the program
    returns). ``SystemExit`` (``--help``, a bad command line) and exceptions leave the usual way.
    """
    status = main()
    if sys.getprofile() is not None or sys.gettrace() is not None or any(
            thread.is_alive() and not thread.daemon for thread in threading.enumerate()
            if thread is not threading.main_thread()):
        sys.exit(status)
    code = 0 if status is None else status
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except (OSError, ValueError):
            code = code or 120
    os._exit(code)


if __name__ == "__main__":
    program()
