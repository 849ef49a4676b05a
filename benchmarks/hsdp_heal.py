"""An HSDP replica's heal from a live replica, shard by shard, beside a sharded checkpoint reload.

Run:  python benchmarks/hsdp_heal.py [--state-mb 100] [--repetitions 3] [--cases heal,reload] [--json FILE]

``heal``: ``elasticrun --live-recovery`` (pre-warmed, etcd: a server of
``elastic.testing.etcd_server``) on 2 nodes x 2 workers runs ``examples/train_hsdp_live.py``
with ``--hidden`` sized so one replica holds ~``--state-mb`` MB (10^6 bytes) of parameters and
AdamW moments (``live_systems.Run(hsdp=True, state_mb=N)``); at step 25 a worker of node 1 is
SIGKILLed, its replica breaks and is replaced, and each replacement receives its own shard from
the rank of the live replica holding the same shard index, the two shard indices at once. From
the workers' recovery records: per healing rank the bytes received and ``healed - formed``;
the heal's time is the slowest rank's.

``reload``: one replica (2 ranks, ``torchrun --standalone``, gloo) of the same model saves its
state once with ``torch.distributed.checkpoint`` to local disk, then loads it into a fresh
FSDP2 model and AdamW (``workers/hsdp_dcp_load.py``): per rank its state's bytes and the load's
seconds (``get_state_dict``, ``dcp.load``, ``set_state_dict``); the reload's time is the
slowest rank's. The files were just written, so they are read from the page cache: a lower
bound for a reload from disk.

Each repetition runs every case in turn; medians and ranges over them are printed, with the
machine's load average.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))  # support: the tests' helpers, not shipped
sys.path.insert(0, str(REPO / "benchmarks"))

from elastic.testing.agents import clean_env, kill_tree  # noqa: E402
from live_side import _start  # noqa: E402
from live_systems import Run, SystemFailed, hsdp_hidden  # noqa: E402

CASES = ("heal", "reload")
DCP_WORKER = REPO / "benchmarks" / "workers" / "hsdp_dcp_load.py"


def measure_heal(workdir: Path, endpoint: str, state_mb: int, timeout: float) -> dict:
    """One live heal of a broken replica: per rank bytes and seconds, and the slowest rank's.

    Raises:
        SystemFailed: the job did not train, or the replacements did not heal in ``timeout``.
    """
    run = Run("live+prewarm", workdir, endpoint, 0.0, timeout=timeout, hsdp=True, state_mb=state_mb)
    try:
        _start(run)
        fault_at = run.crash(1)
        if fault_at is None:
            raise SystemFailed("no worker of node 1 to crash")

        def receivers() -> list[dict]:
            return [e for e in run.events(1) if e.get("ev") == "recovery" and e.get("role") == "receiver"
                    and e["formed"] > fault_at]

        run.wait_for("both replacements' heals", lambda: len(receivers()) >= 2)
        heals = receivers()
        return {"ranks": len(heals), "bytes_per_rank": max(e["nbytes"] for e in heals),
                "bytes_total": sum(e["nbytes"] for e in heals),
                "heal_s": max(e["healed"] - e["formed"] for e in heals),
                "rank_heal_s": sorted(e["healed"] - e["formed"] for e in heals)}
    finally:
        run.stop()


def measure_reload(workdir: Path, state_mb: int, timeout: float) -> dict:
    """One replica's save (once) and reload with torch.distributed.checkpoint, on local disk.

    Raises:
        SystemFailed: the workers failed or did not finish in ``timeout``.
    """
    env = clean_env(PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", HSDP_HIDDEN=str(hsdp_hidden(state_mb)),
                    CKPT_DIR=str(workdir / "checkpoint"), RESULT_DIR=str(workdir), LOGLEVEL="WARNING")
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(DCP_WORKER)]
    proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        _, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired as expired:
        raise SystemFailed(f"the reload did not finish in {timeout:g}s") from expired
    finally:
        if proc.poll() is None:
            kill_tree(proc.pid)
            proc.wait(timeout=10)
    ranks = [json.loads(path.read_text()) for path in sorted(workdir.glob("rank*.json"))]
    if proc.returncode != 0 or len(ranks) != 2:
        raise SystemFailed(f"the reload exited {proc.returncode}: {err.strip().splitlines()[-1:]}")
    if not all(rank["same"] for rank in ranks):
        raise SystemFailed("the reloaded shards differ from the saved ones")
    return {"ranks": len(ranks), "bytes_per_rank": max(r["bytes"] for r in ranks),
            "bytes_total": sum(r["bytes"] for r in ranks), "disk_bytes": ranks[0]["disk_bytes"],
            "save_s": max(r["save_s"] for r in ranks), "heal_s": max(r["load_s"] for r in ranks),
            "rank_heal_s": sorted(r["load_s"] for r in ranks)}


def summary(runs: list[dict]) -> dict:
    """Per number: the median, min and max over the runs (lists are left out)."""
    out = {}
    for key, value in runs[0].items():
        if isinstance(value, (int, float)):
            values = sorted(run[key] for run in runs)
            out[key] = {"median": statistics.median(values), "min": values[0], "max": values[-1]}
    return out


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", default=",".join(CASES), help=f"any of {','.join(CASES)}")
    parser.add_argument("--state-mb", type=int, default=100,
                        help="MB (10^6 bytes) of parameters + AdamW state in one replica (default 100)")
    parser.add_argument("--repetitions", type=int, default=3, help="runs per case; medians are printed (default 3)")
    parser.add_argument("--timeout", type=float, default=180.0, help="seconds to wait for any one thing (default 180)")
    parser.add_argument("--json", help="also write the figures (and every run's) to this file")
    args = parser.parse_args(argv)
    args.cases = [case for case in args.cases.split(",") if case]
    if set(args.cases) - set(CASES):
        parser.error(f"unknown cases: {', '.join(sorted(set(args.cases) - set(CASES)))} (choose from {', '.join(CASES)})")
    if args.repetitions < 1 or args.state_mb < 1:
        parser.error("--repetitions and --state-mb must be at least 1")
    return args


def _interrupted(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _interrupted)
    from elastic.testing.etcd_server import EtcdServerOptions, start_etcd_server

    runs: dict[str, list[dict]] = {case: [] for case in args.cases}
    failed = 0
    load_before = os.getloadavg()
    workdir = Path(tempfile.mkdtemp(prefix="hsdp-heal-"))
    with ExitStack() as cleanup:
        if "heal" in args.cases:
            server = start_etcd_server(EtcdServerOptions())
            cleanup.callback(server.close)
        for repetition in range(args.repetitions):
            for case in args.cases:
                rundir = workdir / f"{case}-{repetition}"
                rundir.mkdir()
                try:
                    figures = (measure_heal(rundir, server.endpoints, args.state_mb, args.timeout) if case == "heal"
                               else measure_reload(rundir, args.state_mb, args.timeout))
                except SystemFailed as error:
                    failed += 1
                    print(f"  {case} FAILED: {error} (logs in {rundir})", file=sys.stderr, flush=True)
                    continue
                runs[case].append(figures)
                print(f"  {case}: {figures}", file=sys.stderr, flush=True)
                shutil.rmtree(rundir / "checkpoint", ignore_errors=True)
    print(f"load average (1/5/15 min) before {tuple(round(x, 2) for x in load_before)}, "
          f"after {tuple(round(x, 2) for x in os.getloadavg())} on {os.cpu_count()} CPUs; "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; hidden {hsdp_hidden(args.state_mb)}")
    print(f"{'case':<7} {'runs':>4} {'ranks':>5} {'bytes/rank':>22} {'seconds (slowest rank)':>24}")
    results = {}
    for case, case_runs in runs.items():
        if not case_runs:
            print(f"{case:<7} no run succeeded")
            continue
        results[case] = summary(case_runs)
        size, secs = results[case]["bytes_per_rank"], results[case]["heal_s"]
        size_cell = f"{size['median'] / 1e6:.1f} MB ({size['min'] / 1e6:.1f}-{size['max'] / 1e6:.1f})"
        secs_cell = f"{secs['median']:.3f} ({secs['min']:.3f}-{secs['max']:.3f})"
        print(f"{case:<7} {len(case_runs):>4} {case_runs[0]['ranks']:>5} {size_cell:>22} {secs_cell:>24}")
    if args.json:
        Path(args.json).write_text(json.dumps({"summary": results, "runs": runs, "load_before": load_before}, indent=2))
    if failed:
        print(f"{failed} run(s) failed; logs kept in {workdir}", file=sys.stderr)
    else:
        shutil.rmtree(workdir, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt as interrupted:
        print(f"interrupted ({interrupted or 'Ctrl-C'}); every process it started was stopped", file=sys.stderr)
        sys.exit(130)
