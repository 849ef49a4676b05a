"""The worker environment ``elasticrun`` (or torchrun) gives, parsed for RPC; and RPC options.

Pure: functions of the mapping they are given (``os.environ`` only when the caller passes it),
no torch, no I/O, so the agent-side code and the tests can use it freely.

An RPC worker is named ``f"{role}{role_rank}"`` (``trainer0``, ``ps1``): with one role per job,
as ``elasticrun`` runs, the role rank is the global rank; with several roles each role counts
from 0. Its RPC rank (torch's *worker id*, the top 16 bits of its distributed autograd ids) is
the global ``RANK``. A role name must not end in a digit, so a name splits back into role and
role rank without ambiguity (``worker1`` + ``0`` would read as ``worker`` + ``10``).

Variables read:

==============================  ==============================================================
``RANK``, ``WORLD_SIZE``        required; the RPC rank and the group size
``MASTER_ADDR``/``MASTER_PORT`` required; where rank 0 hosts the store of this attempt
``ROLE_NAME``                   default ``worker``
``ROLE_RANK``/``ROLE_WORLD_SIZE``  both or neither; default ``RANK``/``WORLD_SIZE``
``LOCAL_RANK``                  default 0
``TORCHELASTIC_RESTART_COUNT``  default 0; part of the store prefix of each attempt
``TORCHELASTIC_RUN_ID``         default ``none``; part of the store prefix
``TORCHELASTIC_USE_AGENT_STORE``  ``True``: the agent hosts the store (torchrun), connect only
``ELASTIC_RPC_TIMEOUT`` ...     RPC options, see :class:`RpcOptions`
==============================  ==============================================================
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Mapping

from rpc.errors import RpcOptionsError, WorkerEnvError

__all__ = [
    "DEFAULT_ROLE",
    "MAX_WORKERS",
    "OPTION_VARS",
    "REQUIRED_VARS",
    "RpcOptions",
    "RpcWorkerEnv",
    "parse_worker_name",
    "worker_name",
]

REQUIRED_VARS = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
DEFAULT_ROLE = "worker"
MAX_WORKERS = 1 << 16
"""torch keeps the worker id in the top 16 bits of every context and message id."""
MAX_NAME_LENGTH = 127
"""torch refuses worker names of 128 characters or more."""

_ROLE = re.compile(r"[A-Za-z0-9_:\-]*[A-Za-z_:\-]")
_NAME = re.compile(r"(?P<role>.*[^0-9])(?P<rank>0|[1-9][0-9]*)")


def worker_name(role: str, role_rank: int) -> str:
    """The RPC name of worker ``role_rank`` of ``role``: ``f"{role}{role_rank}"``.

    Raises:
        WorkerEnvError: the role is not a valid role name, or the rank is negative.
    """
    _check_role(role)
    if role_rank < 0:
        raise WorkerEnvError(f"The role rank ({role_rank}) must not be negative.")
    name = f"{role}{role_rank}"
    if len(name) > MAX_NAME_LENGTH:
        raise WorkerEnvError(f"The worker name {name!r} is longer than torch's {MAX_NAME_LENGTH} characters.")
    return name


def parse_worker_name(name: str) -> tuple[str, int] | None:
    """``(role, role_rank)`` of a name made by :func:`worker_name`, or ``None`` for other names."""
    match = _NAME.fullmatch(name)
    if match is None or not _ROLE.fullmatch(match["role"]):
        return None
    return match["role"], int(match["rank"])


def _check_role(role: str) -> None:
    if not _ROLE.fullmatch(role):
        raise WorkerEnvError(
            f"The role name ({role!r}) must be non-empty, use only letters, digits, '_', ':' and '-', "
            "and must not end with a digit (the role rank is appended to it)."
        )


@dataclass(frozen=True)
class RpcWorkerEnv:
    """One worker's identity for RPC, validated on construction.

    Raises (on construction):
        WorkerEnvError: a value is out of range or inconsistent with another; the message says which.
    """

    rank: int
    world_size: int
    master_addr: str
    master_port: int
    role: str = DEFAULT_ROLE
    role_rank: int | None = None
    role_world_size: int | None = None
    local_rank: int = 0
    restart_count: int = 0
    run_id: str = "none"
    use_agent_store: bool = False

    def __post_init__(self) -> None:
        if self.role_rank is None:
            object.__setattr__(self, "role_rank", self.rank)
        if self.role_world_size is None:
            object.__setattr__(self, "role_world_size", self.world_size)
        if not 1 <= self.world_size <= MAX_WORKERS:
            raise WorkerEnvError(
                f"WORLD_SIZE ({self.world_size}) must be from 1 to {MAX_WORKERS} "
                "(torch keeps the worker id in 16 bits)."
            )
        if not 0 <= self.rank < self.world_size:
            raise WorkerEnvError(f"RANK ({self.rank}) must be less than WORLD_SIZE ({self.world_size}).")
        if not 1 <= self.role_world_size <= self.world_size:
            raise WorkerEnvError(
                f"ROLE_WORLD_SIZE ({self.role_world_size}) must be from 1 to WORLD_SIZE ({self.world_size})."
            )
        if not 0 <= self.role_rank < self.role_world_size:
            raise WorkerEnvError(
                f"ROLE_RANK ({self.role_rank}) must be less than ROLE_WORLD_SIZE ({self.role_world_size})."
            )
        if not self.master_addr:
            raise WorkerEnvError("MASTER_ADDR must not be empty.")
        if not 0 < self.master_port < 65536:
            raise WorkerEnvError(f"MASTER_PORT ({self.master_port}) must be from 1 to 65535.")
        if self.restart_count < 0:
            raise WorkerEnvError(f"TORCHELASTIC_RESTART_COUNT ({self.restart_count}) must not be negative.")
        worker_name(self.role, self.role_rank)  # validates the role and the name's length

    @property
    def name(self) -> str:
        """This worker's RPC name, ``f"{role}{role_rank}"``."""
        return worker_name(self.role, self.role_rank)

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> RpcWorkerEnv:
        """Parse the variables listed in the module docstring.

        Raises:
            WorkerEnvError: required variables are missing (all of them are named), a value is not
                an integer, or the values are inconsistent.
        """
        missing = [var for var in REQUIRED_VARS if not environ.get(var, "").strip()]
        if missing:
            raise WorkerEnvError(
                f"The worker environment is missing {', '.join(missing)}: start the script with "
                "elasticrun (or torchrun), or set RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT."
            )
        has_role_rank, has_role_size = bool(environ.get("ROLE_RANK")), bool(environ.get("ROLE_WORLD_SIZE"))
        if has_role_rank != has_role_size:
            given, absent = ("ROLE_RANK", "ROLE_WORLD_SIZE") if has_role_rank else ("ROLE_WORLD_SIZE", "ROLE_RANK")
            raise WorkerEnvError(f"{given} is set but {absent} is not: set both or neither.")
        return cls(
            rank=_integer(environ, "RANK"),
            world_size=_integer(environ, "WORLD_SIZE"),
            master_addr=environ["MASTER_ADDR"].strip(),
            master_port=_integer(environ, "MASTER_PORT"),
            role=environ.get("ROLE_NAME") or DEFAULT_ROLE,
            role_rank=_integer(environ, "ROLE_RANK") if has_role_rank else None,
            role_world_size=_integer(environ, "ROLE_WORLD_SIZE") if has_role_size else None,
            local_rank=_integer(environ, "LOCAL_RANK", default=0),
            restart_count=_integer(environ, "TORCHELASTIC_RESTART_COUNT", default=0),
            run_id=environ.get("TORCHELASTIC_RUN_ID") or "none",
            use_agent_store=environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True",
        )


def _integer(environ: Mapping[str, str], var: str, default: int | None = None) -> int:
    text = environ.get(var, "").strip()
    if not text and default is not None:
        return default
    if not text.isdigit():
        raise WorkerEnvError(f"{var} ({text!r}) must be a non-negative integer.")
    return int(text)


# -- options -----------------------------------------------------------------------------------

OPTION_VARS = {
    "rpc_timeout": "ELASTIC_RPC_TIMEOUT",
    "init_timeout": "ELASTIC_RPC_INIT_TIMEOUT",
    "num_worker_threads": "ELASTIC_RPC_NUM_THREADS",
    "shutdown_timeout": "ELASTIC_RPC_SHUTDOWN_TIMEOUT",
    "sigterm_timeout": "ELASTIC_RPC_SIGTERM_TIMEOUT",
    "transports": "ELASTIC_RPC_TRANSPORTS",
}
"""Each option's environment variable (an argument to :func:`rpc.start` wins over it)."""

TRANSPORTS = ("uv", "shm", "ibv")
"""TensorPipe's transports in torch 2.13: TCP via libuv, shared memory, InfiniBand verbs."""


@dataclass(frozen=True)
class RpcOptions:
    """How RPC runs in this worker.

    Attributes:
        rpc_timeout: seconds an RPC may take before it fails (torch's default is 60).
        init_timeout: seconds to reach the store and the other workers when starting.
        num_worker_threads: threads of the TensorPipe agent serving requests (torch's default 16).
        shutdown_timeout: seconds a graceful shutdown waits for the other workers; 0 (the
            default, as torch) waits as long as they work: a passive worker (a parameter
            server) legitimately waits for the whole job. A dead peer does not make it hang under
            an agent: the agent stops the group with SIGTERM, which exits within
            ``sigterm_timeout``. Set it when running without an agent.
        sigterm_timeout: seconds the SIGTERM handler gives the local shutdown before exiting.
        transports: TensorPipe transports, in order of preference; ``None`` (``auto``) lets torch
            choose (shm first on one host). The default is ``("uv",)``: measured with torch 2.13,
            the shm transport busy-polls, and an *idle* RPC worker then burns a whole core
            (4.9 s of CPU in 5 s), which starves the training itself on a CPU host; uv idles at 0.

    Raises (on construction):
        RpcOptionsError: a timeout is not a positive finite number (the shutdown timeout may be
            0), or the thread count is < 1.
    """

    rpc_timeout: float = 60.0
    init_timeout: float = 120.0
    num_worker_threads: int = 16
    shutdown_timeout: float = 0.0
    sigterm_timeout: float = 5.0
    transports: tuple[str, ...] | None = ("uv",)

    def __post_init__(self) -> None:
        for field_name in ("rpc_timeout", "init_timeout", "sigterm_timeout"):
            value = getattr(self, field_name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                what = field_name.replace("_", " ")
                raise RpcOptionsError(f"The {what} ({value!r}) must be a positive number of seconds.")
        value = self.shutdown_timeout
        if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
            raise RpcOptionsError(
                f"The shutdown timeout ({value!r}) must be 0 (no limit) or a positive number of seconds."
            )
        if not isinstance(self.num_worker_threads, int) or self.num_worker_threads < 1:
            raise RpcOptionsError(f"The number of worker threads ({self.num_worker_threads!r}) must be at least 1.")
        if self.transports is not None:
            object.__setattr__(self, "transports", tuple(self.transports))
            unknown = [name for name in self.transports if name not in TRANSPORTS]
            if not self.transports or unknown:
                raise RpcOptionsError(
                    f"The transports ({', '.join(self.transports) or 'none'}) must be one or more of "
                    f"{', '.join(TRANSPORTS)}, or auto."
                )

    @classmethod
    def resolve(cls, environ: Mapping[str, str], **overrides: object) -> RpcOptions:
        """Options from ``overrides`` (``None`` means "not given"), else the environment, else defaults.

        Transports are a sequence or a comma-separated string (``"uv"``, ``"shm,uv"``, ``"auto"``).

        Raises:
            RpcOptionsError: an unknown option, a variable that is not a number, or an invalid value.
        """
        unknown = sorted(set(overrides) - set(OPTION_VARS))
        if unknown:
            raise RpcOptionsError(f"Unknown RPC option(s) {', '.join(unknown)}; valid: {', '.join(OPTION_VARS)}.")
        values: dict[str, object] = {}
        for field_name, var in OPTION_VARS.items():
            given = overrides.get(field_name)
            text = environ.get(var, "").strip()
            if given is not None:
                values[field_name] = _transports(given) if field_name == "transports" else given
            elif field_name == "transports" and text:
                values[field_name] = _transports(text)
            elif text:
                values[field_name] = _number(text, var, integer=field_name == "num_worker_threads")
        return cls(**values)


def _number(text: str, var: str, *, integer: bool) -> float | int:
    try:
        return int(text) if integer else float(text)
    except ValueError:
        kind = "an integer" if integer else "a number of seconds"
        raise RpcOptionsError(f"{var} ({text!r}) must be {kind}.") from None


def _transports(value: object) -> tuple[str, ...] | None:
    names = [part.strip() for part in value.split(",")] if isinstance(value, str) else list(value)
    if names == ["auto"]:
        return None
    return tuple(name for name in names if name)
