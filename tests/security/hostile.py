"""Helpers of the security tests: a hostile peer's raw sockets and an ``elastic-store`` process
whose resident memory the tests read. Everything talks to loopback only and stops what it starts."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

from backends.tcp.protocol import MAGIC, PROTOCOL_VERSION, FrameDecoder, encode_frame

REPO = Path(__file__).resolve().parents[2]
NESTED = b"[" * 50_000 + b"]" * 50_000
"""JSON nested far deeper than any decoder's recursion limit (the review's reproducer)."""


def raw_socket(port: int, *, timeout: float = 5.0) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=timeout)


def handshake(port: int, token: str | None = None, **fields: object) -> socket.socket:
    """A raw socket past the store's handshake (fails the test if the store refuses it)."""
    sock = raw_socket(port)
    sock.sendall(MAGIC + encode_frame({"v": PROTOCOL_VERSION, "token": token, **fields}))
    assert sock.recv(len(MAGIC), socket.MSG_WAITALL) == MAGIC
    decoder = FrameDecoder()
    frames = []
    while not frames:
        chunk = sock.recv(65536)
        assert chunk, "the store closed the connection during the handshake"
        frames = decoder.feed(chunk)
    assert "err" not in frames[0].header, frames[0].header
    return sock


def read_frames(sock: socket.socket, *, timeout: float = 5.0) -> list:
    """Every frame the peer sends until it closes the connection (or ``timeout`` passes)."""
    sock.settimeout(timeout)
    decoder = FrameDecoder()
    frames = []
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except (ConnectionResetError, TimeoutError):
        pass
    if data.startswith(MAGIC):
        data = data[len(MAGIC):]
    frames.extend(decoder.feed(data))
    return frames


def closed_by_peer(sock: socket.socket, timeout: float = 5.0) -> bool:
    """Whether the peer closes ``sock`` within ``timeout`` seconds (reading and dropping data)."""
    sock.settimeout(timeout)
    try:
        while sock.recv(65536):
            pass
        return True
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False
    finally:
        sock.close()


class StoreProcess:
    """``elastic-store`` in its own process on a free loopback port, so its RSS can be measured."""

    def __init__(self, *flags: str, token_file: Path | None = None) -> None:
        args = [sys.executable, "-m", "backends.tcp.cli", "--host", "127.0.0.1", "--port", "0",
                "--log-level", "WARNING", *flags]
        if token_file is not None:
            args += ["--token-file", str(token_file)]
        self.proc = subprocess.Popen(args, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()  # type: ignore[union-attr]
        if "listening on" not in line:
            self.stop()
            raise AssertionError(f"elastic-store did not start: {line!r} {self.stderr()!r}")
        self.port = int(line.rsplit(":", 1)[1])

    def rss_bytes(self) -> int:
        with open(f"/proc/{self.proc.pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        raise AssertionError("no VmRSS")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)

    def stderr(self) -> str:
        self.stop()
        return self.proc.stderr.read() if self.proc.stderr else ""  # type: ignore[union-attr]

    def __enter__(self) -> "StoreProcess":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()

