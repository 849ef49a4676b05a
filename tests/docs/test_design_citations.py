"""Every ``DESIGN §X`` citation in the code names a section of docs/design.md.

A section is a heading of docs/design.md that starts with its number: ``## 3. The rendezvous
protocol`` (a number and a dot), ``### 3.10 Liveness is ...``, ``## 4b. Live recovery``. A
citation is the word DESIGN followed by one or more section signs with a number each (``§3.9/§4``:
both count). This file's own examples are not citations.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DESIGN = REPO / "docs" / "design.md"
CODE = ("elastic", "backends", "rpc", "tests", "benchmarks")
"""Where citations are looked for: the packages, and the tests and benchmarks that cite too."""

_NUMBER = r"\d+[a-z]?(?:\.\d+)*"
_HEADING = re.compile(r"^#{1,6}\s+(\d+[a-z]?\.(?=\s)|\d+[a-z]?(?:\.\d+)+(?=\s))")
_CITATION = re.compile(rf"DESIGN((?:[\s,/]*(?:and\s+)?§\s*{_NUMBER})+)")
_SECTION_SIGN = re.compile(rf"§\s*({_NUMBER})")
_FENCE = re.compile(r"^\s*(```|~~~)")


def sections(text: str) -> set[str]:
    """The section numbers of a markdown text: its headings that start with a number."""
    found, fenced = set(), False
    for line in text.splitlines():
        if _FENCE.match(line):
            fenced = not fenced
        elif not fenced and (match := _HEADING.match(line)):
            found.add(match.group(1).rstrip("."))
    return found


def citations(text: str) -> list[tuple[int, str]]:
    """(line number, section number) of every ``DESIGN §...`` citation in ``text``."""
    cited = []
    for number, line in enumerate(text.splitlines(), 1):
        for match in _CITATION.finditer(line):
            cited.extend((number, section) for section in _SECTION_SIGN.findall(match.group(1)))
    return cited


def dangling(root: Path, existing: set[str], places: tuple[str, ...] = CODE) -> list[str]:
    """One line per citation under ``places`` of ``root`` that names no section in ``existing``."""
    problems = []
    for place in places:
        for path in sorted((root / place).rglob("*.py")):
            if path.resolve() == Path(__file__).resolve():
                continue
            for number, section in citations(path.read_text(encoding="utf-8")):
                if section not in existing:
                    problems.append(f"{path.relative_to(root)}:{number}: DESIGN §{section} is not a section of "
                                    "docs/design.md")
    return problems


def test_the_design_document_exists_and_is_numbered():
    assert DESIGN.is_file(), "docs/design.md is missing: the code cites it"
    assert {"1", "2", "3", "4", "4b"} <= sections(DESIGN.read_text(encoding="utf-8"))


def test_every_design_citation_in_the_code_names_a_section_of_docs_design_md():
    existing = sections(DESIGN.read_text(encoding="utf-8")) if DESIGN.is_file() else set()
    assert dangling(REPO, existing) == []


def test_the_code_cites_the_design_at_all():
    """Guards the check itself: a pattern that stopped matching would pass every dangling check."""
    cited = [section for place in CODE[:3] for path in (REPO / place).rglob("*.py")
             for _, section in citations(path.read_text(encoding="utf-8"))]
    assert len(cited) >= 5


# -- the check itself ----------------------------------------------------------------------------


@pytest.mark.parametrize("heading, number", [
    ("## 1. The picture and the layers", "1"),
    ("### 3.10 Liveness is the server's word (static stability)", "3.10"),
    ("## 4b. Live recovery", "4b"),
    ("### 4b.7 The commit fence", "4b.7"),
    ("#### 2.1.3 Deep", "2.1.3"),
])
def test_a_numbered_heading_is_a_section(heading, number):
    assert sections(heading) == {number}


@pytest.mark.parametrize("heading", ["# Design", "## Decisions and why", "## 2026 plans", "```"])
def test_an_unnumbered_heading_is_not_a_section(heading):
    assert sections(heading) == set()


@pytest.mark.parametrize("line, cited", [
    ("liveness is the server's word, DESIGN §3.10): a leaderless", ["3.10"]),
    ('"""Protocol (DESIGN §3), per round', ["3"]),
    ("ten modules cite DESIGN §3.9/§4 and DESIGN §4b.6", ["3.9", "4", "4b.6"]),
    ("DESIGN § 3.6, §3.7 and §2", ["3.6", "3.7", "2"]),
    ("the design says so (§3.1), not DESIGN.md", []),
])
def test_citations_are_found_with_every_number_they_name(line, cited):
    assert [section for _, section in citations(line)] == cited


def test_a_citation_of_a_missing_section_is_reported_and_a_present_one_is_not(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "design.md").write_text(
        "# Design\n\n## 3. Rendezvous\n\n### 3.1 Sessions\n\n```text\n### 3.2 fenced, not a heading\n```\n")
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "a.py").write_text('"""Sessions (DESIGN §3.1); joins (DESIGN §3.2)."""\n\n# DESIGN §3\n')
    (tmp_path / "pkg" / "b.py").write_text("# DESIGN §3.10: 3.1 is a section, 3.10 is not\n")
    existing = sections((tmp_path / "docs" / "design.md").read_text())
    assert dangling(tmp_path, existing, ("pkg",)) == [
        "pkg/a.py:1: DESIGN §3.2 is not a section of docs/design.md",
        "pkg/b.py:1: DESIGN §3.10 is not a section of docs/design.md",
    ]
