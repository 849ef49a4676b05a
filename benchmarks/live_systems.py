"""The systems of the side-by-side live-recovery benchmark: how each is launched on loopback as
2 nodes x 1 worker, how a worker crash and a node loss are dealt to it, and its cleanup.

  live           ``elasticrun --live-recovery --no-prewarm`` (etcd rendezvous), LiveTraining worker
                 started as a fresh process
  live+prewarm   the same pre-warmed: ``--prewarm --prewarm-modules torch,...,elastic.worker.live``
                 (what ``--live-recovery`` does by default, spelled out)
  prewarm        ``elasticrun --prewarm`` (etcd), whole-group restart, checkpoint resume
  torchrun       stock ``torchrun`` (c10d, store on node 0 alone: ``is_host``;
                 TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1)
  torchft        TorchFT 0.2.0: one lighthouse, one ``torchrun --standalone`` per replica group
                 (it restarts a crashed worker), its Manager and DDP; run from its own venv

Liveness is alike: etcd lease 2 s (torchrun: keep-alive 1 s x 2, TorchFT: heartbeat timeout
2 s), last call 1 s (TorchFT: join timeout 1 s); ``elasticrun --live-recovery`` also
``rejoin_timeout=0.5``.

The ``freeze`` fault SIGSTOPs node 1's whole process tree (:meth:`Run.freeze`) and SIGCONTs it
later (:meth:`Run.thaw`); the ``sigterm`` fault SIGTERMs node 1's launcher alone
(:meth:`Run.terminate`: elasticrun's agent, torchrun, TorchFT's replica group's torchrun), as a
Kubernetes eviction or a spot instance's notice does. ``Run(start_sleep=S)`` (the
``slow_replacement`` fault) makes every worker started after its node's first sleep S seconds
before its training starts: ``LIVE_LATE_START_SLEEP`` of ``live_train.py`` (a worker started in a
round after the first, or as a refill) and ``LIVE_RESTART_SLEEP`` of the other two
(``benchmarks/workers/late_start.py``). The ``control_plane`` fault (``live_side.py``) also kills TorchFT's lighthouse
(:meth:`Run.kill_lighthouse`) or the leader of the 3-member etcd cluster the elasticrun systems
then run against.

Every node's worker appends JSON events (``{"ev": "step", "step", "t"}``) to ``node<i>.jsonl`` in
the run's directory; a node started again appends to the same file. Node 1 takes the faults
(node 0 hosts torchrun's store).

``Run(hsdp=True)``: 2 nodes x 2 workers, one FSDP2 replica per node (replicate 2, shard 2), the
model of ``examples/train_hsdp_live.py``. The live systems run that example (``LiveOptions(hsdp=
True)``; each worker writes ``<pid>.jsonl`` to the node's directory ``node<i>/``, and
:meth:`Run.events` reads the steps of the node's shard-0 worker with every worker's other
events); ``torchrun`` and ``prewarm`` run ``workers/hsdp_ckpt_train.py`` (a 2-D mesh, a
``torch.distributed.checkpoint`` save every 10 steps); ``torchft`` runs
``workers/hsdp_torchft_train.py`` (FSDP2 over the replica group, its Manager's all-reduce
across replica groups). Those two log the steps of local rank 0.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from elastic.testing.agents import clean_env, kill_tree, process_tree
from elastic.testing.ports import free_port
from recovery import wait_for_port  # benchmarks/ is on the path (live_side.py, live_recovery.py)
from support.freeze import freeze, thaw  # and tests/

REPO = Path(__file__).resolve().parents[1]
LIVE_WORKER = REPO / "tests" / "worker" / "workers" / "live_train.py"
CKPT_WORKER = REPO / "benchmarks" / "workers" / "ckpt_train.py"
TORCHFT_WORKER = REPO / "benchmarks" / "workers" / "torchft_train.py"
HSDP_LIVE_WORKER = REPO / "examples" / "train_hsdp_live.py"
HSDP_CKPT_WORKER = REPO / "benchmarks" / "workers" / "hsdp_ckpt_train.py"
HSDP_TORCHFT_WORKER = REPO / "benchmarks" / "workers" / "hsdp_torchft_train.py"
HSDP_SHARDS = 2
"""Workers per node with ``Run(hsdp=True)``: the shard dimension."""
HSDP_STATE_BYTES_PER_HIDDEN = 3 * 18 * 4
"""Bytes of a replica's parameters and AdamW moments per unit of the HSDP model's hidden width:
Linear(16, H) and Linear(H, 1) hold 18 H + 1 floats, AdamW two more of each."""


def hsdp_hidden(state_mb: int) -> int:
    """The HSDP model's hidden width for ~``state_mb`` MB (10^6 bytes) of parameters and AdamW
    state over the whole replica; the example's 64 for 0."""
    return state_mb * 1_000_000 // HSDP_STATE_BYTES_PER_HIDDEN if state_mb else 64
SYSTEMS = ("live", "live+prewarm", "prewarm", "torchrun", "torchft")
LABELS = {"live": "elasticrun --live-recovery --no-prewarm", "live+prewarm": "elasticrun --live-recovery --prewarm",
          "prewarm": "elasticrun --prewarm", "torchrun": "torchrun (c10d)", "torchft": "TorchFT 0.2.0"}
LIVE_PREWARM = ["--prewarm", "--prewarm-modules", "torch,torch.distributed,torch._dynamo,elastic.worker.live"]
LEASE_TTL_S = 2
LAST_CALL_S = 1
REJOIN_S = 0.5
"""``rejoin_timeout`` of the live systems (docs/live-recovery.md's example): a round re-formed after
a loss waits this long for the previous round's members once one rejoined, not the last call.
Off for ``prewarm``, as the docs advise without ``--live-recovery``."""
CHECKPOINT_EVERY = 10
TORCHFT_VERSION = "0.2.0"
LIVE_OPTIONS = {"collective_timeout": 10, "store_timeout": 10, "form_timeout": 60, "round_wait_timeout": 60,
                "interrupt_grace": 0.5, "drain_timeout": 15}


class SystemFailed(RuntimeError):
    """A system's run did not get where the benchmark needs it (a node exited, a wait timed out)."""


def torchft_python(cache: Path) -> tuple[str | None, str]:
    """The python of a venv with TorchFT, made on demand under ``cache``; or None and why not.

    The venv sees this interpreter's packages (torch), so only TorchFT and its own dependencies
    are installed into it, from PyPI with pip.
    """
    venv = cache / f"torchft-{TORCHFT_VERSION}"
    python = venv / "bin" / "python"
    probe = [str(python), "-c", "import torchft, torchft.coordination; print(torchft.__file__)"]
    if python.exists() and subprocess.run(probe, capture_output=True).returncode == 0:
        return str(python), "ready"
    try:
        subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True,
                       capture_output=True, timeout=120)
        install = subprocess.run([str(python), "-m", "pip", "install", "-q", f"torchft=={TORCHFT_VERSION}"],
                                 capture_output=True, text=True, timeout=600)
    except (OSError, subprocess.SubprocessError) as error:
        return None, f"could not make its venv in {venv}: {error}"
    if install.returncode != 0:
        return None, f"pip install torchft=={TORCHFT_VERSION} failed: {install.stderr.strip().splitlines()[-1:]}"
    probe_run = subprocess.run(probe, capture_output=True, text=True)
    if probe_run.returncode != 0:
        return None, f"torchft does not import: {probe_run.stderr.strip().splitlines()[-1:]}"
    return str(python), "installed"


def read_events(path: Path) -> list[dict]:
    """The complete JSON lines of a worker log (a last line still being written is left out)."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return []
    return [json.loads(line) for line in text.split("\n")[:-1] if line.strip()]


def _wait_for_port(port: int, timeout: float) -> None:
    try:
        wait_for_port(port, time.monotonic() + timeout)
    except RuntimeError as error:
        raise SystemFailed(f"{error} after {timeout:g}s") from error


@dataclass
class Run:
    """One system's 2-node job in ``workdir``; :meth:`stop` ends every process it started."""

    system: str
    workdir: Path
    etcd_endpoint: str
    step_seconds: float
    torchft_python: str | None = None
    timeout: float = 120.0
    run_id: str = field(default_factory=lambda: f"side-{uuid.uuid4().hex[:8]}")
    nodes: dict[int, subprocess.Popen] = field(default_factory=dict)
    retired: list[subprocess.Popen] = field(default_factory=list)
    frozen: dict[int, list[int]] = field(default_factory=dict)
    lighthouse: subprocess.Popen | None = None
    rejoin_timeout: float = REJOIN_S
    state_mb: int = 0
    """LIVE_BIG_MB of every worker: ~this many MiB of parameters + Adam state (0: the small model)."""
    start_sleep: float = 0.0
    """Seconds every worker but its node's first sleeps before its training starts (0: none)."""
    hsdp: bool = False
    """2 workers per node, one FSDP2 replica each (the module's docstring)."""

    @property
    def world(self) -> int:
        """The ranks of the whole job (both nodes)."""
        return 2 * self.nproc

    @property
    def nproc(self) -> int:
        return HSDP_SHARDS if self.hsdp else 1

    @property
    def live(self) -> bool:
        return self.system in ("live", "live+prewarm")

    def __post_init__(self) -> None:
        self.store_port = free_port()
        if self.system == "torchft":
            port = free_port()
            self.lighthouse_addr = f"http://127.0.0.1:{port}"
            argv = [str(Path(self.torchft_python).parent / "torchft_lighthouse"), "--min_replicas", "1",
                    "--bind", f"127.0.0.1:{port}", "--quorum_tick_ms", "100",
                    "--join_timeout_ms", str(LAST_CALL_S * 1000), "--heartbeat_timeout_ms", str(LEASE_TTL_S * 1000)]
            self.lighthouse = self._popen(argv, "lighthouse", clean_env())
            try:
                _wait_for_port(port, 30)
            except SystemFailed:
                self.stop()
                raise

    def log(self, node: int) -> Path:
        return self.workdir / f"node{node}.jsonl"

    def events_dir(self, node: int) -> Path:
        """Where the HSDP example's workers of ``node`` write their ``<pid>.jsonl``."""
        return self.workdir / f"node{node}"

    def _popen(self, argv: list[str], name: str, env: dict[str, str]) -> subprocess.Popen:
        with open(self.workdir / f"{name}.log", "ab") as out:
            return subprocess.Popen(argv, cwd=REPO, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                                    start_new_session=True)

    def _argv(self, node: int) -> tuple[list[str], dict[str, str]]:
        env = clean_env(PYTHONPATH=str(REPO), LIVE_LOG=str(self.log(node)), LIVE_STEPS="1000000",
                        LIVE_STEP_SLEEP=str(self.step_seconds), OMP_NUM_THREADS="1", LOGLEVEL="WARNING",
                        LIVE_BIG_MB=str(self.state_mb), LIVE_LATE_START_SLEEP=f"{self.start_sleep:g}",
                        LIVE_RESTART_SLEEP=f"{self.start_sleep:g}")
        common = ["--nproc-per-node", str(self.nproc), "--max-restarts", "1000", "--monitor-interval", "0.1"]
        if self.system == "torchft":
            env.update(REPLICA_GROUP_ID=str(node), TORCHFT_LIGHTHOUSE=self.lighthouse_addr)
            if self.hsdp:  # two workers restarted together: torch's workaround for pytorch/pytorch#135712
                env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
            return [self.torchft_python, "-m", "torch.distributed.run", "--standalone", "--nnodes", "1", *common,
                    str(HSDP_TORCHFT_WORKER if self.hsdp else TORCHFT_WORKER)], env
        env.update(CKPT_PATH=str(self.workdir / "checkpoint.pt"), CKPT_EVERY=str(CHECKPOINT_EVERY),
                   CKPT_DIR=str(self.workdir / "dcp"))
        ckpt_worker = HSDP_CKPT_WORKER if self.hsdp else CKPT_WORKER
        rendezvous = ["--nnodes", "1:2", "--rdzv-id", self.run_id, "--local-addr", "127.0.0.1", *common]
        if self.system == "torchrun":
            env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"  # torch's workaround for pytorch/pytorch#135712
            # Only node 0 hosts the store: on loopback both nodes match the endpoint's host, and a
            # second TCPStore server binds the same port (SO_REUSEPORT), splitting the job in two.
            conf = (f"last_call_timeout={LAST_CALL_S},keep_alive_interval=1,keep_alive_max_attempt={LEASE_TTL_S},"
                    f"is_host={'true' if node == 0 else 'false'}")
            return [sys.executable, "-m", "torch.distributed.run", "--rdzv-backend", "c10d", "--rdzv-endpoint",
                    f"127.0.0.1:{self.store_port}", "--rdzv-conf", conf, *rendezvous, str(ckpt_worker)], env
        conf = f"lease_ttl={LEASE_TTL_S},last_call_timeout={LAST_CALL_S}"
        head = [sys.executable, "-m", "elastic.run", "--rdzv-backend", "etcd", "--rdzv-endpoint", self.etcd_endpoint,
                *rendezvous]
        if self.system == "prewarm":
            return [*head, "--rdzv-conf", conf, "--prewarm", str(ckpt_worker)], env
        head += ["--rdzv-conf", f"{conf},rejoin_timeout={self.rejoin_timeout:g}"]
        env.update(LIVE_OPTIONS=json.dumps(LIVE_OPTIONS), LIVE_CHECK="0", LIVE_SLOT=f"node{node}")
        extra = LIVE_PREWARM if self.system == "live+prewarm" else ["--no-prewarm"]
        if self.hsdp:  # the node's shard-group store in the run's directory, as the e2e test does
            env["TMPDIR"] = str(self.workdir)
            return [*head, "--live-recovery", *extra, str(HSDP_LIVE_WORKER), "--steps", "1000000",
                    "--step-time", f"{self.step_seconds:g}", "--hidden", str(hsdp_hidden(self.state_mb)),
                    "--events", str(self.events_dir(node))], env
        return [*head, "--live-recovery", *extra, str(LIVE_WORKER)], env

    def start_node(self, node: int) -> None:
        argv, env = self._argv(node)
        if self.hsdp and self.live:
            self.events_dir(node).mkdir(exist_ok=True)
        self.nodes[node] = self._popen(argv, f"node{node}", env)
        if node == 0 and self.system == "torchrun":
            _wait_for_port(self.store_port, 30)

    def events(self, node: int) -> list[dict]:
        """The node's events in time order; for the HSDP example, the steps of its shard-0
        workers and every worker's other events."""
        if not (self.hsdp and self.live):
            return read_events(self.log(node))
        return hsdp_node_events([read_events(path) for path in self.events_dir(node).glob("*.jsonl")])

    def worker_pid(self, node: int) -> int | None:
        """The newest worker of ``node`` that still runs."""
        for event in reversed(self.events(node)):
            if event.get("ev") == "start" and _running(event["pid"]):
                return event["pid"]
        return None

    def check_running(self) -> None:
        for node, proc in self.nodes.items():
            if proc.poll() is not None:
                raise SystemFailed(f"{self.system}: node {node} exited {proc.returncode} (logs in {self.workdir})")

    def exited(self) -> dict[int, int]:
        """The nodes whose launcher has exited, with its exit code (a lost node started again is
        the new process)."""
        return {node: proc.returncode for node, proc in self.nodes.items() if proc.poll() is not None}

    def wait_for(self, what: str, predicate) -> None:
        deadline = time.monotonic() + self.timeout
        while not predicate():
            self.check_running()
            if time.monotonic() > deadline:
                raise SystemFailed(f"{self.system}: no {what} within {self.timeout:g}s (logs in {self.workdir})")
            time.sleep(0.01)

    def crash(self, node: int) -> float | None:
        """SIGKILL ``node``'s worker; the monotonic time, or None when no worker of it runs."""
        pid = self.worker_pid(node)
        if pid is None:
            return None
        at = time.monotonic()
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            return None
        return at

    def lose(self, node: int) -> float:
        """SIGKILL ``node``'s whole process tree (launcher and workers), then start it again."""
        proc = self.nodes.pop(node)
        at = time.monotonic()
        kill_tree(proc.pid)
        proc.wait(timeout=10)
        self.retired.append(proc)
        self.start_node(node)
        return at

    def terminate(self, node: int) -> float:
        """SIGTERM ``node``'s launcher alone (its workers get what the launcher does on SIGTERM),
        not started again; the monotonic time of the signal."""
        at = time.monotonic()
        os.kill(self.nodes[node].pid, signal.SIGTERM)
        return at

    def freeze(self, node: int) -> float:
        """SIGSTOP ``node``'s whole process tree (launcher, workers, helpers), as a machine that
        hangs, once every thread of it is stopped; the monotonic time of the first signal."""
        procs = process_tree(self.nodes[node].pid)
        at = time.monotonic()
        for proc in procs:
            try:
                freeze(proc.pid)
            except (ProcessLookupError, TimeoutError):
                pass  # it exited meanwhile, or one thread is in a host call: the others are stopped
        self.frozen[node] = [proc.pid for proc in procs]
        return at

    def thaw(self, node: int) -> float:
        """SIGCONT every process :meth:`freeze` stopped; the monotonic time."""
        at = time.monotonic()
        for pid in self.frozen.pop(node, []):
            try:
                thaw(pid)
            except ProcessLookupError:
                pass
        return at

    def kill_lighthouse(self) -> float:
        """SIGKILL TorchFT's lighthouse by PID (not started again: it has no replica); the
        monotonic time of the signal."""
        at = time.monotonic()
        os.kill(self.lighthouse.pid, signal.SIGKILL)
        self.lighthouse.wait(timeout=10)
        return at

    def stop(self) -> None:
        """SIGKILL every launcher tree, every worker the logs name, and the lighthouse (by PID)."""
        for node in list(self.frozen):
            self.thaw(node)
        for proc in [*self.nodes.values(), *self.retired, *([self.lighthouse] if self.lighthouse else [])]:
            if proc.poll() is None:
                kill_tree(proc.pid)
            proc.wait(timeout=10)
        for node in (0, 1):
            for event in self.events(node):  # every worker's start: only steps are filtered
                if event.get("ev") == "start" and _running(event["pid"]):
                    os.kill(event["pid"], signal.SIGKILL)


def _running(pid: int) -> bool:
    """Whether ``pid`` is one of this benchmark's workers, still running (not a reused PID)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            argv = cmdline.read()
        with open(f"/proc/{pid}/stat") as stat:
            state = stat.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z" and (b"live_train.py" in argv or b"ckpt_train.py" in argv or b"torchft_train.py" in argv
                             or b"elastic" in argv or b"hsdp" in argv)


def hsdp_node_events(workers: list[list[dict]]) -> list[dict]:
    """One node's events from its HSDP example workers' logs (one list per process): the steps of
    the workers holding shard 0 (one series per replica), every other event of all, by time."""
    merged = []
    for events in workers:
        start = next((e for e in events if e.get("ev") == "start"), None)
        keep_steps = start is not None and start.get("shard") == 0
        merged += [e for e in events if keep_steps or e.get("ev") != "step"]
    return sorted(merged, key=lambda e: e.get("t", 0.0))
