"""The launcher's console: which lines the default shows, -v and LOGLEVEL, and their form."""

from __future__ import annotations

import io
import logging

import pytest

from elastic.console import CONSOLE, ConsoleSetup, configure, console_setup, quiet_grpc, short_ids

RUN = "44d0b54c-e7d8-4638-9fd9-81d1062f187a"


@pytest.mark.parametrize(("loglevel", "verbose", "expected"), [
    (None, False, ConsoleSetup(logging.INFO, quiet=True)),  # the default: meaningful lines and warnings
    (None, True, ConsoleSetup(logging.INFO, quiet=False)),
    ("INFO", False, ConsoleSetup(logging.INFO, quiet=False)),  # what torchrun users set
    ("info", False, ConsoleSetup(logging.INFO, quiet=False)),
    ("DEBUG", False, ConsoleSetup(logging.DEBUG, quiet=False)),
    ("DEBUG", True, ConsoleSetup(logging.DEBUG, quiet=False)),  # -v does not lower LOGLEVEL
    ("WARNING", False, ConsoleSetup(logging.WARNING, quiet=False)),
    ("WARNING", True, ConsoleSetup(logging.INFO, quiet=False)),
    ("ERROR", False, ConsoleSetup(logging.ERROR, quiet=False)),
    ("LOUD", False, ConsoleSetup(logging.INFO, quiet=True)),  # not a level: as if unset
    ("", False, ConsoleSetup(logging.INFO, quiet=True)),
])
def test_loglevel_and_verbose_choose_the_console(loglevel, verbose, expected):
    environ = {} if loglevel is None else {"LOGLEVEL": loglevel}
    assert console_setup(environ, verbose) == expected


@pytest.mark.parametrize(("text", "expected"), [
    (f"run {RUN} round 0", "run 44d0b54c round 0"),
    (f"path /tmp/{RUN.upper()}/x", "path /tmp/44D0B54C/x"),
    ("run job-42 round 3", "run job-42 round 3"),
    ("store 050335ce79294006bfec46f8dc0d6a46", "store 050335ce79294006bfec46f8dc0d6a46"),  # not a UUID's form
])
def test_uuids_are_cut_to_eight_digits(text, expected):
    assert short_ids(text) == expected


def emit_all(setup: ConsoleSetup) -> list[str]:
    stream = io.StringIO()
    handler = configure(setup, stream)
    log = logging.getLogger("elastic.test_console")
    try:
        log.debug("debug detail")
        log.info("info detail of run %s", RUN)
        log.info("formed a world of %d workers in run %s", 2, RUN, extra=CONSOLE)
        log.warning("the store is slow")
        log.error("it broke")
    finally:
        logging.getLogger().removeHandler(handler)
    return stream.getvalue().splitlines()


def test_the_default_console_shows_marked_lines_and_warnings_short():
    assert emit_all(ConsoleSetup(logging.INFO, quiet=True)) == [
        "elasticrun: formed a world of 2 workers in run 44d0b54c",
        "elasticrun: warning: the store is slow",
        "elasticrun: error: it broke",
    ]


def test_verbose_shows_every_info_line_stamped_with_full_ids():
    lines = emit_all(ConsoleSetup(logging.INFO, quiet=False))
    assert [line.split("] ", 1)[1] for line in lines] == [
        f"elasticrun INFO: info detail of run {RUN}",
        f"elasticrun INFO: formed a world of 2 workers in run {RUN}",
        "elasticrun WARNING: the store is slow",
        "elasticrun ERROR: it broke",
    ]
    assert all(line.startswith("[") for line in lines)


def test_loglevel_warning_shows_warnings_only():
    assert [line.split("] ", 1)[1] for line in emit_all(ConsoleSetup(logging.WARNING, quiet=False))] == [
        "elasticrun WARNING: the store is slow", "elasticrun ERROR: it broke"]


def test_configuring_twice_prints_each_line_once():
    first, second = io.StringIO(), io.StringIO()
    configure(ConsoleSetup(logging.INFO, quiet=True), first)
    handler = configure(ConsoleSetup(logging.INFO, quiet=True), second)
    try:
        logging.getLogger("elastic.test_console").warning("once")
    finally:
        logging.getLogger().removeHandler(handler)
    assert first.getvalue() == "" and second.getvalue() == "elasticrun: warning: once\n"


def test_a_traceback_logged_with_exc_info_is_kept():
    stream = io.StringIO()
    handler = configure(ConsoleSetup(logging.INFO, quiet=True), stream)
    try:
        try:
            raise RuntimeError("bug")
        except RuntimeError:
            logging.getLogger("elastic.test_console").exception("unexpected")
    finally:
        logging.getLogger().removeHandler(handler)
    assert stream.getvalue().startswith("elasticrun: error: unexpected\nTraceback")


@pytest.mark.parametrize(("setup", "given", "inside"), [
    (ConsoleSetup(logging.INFO, quiet=True), None, "ERROR"),  # quiet: gRPC's core INFO lines off while it starts
    (ConsoleSetup(logging.INFO, quiet=True), "DEBUG", "DEBUG"),  # the user's own setting stays
    (ConsoleSetup(logging.INFO, quiet=False), None, None),  # -v / LOGLEVEL: gRPC as it is
])
def test_grpc_is_quiet_only_while_it_starts_and_only_on_the_default_console(setup, given, inside):
    environ = {} if given is None else {"GRPC_VERBOSITY": given}
    with quiet_grpc(setup, environ):
        assert environ.get("GRPC_VERBOSITY") == inside
    assert environ.get("GRPC_VERBOSITY") == given  # the workers inherit the environment as given
