"""What ``elastic.testing`` ships is what docs/backends.md documents, and its examples work.

The section "Testing your own backend or training script" lists the public modules in a table
and names the modules that only serve them; every module of the package must be one or the
other, so a helper for this repository's own tests added there fails here (it belongs in
``tests/support/``). The section's code blocks are executed (their imports, the definitions),
and the two that are tests are run as written under pytest in the slow tier.
"""

from __future__ import annotations

import ast
import importlib
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import elastic.testing

REPO = Path(__file__).resolve().parents[2]
PACKAGE = Path(elastic.testing.__file__).parent
SECTION = "### Testing your own backend or training script"
SERVING = ("hang_report", "os_threads", "tls")
"""The modules the section says serve the public ones (not for direct use)."""


def section() -> str:
    text = (REPO / "docs" / "backends.md").read_text()
    start = text.index(SECTION)
    end = re.search(r"^#{1,3} ", text[start + len(SECTION):], re.M)
    return text[start:] if end is None else text[start:start + len(SECTION) + end.start()]


def table_rows() -> dict[str, list[str]]:
    """Each public module of the table, with the names its row gives in backticks."""
    rows: dict[str, list[str]] = {}
    for line in section().splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if not line.startswith("|") or len(cells) != 2 or not cells[0].startswith("`elastic.testing."):
            continue
        names = re.findall(r"`([A-Za-z_][A-Za-z0-9_]*)(?:\(.*?\))?`", cells[1])
        for module in re.findall(r"`elastic\.testing\.([a-z_]+)`", cells[0]):
            rows[module] = names
    return rows


def code_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", section(), re.S)


def shipped_modules() -> set[str]:
    """The modules and subpackages directly under elastic/testing/."""
    found = {path.stem for path in PACKAGE.glob("*.py") if path.stem != "__init__"}
    found |= {path.parent.name for path in PACKAGE.glob("*/__init__.py")}
    return found


def package_imports(module: str) -> set[str]:
    """The modules of elastic.testing that ``module`` (a file or a subpackage's files) imports."""
    files = [PACKAGE / f"{module}.py"] if (PACKAGE / f"{module}.py").exists() else (PACKAGE / module).glob("*.py")
    names: set[str] = set()
    for path in files:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("elastic.testing."):
                names.add(node.module.split(".")[2])
            elif isinstance(node, ast.ImportFrom) and node.module == "elastic.testing":
                names.update(alias.name for alias in node.names)
    return names - {module}


def test_every_module_of_elastic_testing_is_documented_public_or_serves_a_public_one():
    public = set(table_rows())
    unlisted = shipped_modules() - public - set(SERVING)
    assert not unlisted, (
        f"elastic/testing/ ships {sorted(unlisted)}, which docs/backends.md does not list: a helper for this "
        "repository's own tests goes in tests/support/; one for users goes in the section's table")
    assert public | set(SERVING) <= shipped_modules()


def test_the_serving_modules_are_named_in_the_section_and_reached_from_a_public_one():
    reached: set[str] = set()
    todo = list(table_rows())
    while todo:
        for name in package_imports(todo.pop()) - reached:
            reached.add(name)
            todo.append(name)
    assert set(SERVING) <= reached, f"serving no public module: {sorted(set(SERVING) - reached)}"
    text = section()
    assert all(f"`{name}`" in text for name in SERVING)


def test_every_public_module_imports_and_has_the_names_its_row_gives():
    rows = table_rows()
    assert {"agents", "with_stacks", "etcd_server", "ports", "contract", "harness", "tcp_store", "fake_store"} <= set(rows)
    for line in section().splitlines():
        modules = re.findall(r"`elastic\.testing\.([a-z_]+)`", line)
        if not modules or not line.startswith("|"):
            continue
        loaded = [importlib.import_module(f"elastic.testing.{module}") for module in modules]
        missing = [name for name in rows[modules[0]] if not any(hasattr(module, name) for module in loaded)]
        assert not missing, f"{line.split('|')[1].strip()} has no {missing}"


def test_the_package_docstring_names_every_public_and_serving_module():
    doc = elastic.testing.__doc__
    assert all(f"elastic.testing.{module}`" in doc for module in table_rows())
    assert all(f"elastic.testing.{module}`" in doc for module in SERVING)


def test_the_code_blocks_of_the_section_import_and_define_what_they_show():
    blocks = code_blocks()
    assert len(blocks) == 4
    defined: dict[str, object] = {}
    for block in blocks:
        namespace: dict[str, object] = {"__name__": "docs_example"}
        exec(compile(block, "docs/backends.md", "exec"), namespace)  # imports, definitions, free_port()
        defined.update(namespace)
    assert {"test_my_code_reads_what_it_wrote", "test_two_agents_train_to_the_end", "TestMyBackend"} <= set(defined)
    assert re.fullmatch(r"127\.0\.0\.1:\d+", defined["endpoint"])


@pytest.mark.slow
@pytest.mark.etcd
def test_the_sections_example_tests_pass_as_written(tmp_path):
    tests = [block for block in code_blocks() if "def test_" in block]
    assert len(tests) == 2
    for number, block in enumerate(tests):
        (tmp_path / f"test_example_{number}.py").write_text(block)
    (tmp_path / "train.py").write_text(textwrap.dedent("""\
        import os
        print("rank", os.environ["RANK"], "of", os.environ["WORLD_SIZE"])
    """))
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", str(tmp_path),
                           str(tmp_path)], cwd=tmp_path, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0 and "2 passed" in done.stdout, done.stdout[-3000:] + done.stderr[-2000:]
