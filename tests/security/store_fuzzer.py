"""A bounded, seeded fuzzer of the built-in store's wire protocol (run by test_store_fuzz.py).

    python store_fuzzer.py PORT TOKEN SEED SECONDS [THREADS]

For SECONDS, THREADS threads each open connection after connection to the store on loopback
and send what a hostile or broken peer could: random bytes, a wrong or truncated magic, random
and truncated and oversized frames, frames whose header length lies, headers that are not JSON
objects or are deeply nested, hellos with every field of the wrong type; and, on half the
connections, the same after a correct handshake, plus requests of every op with random field
values and payloads. It reads what comes back without waiting long, and prints one JSON line:
connections, frames sent, replies by error code (``internal`` would be a bug in the store) and
the seed (a failure replays with it).
"""

from __future__ import annotations

import collections
import json
import random
import socket
import struct
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from backends.tcp.protocol import MAGIC, PROTOCOL_VERSION, FrameDecoder  # noqa: E402

OPS = ["get", "range", "put", "txn", "del", "del_prefix", "grant", "keepalive", "revoke", "compact", "watch",
       "unwatch"]
FIELDS = ["i", "op", "k", "p", "l", "ttl", "lease", "t", "w", "s", "r", "v", "token", "max_frame"]
_PREFIX = struct.Struct("!II")


def random_value(rng: random.Random, depth: int = 0):
    kind = rng.randrange(9 if depth < 4 else 6)
    if kind == 0:
        return rng.choice([0, 1, -1, 2 ** 31, 2 ** 63, -(2 ** 63), 2 ** 64 + 1, 10 ** 30, rng.randrange(-1000, 1000)])
    if kind == 1:
        return rng.choice([0.0, -1.5, 1e308, 1e-300, float("inf"), float("nan"), rng.random() * 100])
    if kind == 2:
        return "".join(rng.choice("/ab\x00\u00e9\u4e2d\ud800k") for _ in range(rng.randrange(0, 40)))
    if kind == 3:
        return rng.choice([True, False, None])
    if kind == 4:
        return "/" + "k" * rng.choice([1, 100, 9000])
    if kind == 5:
        return rng.randrange(1, 50)
    if kind == 6:
        return [random_value(rng, depth + 1) for _ in range(rng.randrange(0, 5))]
    if kind == 7:
        return {rng.choice(FIELDS + ["s", "f", "c"]): random_value(rng, depth + 1) for _ in range(rng.randrange(0, 4))}
    return [["p", "/k", 0, 1], ["r", "/", True, False], ["d", "/", True], ["t", {"s": []}]][: rng.randrange(0, 5)]


def random_header(rng: random.Random, request_id: int) -> dict:
    header = {"i": request_id if rng.random() < 0.9 else random_value(rng),
              "op": rng.choice(OPS) if rng.random() < 0.9 else random_value(rng)}
    for _ in range(rng.randrange(0, 5)):
        header[rng.choice(FIELDS)] = random_value(rng)
    return header


def plausible_header(rng: random.Random, request_id: int) -> dict:
    """A request of a real op with fields of the right types but edge values (so state changes)."""
    key = "/fz/" + "k" * rng.choice([1, 10, 200, 8200]) + str(rng.randrange(100))
    lease = rng.choice([0, rng.randrange(1, 2 ** 63), -1, 2 ** 63 - 1])
    op = rng.choice(OPS)
    fields = {
        "get": {"k": key}, "range": {"p": rng.choice(["/fz/", "/", ""])}, "put": {"k": key, "l": lease},
        "del": {"k": key}, "del_prefix": {"p": rng.choice(["/fz/", "/fz/k"])},
        "grant": {"ttl": rng.choice([0.001, 1, 3600, 1e9, 0, -1])}, "keepalive": {"lease": lease},
        "revoke": {"lease": lease}, "compact": {"r": rng.choice([0, 1, 2 ** 40, rng.randrange(1, 500)])},
        "watch": {"p": rng.choice(["/fz/", "/"]), "s": rng.choice([None, 0, 1, 2 ** 40, rng.randrange(1, 500)])},
        "unwatch": {"w": rng.randrange(0, 30)},
        "txn": {"t": {"c": [[key, rng.choice(["c", "m", "v"]), rng.choice(["==", "<", ">", "!="]), 0]],
                      "s": [["p", key, 0, 4], ["r", "/fz/", True, rng.random() < 0.5]],
                      "f": [["d", "/fz/", True]]}},
    }[op]
    return {"i": request_id, "op": op, **{k: v for k, v in fields.items() if v is not None}}


def frame(header_bytes: bytes, payload: bytes = b"") -> bytes:
    return _PREFIX.pack(4 + len(header_bytes) + len(payload), len(header_bytes)) + header_bytes + payload


def encode(value) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


def hostile_frame(rng: random.Random, request_id: int) -> tuple[str, bytes]:
    """One mutation: (its name, the bytes to send)."""
    kind = rng.randrange(12)
    payload = rng.randbytes(rng.choice([0, 1, 10, 1000, 4000]))
    if kind <= 1:
        return "request", frame(encode(random_header(rng, request_id)), payload)
    if kind <= 5:
        header = plausible_header(rng, request_id)
        return "plausible", frame(encode(header), payload if header["op"] != "txn" else b"abcd")
    if kind == 6:
        return "random-bytes", rng.randbytes(rng.randrange(1, 3000))
    if kind == 7:
        whole = frame(encode(random_header(rng, request_id)), payload)
        return "truncated", whole[: rng.randrange(1, len(whole))]
    if kind == 8:
        return "oversized", struct.pack("!II", rng.choice([2 ** 32 - 1, 2 ** 27, 2 ** 24 + 5]), 16) + payload[:100]
    if kind == 9:
        head = encode(random_header(rng, request_id))
        return "lying-lengths", struct.pack("!II", rng.randrange(0, 8), len(head) + rng.randrange(1, 100)) + head
    if kind == 10:
        return "not-an-object", frame(rng.choice([b"[1,2]", b"null", b"\"x\"", b"{", b"\xff\xfe", b"{\"op\":NaN}"]))
    depth = rng.choice([10, 100, 3000])
    return "nested", frame(b'{"op":"get","i":1,"k":' + b"[" * depth + b"]" * depth + b"}")


def hostile_hello(rng: random.Random, token: str) -> bytes:
    fields = {"v": rng.choice([PROTOCOL_VERSION, 1, 3, "2", None, 2.0]),
              "token": rng.choice([token, token + "x", "", None, 5, [token]]),
              "max_frame": random_value(rng)}
    for name in list(fields):
        if rng.random() < 0.2:
            del fields[name]
    return frame(encode(fields))


class Tally:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.counts: collections.Counter = collections.Counter()
        self.internal: list[str] = []

    def add(self, name: str, amount: int = 1) -> None:
        with self.lock:
            self.counts[name] += amount


def drain(sock: socket.socket, tally: Tally, wait: float) -> None:
    """Read what the store sends within ``wait`` seconds in all; tally error codes."""
    decoder = FrameDecoder(1 << 26)
    data = b""
    deadline = time.monotonic() + wait
    try:
        while (remaining := deadline - time.monotonic()) > 0 and len(data) < 8 << 20:
            sock.settimeout(remaining)
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
    except OSError:
        pass
    if data.startswith(MAGIC):
        data = data[len(MAGIC):]
    try:
        frames = decoder.feed(data)
    except Exception:  # noqa: BLE001 - a truncated tail after we stopped reading
        frames = []
    for reply in frames:
        code = reply.header.get("err")
        tally.add(f"reply:{code or 'ok'}")
        if code == "internal":
            with tally.lock:
                tally.internal.append(str(reply.header.get("msg"))[:300])


def one_connection(port: int, token: str, rng: random.Random, tally: Tally) -> None:
    try:
        sock = socket.create_connection(("127.0.0.1", port), timeout=2)
    except OSError:
        tally.add("connect-failed")
        return
    with sock:
        tally.add("connections")
        try:
            authenticated = rng.random() < 0.5
            if authenticated:
                sock.sendall(MAGIC + frame(encode({"v": PROTOCOL_VERSION, "token": token})))
                tally.add("authenticated")
            else:
                opening = rng.randrange(4)
                if opening == 0:
                    sock.sendall(MAGIC[: rng.randrange(0, len(MAGIC))] + rng.randbytes(rng.randrange(0, 200)))
                    tally.add("pre-auth:bad-magic")
                    drain(sock, tally, 0.02)
                    return
                sock.sendall(MAGIC + (hostile_hello(rng, token) if opening == 1 else b""))
                tally.add("pre-auth:hello" if opening == 1 else "pre-auth:frames")
            for request_id in range(1, rng.randrange(2, 20)):
                name, data = hostile_frame(rng, request_id)
                sock.sendall(data)
                tally.add(f"{'post' if authenticated else 'pre'}-auth:{name}")
                if name in ("truncated", "oversized", "random-bytes") and rng.random() < 0.5:
                    break
        except OSError:
            tally.add("dropped-by-store")
        drain(sock, tally, 0.05)


def main() -> None:
    port, token, seed, seconds = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
    threads = int(sys.argv[5]) if len(sys.argv) > 5 else 3
    tally = Tally()
    end = time.monotonic() + seconds

    def run(index: int) -> None:
        rng = random.Random(seed * 1000 + index)
        while time.monotonic() < end:
            one_connection(port, token, rng, tally)

    workers = [threading.Thread(target=run, args=(index,)) for index in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    print(json.dumps({"seed": seed, "counts": dict(tally.counts), "internal": tally.internal[:20]}), flush=True)


if __name__ == "__main__":
    main()
