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


@pytest.mark.parametrize("nodes, size", [(10, 637), (100, 6037), (1000, 60607)])
def test_the_encoded_round_record_size_is_pinned(nodes, size):
    # ~60 bytes a member: a 1000-node round is 6% of the 1 MiB value limit.
    assert len(records.encode_round(sample_round(nodes))) == size


def test_records_round_trip():
    round_record = sample_round(3)
    assert records.decode_round("k", records.encode_round(round_record)) == round_record
    join = JoinRecord("n1", "[::1]", 29500)
    assert records.decode_join("k", records.encode_join(join)) == join
    assert records.decode_closed("k", records.encode_closed(ClosedRecord("done"))) == ClosedRecord("done")


@pytest.mark.parametrize(
    "raw, says",
    [
        (b"\x80\x04pickle", "is corrupt: it is not JSON"),
        (b"[1, 2]", "not a JSON object"),
        (b'{"v": 2, "round": 1, "members": []}', "format version 2"),
        (b'{"round": 1, "members": []}', "format version None"),
        (b'{"v": 1, "round": -1, "members": []}', "round number"),
        (b'{"v": 1, "round": 1, "members": [["a", "h"]]}', "is not [node id, address, port]"),
        (b'{"v": 1, "round": 1, "members": [["a", "h", 0]]}', "is not [node id, address, port]"),
        (b'{"v": 1, "round": 1, "members": [["a", "h", 1], ["a", "h", 2]]}', "listed twice"),
    ],
)
def test_bad_round_state_names_the_key_and_how_to_clear_it(raw, says):
    with pytest.raises(RendezvousStateError) as raised:
        records.decode_round("/elastic/job/state/round", raw)
    message = str(raised.value)
    assert says in message
    assert "/elastic/job/state/round" in message
    assert "--rdzv-id" in message


def test_a_bad_join_record_is_rejected():
    with pytest.raises(RendezvousStateError, match="join record"):
        records.decode_join("k", b'{"v": 1, "node": "", "addr": "h", "port": 1}')


def test_node_keys_parse_back_and_foreign_keys_do_not():
    keys = RendezvousKeys("/elastic", "job")
    assert keys.parse_node_key(keys.node(12, "host-1")) == (12, "host-1")
    assert keys.parse_node_key(keys.round) is None
    assert keys.parse_node_key("/elastic/job/rounds/x/nodes/n") is None
    assert not keys.round.startswith(keys.nodes_prefix(1))
