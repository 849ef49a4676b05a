"""The commit bookkeeping (pure): the step counter, the mark a heal compares, the failures in a row."""

from __future__ import annotations

from elastic.worker.commits import Commits
from elastic.worker.decisions import Mark
from elastic.worker.errors import CollectiveFailed, Superseded


def test_a_commit_counts_the_step_marks_its_round_and_clears_the_failures():
    commits = Commits()
    assert (commits.step, commits.mark, commits.failed_in_a_row) == (0, Mark(0, -1), 0)
    commits.lose(CollectiveFailed("a peer closed its connection", 3))
    commits.lose(CollectiveFailed("a peer closed its connection", 4))
    assert commits.failed_in_a_row == 2
    commits.commit(5)
    assert (commits.step, commits.mark, commits.failed_in_a_row) == (1, Mark(1, 5), 0)


def test_a_group_superseded_by_a_newer_round_is_not_a_failure():
    commits = Commits()
    commits.lose(Superseded("round 2 was abandoned for a newer round", 2))
    assert commits.failed_in_a_row == 0


def test_a_heal_moves_the_mark_and_a_renumbering_forgets_the_round():
    commits = Commits()
    commits.commit(1)
    commits.adopt(Mark(40, 6))
    assert (commits.step, commits.mark) == (40, Mark(40, 6))
    commits.renumbered()
    assert commits.mark == Mark(40, -1)
