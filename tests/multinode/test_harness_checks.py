"""The harness's pure checks on hand-made tables: what they accept and what they catch."""

from __future__ import annotations

import pytest

import harness
from harness import Attempt


def row(node: str, group: int, local: int, rank: int, world: int, local_world: int, groups: int, *,
        restart: int = 0, port: int = 29500, role_rank: int | None = None, total: int | None = None) -> dict:
    env = {"RANK": str(rank), "LOCAL_RANK": str(local), "WORLD_SIZE": str(world), "LOCAL_WORLD_SIZE": str(local_world),
           "GROUP_RANK": str(group), "GROUP_WORLD_SIZE": str(groups), "ROLE_NAME": "default",
           "ROLE_RANK": str(rank if role_rank is None else role_rank), "ROLE_WORLD_SIZE": str(world),
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "TORCHELASTIC_RESTART_COUNT": str(restart)}
    return {"event": "formed", "time": 1.0 + rank, "pid": 100 + rank, "token": f"t{node}{local}", "node": node,
            "env": env, "rank": rank, "world": world, "allreduce_sum": world * (world - 1) // 2 if total is None else total}


def attempt(*rows: dict) -> Attempt:
    return Attempt(frozenset(r["token"] for r in rows), tuple(rows))


# torchrun's world for A --nproc-per-node=2, B --nproc-per-node=1.
TORCHRUN_2_1 = [row("A", 0, 0, 0, 3, 2, 2), row("A", 0, 1, 1, 3, 2, 2), row("B", 1, 0, 2, 3, 1, 2)]
NPROC = {"A": 2, "B": 1}


@pytest.mark.parametrize("rows, expected", [
    (TORCHRUN_2_1, []),
    # B is group rank 0: its rank comes first, A's follow (also torchrun's rule).
    ([row("B", 0, 0, 0, 3, 1, 2), row("A", 1, 0, 1, 3, 2, 2), row("A", 1, 1, 2, 3, 2, 2)], []),
    # The issue's world: A 0/4, 1/4; B 1/2.
    ([row("A", 0, 0, 0, 4, 2, 2), row("A", 0, 1, 1, 4, 2, 2), row("B", 1, 0, 1, 2, 1, 2)],
     ["RANK is [0, 1, 1], not 0..2", "WORLD_SIZE is ['2', '4'], not one value 3", "node B (GROUP_RANK 1)"]),
    ([*TORCHRUN_2_1[:2], row("B", 1, 0, 2, 3, 1, 2, restart=1)], ["TORCHELASTIC_RESTART_COUNT is ['0', '1']"]),
    ([*TORCHRUN_2_1[:2], row("B", 1, 0, 2, 3, 1, 2, port=29501)], ["MASTER_ADDR:MASTER_PORT is"]),
    ([*TORCHRUN_2_1[:2], row("B", 1, 0, 2, 3, 1, 2, total=2)], ["all_reduce(rank) gave [2, 3], not 3"]),
    ([*TORCHRUN_2_1[:2], row("B", 1, 0, 2, 3, 1, 2, role_rank=0)], ["ROLE_RANK differs from RANK"]),
    # Group rank 1 numbered first: ranks are not the cumulative local world sizes.
    ([row("A", 0, 0, 1, 3, 2, 2), row("A", 0, 1, 2, 3, 2, 2), row("B", 1, 0, 0, 3, 1, 2)],
     ["node A (GROUP_RANK 0): (LOCAL_RANK, RANK) [('0', '1'), ('1', '2')]", "node B (GROUP_RANK 1)"]),
    ([row("A", 0, 0, 0, 3, 2, 2), row("A", 0, 1, 1, 3, 2, 2), row("B", 0, 0, 2, 3, 1, 2)],
     ["GROUP_RANK is [0] with GROUP_WORLD_SIZE [2]", "one GROUP_RANK on several nodes"]),
    ([row("A", 0, 0, 0, 2, 1, 2), row("B", 1, 0, 1, 2, 1, 2)], ["node A runs 1 workers, not its --nproc-per-node 2"]),
], ids=["torchrun", "other-group-order", "issue-13", "restart-count", "master", "sum", "role-rank", "rank-order",
        "group-rank", "nproc"])  # fmt: skip
def test_violations_name_every_inconsistency_of_an_attempt(rows, expected):
    found = harness.violations(attempt(*rows), NPROC)
    assert len(found) >= len(expected), found
    for piece in expected:
        assert any(piece in violation for violation in found), (piece, found)
    if not expected:
        assert found == []


def test_a_member_that_wrote_no_formed_row_is_a_violation():
    incomplete = Attempt(frozenset({"tA0", "tA1", "tB0", "tX"}), tuple(TORCHRUN_2_1))
    assert "1 of 4 members wrote no 'formed' row" in harness.violations(incomplete)


def test_shape_ignores_the_order_of_group_ranks_but_not_the_columns():
    swapped = [row("B", 0, 0, 0, 3, 1, 2), row("A", 1, 0, 1, 3, 2, 2), row("A", 1, 1, 2, 3, 2, 2)]
    assert harness.shape(attempt(*TORCHRUN_2_1)) == harness.shape(attempt(*swapped))
    issue = [row("A", 0, 0, 0, 4, 2, 2), row("A", 0, 1, 1, 4, 2, 2), row("B", 1, 0, 1, 2, 1, 2)]
    assert harness.shape(attempt(*TORCHRUN_2_1)) != harness.shape(attempt(*issue))


def test_attempts_are_the_groups_of_all_gathered_tokens_in_formation_order():
    first = [dict(r, tokens=["tA0", "tA1", "tB0"]) for r in TORCHRUN_2_1]
    second = [dict(r, token=r["token"] + "'", tokens=["tA0'", "tB0'"], time=r["time"] + 10) for r in
              (row("A", 0, 0, 0, 2, 1, 2), row("B", 1, 0, 1, 2, 1, 2))]
    started = [dict(TORCHRUN_2_1[0], event="started")]
    found = harness.attempts([*second, *started, *first])
    assert [a.world for a in found] == [3, 2]
    assert all(a.complete for a in found)
    assert found[1].nodes() == {"A", "B"}
