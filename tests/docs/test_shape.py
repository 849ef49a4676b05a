"""The package code keeps its shape: constructors that say what they need, classes of one job.

Two bounds, checked on the syntax tree of the package sources (``elastic/``, ``backends/``,
``rpc/``; not the tests):

* no ``__init__`` takes more than :data:`MAX_PARAMETERS` parameters (``self`` aside; ``*args``
  and ``**kwargs`` count one each) outside a ``@dataclass``: what travels together goes in one
  frozen dataclass (a ``NodeSpec``, a ``StateLimits``);
* no class in ``elastic/worker`` or ``elastic/agent`` is longer than :data:`MAX_CLASS_LINES`
  lines (from ``class`` to its last line, docstring included): a longer one has two jobs.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("elastic", "backends", "rpc")
"""Where constructors are checked."""
ONE_JOB = ("elastic/worker", "elastic/agent")
"""Where class lengths are checked."""
MAX_PARAMETERS = 8
MAX_CLASS_LINES = 250


@dataclass(frozen=True)
class ClassShape:
    """One class as the checks see it: where it is, its length, and its constructor's parameters
    (None: it defines no ``__init__``)."""

    where: str
    name: str
    lines: int
    parameters: int | None
    dataclass: bool


def _is_dataclass(node: ast.ClassDef) -> bool:
    for decorator in node.decorator_list:
        target = decorator.func if isinstance(decorator, ast.Call) else decorator
        name = target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", None)
        if name == "dataclass":
            return True
    return False


def _parameters(function: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """How many parameters ``function`` takes besides ``self``; ``*args`` and ``**kwargs`` count one each."""
    args = function.args
    named = len(args.posonlyargs) + len(args.args) + len(args.kwonlyargs)
    return named + (args.vararg is not None) + (args.kwarg is not None) - 1


def shapes(source: str, where: str) -> list[ClassShape]:
    """Every class of ``source`` (nested ones too), in the order met."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.ClassDef):
            continue
        inits = [item for item in node.body
                 if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and item.name == "__init__"]
        parameters = _parameters(inits[-1]) if inits else None
        lines = (node.end_lineno or node.lineno) - node.lineno + 1
        found.append(ClassShape(f"{where}:{node.lineno}", node.name, lines, parameters, _is_dataclass(node)))
    return found


def package_shapes(roots: tuple[str, ...]) -> list[ClassShape]:
    found = []
    for root in roots:
        for path in sorted((REPO / root).rglob("*.py")):
            found.extend(shapes(path.read_text(encoding="utf-8"), str(path.relative_to(REPO))))
    return found


@pytest.mark.parametrize("source, expected", [
    ("class A:\n    def __init__(self, a, b, *, c=1):\n        pass\n", [("A", 3, 3)]),
    ("class A:\n    def __init__(self, *args, **kwargs):\n        pass\n", [("A", 2, 3)]),
    ("class A:\n    def __init__(self, a, /, b):\n        pass\n", [("A", 2, 3)]),
    ("class A:\n    x = 1\n", [("A", None, 2)]),
    ("class A:\n    class B:\n        def __init__(self, a):\n            pass\n", [("A", None, 4), ("B", 1, 3)]),
])
def test_the_shape_counts_parameters_besides_self_with_star_args_as_one_each(source, expected):
    assert [(shape.name, shape.parameters, shape.lines) for shape in shapes(source, "x.py")] == expected


@pytest.mark.parametrize("decorator, is_dataclass", [
    ("@dataclass", True),
    ("@dataclass(frozen=True)", True),
    ("@dataclasses.dataclass(frozen=True, slots=True)", True),
    ("@functools.total_ordering", False),
    ("", False),
])
def test_a_class_is_a_dataclass_by_its_decorator(decorator, is_dataclass):
    (shape,) = shapes(f"{decorator}\nclass A:\n    a: int\n", "x.py")
    assert shape.dataclass is is_dataclass


def test_no_constructor_outside_a_dataclass_takes_more_than_eight_parameters():
    over = [f"{shape.where}: {shape.name}.__init__ takes {shape.parameters} parameters"
            for shape in package_shapes(PACKAGES)
            if not shape.dataclass and shape.parameters is not None and shape.parameters > MAX_PARAMETERS]
    assert not over, (f"At most {MAX_PARAMETERS} constructor parameters; bundle what travels together into a "
                      f"frozen dataclass:\n" + "\n".join(over))


def test_no_class_in_the_worker_or_the_agent_is_longer_than_250_lines():
    over = [f"{shape.where}: {shape.name} is {shape.lines} lines"
            for shape in package_shapes(ONE_JOB) if shape.lines > MAX_CLASS_LINES]
    assert not over, f"At most {MAX_CLASS_LINES} lines a class; split it by job:\n" + "\n".join(over)


MAX_FACADE_LINES = 150
"""The training loop's facade only reads its arguments and delegates to the jobs behind it."""


def test_the_live_training_facade_stays_a_facade():
    [facade] = [shape for shape in package_shapes(("elastic/worker",)) if shape.name == "LiveTraining"]
    assert facade.lines <= MAX_FACADE_LINES, (
        f"{facade.where}: LiveTraining is {facade.lines} lines; move what is not the user's API into the "
        f"jobs behind it (elastic/worker/assembly.py, lifecycle.py, recoverer.py, steps.py)")
