"""backends.txn's pure parts: which transactions check_txn refuses, as etcd would, in polynomial time."""

import pytest

from backends.errors import ValueTooLargeError
from backends.txn import MAX_TXN_DEPTH, Compare, CompareOp, Delete, Put, Range, Target, Txn, check_txn

P, Q = Put("/k", b"1"), Put("/k", b"2")


def nest(op, depth: int) -> Txn:
    txn = Txn((), (op,))
    for _ in range(depth - 1):
        txn = Txn((), (txn,))
    return txn


@pytest.mark.parametrize(
    "txn, error",
    [
        (Txn((), (P, Put("/j", b"2")), (Q,)), None),  # the branches are separate
        (Txn((), (P, Q)), "twice"),
        (Txn((), (P, Delete("/k"))), "both puts and deletes"),
        (Txn((), (Delete("/"), P)), None),  # "/" alone, not as a prefix
        (Txn((), (Delete("/", prefix=True), P)), "both puts and deletes"),
        (Txn((), (Delete("/k"), Delete("/k"))), None),  # etcd allows deleting twice
        (Txn((), (Txn((), (P,), (Q,)),)), None),  # a nested txn's branches exclude each other
        (Txn((), (P, Txn((), (), (Q,)))), "twice"),
        (Txn((), (Txn((), (P,)), Txn((), (), (Q,)))), "twice"),  # both nested txns may run
        (Txn((), (Txn((), (Delete("/", prefix=True),)), P)), "both puts and deletes"),
        (Txn((), (Range("/k"),) * 129), "at most 128"),
        (Txn(tuple(Compare.absent("/k") for _ in range(129))), "at most 128"),
        (Txn((), tuple(Txn((), (Range("/k"),) * 128) for _ in range(8))), "1032 operations"),
        (nest(P, MAX_TXN_DEPTH), None),
        (nest(P, MAX_TXN_DEPTH + 1), f"nested {MAX_TXN_DEPTH + 1} deep"),
    ],
)
def test_check_txn_refuses_what_etcd_would_and_what_cannot_be_meant(txn, error):
    if error is None:
        check_txn(txn, 1024)
    else:
        with pytest.raises(ValueError, match=error):
            check_txn(txn, 1024)


def test_check_txn_refuses_wrong_types_and_large_values():
    with pytest.raises(ValueTooLargeError):
        check_txn(Txn((), (), (Put("/k", b"x" * 11),)), 10)
    with pytest.raises(TypeError):
        check_txn(Txn((), ("put",)), 10)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        check_txn(Txn((), (Put("/k", "text"),)), 10)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        check_txn(Txn(("/k",)), 10)  # type: ignore[arg-type]


def test_check_txn_is_polynomial_in_nested_branches():
    """128 nested transactions writing in both branches have 2**128 paths; checking walks none of them."""
    check_txn(Txn((), tuple(Txn((), (Put(f"/k{i}", b""),), (Put(f"/k{i}", b""),)) for i in range(128))), 10)


@pytest.mark.parametrize(
    "target, op, operand, current, holds",
    [
        (Target.CREATE_REVISION, CompareOp.EQUAL, 0, None, True),
        (Target.MOD_REVISION, CompareOp.LESS, 1, None, True),
        (Target.VERSION, CompareOp.GREATER, 0, None, False),
        (Target.VALUE, CompareOp.NOT_EQUAL, b"x", None, False),  # a value never compares for an absent key
        (Target.VALUE, CompareOp.GREATER, b"a", b"b", True),
        (Target.VALUE, CompareOp.LESS, b"a", b"b", False),
    ],
)
def test_compare_holds_as_etcd_judges(target, op, operand, current, holds):
    from backends.api import KeyValue

    kv = None if current is None else KeyValue("/k", current, 2, 3, 1, 0)
    assert Compare("/k", target, op, operand).holds(kv) is holds


@pytest.mark.parametrize("target, operand", [(Target.VALUE, 1), (Target.MOD_REVISION, -1),
                                             (Target.VERSION, True), (Target.CREATE_REVISION, b"1")])
def test_a_compare_with_an_operand_of_the_wrong_kind_is_refused(target, operand):
    with pytest.raises(ValueError):
        Compare("/k", target, CompareOp.EQUAL, operand)
