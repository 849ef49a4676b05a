"""The built-in store's request handlers refuse malformed guarded claims with ProtocolError."""

import pytest

from backends.errors import ProtocolError
from backends.kvstate import KVState
from backends.tcp.ops import apply_request


def _claim(guards):
    header = {"op": "put_claim", "k": "/n/a", "ck": "/s/closer", "n": 1, "g": guards, "rp": "/s/"}
    return apply_request(KVState(), "put_claim", header, b"ab")


@pytest.mark.parametrize("guards", ["x", [["/s/round"]], [[1, None]], [["/s/round", "7"]], [["/s/round", True]]])
def test_a_malformed_guard_is_refused(guards):
    with pytest.raises(ProtocolError):
        _claim(guards)


def test_a_guarded_claim_answers_with_the_read_and_the_claim():
    reply = _claim([["/s/round", None]])
    assert reply.header["a"] is True and reply.header["c"] is True
    assert [item for item in reply.header["kvs"]] and reply.header["rr"] == reply.header["r"]
    missed = apply_request(KVState(), "put_claim", {"op": "put_claim", "k": "/n/a", "ck": "/s/c", "n": 1,
                                                     "g": [["/s/round", 3]], "rp": "/s/"}, b"ab")
    assert missed.header == {"a": False, "rr": 1, "kvs": []} and missed.events == ()  # a fresh store is at revision 1
