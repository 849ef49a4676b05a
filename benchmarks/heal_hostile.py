"""What a hostile heal source costs a receiver, and what a real heal takes.

Run:  python benchmarks/heal_hostile.py [--cases overlap,long_shape,chunk_1e15,chunk_1e30,many_chunks,legit]
                                        [--state-mb 100] [--code DIR]

Each case runs ``tests/security/heal_peer.py`` twice on loopback (rank 0 sends, rank 1 receives
through :func:`elastic.worker.transfer.receive_state` over a real gloo pair), importing the
package from ``--code`` (a checkout, default this one, so an older commit can be measured the
same way), and prints the receiver's outcome, seconds, RSS growth (peak) and the longest a
1 ms ticker thread (as the round watcher) waited for the GIL:

  overlap      an 8 KB header: 250 tensors over the same 4 MiB chunk (each a separate clone)
  long_shape   a 1.2 MB header: one shape of 600,000 dimensions
  chunk_1e15   a chunk of 10^15 float32 elements announced (none sent)
  chunk_1e30   a chunk of 10^30 elements announced
  many_chunks  a 16 MiB header of 1,000,000 empty chunks
  legit        a real ~--state-mb MiB state (encode_state of large and small tensors), --rounds
               heals over one pair: each, their median and minimum
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(HERE))

from elastic.testing.ports import free_port  # noqa: E402

PEER = HERE / "tests" / "security" / "heal_peer.py"
CASES = ("overlap", "long_shape", "chunk_1e15", "chunk_1e30", "many_chunks", "legit")


def run_case(case: str, code: Path, state_mb: int, *, rounds: int = 5, max_state_bytes: int | None = None,
             timeout: float = 300) -> list[dict]:
    """The receiver's JSON lines for ``case``; both peers are stopped (by PID) before returning."""
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(code), "OMP_NUM_THREADS": "1"}
    args = ["--state-mb", str(state_mb), "--rounds", str(rounds)]
    if max_state_bytes is not None:
        args += ["--max-state-bytes", str(max_state_bytes)]
    peers = [subprocess.Popen([sys.executable, str(PEER), case, str(rank), str(port), *args], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for rank in (0, 1)]
    try:
        out, err = peers[1].communicate(timeout=timeout)
    finally:
        for peer in peers:
            if peer.poll() is None:
                peer.kill()
            peer.wait()
    lines = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    if not lines:
        raise RuntimeError(f"{case}: the receiver printed nothing (rc {peers[1].returncode}): {err[-2000:]}")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--state-mb", type=int, default=100)
    parser.add_argument("--code", type=Path, default=HERE)
    parser.add_argument("--rounds", type=int, default=5, help="heals of the legit state (median and min shown)")
    args = parser.parse_args()
    cases = args.cases.split(",")
    unknown = set(cases) - set(CASES)
    if unknown:
        parser.error(f"unknown cases {sorted(unknown)}; choose from {','.join(CASES)}")
    print(f"code: {args.code}; load average {os.getloadavg()[0]:.1f}")
    for case in cases:
        lines = run_case(case, args.code, args.state_mb, rounds=args.rounds)
        for line in lines:
            print(f"{case:12} {line['outcome']:20} {line['seconds']:8.3f} s  rss +{line['rss_peak_mib']:7.1f} MiB  "
                  f"ticker waited {line['gil_stall_s']:.3f} s  {line['nbytes'] / (1 << 20):7.1f} MiB  {line['error'][:120]}")
        if case == "legit":
            seconds = [line["seconds"] for line in lines]
            print(f"{case:12} median of {len(lines)}: {statistics.median(seconds):.3f} s, min {min(seconds):.3f} s")


if __name__ == "__main__":
    main()
