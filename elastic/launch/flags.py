"""The ``elasticrun`` flag table: spellings, values, defaults, ``PET_*`` twins and help.

One :class:`Option` per flag; :mod:`elastic.launch.cli` scans and validates the command line
from it and :func:`format_help` prints it. Every torchrun 2.13 flag is here with torchrun's
default and both spellings (``--nproc-per-node`` and ``--nproc_per_node``); the twin of a flag
is ``PET_`` + its name in capitals with underscores, as torchrun's ``env`` action derives it
(none for ``--logs-specs`` and ``--numa-binding``, as in torchrun, nor for ``--dry-run``).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any

from elastic.rendezvous.backend_spec import (
    BACKEND_NAMES, ETCD_DEFAULT_PORT, STATIC_DEFAULT_ADDR, STATIC_DEFAULT_PORT, STORE_DEFAULT_PORT,
)
from elastic.rendezvous.conf import BACKEND_KEYS, ENGINE_KEYS, NO_EFFECT_KEYS, REMOVED_KEYS, TORCH_ALIASES

PROG = "elasticrun"
SHUTDOWN_TIMEOUT_ENV = "TORCH_ELASTIC_SHUTDOWN_TIMEOUT"
LOG_LINE_PREFIX_TEMPLATE_ENV = "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"
START_METHODS = ("spawn", "fork", "forkserver")
NUMA_MODES = ("node", "socket", "exclusive", "core-complex")  # torch.numa.binding.AffinityMode

NODES = "nodes and workers"
RENDEZVOUS = "rendezvous"
COMMAND = "what the workers run"
OUTPUT = "worker output"
STATIC = "static rendezvous and addresses"
LIFECYCLE = "restarts, signals and shutdown"
ADDITIONS = "elasticrun additions (not in torchrun)"
COMPAT = "accepted for torchrun compatibility"
_GROUPS = (NODES, RENDEZVOUS, COMMAND, OUTPUT, STATIC, LIFECYCLE, ADDITIONS, COMPAT)
_NO_EFFECT = "Accepted for torchrun compatibility; has no effect in elasticrun"
LIVE_PREWARM_MODULES = ("torch", "torch.distributed", "torch._dynamo", "elastic.worker.live")
"""``--prewarm-modules``' default with ``--live-recovery``: what a LiveTraining worker imports before
its first step (its first optimizer imports ``torch._dynamo``), so a forked replacement only builds
its state."""


@dataclass(frozen=True)
class Option:
    """One launcher flag: its spellings, its value (``metavar``; None for a switch), its default
    as it would be typed (None: unset), whether it has a ``PET_*`` twin, and its help."""

    flags: tuple[str, ...]
    group: str
    help: str
    metavar: str | None = None
    default: str | None = None
    env: bool = True
    repeatable: bool = False

    @property
    def dest(self) -> str:
        """The attribute name, as argparse derives it: ``--nproc-per-node`` -> ``nproc_per_node``."""
        return self.long_flag[2:].replace("-", "_")

    @property
    def env_name(self) -> str | None:
        """``PET_<DEST>``, torchrun's environment twin, or None when the flag has none."""
        return f"PET_{self.dest.upper()}" if self.env else None

    @property
    def name(self) -> str:
        """How messages name the flag: ``-m/--module``, ``--nproc-per-node``."""
        return "/".join([flag for flag in self.flags if not flag.startswith("--")] + [self.long_flag])

    @property
    def takes_value(self) -> bool:
        return self.metavar is not None

    @property
    def long_flag(self) -> str:
        return next(flag for flag in self.flags if flag.startswith("--"))


def _hyphen_and_underscore(flag: str) -> tuple[str, ...]:
    underscored = "--" + flag[2:].replace("-", "_")
    return (flag,) if underscored == flag else (flag, underscored)


def _option(flag: str, group: str, help: str, *, short: str | None = None, **kwargs: Any) -> Option:
    flags = ((short,) if short else ()) + _hyphen_and_underscore(flag)
    return Option(flags, group, help, **kwargs)


OPTIONS: tuple[Option, ...] = (
    _option("--nnodes", NODES, "Number of nodes, or the range MIN:MAX an elastic job may run on "
            "(the static backend needs a fixed N).", metavar="N|MIN:MAX", default="1:1"),
    _option("--nproc-per-node", NODES, "Workers per node: a number; gpu (one per visible NVIDIA GPU, an "
            "error when there is none); xpu (one per Intel XPU torch sees, an error when there is none); "
            "cpu (one per CPU this process may use); auto (gpu when a GPU is visible, else xpu when torch "
            "sees an XPU, else cpu). Other accelerators are not detected: give a number.",
            metavar="N|auto|cpu|gpu|xpu", default="1"),
    _option("--rdzv-backend", RENDEZVOUS, "etcd or etcd-v3 (an etcd v3 cluster); tcp (a running "
            "elastic-store); c10d (the built-in store, hosted by the node whose address is the endpoint); "
            "static (fixed --node-rank, no elasticity). A single static node without --master-port runs "
            "standalone, as in torchrun.", metavar="|".join(BACKEND_NAMES), default="static"),
    _option("--rdzv-endpoint", RENDEZVOUS, f"HOST[:PORT], comma-separated for an etcd cluster (default ports: "
            f"etcd {ETCD_DEFAULT_PORT}, tcp and c10d {STORE_DEFAULT_PORT}). c10d on port 0 with one node hosts "
            "the store on a free port. Static: where rank 0's workers meet (default "
            "--master-addr:--master-port).", metavar="ENDPOINT", default=""),
    _option("--rdzv-id", RENDEZVOUS, "Job id shared by all nodes of a job (letters, digits, '.', '_', '-').",
            metavar="ID", default="none"),
    _option("--rdzv-conf", RENDEZVOUS, "Rendezvous options K=V[,K=V...]; repeatable, merged, later keys win. "
            f"Keys: {', '.join(sorted(ENGINE_KEYS) + sorted(set(BACKEND_KEYS) - REMOVED_KEYS))}. The keys torch's handlers read are "
            f"accepted too: {', '.join(sorted(TORCH_ALIASES))} (our TLS keys), timeout (join_timeout; no effect "
            f"with c10d and static, as in torch), {', '.join(sorted(NO_EFFECT_KEYS))} (no effect; a note says "
            "why). Unknown keys are errors.",
            metavar="K=V,...", default="", repeatable=True),
    _option("--standalone", RENDEZVOUS, "One node: host an embedded built-in store on a free local port "
            "under a random run id; --rdzv-backend, --rdzv-endpoint and --rdzv-id are ignored (with a "
            "warning). Needs --nnodes 1."),
    _option("--module", COMMAND, "Run SCRIPT as a Python module, like python -m.", short="-m"),
    _option("--no-python", COMMAND, "Run SCRIPT as an executable, without python (not with -m)."),
    _option("--run-path", COMMAND, "Run SCRIPT with runpy.run_path in a fresh python (give an absolute "
            "path); takes precedence over --no-python and -m."),
    _option("--role", COMMAND, "Role name of the workers.", metavar="ROLE", default="default"),
    _option("--log-dir", OUTPUT, "Base directory of the worker logs: "
            "DIR/RUN_ID/NODE_ID/attempt_K/LOCAL_RANK/{stdout,stderr}.log (NODE_ID keeps agents that share DIR apart).", metavar="DIR"),
    _option("--redirects", OUTPUT, "Send worker streams to the log files instead of the console: 0 none, "
            "1 stdout, 2 stderr, 3 both, for every local rank; or per local rank, e.g. 0:1,1:2.",
            short="-r", metavar="0-3|RANK:0-3,...", default="0"),
    _option("--tee", OUTPUT, "Send worker streams to the log files and to the console (forms as --redirects).",
            short="-t", metavar="0-3|RANK:0-3,...", default="0"),
    _option("--local-ranks-filter", OUTPUT, "Show only these local ranks' output on the console, e.g. 0,1 "
            "(log files keep everything; default: all ranks).", metavar="RANKS", default=""),
    _option("--logs-specs", OUTPUT, "A torchrun.logs_specs entry point (a torch LogsSpecs class, e.g. torch's "
            "default) that decides where each rank's output goes instead of --log-dir's layout; it runs in a "
            "helper process that imports torch, which the launch waits for. An unknown name is refused at once.",
            metavar="NAME", env=False),
    _option("--node-rank", STATIC, "This node's rank; static backend only.", metavar="N", default="0"),
    _option("--master-addr", STATIC, f"Address of the node of rank 0; static backend only (default "
            f"{STATIC_DEFAULT_ADDR}). IPv6 as [::1].", metavar="HOST"),
    _option("--master-port", STATIC, f"Port where rank 0's workers meet; static backend only (default "
            f"{STATIC_DEFAULT_PORT}).", metavar="PORT"),
    _option("--local-addr", STATIC, "Address other nodes use to reach this one (default: this host's "
            "fully qualified name). IPv6 with or without brackets.", metavar="HOST"),
    _option("--max-restarts", LIFECYCLE, "Worker-group restarts allowed after worker failures before the "
            "job fails; membership changes do not count.", metavar="N", default="0"),
    _option("--monitor-interval", LIFECYCLE, "Seconds between checks of the workers.", metavar="SECONDS",
            default="0.1"),
    _option("--signals-to-handle", LIFECYCLE, "Signals the agent catches and forwards to the workers, e.g. "
            "add SIGUSR1,SIGUSR2 under SLURM (SIGKILL and SIGSTOP cannot be caught).", metavar="SIG,...",
            default="SIGTERM,SIGINT,SIGHUP,SIGQUIT"),
    _option("--shutdown-timeout", LIFECYCLE, "Seconds between SIGTERM and SIGKILL when stopping workers "
            f"(default: {SHUTDOWN_TIMEOUT_ENV}, else 30).", metavar="SECONDS"),
    _option("--start-method", LIFECYCLE, "Accepted for torchrun compatibility: workers are always fresh "
            "processes, whichever method is named.", metavar="|".join(START_METHODS), default="spawn"),
    _option("--exit-barrier-timeout", ADDITIONS, "Seconds this node waits, once its workers are done, for "
            "the other nodes' workers to finish.", metavar="SECONDS", default="300"),
    _option("--metrics-port", ADDITIONS, "Serve /healthz and Prometheus /metrics on this port (default: off).",
            metavar="PORT"),
    _option("--metrics-addr", ADDITIONS, "Address the metrics port listens on; 0.0.0.0 or :: for every "
            "interface (default: 127.0.0.1, this machine only).", metavar="ADDR", default="127.0.0.1"),
    _option("--event-log", ADDITIONS, "Append structured events (rounds, restarts, failures) to FILE as "
            "JSON lines (default: off).", metavar="FILE"),
    _option("--prewarm", ADDITIONS, "Fork each worker from a template process per local rank that has "
            "already imported --prewarm-modules, so a (re)start costs a fork instead of an interpreter start "
            "and torch's import. On by default with --live-recovery (turn it off with --no-prewarm). Python "
            "entrypoints only (not --no-python); a template that initialised CUDA or started threads is "
            "refused and its workers start normally."),
    _option("--no-prewarm", ADDITIONS, "Start every worker as a fresh process even with --live-recovery "
            "(which otherwise turns --prewarm on); not with --prewarm."),
    _option("--prewarm-modules", ADDITIONS, "Comma-separated modules the --prewarm templates import "
            f"(with --live-recovery the default is {', '.join(LIVE_PREWARM_MODULES[:-1])} and "
            f"{LIVE_PREWARM_MODULES[-1]}: what a LiveTraining worker imports before its first step).",
            metavar="MODULE,...", default="torch"),
    _option("--live-recovery", ADDITIONS, "Keep healthy workers running through a peer's failure or a "
            "membership change: the agent publishes each new round to its workers (ELASTIC_ROUND_FD) and "
            "restarts only those that died; for scripts that use elastic.worker.LiveTraining "
            "(docs/live-recovery.md). Turns --prewarm on, so a replacement worker is a fork that has "
            "imported --prewarm-modules (--no-prewarm: a fresh process). Not with the static rendezvous."),
    _option("--live-recovery-timeout", ADDITIONS, "Seconds a live worker has to form a new round before "
            "the agent restarts the node's whole group as without --live-recovery.", metavar="SECONDS",
            default="60"),
    _option("--verbose", ADDITIONS, "Show every INFO line of the agent, time-stamped (default: one line per "
            "world formed, node lost, restart, and a summary at exit; LOGLEVEL=INFO does the same, "
            "LOGLEVEL=DEBUG adds the JSON events, LOGLEVEL=WARNING shows warnings only).", short="-v"),
    _option("--dry-run", ADDITIONS, "Print the resolved configuration and exit without starting anything "
            "(no PET_ twin: a dry run is asked for each time).", env=False),
    _option("--event-log-handler", COMPAT, f"{_NO_EFFECT}: torch's event handlers need torch; use "
            "--event-log FILE.", metavar="NAME", default="null"),
    _option("--numa-binding", COMPAT, f"{_NO_EFFECT}: workers are not pinned to CPUs.",
            metavar="|".join(NUMA_MODES), env=False),
    _option("--duplicate-stdout-filters", COMPAT, f"{_NO_EFFECT}.", metavar="PATTERNS", default=""),
    _option("--duplicate-stderr-filters", COMPAT, f"{_NO_EFFECT}.", metavar="PATTERNS", default=""),
    _option("--virtual-local-rank", COMPAT, f"{_NO_EFFECT}: LOCAL_RANK is the worker's real local rank."),
)

OPTIONS_BY_DEST: dict[str, Option] = {option.dest: option for option in OPTIONS}
OPTIONS_BY_FLAG: dict[str, Option] = {flag: option for option in OPTIONS for flag in option.flags}
HELP_FLAGS = ("-h", "--help")
VERSION_FLAGS = ("--version",)

TORCHRUN_LONG_FLAGS: tuple[str, ...] = (
    *(flag for option in OPTIONS if option.group != ADDITIONS for flag in option.flags if flag.startswith("--")),
    "--help",
)
"""Every long spelling torchrun 2.13's parser has, in its order: what an abbreviation is matched against first."""

OWN_LONG_FLAGS: tuple[str, ...] = (
    *(flag for option in OPTIONS if option.group == ADDITIONS for flag in option.flags if flag.startswith("--")),
    *VERSION_FLAGS,
)
"""The long spellings only elasticrun has."""


def flag_candidates(flag: str) -> tuple[str, ...]:
    """The flags ``flag`` (a word's part before ``=``) may stand for, as torchrun's argparse
    parser (``allow_abbrev``) reads it: itself when it is a flag; else, for a ``--`` word, every
    torchrun spelling it is a prefix of; else every elasticrun-only spelling it is a prefix of.

    One: that flag. Several: ambiguous, even when they spell one flag (argparse counts
    spellings, so ``--nproc`` is ambiguous under torchrun too). None: unknown. torchrun's
    spellings come first so that what torchrun accepts means the same here (``--event-l`` is
    ``--event-log-handler``, although ``--event-log`` shares the prefix).
    """
    if flag in OPTIONS_BY_FLAG or flag in HELP_FLAGS or flag in VERSION_FLAGS:
        return (flag,)
    if not flag.startswith("--"):
        return ()
    return (tuple(known for known in TORCHRUN_LONG_FLAGS if known.startswith(flag))
            or tuple(known for known in OWN_LONG_FLAGS if known.startswith(flag)))


class _HelpFormatter(argparse.HelpFormatter):
    """Shows a flag's value once: ``--nproc-per-node, --nproc_per_node N|auto|cpu|gpu``."""

    def _format_action_invocation(self, action: argparse.Action) -> str:
        if not action.option_strings or action.nargs == 0:
            return super()._format_action_invocation(action)
        return f"{', '.join(action.option_strings)} {self._format_args(action, action.dest.upper())}"


def format_help() -> str:
    """The ``--help`` text, built from :data:`OPTIONS` (defaults and ``PET_*`` twins included)."""
    parser = argparse.ArgumentParser(
        prog=PROG, add_help=False, formatter_class=_HelpFormatter,
        usage=f"{PROG} [flags] SCRIPT [ARGS...]  |  {PROG} [flags] -m MODULE [ARGS...]",
        description="Elastic launcher for PyTorch training: torchrun's flags, rendezvous on etcd v3 or a "
                    "built-in store. Everything after SCRIPT (or after --) goes to the workers untouched.",
        epilog="Draw the --event-log files of a run as one HTML page: elasticrun timeline EVENTS.jsonl... "
               "-o timeline.html (see elastic-timeline --help). The manual with examples: python -m pydoc elastic.run",
    )
    parser.add_argument("-h", "--help", action="store_true", help="Show this help and exit.")
    parser.add_argument("--version", action="store_true", help="Show the version and exit.")
    groups = {name: parser.add_argument_group(name) for name in _GROUPS}
    for option in OPTIONS:
        notes = []
        if option.default:
            notes.append(f"default: {option.default}")
        if option.env_name:
            notes.append(f"env: {option.env_name}")
        text = option.help + (f" [{'; '.join(notes)}]" if notes else "")
        kwargs: dict[str, Any] = {"metavar": option.metavar} if option.takes_value else {"action": "store_true"}
        groups[option.group].add_argument(*option.flags, help=text.replace("%", "%%"), **kwargs)
    parser.add_argument("script", metavar="SCRIPT", help="The training script (module with -m, executable "
                        "with --no-python), followed by its arguments.")
    return parser.format_help()
