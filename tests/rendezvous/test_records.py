"""Versioned JSON state: round trips, pinned sizes, and clear errors for anything else."""

import pytest

from elastic.rendezvous import records
from elastic.rendezvous.errors import RendezvousStateError
from elastic.rendezvous.records import ClosedRecord, JoinRecord, Member, RendezvousKeys, RoundRecord


def sample_round(nodes):
    members = tuple(
        Member(f"worker-{index:04d}.cluster.local-4242-a1b2c3", f"10.1.{index // 256}.{index % 256}", 29500 + index % 1000)
        for index in range(nodes)
    )
    return RoundRecord(17, members, members_revision=123456)


@pytest.mark.parametrize("nodes, size", [(10, 770), (100, 7250), (1000, 72620)])
def test_the_encoded_round_record_size_is_pinned(nodes, size):
    # ~73 bytes a member: a 1000-node round is 7% of the 1 MiB value limit.
    assert len(records.encode_round(sample_round(nodes))) == size


def test_records_round_trip():
    round_record = sample_round(3)
    assert records.decode_round("k", records.encode_round(round_record)) == round_record
    for join in (JoinRecord("n1", "[::1]", 29500), JoinRecord("n2", "h", 1, 8, "trainer", failed_round=4)):
        assert records.decode_join("k", records.encode_join(join)) == join
    mixed = RoundRecord(3, (Member("a", "h", 1, 2, "trainer"), Member("b", "h", 2, 1, "ps")), 9, restart_count=2)
    assert records.decode_round("k", records.encode_round(mixed)) == mixed
    assert records.decode_closed("k", records.encode_closed(ClosedRecord("done"))) == ClosedRecord("done")


@pytest.mark.parametrize(
    "raw, says",
    [
        (b"\x80\x04pickle", "is corrupt: it is not JSON"),
        (b"[1, 2]", "not a JSON object"),
        (b'{"v": 1, "round": 1, "members": [["a", "h", 1]]}', "format version 1"),
        (b'{"round": 1, "members": []}', "format version None"),
        (b'{"v": 2, "round": -1, "members": [], "restarts": 0}', "round number"),
        (b'{"v": 2, "round": 1, "members": [], "restarts": 0}', "non-empty member list"),
        (b'{"v": 2, "round": 1, "members": [["a", "h", 1, 1, "r"]]}', "restart count"),
        (b'{"v": 2, "round": 1, "members": [["a", "h", 1, 1, "r"]], "restarts": -1}', "restart count"),
        (b'{"v": 2, "round": 1, "members": [["a", "h"]], "restarts": 0}', "is not [node id, address, port, local"),
        (b'{"v": 2, "round": 1, "members": [["a", "h", 0, 1, "r"]], "restarts": 0}', "is not [node id, address, port"),
        (b'{"v": 2, "round": 1, "members": [["a", "h", 1, 0, "r"]], "restarts": 0}', "local world size, role]"),
        (b'{"v": 2, "round": 1, "members": [["a", "h", 1, 1, ""]], "restarts": 0}', "local world size, role]"),
        (b'{"v": 2, "round": 1, "members": [["a", "h", 1, true, "r"]], "restarts": 0}', "local world size, role]"),
        (b'{"v": 2, "round": 1, "members": [["a", "h", 1, 1, "r"], ["a", "h", 2, 1, "r"]], "restarts": 0}',
         "listed twice"),
    ],
)
def test_bad_round_state_names_the_key_and_how_to_clear_it(raw, says):
    with pytest.raises(RendezvousStateError) as raised:
        records.decode_round("/elastic/job/state/round", raw)
    message = str(raised.value)
    assert says in message
    assert "/elastic/job/state/round" in message
    assert "--rdzv-id" in message


@pytest.mark.parametrize("body", [
    b'{"v": 2, "node": "", "addr": "h", "port": 1, "lws": 1, "role": "r"}',
    b'{"v": 2, "node": "n", "addr": "h", "port": 1}',
    b'{"v": 2, "node": "n", "addr": "h", "port": 1, "lws": 0, "role": "r"}',
    b'{"v": 2, "node": "n", "addr": "h", "port": 1, "lws": 1, "role": ""}',
    b'{"v": 2, "node": "n", "addr": "h", "port": 1, "lws": 1, "role": "r", "failed": -1}',
])
def test_a_bad_join_record_is_rejected(body):
    with pytest.raises(RendezvousStateError, match="join record"):
        records.decode_join("k", body)


def test_a_corrupt_member_entry_is_quoted_in_at_most_about_100_characters():
    raw = b'{"v": 2, "round": 1, "restarts": 0, "members": [["' + b"x" * 100000 + b'", "h"]]}'
    with pytest.raises(RendezvousStateError) as raised:
        records.decode_round("k", raw)
    assert len(str(raised.value)) < 400


def torch_assign(shapes):
    """torch 2.13's ``_assign_worker_ranks`` (slow path), restated: ``shapes`` are (role, local
    world size) in group-rank order; returns per node (base rank, world, role base, role world)."""
    role_sizes, world = {}, 0
    for role, size in shapes:
        role_sizes[role] = role_sizes.get(role, 0) + size
        world += size
    out, base, role_ranks = [], 0, {}
    for role, size in shapes:
        out.append((base, world, role_ranks.get(role, 0), role_sizes[role]))
        base += size
        role_ranks[role] = role_ranks.get(role, 0) + size
    return out


@pytest.mark.parametrize("shapes", [
    [("default", 2), ("default", 1)],
    [("default", 3), ("default", 1), ("default", 2)],
    [("default", 8)] * 4,
    [("trainer", 2), ("ps", 1), ("trainer", 4), ("ps", 2)],
    [("default", 1)],
])
def test_the_round_record_places_workers_as_torchrun_does(shapes):
    record = RoundRecord(0, tuple(Member(f"n{i}", "h", 1000 + i, size, role) for i, (role, size) in enumerate(shapes)))
    expected = torch_assign(shapes)
    assert record.world_size == sum(size for _, size in shapes)
    assert record.group_world_size == len(shapes)
    for index, (role, size) in enumerate(shapes):
        layout = record.layout_of(f"n{index}")
        assert (layout.base_rank, layout.world_size, layout.role_base_rank, layout.role_world_size) == expected[index]
        assert (layout.group_rank, layout.group_world_size, layout.local_world_size, layout.role) == (
            index, len(shapes), size, role)
    assert record.layout_of("stranger") is None


def test_node_keys_parse_back_and_foreign_keys_do_not():
    keys = RendezvousKeys("/elastic", "job")
    assert keys.parse_node_key(keys.node(12, "host-1")) == (12, "host-1")
    assert keys.parse_node_key(keys.round) is None
    assert keys.parse_node_key("/elastic/job/rounds/x/nodes/n") is None
    assert not keys.round.startswith(keys.nodes_prefix(1))
