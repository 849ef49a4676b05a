"""Finding 11 of round three: a template frame the agent cannot use costs that template, never
the agent's reader thread.

A real template process runs a user module (``--prewarm-modules``) that writes a hostile frame
on the template's channel to the agent; the agent must judge the template dead, say why in one
line, and leave no thread killed by an exception (the review's deeply nested JSON killed the
reader with a ``RecursionError``, and the template then stayed "starting" for two minutes).
"""

from __future__ import annotations

import os
import struct
import sys
import textwrap
import threading

import pytest

from elastic.agent.prewarm.control import TemplateState
from elastic.agent.prewarm.pool import TemplatePool
from elastic.agent.prewarm.wire import MAX_NESTING, FrameReader, TemplateWireError, encode
from elastic.config import Entrypoint, LaunchConfig

WRITE_FRAME = """
import os, struct, sys
body = {body!r}
os.write(int(sys.argv[1]), struct.pack(">I", len(body)) + body)
"""

BODIES = {
    "nested-list": b"[" * 50_000 + b"]" * 50_000,
    "nested-object": b'{"op":"forked","pid":' + b'{"a":' * 20_000 + b"1" + b"}" * 20_001,
    "pid-not-a-number": b'{"op":"exited","pid":"x"}',
    "pid-a-list": b'{"op":"exited","pid":[1],"code":0}',
}


@pytest.fixture
def thread_deaths():
    deaths = []
    previous = threading.excepthook
    threading.excepthook = lambda args: deaths.append(f"{args.thread.name}: {args.exc_type.__name__}")
    try:
        yield deaths
    finally:
        threading.excepthook = previous


@pytest.mark.parametrize("name", sorted(BODIES))
def test_a_hostile_template_frame_kills_that_template_not_the_reader_thread(tmp_path, thread_deaths, name):
    (tmp_path / "hostile_frame.py").write_text(textwrap.dedent(WRITE_FRAME.format(body=BODIES[name])))
    (tmp_path / "train.py").write_text("print('trained')\n")
    config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=1, run_id="frames",
                          entrypoint=Entrypoint("script", str(tmp_path / "train.py")), prewarm=True,
                          prewarm_modules=("hostile_frame",))
    pool = TemplatePool(config, dict(os.environ), sys.executable, cwd=str(tmp_path), ready_timeout=30)
    try:
        pool.start()
        (template,) = pool.templates().values()
        state = template.wait_ready(30)
        assert state is TemplateState.DEAD, (state, template.reason)
        assert ("nested" if name.startswith("nested") else "malformed") in template.reason
        assert "\n" not in template.reason and len(template.reason) < 300
        template.close(timeout=10)
    finally:
        pool.close()
    assert thread_deaths == []


def test_json_nested_beyond_the_bound_is_refused_and_brackets_in_strings_do_not_count():
    deep = b"[" * (MAX_NESTING + 1) + b"]" * (MAX_NESTING + 1)
    ok = {"op": "fork", "env": {"A": "[{}]"}, "args": [["x"]]}
    assert FrameReader().feed(encode(ok)) == [ok]
    quoted = {"op": "x", "s": "[" * 10_000}  # brackets inside a string do not nest
    assert FrameReader().feed(encode(quoted)) == [quoted]
    with pytest.raises(TemplateWireError, match="nested"):
        FrameReader().feed(struct.pack(">I", len(deep) + 6) + b'{"a":' + deep + b"}")
