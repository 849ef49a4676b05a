"""``elastic-timeline EVENTS.jsonl [EVENTS2.jsonl ...] [-o timeline.html]``: draw a run.

Reads the ``--event-log`` files of every node (one file with several agents' lines works too),
merges them and writes one self-contained HTML page (see :mod:`elastic.timeline`). Also
``python -m elastic.timeline`` and ``elasticrun timeline`` (see :func:`elastic.run.main`).

Lines it cannot read are skipped with one line on stderr per file, and named on the page; a
file it cannot open is one line and skipped. Exit status: 0 when the page was written, 1 when
there was nothing to draw or the page cannot be written, 2 for a bad command line.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import NoReturn

from elastic.agent.private_files import replace_file
from elastic.timeline.layout import layout
from elastic.timeline.page import render_page
from elastic.timeline.records import Record, read_log

__all__ = ["PROG", "main"]

PROG = "elastic-timeline"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        """One line, as elasticrun's own errors."""
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def _parser(prog: str) -> argparse.ArgumentParser:
    parser = _Parser(prog=prog, description="Draw the event logs (--event-log) of a run's agents as one HTML page: "
                     "a lane per node, rounds and attempts as bars, restarts and worker exits as marks with their "
                     "cause, and the world size over time.")
    parser.add_argument("logs", nargs="+", metavar="EVENTS.jsonl", help="event logs, one per agent or shared")
    parser.add_argument("-o", "--output", default="timeline.html",
                        help="the page to write (default: timeline.html; '-' for standard output)")
    return parser


def main(argv: Sequence[str] | None = None, *, prog: str = PROG) -> int:
    """Run the command; returns the exit status (see the module docstring)."""
    args = _parser(prog).parse_args(sys.argv[1:] if argv is None else list(argv))
    records: list[Record] = []
    notes: list[str] = []
    for path in args.logs:
        try:
            with open(path, "rb") as stream:
                got, skipped = read_log(stream, path)
        except OSError as error:
            notes.append(f"{path}: cannot be read ({error.strerror or error}); skipped")
            print(f"{prog}: {notes[-1]}", file=sys.stderr)
            continue
        records.extend(got)
        if skipped.anything:
            notes.append(skipped.line())
            print(f"{prog}: {notes[-1]}", file=sys.stderr)
    if not records:
        print(f"{prog}: no events to draw in {', '.join(args.logs)}", file=sys.stderr)
        return 1
    timeline = layout(records)
    page = render_page(timeline, notes)
    try:
        _write(args.output, page)
    except OSError as error:
        print(f"{prog}: cannot write {args.output}: {error.strerror or error}", file=sys.stderr)
        return 1
    s = timeline.summary
    if args.output != "-":
        print(f"{prog}: wrote {args.output}: {s.nodes} node(s), {s.rounds} round(s), "
              f"{sum(n for _, n in s.restarts)} restart(s)", file=sys.stderr)
    return 0


def _write(path: str, page: str) -> None:
    if path == "-":
        sys.stdout.write(page)
        return
    # a reader never sees half a page; permissions as open() gives them (0666 less the umask)
    replace_file(path, lambda out: out.write(page.encode("utf-8")), mode=0o666)
