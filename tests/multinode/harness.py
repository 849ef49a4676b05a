"""The multi-node differential harness: one scenario, several real agents, several launchers.

A :class:`Job` runs one scenario under one launcher: every agent is a separate process on
loopback (``python -m elastic.run`` or ``python -m torch.distributed.run``) with a clean
environment plus ``PROBE_NODE=<label>``, so each row of the table says which agent started the
worker. Workers (``workers/probe.py``) append rows to one table file; :func:`attempts` groups
the ``formed`` rows by the tokens the workers all-gathered: an attempt is the set of workers
that really formed one process group, whatever the launcher claimed.

:func:`violations` is the pure check of one attempt (ranks, sizes, master, restart count,
all-reduce, torchrun's rank derivation) and :func:`shape` the launcher-independent form of its
rank/world columns, compared with stock torchrun's c10d run of the same scenario.

The processes are :mod:`elastic.testing.agents`'s: every process a job starts (agents, their
workers, found through the process tree and the table's pids) is stopped by PID at the end,
whatever happened.
"""

from __future__ import annotations

import sys
import time
import uuid
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

from elastic.testing import agents, with_stacks
from elastic.testing.ports import free_port

HERE = Path(__file__).parent
PROBE = HERE / "workers" / "probe.py"
REPO = HERE.parents[1]

ELASTICRUN = "elasticrun"
PREWARMED = "elasticrun-prewarm"
"""elasticrun with ``--prewarm``: workers forked from templates that imported torch."""
PLUGIN = "torchrun-etcd-v3"
C10D = "torchrun-c10d"
LAUNCHERS = (ELASTICRUN, PREWARMED, PLUGIN, C10D)
ELASTICRUN_C10D = "elasticrun-c10d"
"""elasticrun with ``--rdzv-backend=c10d``, for the scenarios about the c10d store itself."""
C10D_LAUNCHERS = (ELASTICRUN_C10D, C10D)
"""The launchers that need no etcd."""

LEASE_TTL = 2
LAST_CALL = 1
OURS_CONF = f"lease_ttl={LEASE_TTL},last_call_timeout={LAST_CALL}"
# torch's dynamic rendezvous (c10d) takes join/last_call/close timeouts and keep-alive settings
# (torch/distributed/elastic/rendezvous/dynamic_rendezvous.py:create_handler).
# read_timeout bounds its store waits (60 s by default), which is where it hangs when it cannot
# re-form (see the membership tests and the finished-job scenario: each waits it out once, then
# torchrun exits 1). Where it completes, those waits last well under a second (every agent of a
# round writes its key at once), so 10 s exercises the same outcome as 20 s, 10 s sooner. It is
# also how long a client that is not the host keeps trying to connect to the store: the
# any-order scenario, which waits for a host started 5 s later, sets C10D_CONNECT_TIMEOUT.
C10D_READ_TIMEOUT = 10
C10D_CONNECT_TIMEOUT = 20
"""``read_timeout`` for a c10d node that starts before its store's host (test_any_order_differential)."""
C10D_CONF = f"join_timeout=60,last_call_timeout={LAST_CALL},close_timeout=20,keep_alive_interval=1," \
            f"keep_alive_max_attempt=3,read_timeout={C10D_READ_TIMEOUT}"
JOB_TIMEOUT = 60.0
"""Seconds one launcher may take for one phase of a scenario before the harness gives up on it."""
REFERENCE_TIMEOUT = 30.0
"""How long to wait for torchrun c10d, the reference, to reach a membership phase: one it has not
reached by then is recorded as not reached (its own timeouts would take minutes) and only what it
reached is compared."""
REFERENCE_RUN_TIMEOUT = 40.0
"""How long a whole run of torchrun c10d may take (its crash run sometimes hangs in its store
waits; it takes 6-25 s when it completes here, under load)."""


HUNG_TAIL = 16000
"""How much of the stderr of an agent that did not exit goes into a failure (its stack dump is last)."""


def clean_env(**extra: str) -> dict[str, str]:
    """An agent's environment: :func:`elastic.testing.agents.clean_env` without ``PROBE_*`` from
    outside, with one OpenMP thread, gloo on loopback and unbuffered output; plus ``extra``."""
    env = {key: value for key, value in agents.clean_env().items() if not key.startswith("PROBE_")}
    env.update(OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo", PYTHONUNBUFFERED="1")
    env.update(extra)
    return env


# -- launchers ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Rendezvous:
    """Where one job's agents meet: the etcd endpoints and credentials, or a c10d port."""

    run_id: str
    etcd_endpoints: str
    etcd_user: str
    etcd_password: str
    c10d_port: int


def launcher_argv(launcher: str, rdzv: Rendezvous, *, nnodes: str, nproc: str, max_restarts: int,
                  log_dir: Path, conf: str = "") -> list[str]:
    """The command line of one agent of ``launcher`` (before the script and its arguments);
    ``conf``: more ``--rdzv-conf`` options for this agent (e.g. ``is_host=0``)."""
    common = [f"--nnodes={nnodes}", f"--nproc-per-node={nproc}", f"--max-restarts={max_restarts}",
              "--monitor-interval=0.2", f"--rdzv-id={rdzv.run_id}", f"--log-dir={log_dir}"]
    credentials = f"user={rdzv.etcd_user},password={rdzv.etcd_password}"
    more = f",{conf}" if conf else ""
    if launcher in (ELASTICRUN, PREWARMED):
        return [sys.executable, "-m", "elastic.run", *common, "--rdzv-backend=etcd",
                f"--rdzv-endpoint={rdzv.etcd_endpoints}", f"--rdzv-conf={OURS_CONF},{credentials}{more}",
                "--local-addr=127.0.0.1", *(["--prewarm"] if launcher == PREWARMED else [])]
    if launcher == ELASTICRUN_C10D:
        return [sys.executable, "-m", "elastic.run", *common, "--rdzv-backend=c10d",
                f"--rdzv-endpoint=127.0.0.1:{rdzv.c10d_port}", f"--rdzv-conf={OURS_CONF}{more}",
                "--local-addr=127.0.0.1"]
    # Under with_stacks: an agent that does not exit can be asked for its Python stacks (SIGUSR1).
    torchrun = [*with_stacks.command("torch.distributed.run"), *common, "--local-addr=127.0.0.1"]
    if launcher == PLUGIN:
        endpoint = rdzv.etcd_endpoints.split(",")[0].split("://", 1)[-1]
        return [*torchrun, "--rdzv-backend=etcd-v3", f"--rdzv-endpoint={endpoint}",
                f"--rdzv-conf={OURS_CONF},{credentials},join_timeout=60,read_timeout=30{more}"]
    if launcher == C10D:
        return [*torchrun, "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{rdzv.c10d_port}",
                f"--rdzv-conf={C10D_CONF}{more}"]
    raise ValueError(f"Unknown launcher {launcher!r}.")


# -- processes ---------------------------------------------------------------------------------


@dataclass
class Outcome:
    """What a job ended with: each agent's exit code (None: still running when given up)."""

    codes: dict[str, int | None]
    seconds: float
    note: str = ""

    @property
    def completed(self) -> bool:
        return bool(self.codes) and all(code == 0 for code in self.codes.values())


class Job:
    """One scenario under one launcher: its agents, its table; stops everything at ``close``."""

    def __init__(self, launcher: str, workdir: Path, etcd_server, *, nnodes: str, max_restarts: int,
                 probe_args: Iterable[str] = ()) -> None:
        """``etcd_server``: the session's etcd, or None for a job of c10d launchers only."""
        self.launcher = launcher
        self.workdir = workdir
        workdir.mkdir(parents=True, exist_ok=True)
        self.table_path = workdir / "table.jsonl"
        self.stop_file = workdir / "stop"
        self.nnodes = nnodes
        self.max_restarts = max_restarts
        self.probe_args = list(probe_args)
        if etcd_server is None and launcher not in C10D_LAUNCHERS:
            raise ValueError(f"The launcher {launcher!r} needs an etcd server.")
        config = etcd_server.client_config() if etcd_server is not None else None
        self.rdzv = Rendezvous(f"mn-{uuid.uuid4().hex[:10]}", etcd_server.endpoints if etcd_server else "",
                               config.user if config else "", config.password if config else "", free_port())
        self.started = time.monotonic()
        self.phase_timeout = REFERENCE_TIMEOUT if launcher == C10D else JOB_TIMEOUT
        self.exit_timeout = REFERENCE_RUN_TIMEOUT if launcher == C10D else JOB_TIMEOUT
        self.processes = agents.Job(workdir, timeout=self.exit_timeout, worker_marker=str(PROBE.parent))

    @property
    def agents(self) -> dict[str, agents.Launched]:
        """The agents by label."""
        return self.processes.agents

    def start(self, label: str, nproc: str | int, conf: str = "", *, script: Path = PROBE,
              probe_args: Iterable[str] | None = None) -> agents.Launched:
        """Start agent ``label`` running ``script`` (the probe, or one that runs it under another
        name) with the job's probe arguments (or ``probe_args``); ``conf``: more ``--rdzv-conf``
        options for this agent (e.g. ``is_host=0``)."""
        argv = launcher_argv(self.launcher, self.rdzv, nnodes=self.nnodes, nproc=str(nproc),
                             max_restarts=self.max_restarts, log_dir=self.workdir / f"logs-{label}", conf=conf)
        argv += [str(script), str(self.table_path), *(self.probe_args if probe_args is None else probe_args)]
        # Both agents log each step (rendezvous, exit barrier, shutdown) at INFO: the failure
        # message's stderr tail then says where an agent that did not exit got to.
        return self.processes.start(label, argv, env=clean_env(PROBE_NODE=label, LOGLEVEL="INFO"), cwd=self.workdir)

    def rows(self) -> list[dict]:
        return agents.read_json_lines(self.table_path)

    def wait_for(self, what: str, predicate: Callable[[list[dict]], bool],
                 labels: Iterable[str] | None = None) -> list[dict] | None:
        """Poll the table until ``predicate(rows)``; None after ``phase_timeout`` or when one of
        the agents ``labels`` (all) exits first."""
        watched = [self.agents[label] for label in (labels if labels is not None else self.agents)]
        try:
            return agents.Reports(self.table_path).wait_for(what, predicate, watched, self.phase_timeout)
        except (agents.WaitTimeout, agents.ProcessExited):
            return None

    def wait_exit(self, labels: Iterable[str] | None = None, timeout: float | None = None) -> Outcome:
        """Wait for the agents to exit (all, or ``labels``); codes are None for those still running."""
        # The reference's own hangs are known and not asserted: where its agents wait is not gathered.
        codes = self.processes.collect(labels, timeout, diagnose=self.launcher != C10D)
        return Outcome(codes, time.monotonic() - self.started)

    def logs(self, tail: int = 1500) -> str:
        parts = []
        for label, agent in self.agents.items():
            parts.append(f"--- {self.launcher} agent {label} (exit {agent.proc.poll()}) stderr tail:\n"
                         f"{agent.stderr[-(HUNG_TAIL if agent.hang else tail):]}")
            if agent.hang:  # its Python stacks (SIGUSR1) are in the stderr tail above
                parts.append(f"--- {self.launcher} agent {label} did not exit; its threads:\n{agent.hang}")
        return "\n".join(parts)

    def close(self) -> None:
        """SIGKILL every agent still running (with its tree) and every probe worker left behind."""
        self.processes.worker_pids.update(row["pid"] for row in self.rows())
        self.processes.stop_all()


# -- attempts ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Attempt:
    """The workers that formed one process group (by their all-gathered tokens) and their rows."""

    tokens: frozenset[str]
    formed: tuple[dict, ...]
    """The ``formed`` rows of this group's workers (one per worker, or fewer if one never wrote it)."""

    @property
    def world(self) -> int:
        return len(self.tokens)

    @property
    def time(self) -> float:
        return min(row["time"] for row in self.formed)

    @property
    def complete(self) -> bool:
        return {row["token"] for row in self.formed} == set(self.tokens)

    def nodes(self) -> set[str]:
        return {row["node"] for row in self.formed}


def attempts(rows: list[dict]) -> list[Attempt]:
    """The process groups the workers really formed, in the order they formed."""
    formed = [row for row in rows if row["event"] == "formed"]
    groups: dict[frozenset[str], list[dict]] = defaultdict(list)
    for row in formed:
        groups[frozenset(row["tokens"])].append(row)
    found = [Attempt(key, tuple(sorted(members, key=lambda r: int(r["env"].get("RANK", -1)))))
             for key, members in groups.items()]
    return sorted(found, key=lambda attempt: attempt.time)


def _int(row: dict, key: str) -> int | None:
    value = row["env"].get(key)
    return int(value) if value is not None and value.lstrip("-").isdigit() else None


def violations(attempt: Attempt, nproc_of: dict[str, int] | None = None) -> list[str]:
    """Everything wrong with one attempt's world (empty: consistent). Pure; no I/O.

    Checks: one row per member; RANK equal to the process group's rank; the all-reduce of the
    ranks equals W(W-1)/2 on every row; and :func:`env_violations` of the rows for world W.
    """
    found: list[str] = []
    rows = attempt.formed
    world = attempt.world
    if not attempt.complete:
        found.append(f"{world - len(rows)} of {world} members wrote no 'formed' row")
    if any(_int(row, "RANK") != row["rank"] for row in rows):
        found.append("RANK differs from the process group's rank on "
                     f"{[(row['env'].get('RANK'), row['rank']) for row in rows if _int(row, 'RANK') != row['rank']]}")
    sums = {row["allreduce_sum"] for row in rows}
    if sums != {world * (world - 1) // 2}:
        found.append(f"all_reduce(rank) gave {sorted(sums)}, not {world * (world - 1) // 2}")
    return found + env_violations(rows, world, nproc_of)


def env_violations(rows: Iterable[dict], world: int, nproc_of: dict[str, int] | None = None) -> list[str]:
    """What is wrong with the environments of the ``world`` workers of one attempt. Pure.

    Checks: RANK exactly 0..W-1; one WORLD_SIZE == W; one MASTER_ADDR:MASTER_PORT; one
    TORCHELASTIC_RESTART_COUNT; GROUP_RANK 0..G-1 with one GROUP_WORLD_SIZE == G; per node
    LOCAL_RANK 0..L-1 with LOCAL_WORLD_SIZE == L (== the node's ``--nproc-per-node`` when
    ``nproc_of`` names it); RANK == (sum of LOCAL_WORLD_SIZE of lower group ranks) + LOCAL_RANK,
    as torch's ``_assign_worker_ranks``; one ROLE_NAME, ROLE_RANK == RANK and ROLE_WORLD_SIZE ==
    WORLD_SIZE (one role).
    """
    rows = tuple(rows)
    found: list[str] = []

    def one(key: str) -> set:
        return {row["env"].get(key) for row in rows}

    ranks = [_int(row, "RANK") for row in rows]
    if None in ranks or sorted(ranks) != list(range(world)):
        found.append(f"RANK is {sorted(ranks, key=lambda r: -1 if r is None else r)}, not 0..{world - 1}")
    if one("WORLD_SIZE") != {str(world)}:
        found.append(f"WORLD_SIZE is {sorted(map(str, one('WORLD_SIZE')))}, not one value {world}")
    masters = {f"{row['env'].get('MASTER_ADDR')}:{row['env'].get('MASTER_PORT')}" for row in rows}
    if len(masters) != 1:
        found.append(f"MASTER_ADDR:MASTER_PORT is {sorted(masters)}, not one value")
    if len(one("TORCHELASTIC_RESTART_COUNT")) != 1:
        found.append(f"TORCHELASTIC_RESTART_COUNT is {sorted(map(str, one('TORCHELASTIC_RESTART_COUNT')))} "
                     "on one attempt, not one value")
    found += _node_violations(rows, world, nproc_of)
    if len(one("ROLE_NAME")) != 1:
        found.append(f"ROLE_NAME is {sorted(map(str, one('ROLE_NAME')))}, not one role")
    if any(row["env"].get("ROLE_RANK") != row["env"].get("RANK") for row in rows):
        found.append("ROLE_RANK differs from RANK (one role)")
    if any(row["env"].get("ROLE_WORLD_SIZE") != row["env"].get("WORLD_SIZE") for row in rows):
        found.append("ROLE_WORLD_SIZE differs from WORLD_SIZE (one role)")
    return found


def unformed(rows: list[dict]) -> dict[str, list[dict]]:
    """The ``started`` rows of workers that formed no group, by the master their launcher named.

    The master port is fresh per attempt, so each entry is what one attempt's launchers claimed.
    """
    formed = {row["token"] for row in rows if row["event"] == "formed"}
    claimed: dict[str, list[dict]] = defaultdict(list)
    for row in rows:
        if row["event"] == "started" and row["token"] not in formed:
            claimed[f"{row['env'].get('MASTER_ADDR')}:{row['env'].get('MASTER_PORT')}"].append(row)
    return dict(claimed)


def _node_violations(rows: tuple[dict, ...], world: int, nproc_of: dict[str, int] | None) -> list[str]:
    found: list[str] = []
    group_sizes = {_int(row, "GROUP_WORLD_SIZE") for row in rows}
    by_group: dict[int | None, list[dict]] = defaultdict(list)
    for row in rows:
        by_group[_int(row, "GROUP_RANK")].append(row)
    if len(group_sizes) != 1 or set(by_group) != set(range(next(iter(group_sizes)) or 0)):
        found.append(f"GROUP_RANK is {sorted(by_group, key=str)} with GROUP_WORLD_SIZE {sorted(group_sizes, key=str)}, "
                     "not 0..G-1 with one G")
    labels_per_group = {group: {row["node"] for row in members} for group, members in by_group.items()}
    if any(len(labels) != 1 for labels in labels_per_group.values()):
        found.append(f"one GROUP_RANK on several nodes: {dict(sorted(labels_per_group.items(), key=str))}")
    base = 0
    for group in sorted(by_group, key=lambda g: -1 if g is None else g):
        members = by_group[group]
        local = len(members)
        node = members[0]["node"]
        if {_int(row, "LOCAL_WORLD_SIZE") for row in members} != {local}:
            found.append(f"node {node} (GROUP_RANK {group}) has {local} workers but LOCAL_WORLD_SIZE "
                         f"{sorted({row['env'].get('LOCAL_WORLD_SIZE') for row in members})}")
        if nproc_of and node in nproc_of and local != nproc_of[node]:
            found.append(f"node {node} runs {local} workers, not its --nproc-per-node {nproc_of[node]}")
        if sorted(_int(row, "LOCAL_RANK") for row in members if _int(row, "LOCAL_RANK") is not None) != list(range(local)):
            found.append(f"node {node}: LOCAL_RANK {[row['env'].get('LOCAL_RANK') for row in members]} not 0..{local - 1}")
        wrong = [(row["env"].get("LOCAL_RANK"), row["env"].get("RANK")) for row in members
                 if _int(row, "RANK") != base + (_int(row, "LOCAL_RANK") or 0)]
        if wrong:
            found.append(f"node {node} (GROUP_RANK {group}): (LOCAL_RANK, RANK) {wrong}, torchrun gives RANK = "
                         f"{base} + LOCAL_RANK (the local world sizes of the lower group ranks, summed)")
        base += local
    return found


def shape(attempt: Attempt) -> list[tuple]:
    """The rank/world columns per node, independent of the order of the nodes' group ranks.

    One entry per node: ``(LOCAL_WORLD_SIZE, GROUP_WORLD_SIZE, WORLD_SIZE, ((LOCAL_RANK,
    RANK - the node's first RANK, ROLE_RANK - RANK, ROLE_WORLD_SIZE), ...))``, sorted.
    """
    by_node: dict[str, list[dict]] = defaultdict(list)
    for row in attempt.formed:
        by_node[row["node"]].append(row)
    nodes = []
    for members in by_node.values():
        first = min(_int(row, "RANK") or 0 for row in members)
        columns = tuple(sorted(
            (_int(row, "LOCAL_RANK"), (_int(row, "RANK") or 0) - first,
             (_int(row, "ROLE_RANK") or 0) - (_int(row, "RANK") or 0), _int(row, "ROLE_WORLD_SIZE"))
            for row in members))  # fmt: skip
        nodes.append((_int(members[0], "LOCAL_WORLD_SIZE"), _int(members[0], "GROUP_WORLD_SIZE"),
                      _int(members[0], "WORLD_SIZE"), columns))
    return sorted(nodes, key=repr)


# -- readable failures -------------------------------------------------------------------------

COLUMNS = ("node", "pid", "event", "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
           "GROUP_WORLD_SIZE", "ROLE_RANK", "ROLE_WORLD_SIZE", "MASTER", "RESTART", "sum", "world")


def table(rows: Iterable[dict]) -> str:
    """Rows as an aligned text table (environment columns, the all-reduce sum, the real group size)."""
    lines = [COLUMNS]
    for row in rows:
        env = row["env"]
        lines.append((
            str(row.get("node")), str(row["pid"]), row["event"],
            *(str(env.get(key, "-")) for key in COLUMNS[3:11]),
            f"{env.get('MASTER_ADDR', '-')}:{env.get('MASTER_PORT', '-')}",
            str(env.get("TORCHELASTIC_RESTART_COUNT", "-")),
            str(row.get("allreduce_sum", "-")), str(row.get("world", "-")),
        ))  # fmt: skip
    widths = [max(len(line[i]) for line in lines) for i in range(len(COLUMNS))]
    return "\n".join("  ".join(cell.ljust(width) for cell, width in zip(line, widths)) for line in lines)


def describe(rows: list[dict]) -> str:
    """Every attempt's table, then the rows of workers that formed nothing (started/failed/timeout)."""
    parts = []
    for index, attempt in enumerate(attempts(rows)):
        parts.append(f"attempt {index} (world {attempt.world}):\n{table(attempt.formed)}")
    formed = {row["token"] for row in rows if row["event"] == "formed"}
    others = [row for row in rows if row["token"] not in formed and row["event"] != "started"]
    if others:
        parts.append("workers that formed no group:\n" + table(others) + "\n" +
                     "\n".join(f"  {row['node']} pid {row['pid']}: {row.get('error', row['event'])}" for row in others))
    if not parts:
        parts.append("no worker formed a group; started:\n" + table(r for r in rows if r["event"] == "started"))
    return "\n".join(parts)


def restart_counts(attempt: Attempt) -> dict[str, str]:
    """``{node: TORCHELASTIC_RESTART_COUNT}`` of one attempt (the value of the node's first row)."""
    return {row["node"]: row["env"].get("TORCHELASTIC_RESTART_COUNT") for row in attempt.formed}


def node_counts(attempt: Attempt) -> Counter:
    return Counter(row["node"] for row in attempt.formed)
