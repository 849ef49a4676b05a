"""A bounded fuzz of the built-in store's protocol, before and after authentication, while a
well-behaved client keeps working (round three's re-run of the review's fuzz).

``elastic-store`` runs in its own process with small data bounds (8 MiB live, 8 MiB history),
the fuzzer (:mod:`store_fuzzer`) in another, for a fixed time with a fixed seed; meanwhile this
test writes and reads a key every 20 ms on its own connection and samples the store's VmRSS.
The store must stay up, answer no request with an internal error (a bug), keep its memory
within its bounds, and keep the good client's requests fast. The figures are printed
(``pytest -s``) for the report.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from backends.tcp.client import TcpStoreBackend
from backends.tcp.config import TcpStoreConfig
from hostile import REPO, StoreProcess

MiB = 1024 * 1024
FUZZ_SECONDS = float(os.environ.get("STORE_FUZZ_SECONDS", "15"))
SEED = int(os.environ.get("STORE_FUZZ_SEED", "20261126"))
FUZZER = Path(__file__).with_name("store_fuzzer.py")


@pytest.mark.slow
def test_the_store_survives_a_bounded_protocol_fuzz_and_keeps_serving_a_good_client(tmp_path):
    token = secrets.token_hex(16)
    token_file = tmp_path / "token"
    token_file.write_text(token)
    with StoreProcess("--max-live-bytes", str(8 * MiB), "--max-history-bytes", str(8 * MiB),
                      token_file=token_file) as store:
        config = TcpStoreConfig(f"127.0.0.1:{store.port}", token=token, request_timeout=5.0)
        rss = [store.rss_bytes()]
        latencies: list[float] = []
        failures: list[str] = []
        fuzzer = subprocess.Popen([sys.executable, str(FUZZER), str(store.port), token, str(SEED), str(FUZZ_SECONDS)],
                                  cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        sampling = threading.Event()

        def sample() -> None:
            while not sampling.wait(0.5):
                rss.append(store.rss_bytes())

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        try:
            with TcpStoreBackend(config).connect() as good:
                step = 0
                while fuzzer.poll() is None:
                    started = time.monotonic()
                    try:
                        good.put("/good/key", str(step).encode())
                        assert good.get("/good/key").kv.value == str(step).encode()
                        latencies.append(time.monotonic() - started)
                    except Exception as error:  # noqa: BLE001 - every failure is reported below
                        failures.append(f"{type(error).__name__}: {error}")
                    step += 1
                    time.sleep(0.02)
            out, err = fuzzer.communicate(timeout=FUZZ_SECONDS + 60)
        finally:
            sampling.set()
            sampler.join()
            if fuzzer.poll() is None:
                fuzzer.kill()
                fuzzer.wait()
        alive = store.alive()
        log = store.stderr()
    assert fuzzer.returncode == 0, err[-3000:]
    summary = json.loads(out)
    latencies.sort()
    figures = {
        "seed": SEED, "seconds": FUZZ_SECONDS, "connections": summary["counts"].get("connections", 0),
        "frames": sum(v for k, v in summary["counts"].items() if k.startswith(("pre-auth:", "post-auth:"))),
        "rss_mib": [round(rss[0] / MiB, 1), round(max(rss) / MiB, 1)],
        "good_requests": len(latencies),
        "good_p50_ms": round(latencies[len(latencies) // 2] * 1000, 2) if latencies else None,
        "good_p99_ms": round(latencies[int(len(latencies) * 0.99)] * 1000, 2) if latencies else None,
        "good_max_ms": round(latencies[-1] * 1000, 2) if latencies else None,
        "replies": {k: v for k, v in summary["counts"].items() if k.startswith("reply:")},
        "log_lines": len(log.splitlines()),
    }
    print(f"\nstore fuzz figures: {json.dumps(figures)}")
    assert alive, log[-3000:]
    assert summary["internal"] == [], summary["internal"]
    assert "Traceback" not in log and "failed" not in log, log[-3000:]
    assert failures == [], failures[:5]
    assert figures["connections"] > 100 and figures["frames"] > 1000, figures
    assert max(rss) - rss[0] < 48 * MiB, figures
    assert latencies[-1] < 2.0, figures
