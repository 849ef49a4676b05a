"""The transaction vocabulary of the contract: etcd's ``Txn(If(...).Then(...).Else(...))``, typed.

A transaction evaluates its comparisons against the store as it was before the transaction,
then runs one branch's operations in order, atomically: every write of the branch lands at one
new revision (none if nothing changed), and a range in the branch sees the writes before it.
A nested :class:`Txn` is one operation; its comparisons too are judged on the state before the
outer transaction (etcd computes the whole path of branches first).

Why a transaction and not rendezvous-shaped operations: a recipe ("join and claim the closer
if nobody holds it, if the round is still the one I read") is then a few lines next to the
protocol that needs it, and a backend implements one primitive (DESIGN §2).

This module is pure: the data types, the comparison rule (:meth:`Compare.holds`) and the
request checks every backend applies before sending (:func:`check_txn`).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Union

from backends.types import NO_LEASE, KeyValue, RangeResult
from backends.untrusted import quote

__all__ = [
    "MAX_TXN_DEPTH",
    "MAX_TXN_OPS",
    "MAX_TXN_TOTAL_OPS",
    "Compare",
    "CompareOp",
    "Delete",
    "DeleteResult",
    "Operation",
    "Put",
    "PutResult",
    "Range",
    "Response",
    "Target",
    "Txn",
    "TxnResult",
    "check_txn",
]

MAX_TXN_OPS = 128
"""Most operations in one branch, and most comparisons (etcd's default ``--max-txn-ops``);
more is refused before sending."""

MAX_TXN_DEPTH = 8
"""Deepest nesting of transactions (the outer one is depth 1); deeper is refused before sending.

etcd sets no such bound; ours keeps every backend's decoding of a peer's request bounded, and
no recipe needs more than two levels."""

MAX_TXN_TOTAL_OPS = 1024
"""Most operations and comparisons in one transaction, nested ones included; more is refused
before sending (etcd bounds the request's bytes instead; no recipe comes near this)."""


class Target(enum.Enum):
    """What of a key a :class:`Compare` looks at. An absent key has revisions and version 0."""

    CREATE_REVISION = "create_revision"
    MOD_REVISION = "mod_revision"
    VERSION = "version"
    VALUE = "value"


class CompareOp(enum.Enum):
    """How a :class:`Compare` relates the key's field to its operand."""

    EQUAL = "=="
    NOT_EQUAL = "!="
    LESS = "<"
    GREATER = ">"


@dataclass(frozen=True)
class Compare:
    """One condition of a transaction: ``key``'s ``target`` ``op`` ``operand``.

    Build with the class methods; ``operand`` is an int for revisions and version, bytes for
    the value. Raises ValueError for an operand of the wrong type.
    """

    key: str
    target: Target
    op: CompareOp
    operand: int | bytes

    def __post_init__(self) -> None:
        if self.target is Target.VALUE:
            if not isinstance(self.operand, (bytes, bytearray)):
                raise ValueError(f"A value comparison of {quote(self.key)} needs bytes, not {self.operand!r}.")
            object.__setattr__(self, "operand", bytes(self.operand))
        elif isinstance(self.operand, bool) or not isinstance(self.operand, int) or self.operand < 0:
            raise ValueError(f"A {self.target.value} comparison of {quote(self.key)} needs a non-negative "
                             f"integer, not {self.operand!r}.")

    @classmethod
    def absent(cls, key: str) -> "Compare":
        """Holds while ``key`` does not exist (``create_revision == 0``, as etcd's recipes test it)."""
        return cls(key, Target.CREATE_REVISION, CompareOp.EQUAL, 0)

    @classmethod
    def exists(cls, key: str) -> "Compare":
        """Holds while ``key`` exists."""
        return cls(key, Target.CREATE_REVISION, CompareOp.GREATER, 0)

    @classmethod
    def mod_revision(cls, key: str, revision: int) -> "Compare":
        """Holds while ``key`` was last written at ``revision`` (0: the key is absent)."""
        return cls(key, Target.MOD_REVISION, CompareOp.EQUAL, revision)

    @classmethod
    def created_at(cls, key: str, revision: int) -> "Compare":
        """Holds while ``key`` is the incarnation created at ``revision`` (ownership, as in etcd's mutex)."""
        return cls(key, Target.CREATE_REVISION, CompareOp.EQUAL, revision)

    @classmethod
    def value_is(cls, key: str, value: bytes) -> "Compare":
        """Holds while ``key`` exists and holds exactly ``value``."""
        return cls(key, Target.VALUE, CompareOp.EQUAL, value)

    def holds(self, current: KeyValue | None) -> bool:
        """Whether the comparison holds for a key now ``current`` (None: absent), as etcd judges it.

        A value comparison never holds for an absent key (etcd cannot tell an empty value from
        a missing one, so it fails them all); the other targets read 0 for an absent key.
        """
        if self.target is Target.VALUE:
            if current is None:
                return False
            actual: int | bytes = current.value
        elif current is None:
            actual = 0
        else:
            actual = getattr(current, self.target.value)
        operand = self.operand
        if self.op is CompareOp.EQUAL:
            return actual == operand
        if self.op is CompareOp.NOT_EQUAL:
            return actual != operand
        if self.op is CompareOp.LESS:
            return actual < operand  # type: ignore[operator]
        return actual > operand  # type: ignore[operator]


@dataclass(frozen=True)
class Put:
    """Write ``key`` (bound to ``lease``, 0 for none)."""

    key: str
    value: bytes
    lease: int = NO_LEASE


@dataclass(frozen=True)
class Delete:
    """Delete ``key``, or every key under it with ``prefix``."""

    key: str
    prefix: bool = False


@dataclass(frozen=True)
class Range:
    """Read ``key``, or every key under it with ``prefix``; ``count_only`` returns just how many."""

    key: str
    prefix: bool = False
    count_only: bool = False


@dataclass(frozen=True)
class Txn:
    """A transaction: if every comparison holds, run ``on_success``, else ``on_failure``.

    Used as the argument of :meth:`~backends.api.KVBackend.txn`, and nested as one operation.
    """

    compares: tuple[Compare, ...] = ()
    on_success: tuple["Operation", ...] = ()
    on_failure: tuple["Operation", ...] = ()

    def __post_init__(self) -> None:
        for name in ("compares", "on_success", "on_failure"):
            object.__setattr__(self, name, tuple(getattr(self, name)))

    @property
    def writes(self) -> bool:
        """Whether some branch (nested ones included) may write: such a transaction is not a read."""
        return any(isinstance(op, (Put, Delete)) or (isinstance(op, Txn) and op.writes)
                   for op in self.on_success + self.on_failure)


Operation = Union[Put, Delete, Range, Txn]


@dataclass(frozen=True)
class PutResult:
    """What a :class:`Put` did: the key as it now is."""

    kv: KeyValue


@dataclass(frozen=True)
class DeleteResult:
    """What a :class:`Delete` did: how many keys it deleted."""

    deleted: int


@dataclass(frozen=True)
class TxnResult:
    """What a transaction did.

    Attributes:
        succeeded: whether every comparison held (so ``on_success`` ran).
        revision: the store revision after the transaction (its writes' revision if it wrote).
        responses: one per operation of the branch that ran, in order: :class:`PutResult`,
            :class:`DeleteResult`, :class:`~backends.api.RangeResult` or a nested :class:`TxnResult`.
    """

    succeeded: bool
    revision: int
    responses: tuple["Response", ...] = field(default=())


Response = Union[PutResult, DeleteResult, RangeResult, TxnResult]


def check_txn(txn: Txn, max_value_bytes: int) -> None:
    """Refuse, before sending, what etcd would refuse or what cannot be meant.

    Every check is polynomial in the request's size, so a peer's request cannot make a
    backend work exponentially (a branch of 128 nested transactions has 2**128 paths).

    Raises:
        ValueTooLargeError: a put's value exceeds ``max_value_bytes`` (checked in both branches).
        TypeError: an operation, condition or value of the wrong type.
        ValueError: more than :data:`MAX_TXN_OPS` operations in a branch or comparisons, more
            than :data:`MAX_TXN_TOTAL_OPS` in all, nesting deeper than :data:`MAX_TXN_DEPTH`,
            or a branch that may write one key twice (etcd's "duplicate key given in txn
            request", judged as etcd does).
    """
    total = _check_shape(txn, max_value_bytes, 1)
    if total > MAX_TXN_TOTAL_OPS:
        raise ValueError(f"A transaction has {total} operations and comparisons in all; at most "
                         f"{MAX_TXN_TOTAL_OPS} are accepted.")
    _branch_writes(txn.on_success)
    _branch_writes(txn.on_failure)


def _check_shape(txn: Txn, max_value_bytes: int, depth: int) -> int:
    """Check types, sizes, counts and depth; return how many operations and comparisons in all."""
    from backends.errors import ValueTooLargeError

    if depth > MAX_TXN_DEPTH:
        raise ValueError(f"Transactions are nested {depth} deep; at most {MAX_TXN_DEPTH} levels are accepted.")
    if len(txn.compares) > MAX_TXN_OPS:
        raise ValueError(f"A transaction has {len(txn.compares)} comparisons; etcd accepts at most {MAX_TXN_OPS}.")
    for compare in txn.compares:
        if not isinstance(compare, Compare):
            raise TypeError(f"A transaction condition must be a Compare, not {type(compare).__name__}.")
    total = len(txn.compares)
    for branch in (txn.on_success, txn.on_failure):
        if len(branch) > MAX_TXN_OPS:
            raise ValueError(f"A transaction branch has {len(branch)} operations; etcd accepts at most {MAX_TXN_OPS}.")
        total += len(branch)
        for op in branch:
            if isinstance(op, Put):
                if not isinstance(op.value, (bytes, bytearray)):
                    raise TypeError(f"The value for {quote(op.key)} must be bytes, not {type(op.value).__name__}.")
                if len(op.value) > max_value_bytes:
                    raise ValueTooLargeError(f"The value for {quote(op.key)} has {len(op.value)} bytes; the backend "
                                             f"accepts at most {max_value_bytes}.")
            elif isinstance(op, Txn):
                total += _check_shape(op, max_value_bytes, depth + 1)
                if total > MAX_TXN_TOTAL_OPS:
                    return total
            elif not isinstance(op, (Delete, Range)):
                raise TypeError(f"A transaction operation must be Put, Delete, Range or Txn, not {type(op).__name__}.")
    return total


def _branch_writes(branch: tuple[Operation, ...]) -> tuple[set[str], list[Delete]]:
    """The keys ``branch`` may put and the deletes it may run, refusing overlaps as etcd does.

    etcd's ``checkIntervals``: the two branches of a nested transaction exclude each other, so
    both may put one key; anything else that may run in one pass must not put a key twice, nor
    put a key that a delete covers.
    """
    deletes = [op for op in branch if isinstance(op, Delete)]
    puts: set[str] = set()
    for op in branch:
        if not isinstance(op, Txn):
            continue
        then_puts, then_deletes = _branch_writes(op.on_success)
        else_puts, else_deletes = _branch_writes(op.on_failure)
        for key in then_puts:
            _refuse_put(key, key in puts, deletes)
            puts.add(key)
        for key in else_puts:
            _refuse_put(key, key in puts and key not in then_puts, deletes)
            puts.add(key)
        deletes += then_deletes + else_deletes
    for op in branch:
        if isinstance(op, Put):
            _refuse_put(op.key, op.key in puts, deletes)
            puts.add(op.key)
    return puts, deletes


def _refuse_put(key: str, twice: bool, deletes: list[Delete]) -> None:
    if twice:
        raise ValueError(f"A transaction branch writes {quote(key)} twice; etcd refuses that.")
    for op in deletes:
        if key == op.key or (op.prefix and key.startswith(op.key)):
            raise ValueError(f"A transaction branch both puts and deletes {quote(key)}; etcd refuses that.")
