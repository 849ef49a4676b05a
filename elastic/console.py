"""What ``elasticrun`` prints on its console, and how: quiet by default, everything on request.

The default console shows one line per meaningful change (a world formed, a node lost, a
restart and its cause, waiting for nodes, the run's summary) and every warning; the rest of
the agent's INFO lines, and the JSON events, stay off it (the events go to ``--event-log``).
A line is meant for the default console when it is logged at INFO with ``extra=CONSOLE``::

    log.info("run %s: ...", run_id, extra=CONSOLE)

``-v``/``--verbose`` shows every INFO line; ``LOGLEVEL`` (as torchrun users set it) picks the
level: ``LOGLEVEL=INFO`` is ``-v``, ``DEBUG`` adds the JSON events, ``WARNING`` shows warnings
only. Both give time-stamped lines with the level, as before; the default console prints
``elasticrun: <line>`` (``elasticrun: warning: <line>`` for a warning), with UUID run ids cut
to their first 8 characters. Worker output never passes through here.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import sys
from dataclasses import dataclass
from typing import IO, Iterator, Mapping, MutableMapping

__all__ = ["CONSOLE", "ConsoleFilter", "ConsoleSetup", "QuietFormatter", "configure", "console_setup", "quiet_grpc",
           "short_ids"]

CONSOLE: Mapping[str, object] = {"console": True}
"""``extra=`` of a log record meant for the default console."""

VERBOSE_FORMAT = "[%(asctime)s] elasticrun %(levelname)s: %(message)s"
_UUID = re.compile(r"\b([0-9a-f]{8})-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b", re.IGNORECASE)
_LEVELS = {"CRITICAL": logging.CRITICAL, "FATAL": logging.CRITICAL, "ERROR": logging.ERROR, "WARN": logging.WARNING,
           "WARNING": logging.WARNING, "INFO": logging.INFO, "DEBUG": logging.DEBUG}


@dataclass(frozen=True)
class ConsoleSetup:
    """How the launcher's log lines reach the console.

    Attributes:
        level: the lowest level shown.
        quiet: INFO lines only when marked :data:`CONSOLE`, in the short form.
    """

    level: int
    quiet: bool


def console_setup(environ: Mapping[str, str], verbose: bool) -> ConsoleSetup:
    """The console for ``LOGLEVEL`` in ``environ`` and ``-v``: quiet unless either asks for more.

    ``LOGLEVEL`` wins when set to a level name (``-v`` cannot lower ``LOGLEVEL=DEBUG``, and with
    ``LOGLEVEL=WARNING`` a ``-v`` still shows INFO); an unknown name counts as unset.
    """
    named = _LEVELS.get(environ.get("LOGLEVEL", "").strip().upper())
    if named is not None:
        return ConsoleSetup(min(named, logging.INFO) if verbose else named, quiet=False)
    return ConsoleSetup(logging.INFO, quiet=not verbose)


def short_ids(text: str) -> str:
    """``text`` with every UUID cut to its first 8 hex digits (a standalone run id, say)."""
    return _UUID.sub(r"\1", text)


class ConsoleFilter(logging.Filter):
    """Lets WARNING and above through, and INFO records marked :data:`CONSOLE`."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.WARNING or bool(getattr(record, "console", False))


class QuietFormatter(logging.Formatter):
    """``elasticrun: <message>``, ``elasticrun: warning: <message>`` (error, critical), UUIDs cut short.

    A record's traceback (``exc_info``) is kept: a bug still shows where it happened.
    """

    def format(self, record: logging.LogRecord) -> str:
        level = "" if record.levelno < logging.WARNING else f"{record.levelname.lower()}: "
        text = f"elasticrun: {level}{short_ids(record.getMessage())}"
        if record.exc_info:
            text += "\n" + self.formatException(record.exc_info)
        return text


def configure(setup: ConsoleSetup, stream: IO[str] | None = None) -> logging.Handler:
    """Send the root logger's records to ``stream`` (default ``sys.stderr``) as ``setup`` says.

    Replaces handlers an earlier call installed, so a second call (a test, say) does not print
    every line twice. Returns the handler.
    """
    root = logging.getLogger()
    for handler in [h for h in root.handlers if getattr(h, "_elasticrun_console", False)]:
        root.removeHandler(handler)
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler._elasticrun_console = True  # type: ignore[attr-defined]
    if setup.quiet:
        handler.addFilter(ConsoleFilter())
        handler.setFormatter(QuietFormatter())
    else:
        handler.setFormatter(logging.Formatter(VERBOSE_FORMAT))
    root.addHandler(handler)
    root.setLevel(setup.level)
    return handler


@contextlib.contextmanager
def quiet_grpc(setup: ConsoleSetup, environ: MutableMapping[str, str] | None = None) -> Iterator[None]:
    """On the default console, ``GRPC_VERBOSITY=ERROR`` while gRPC starts (within the block).

    gRPC's core logs every failed TLS handshake at INFO straight to stderr (``I1126 ...
    ssl_transport_security.cc ...``), beside the one line that says what to do. It reads the
    variable once, when it starts, so it is set only meanwhile: the workers inherit the
    environment as the user gave it. A ``GRPC_VERBOSITY`` the user set is left alone.
    """
    environ = os.environ if environ is None else environ
    if not setup.quiet or "GRPC_VERBOSITY" in environ:
        yield
        return
    environ["GRPC_VERBOSITY"] = "ERROR"
    try:
        yield
    finally:
        environ.pop("GRPC_VERBOSITY", None)
