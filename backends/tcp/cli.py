"""``elastic-store``: run the built-in TCP store on its own.

    elastic-store --host 127.0.0.1 --port 29400 [--token-file FILE] [--log-level INFO]

Prints ``elastic-store listening on HOST:PORT`` once it accepts clients, and serves until
SIGTERM or SIGINT, then exits 0. Bad flags or an unreadable token file print one line and
exit 2; an address that cannot be bound exits 1. The token file holds the shared secret
clients must present (surrounding whitespace is ignored); without it any client is accepted,
and a warning says so when the store listens off loopback.
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
from backends.tcp.protocol import DEFAULT_PORT
from backends.tcp.server import start_server

__all__ = ["main"]

PROG = "elastic-store"


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


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog=PROG, description="Run the etcd-elastic TCP key-value store.")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=_port, default=DEFAULT_PORT, help=f"port to listen on (default {DEFAULT_PORT})")
    parser.add_argument("--token-file", "--token_file", dest="token_file", type=Path,
                        help="file holding the shared token clients must present")
    parser.add_argument("--log-level", "--log_level", dest="log_level", default="INFO",
                        choices=["DEBUG", "INFO", "WARNING", "ERROR"], help="logging level (default INFO)")
    return parser


def read_token(path: Path | None) -> str | None:
    """The token in ``path`` (None without a path).

    Raises:
        _UsageError: the file cannot be read or holds only whitespace.
    """
    if path is None:
        return None
    try:
        token = path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as error:
        raise _UsageError(f"cannot read the token file {str(path)!r}: {error}") from error
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
        logging.getLogger(__name__).warning(
            "%s on %s has no --token-file: anyone who can reach port %s can read and rewrite every key "
            "(the rendezvous members and master address included). Pass --token-file, or listen on 127.0.0.1.",
            PROG, args.host, args.port)
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    try:
        handle = start_server(args.host, args.port, token)
    except OSError as error:
        print(f"{PROG}: error: cannot listen on {args.host}:{args.port}: {error}", file=sys.stderr)
        return 1
    print(f"{PROG} listening on {handle.endpoint}", flush=True)
    stop.wait()
    handle.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
