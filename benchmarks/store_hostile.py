"""What an authenticated peer and a flood of bad connections cost the built-in TCP store.

Run:  python benchmarks/store_hostile.py [--seconds 30] [--code DIR] [--only grants,heap,keys,flood,stall]

Each scenario starts ``elastic-store`` (``python -m backends.tcp.cli``, from ``--code``: a
checkout, default this one, so an older commit can be measured the same way) on loopback
with a token and prints the server's resident memory (VmRSS) before and after:

  grants   one authenticated client grants 3600 s leases as fast as it can for --seconds
  heap     a 3600 s lease nobody renews sits at the top of the expiry heap while another
           client renews a 7200 s lease as fast as it can for --seconds
  keys     one client writes 150 distinct keys of 1 MiB each
  flood    four threads open connections that send garbage before the handshake, for
           --seconds; the store's stderr is read: its line and byte counts
  stall    the same flood for --seconds with the store's stderr a pipe nobody reads, while a
           well-behaved client puts a key every 50 ms: its latencies and timeouts
"""

from __future__ import annotations

import argparse
import os
import secrets
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]
MiB = 1024 * 1024


class Store:
    """``elastic-store`` in a process of its own; ``stderr`` is read by a thread unless ``unread``."""

    def __init__(self, code: Path, token_file: Path, *, unread: bool = False) -> None:
        env = {**os.environ, "PYTHONPATH": str(code)}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "backends.tcp.cli", "--host", "127.0.0.1", "--port", "0", "--token-file",
             str(token_file), "--log-level", "INFO"],
            cwd=code, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        line = self.proc.stdout.readline().decode()
        if "listening on" not in line:
            raise SystemExit(f"elastic-store did not start: {line!r}")
        self.port = int(line.rsplit(":", 1)[1])
        self.lines = self.bytes = 0
        if not unread:
            threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stderr:
            self.lines += 1
            self.bytes += len(line)

    def rss(self) -> int:
        with open(f"/proc/{self.proc.pid}/status") as status:
            return next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmRSS:"))

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()


def client(store: Store, token: str, timeout: float = 10.0):
    from backends.tcp.client import TcpStoreBackend
    from backends.tcp.config import TcpStoreConfig

    return TcpStoreBackend(TcpStoreConfig(f"127.0.0.1:{store.port}", token=token, request_timeout=timeout)).connect()


def until(seconds: float, step) -> tuple[int, int]:
    """Call ``step()`` until ``seconds`` pass; (calls that returned, calls that raised)."""
    ok = refused = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            step()
            ok += 1
        except Exception:  # noqa: BLE001 - a refusal is what is being counted
            refused += 1
    return ok, refused


def grants(store: Store, token: str, seconds: float) -> str:
    with client(store, token) as peer:
        before = store.rss()
        ok, refused = until(seconds, lambda: peer.grant(3600))
        return f"grants: {ok} granted, {refused} refused; RSS {before / MiB:.0f} -> {store.rss() / MiB:.0f} MiB"


def heap(store: Store, token: str, seconds: float) -> str:
    with client(store, token) as peer:
        peer.grant(3600)  # never renewed: the top of the expiry heap for an hour
        renewed = peer.grant(7200).id
        before = store.rss()
        ok, refused = until(seconds, lambda: peer.keepalive(renewed))
        return f"heap: {ok} renewals ({refused} failed); RSS {before / MiB:.0f} -> {store.rss() / MiB:.0f} MiB"


def keys(store: Store, token: str, seconds: float) -> str:
    with client(store, token, timeout=30) as peer:
        before = store.rss()
        ok = refused = 0
        for index in range(150):
            try:
                peer.put(f"/big/{index}", bytes([index % 256]) * MiB)
                ok += 1
            except Exception:  # noqa: BLE001 - the refusals are the point
                refused += 1
        return f"keys: {ok} stored, {refused} refused; RSS {before / MiB:.0f} -> {store.rss() / MiB:.0f} MiB"


def _flood(port: int, stop: threading.Event) -> None:
    while not stop.is_set():
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=2) as sock:
                sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        except OSError:
            time.sleep(0.001)


def flood(store: Store, token: str, seconds: float) -> str:
    stop = threading.Event()
    threads = [threading.Thread(target=_flood, args=(store.port, stop), daemon=True) for _ in range(4)]
    before = store.rss()
    for thread in threads:
        thread.start()
    time.sleep(seconds)
    stop.set()
    for thread in threads:
        thread.join()
    time.sleep(1.0)
    return (f"flood: {store.lines} log lines, {store.bytes / MiB:.1f} MiB of log in {seconds:g}s; "
            f"RSS {before / MiB:.0f} -> {store.rss() / MiB:.0f} MiB")


def stall(store: Store, token: str, seconds: float) -> str:
    stop = threading.Event()
    threads = [threading.Thread(target=_flood, args=(store.port, stop), daemon=True) for _ in range(4)]
    for thread in threads:
        thread.start()
    latencies, timeouts = [], 0
    try:
        with client(store, token, timeout=2.0) as good:
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                started = time.monotonic()
                try:
                    good.put("/good", b"1")
                    latencies.append(time.monotonic() - started)
                except Exception:  # noqa: BLE001 - a timeout is what is being counted
                    timeouts += 1
                time.sleep(0.05)
    finally:
        stop.set()
        for thread in threads:
            thread.join()
    latencies.sort()
    p50 = latencies[len(latencies) // 2] * 1000 if latencies else float("nan")
    worst = latencies[-1] * 1000 if latencies else float("nan")
    return f"stall: {len(latencies)} puts, p50 {p50:.1f} ms, max {worst:.1f} ms, {timeouts} failed (stderr unread)"


SCENARIOS = {"grants": grants, "heap": heap, "keys": keys, "flood": flood, "stall": stall}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--code", type=Path, default=HERE, help="checkout whose elastic-store is measured")
    parser.add_argument("--only", default=",".join(SCENARIOS))
    args = parser.parse_args()
    sys.path.insert(0, str(HERE))  # the client is always this checkout's
    token = secrets.token_hex(16)
    with tempfile.TemporaryDirectory() as tmp:
        token_file = Path(tmp) / "token"
        token_file.write_text(token)
        for name in args.only.split(","):
            store = Store(args.code, token_file, unread=name == "stall")
            try:
                print(SCENARIOS[name](store, token, args.seconds), flush=True)
            finally:
                store.stop()


if __name__ == "__main__":
    main()
