"""The init method of one RPC attempt: an ``elastic-rpc://`` URL and the store behind it.

``init_rpc`` only takes a URL, so we register a rendezvous scheme with torch
(``torch.distributed.register_rendezvous_handler``, public API) whose handler returns the
attempt's store: a ``TCPStore`` on ``MASTER_ADDR:MASTER_PORT`` wrapped in a ``PrefixStore``
named after the run and the restart count.

Why this is fresh for every attempt:

* ``elasticrun`` picks ``MASTER_PORT`` afresh for every round (DESIGN §4.6) and rank 0 of the
  attempt hosts the store in its own process, so a new attempt talks to a new, empty server.
* The prefix ``etcd-elastic/rpc/<run id>/restart-<n>`` keeps attempts apart on a store that
  outlives them (torchrun's agent-hosted store, ``TORCHELASTIC_USE_AGENT_STORE=True``, where
  every worker connects as a client). torchrun does not bump the restart count on a membership
  change, so there only the port (new per torchrun round when the store is not shared) tells
  those attempts apart.
* The server is multi-tenant, as torch's own ``env://`` one: a script that also calls
  ``init_process_group`` on the same ``MASTER_PORT`` shares rank 0's listening socket, and the
  prefix keeps the two sets of keys apart.

The URL carries the store timeout (``init_timeout``): torch's ``init_rpc`` would otherwise wait
for the store with the process-group default of 30 minutes.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterator
from urllib.parse import parse_qs, quote, unquote, urlparse

from rpc.errors import RpcInitError

if TYPE_CHECKING:
    from rpc.env import RpcWorkerEnv

__all__ = ["SCHEME", "StoreSpec", "init_method", "parse_init_method", "register", "store_prefix"]

SCHEME = "elastic-rpc"

_registered = False
_register_lock = threading.Lock()


@dataclass(frozen=True)
class StoreSpec:
    """Where the store of an attempt is and how to open it."""

    host: str
    port: int
    prefix: str
    timeout: float
    agent_store: bool


def store_prefix(env: RpcWorkerEnv) -> str:
    """The key prefix of this attempt: the run id and the restart count."""
    return f"etcd-elastic/rpc/{env.run_id}/restart-{env.restart_count}"


def init_method(env: RpcWorkerEnv, init_timeout: float) -> str:
    """The ``elastic-rpc://`` URL of this attempt (rank and world size are added by torch)."""
    host = f"[{env.master_addr}]" if ":" in env.master_addr else env.master_addr
    agent = 1 if env.use_agent_store else 0
    path = quote(store_prefix(env), safe="")
    return f"{SCHEME}://{host}:{env.master_port}/{path}?timeout={init_timeout:g}&agent_store={agent}"


def parse_init_method(url: str) -> tuple[StoreSpec, int, int]:
    """``(spec, rank, world_size)`` from a URL made by :func:`init_method` plus torch's query.

    Raises:
        RpcInitError: the URL is not an ``elastic-rpc://`` URL with a host, port, prefix, timeout,
            rank and world size.
    """
    parsed = urlparse(url)
    query = {key: values[-1] for key, values in parse_qs(parsed.query).items()}
    try:
        if parsed.scheme != SCHEME or not parsed.hostname or parsed.port is None:
            raise ValueError("scheme, host or port missing")
        spec = StoreSpec(
            host=parsed.hostname,
            port=parsed.port,
            prefix=unquote(parsed.path.lstrip("/")),
            timeout=float(query["timeout"]),
            agent_store=query.get("agent_store") == "1",
        )
        rank, world_size = int(query["rank"]), int(query["world_size"])
    except (KeyError, ValueError) as error:
        raise RpcInitError(f"The init method {url!r} is not a complete {SCHEME}:// URL ({error}).") from error
    if not spec.prefix:
        raise RpcInitError(f"The init method {url!r} has no store prefix.")
    return spec, rank, world_size


def register() -> None:
    """Register the ``elastic-rpc://`` scheme with torch, once per process (imports torch)."""
    global _registered
    with _register_lock:
        if _registered:
            return
        import torch.distributed as dist

        try:
            dist.register_rendezvous_handler(SCHEME, _handler)
        except RuntimeError as error:  # registered by another copy of this module
            if "already registered" not in str(error):
                raise
        _registered = True


def _handler(url: str, **_: object) -> Iterator[tuple[object, int, int]]:
    """torch's rendezvous-handler protocol: yield ``(store, rank, world_size)`` once."""
    from datetime import timedelta

    import torch.distributed as dist

    spec, rank, world_size = parse_init_method(url)
    hosts = rank == 0 and not spec.agent_store
    store = dist.TCPStore(
        host_name=spec.host,
        port=spec.port,
        world_size=world_size,
        is_master=hosts,
        timeout=timedelta(seconds=spec.timeout),
        multi_tenant=True,
    )
    yield dist.PrefixStore(spec.prefix, store), rank, world_size
    raise RuntimeError(f"The {SCHEME}:// init method cannot rendezvous twice; start a new attempt instead.")
