"""Every relative link and ``#anchor`` in README.md and docs/*.md resolves.

Anchors are GitHub's heading slugs: lower case, punctuation other than ``-`` and ``_`` dropped,
spaces to ``-``, a repeated heading suffixed ``-1``, ``-2``. Links inside code (fenced blocks or
backticks) and absolute URLs are not checked.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

_FENCE = re.compile(r"^\s*(```|~~~)")
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
_INLINE_CODE = re.compile(r"`+[^`]*`+")
_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")


def slug(heading: str) -> str:
    """GitHub's anchor for a heading's text (markdown links reduced to their text)."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _prose_lines(text: str) -> list[tuple[int, str]]:
    """(line number, line) outside fenced code blocks."""
    lines, fenced = [], False
    for number, line in enumerate(text.splitlines(), 1):
        if _FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            lines.append((number, line))
    return lines


def anchors(path: Path) -> set[str]:
    """The anchors GitHub gives the headings of the markdown file ``path``."""
    seen: dict[str, int] = {}
    found = set()
    for _, line in _prose_lines(path.read_text(encoding="utf-8")):
        match = _HEADING.match(line)
        if not match:
            continue
        base = slug(match.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def broken_links(path: Path, root: Path = REPO) -> list[str]:
    """One line per link of ``path`` whose file (inside ``root``) or anchor does not exist."""
    problems = []
    for number, line in _prose_lines(path.read_text(encoding="utf-8")):
        for target in _LINK.findall(_INLINE_CODE.sub("", line)):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):  # http:, https:, mailto:
                continue
            file_part, _, anchor = target.partition("#")
            resolved = (path.parent / file_part).resolve() if file_part else path
            where = f"{path.relative_to(root)}:{number}: {target}"
            if root not in resolved.parents and resolved != root:
                problems.append(f"{where}: points outside the repository")
            elif not resolved.exists():
                problems.append(f"{where}: no such file {resolved.relative_to(root)}")
            elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
                problems.append(f"{where}: no heading with anchor #{anchor} in {resolved.relative_to(root)}")
    return problems


def documents(root: Path = REPO) -> list[Path]:
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


@pytest.mark.parametrize("document", documents(), ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_and_anchor_resolves(document):
    assert broken_links(document) == []


def test_the_readme_links_the_docs_pages():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    for page in ("design", "internals", "failure-behaviour", "backends", "security", "benchmarks", "testing"):
        assert f"docs/{page}.md" in readme


# -- the check itself ----------------------------------------------------------------------------


@pytest.mark.parametrize("heading, expected", [
    ("Quick start", "quick-start"),
    ("Pre-warmed restarts (`--prewarm`)", "pre-warmed-restarts---prewarm"),
    ("Membership policy: spares, stable ranks, bad nodes", "membership-policy-spares-stable-ranks-bad-nodes"),
    ("Distributed autograd over RPC (`rpc/`)", "distributed-autograd-over-rpc-rpc"),
    ("What `elasticrun` adds", "what-elasticrun-adds"),
    ("See [the docs](docs/x.md) here", "see-the-docs-here"),
    ("snake_case and 3.5", "snake_case-and-35"),
])
def test_slugs_are_githubs(heading, expected):
    assert slug(heading) == expected


def test_a_broken_file_or_anchor_is_reported_and_good_ones_are_not(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "page.md").write_text("# Page\n\n## Two words\n\n## Two words\n")
    (tmp_path / "README.md").write_text(
        "# Top\n\n## Quick start\n\n"
        "[ok](docs/page.md) [ok](docs/page.md#two-words) [ok](docs/page.md#two-words-1) [ok](#quick-start)\n"
        "[web](https://example.com/#x) `[code](nowhere.md)`\n\n"
        "```\n[fenced](nowhere.md)\n```\n\n"
        "[gone](docs/missing.md) [bad anchor](docs/page.md#three-words) ![img](docs/none.png) [self](#nope)\n"
        "[out](../outside.md)\n"
    )
    problems = broken_links(tmp_path / "README.md", root=tmp_path)
    assert [p.split(": ", 1)[1].split(":")[0] for p in problems] == [
        "docs/missing.md", "docs/page.md#three-words", "docs/none.png", "#nope", "../outside.md",
    ]
    assert all(p.startswith(("README.md:12:", "README.md:13:")) for p in problems)
