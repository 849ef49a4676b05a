"""``elastic-store``: run the built-in TCP store on its own.

    elastic-store --host 127.0.0.1 --port 29400 [--token-file FILE] [--log-level INFO] [--max-... N]

Prints ``elastic-store listening on HOST:PORT`` once it accepts clients, and serves until
SIGTERM or SIGINT, then exits 0. Bad flags or an unreadable token file print one line and
exit 2; an address that cannot be bound exits 1. The token file holds the shared secret
clients must present (surrounding whitespace is ignored); without it any client is accepted,
and a warning says so when the store listens off loopback.

The ``--max-*`` flags bound what clients can make the store hold (see
:class:`~backends.tcp.limits.StoreLimits` and :class:`~backends.kvstate.KVState`); a client
that passes one gets an error naming it.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from pathlib import Path
from typing import NoReturn, Sequence

from backends.endpoints import is_loopback_only
from backends.kvstate import (
    DEFAULT_HISTORY_BYTES, DEFAULT_MAX_KEY_BYTES, DEFAULT_MAX_LEASES, DEFAULT_MAX_LIVE_BYTES, DEFAULT_MAX_VALUE_BYTES,
    KEY_OVERHEAD_BYTES,
)
from backends.tcp.limits import StoreLimits
from backends.tcp.protocol import DEFAULT_PORT
from backends.tcp.server import start_server
from backends.untrusted import read_small_file

log = logging.getLogger(__name__)

__all__ = ["main"]

PROG = "elastic-store"

MAX_TOKEN_FILE_BYTES = 64 * 1024
"""Largest token file read (a token is a line; this refuses ``/dev/zero``)."""


class _Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line (no usage dump)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{PROG}: error: {message} (see {PROG} --help)\n")


class _UsageError(Exception):
    """A setting is unusable; the message is the one line to print."""


def _port(text: str) -> int:
    if not text.isdigit() or not 0 <= int(text) <= 65535:
        raise argparse.ArgumentTypeError(f"the port {text!r} must be a number from 0 to 65535 (0: any free port)")
    return int(text)


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be a positive whole number")
    return int(text)


_DEFAULTS = StoreLimits()
_STATE_LIMITS = (
    ("max_key_bytes", DEFAULT_MAX_KEY_BYTES, "longest key in bytes"),
    ("max_value_bytes", DEFAULT_MAX_VALUE_BYTES, "largest value in bytes"),
    ("max_history_bytes", DEFAULT_HISTORY_BYTES, "bytes of keys and values kept for watches that start in the past"),
    ("max_live_bytes", DEFAULT_MAX_LIVE_BYTES,
     f"bytes of live keys and values (each key also counts {KEY_OVERHEAD_BYTES})"),
    ("max_leases", DEFAULT_MAX_LEASES, "live leases"),
)
_SERVER_LIMITS = (
    ("max_header_bytes", _DEFAULTS.max_header_bytes, "largest request header in bytes"),
    ("max_connections", _DEFAULTS.max_connections, "connections served at once"),
    ("max_pending_connections", _DEFAULTS.max_pending_connections,
     "connections in the handshake at once (a new one evicts the oldest)"),
    ("max_watches_per_connection", _DEFAULTS.max_watches_per_connection, "live watches of one connection"),
    ("max_write_buffer_bytes", _DEFAULTS.max_write_buffer_bytes,
     "bytes queued for a slow client before it is dropped"),
)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog=PROG, description="Run the etcd-elastic TCP key-value store.")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=_port, default=DEFAULT_PORT, help=f"port to listen on (default {DEFAULT_PORT})")
    parser.add_argument("--token-file", "--token_file", dest="token_file", type=Path,
                        help="file holding the shared token clients must present")
    parser.add_argument("--log-level", "--log_level", dest="log_level", default="INFO",
                        choices=["DEBUG", "INFO", "WARNING", "ERROR"], help="logging level (default INFO)")
    for name, default, what in _STATE_LIMITS + _SERVER_LIMITS:
        flag = name.replace("_", "-")
        parser.add_argument(f"--{flag}", f"--{name}", dest=name, type=_positive, default=default,
                            metavar="N", help=f"{what} (default {default})")
    return parser


def read_token(path: Path | None) -> str | None:
    """The token in ``path`` (None without a path).

    Raises:
        _UsageError: the file cannot be read or holds only whitespace.
    """
    if path is None:
        return None
    try:
        token = read_small_file(path, max_bytes=MAX_TOKEN_FILE_BYTES).decode("utf-8").strip()
    except ValueError as error:  # UnicodeDecodeError included
        reason = "it is not UTF-8 text" if isinstance(error, UnicodeDecodeError) else str(error)
        raise _UsageError(f"cannot read the token file {str(path)[:200]!r}: {reason}") from None
    if not token:
        raise _UsageError(f"the token file {str(path)!r} is empty")
    return token


def main(argv: Sequence[str] | None = None) -> int:
    """Run the store until SIGTERM/SIGINT; returns the process exit code."""
    args = build_parser().parse_args(argv)
    try:
        token = read_token(args.token_file)
    except _UsageError as error:
        print(f"{PROG}: error: {error}", file=sys.stderr)
        return 2
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if token is None and not is_loopback_only(args.host):
        log.warning(
            "%s on %s has no --token-file: anyone who can reach port %s can read and rewrite every key "
            "(the rendezvous members and master address included). Pass --token-file, or listen on 127.0.0.1.",
            PROG, args.host, args.port)
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    try:
        limits = StoreLimits(**{name: getattr(args, name) for name, _, _ in _SERVER_LIMITS})
    except ValueError as error:
        print(f"{PROG}: error: {error}", file=sys.stderr)
        return 2
    try:
        handle = start_server(args.host, args.port, token, max_key_bytes=args.max_key_bytes,
                              max_value_bytes=args.max_value_bytes, history_bytes=args.max_history_bytes,
                              max_live_bytes=args.max_live_bytes, max_leases=args.max_leases, limits=limits)
    except OSError as error:
        print(f"{PROG}: error: cannot listen on {args.host}:{args.port}: {error}", file=sys.stderr)
        return 1
    print(f"{PROG} listening on {handle.endpoint}", flush=True)
    stop.wait()
    handle.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
