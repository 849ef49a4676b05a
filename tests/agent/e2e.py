"""The ``elasticrun`` end-to-end scenarios' helpers (test_elasticrun.py, test_membership_policy.py).

Built on :mod:`elastic.testing.agents`: :class:`Processes` is a job that starts ``elasticrun``,
stock ``torchrun`` and the built-in store; the workers (``workers/``) append JSON lines with
their ranks, restart count and wall times to one :class:`~elastic.testing.agents.Reports` file.
The fixtures ``procs`` and ``reports`` are in ``conftest.py``.

Rendezvous settings are shrunk to keep the runs fast: ``lease_ttl=2,last_call_timeout=1``.
With ``ELASTIC_TEST_PREWARM=1`` every agent runs with ``--prewarm``.
"""

from __future__ import annotations

import os
import sys
import uuid
from pathlib import Path
from typing import Callable

from elastic.testing import agents

WORKERS = Path(__file__).parent / "workers"
PREWARM = os.environ.get("ELASTIC_TEST_PREWARM") == "1"
ELASTICRUN = [sys.executable, "-m", "elastic.run", *(["--prewarm"] if PREWARM else [])]
TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]
LEASE_TTL = 2.0
LAST_CALL = 1.0
FAST_CONF = f"lease_ttl={LEASE_TTL:g},last_call_timeout={LAST_CALL:g}"
RUN_TIMEOUT = 60.0
"""What a run may take at most before the test gives up on it (each worker imports torch, ~1.5 s)."""


class Processes(agents.Job):
    """Launchers and stores of one test; at the end every one (and every worker reported) is
    stopped by PID."""

    def __init__(self, workdir: Path) -> None:
        super().__init__(workdir, timeout=RUN_TIMEOUT, worker_marker=str(WORKERS))

    def elasticrun(self, *args: str, name: str | None = None, env: dict[str, str] | None = None) -> agents.Launched:
        return self._launch(ELASTICRUN + list(args), name or f"agent{len(self.agents)}", env)

    def torchrun(self, *args: str, name: str = "torchrun", env: dict[str, str] | None = None) -> agents.Launched:
        return self._launch(TORCHRUN + list(args), name, env)

    def _launch(self, argv: list[str], name: str, env: dict[str, str] | None) -> agents.Launched:
        # TMPDIR (both launchers, so their workers' environments compare equal): the PID files of
        # our agents without --log-dir, which kill_tree leaves behind, stay in the test's directory.
        return self.start(name, argv, env=env or agents.clean_env(TMPDIR=str(self.workdir)))

    def tcp_store(self, port: int, token_file: Path) -> agents.Launched:
        """The built-in store on its own (``python -m backends.tcp.cli``), ready when this returns."""
        store = self.start(f"store{len(self.agents)}", [
            sys.executable, "-m", "backends.tcp.cli", "--host", "127.0.0.1", "--port", str(port),
            "--token-file", str(token_file), "--log-level", "WARNING"])
        self.wait_for("the store to listen", lambda: "listening on" in store.stdout, names=[store.name])
        return store


def worker_alive(pid: int) -> bool:
    """Whether ``pid`` is still one of our worker scripts (not a reused pid, not a zombie)."""
    return agents.is_alive(pid, str(WORKERS))


def allreduces_at(world: int, *, after: float = 0.0,
                  not_by: frozenset[int] = frozenset()) -> Callable[[list[dict]], bool]:
    """Every rank of a ``world``-sized group has completed an all-reduce after wall time ``after``,
    counting only workers whose pid is not in ``not_by`` (pass :func:`worker_pids` of a world
    of the same size before a kill: its workers can still report an all-reduce right at the kill)."""
    def seen(records: list[dict]) -> bool:
        ranks = {r["rank"] for r in records
                 if r["event"] == "allreduce" and r["world_size"] == world and r["time"] > after
                 and r["pid"] not in not_by}
        return ranks == set(range(world))
    return seen


def worker_pids(records: list[dict]) -> frozenset[int]:
    """The pids of every worker that reported its start in ``records``."""
    return frozenset(r["pid"] for r in records if r["event"] == "started")


def assert_correct_allreduces(records: list[dict], world: int) -> None:
    """Each rank 0..world-1 reported the sum 1 + ... + world."""
    done = [r for r in records if r["event"] == "allreduce" and r["world_size"] == world]
    assert sorted({r["rank"] for r in done}) == list(range(world))
    assert {r["result"] for r in done} == {world * (world + 1) // 2}


def run_id() -> str:
    return f"e2e-{uuid.uuid4().hex[:10]}"


def script(name: str) -> str:
    return str(WORKERS / name)


def loop_args(reports: agents.Reports, stop_file: Path) -> list[str]:
    return [script("allreduce.py"), str(reports.path), "--loop", "--stop-file", str(stop_file),
            "--max-seconds", "90", "--interval", "0.05"]


def etcd_flags(etcd_server) -> list[str]:
    config = etcd_server.client_config()
    conf = f"{FAST_CONF},user={config.user},password={config.password}"
    return ["--rdzv-backend", "etcd", "--rdzv-endpoint", etcd_server.endpoints, "--rdzv-id", run_id(),
            "--rdzv-conf", conf, "--local-addr", "127.0.0.1"]
