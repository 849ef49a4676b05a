"""The rendezvous flags of ``elasticrun`` as :class:`~elastic.config.LaunchConfig` fields.

``--rdzv-backend``, ``--rdzv-endpoint``, ``--rdzv-id``, ``--rdzv-conf``, ``--standalone`` and the
static backend's ``--node-rank``/``--master-addr``/``--master-port`` become a run id, the engine's
:class:`~elastic.rendezvous.settings.RendezvousSettings` and a backend spec
(:mod:`elastic.rendezvous.backend_spec`), with torchrun's single-node shortcuts applied. Each
string is parsed here once; the runner and the registry use the typed values.
"""

from __future__ import annotations

from functools import partial
from typing import Any, Callable, Mapping

from backends.endpoints import Endpoint, parse_endpoint
from backends.errors import EndpointError
from elastic.launch.flags import STATIC_DEFAULT_ADDR, STATIC_DEFAULT_PORT
from elastic.launch.values import (
    Sources, as_given, fail, host_address, integer, optional_port, optional_text, sentence_tail,
)
from elastic.rendezvous.backend_spec import (
    BACKEND_NAMES, ETCD_NAMES, BackendSpec, StaticSpec, etcd_endpoints, etcd_spec, standalone_spec, store_endpoint,
    store_spec,
)
from elastic.rendezvous.conf import from_torch, parse_rdzv_conf, unquote_conf
from elastic.rendezvous.errors import RendezvousConfigError
from elastic.rendezvous.settings import RendezvousSettings, settings_from_conf


SpecMaker = Callable[[Mapping[str, str]], BackendSpec]
"""Builds the backend spec from the parsed ``--rdzv-conf`` once the engine settings are valid."""


def rendezvous_fields(sources: Sources, min_nodes: int, max_nodes: int,
                      new_run_id: Callable[[], str], warn: Callable[[str], None]) -> dict[str, Any]:
    """The rendezvous fields of :class:`LaunchConfig` (``run_id``, ``backend``, ``rendezvous``),
    with torchrun's standalone shortcuts applied.

    Errors come in the order a reader meets the flags: backend, endpoint, id, then options.

    Raises:
        ConfigError: one line naming the flag (or its ``PET_*`` twin) and the accepted forms.
    """
    backend_text, backend_where = sources.text("rdzv_backend")
    backend = (backend_text or "").strip().lower()
    if backend not in BACKEND_NAMES:
        hint = " (etcd's v2 API is not supported: use etcd with an etcd v3 server)" if backend == "etcd-v2" else ""
        raise fail(backend_where, f"{backend_text!r} is not one of {', '.join(BACKEND_NAMES)}{hint}")
    endpoint = (sources.text("rdzv_endpoint")[0] or "").strip()
    node_rank = integer(*sources.text("node_rank"), minimum=0)
    master_port = optional_port(*sources.text("master_port"))
    conf = _rdzv_conf(sources, _torch_backend(sources, backend, endpoint, master_port, max_nodes), warn)

    make_spec: SpecMaker = standalone_spec  # --standalone and the single-node shortcuts
    if sources.switch("standalone"):
        if (min_nodes, max_nodes) != (1, 1):
            raise fail("--standalone", f"runs a single node, so --nnodes must be 1 or 1:1 "
                                       f"(got {sources.text('nnodes')[0]})")
        for dest in ("rdzv_backend", "rdzv_endpoint", "rdzv_id"):
            if sources.explicit(dest):
                warn(f"--standalone ignores {as_given(sources, dest)}")
        run_id, why = new_run_id(), "--standalone"
    elif backend == "static" and not endpoint and master_port is None and max_nodes == 1:
        # torchrun's shortcut: one static node with no master port runs standalone, so that jobs
        # stacked on one host never share a port.
        run_id = _run_id(sources) if sources.explicit("rdzv_id") else new_run_id()
        why = "a standalone store (one static node without --master-port)"
    elif backend == "static":
        run_id, why = _run_id(sources), ""
        make_spec = _static(sources, endpoint, min_nodes, max_nodes, node_rank, master_port, warn)
    else:
        run_id = _run_id(sources)
        make_spec, why = _dynamic(sources, backend, endpoint, max_nodes, warn)
    if why:
        _warn_static_only(sources, node_rank, why, warn)
    settings = _settings(sources, run_id, min_nodes, max_nodes, conf)
    try:
        spec = make_spec(conf)
    except RendezvousConfigError as error:
        raise fail(sources.texts("rdzv_conf")[1], sentence_tail(error)) from error
    return {"run_id": run_id, "backend": spec, "rendezvous": settings}


def _run_id(sources: Sources) -> str:
    return (sources.text("rdzv_id")[0] or "").strip()


def _rdzv_conf(sources: Sources, torch_backend: str, warn: Callable[[str], None]) -> Mapping[str, str]:
    """``--rdzv-conf`` in our vocabulary (torch's keys mapped, as torchrun's plugin maps them);
    a torch key that has no effect here is said once, through ``warn``."""
    texts, where = sources.texts("rdzv_conf")
    texts = [_unquoted(text, where, warn) for text in texts]
    try:
        conf = from_torch(parse_rdzv_conf(texts), torch_backend)
    except RendezvousConfigError as error:
        raise fail(where, sentence_tail(error)) from error
    for note in conf.notes:
        warn(note)
    return conf.values


def _unquoted(text: str, where: str, warn: Callable[[str], None]) -> str:
    """``text`` without one pair of quotes around it (:func:`unquote_conf`), said in one line."""
    inner = unquote_conf(text)
    if inner is None:
        return text
    warn(f"{where}: took the quotes off {text.strip()} (a shell would have removed them)")
    return inner


def _torch_backend(sources: Sources, backend: str, endpoint: str, master_port: int | None, max_nodes: int) -> str:
    """The backend torchrun would run this command line on: its single-node shortcuts run c10d."""
    if sources.switch("standalone") or (backend == "static" and not endpoint and master_port is None
                                        and max_nodes == 1):
        return "c10d"
    return backend


def _static(sources: Sources, endpoint: str, min_nodes: int, max_nodes: int, node_rank: int,
            master_port: int | None, warn: Callable[[str], None]) -> SpecMaker:
    if min_nodes != max_nodes:
        raise fail(sources.text("nnodes")[1], f"the static backend needs a fixed node count (got "
                   f"{min_nodes}:{max_nodes}); elastic ranges need --rdzv-backend etcd, c10d or tcp")
    if node_rank >= max_nodes:
        raise fail(sources.text("node_rank")[1], f"{node_rank} is not below the node count ({max_nodes}) "
                                                 "of the static backend")
    if endpoint:
        master = _endpoint(endpoint, STATIC_DEFAULT_PORT, sources.text("rdzv_endpoint")[1])
        for dest in ("master_addr", "master_port"):
            if sources.explicit(dest):
                warn(f"{as_given(sources, dest)} is ignored: --rdzv-endpoint {endpoint} names the master")
    else:
        addr_text, addr_where = sources.text("master_addr")
        addr = host_address(optional_text(addr_text)) or STATIC_DEFAULT_ADDR
        port = master_port or STATIC_DEFAULT_PORT
        master = _endpoint(Endpoint(addr, port).netloc, port, addr_where)
    return lambda _conf: StaticSpec(node_rank, master)  # the static backend reads no --rdzv-conf key


def _dynamic(sources: Sources, backend: str, endpoint: str, max_nodes: int,
             warn: Callable[[str], None]) -> tuple[SpecMaker, str]:
    """The spec maker of an etcd or store backend, and why static-only flags are ignored."""
    where = sources.text("rdzv_endpoint")[1]
    if not endpoint:
        example = "etcd-0:2379,etcd-1:2379" if backend in ETCD_NAMES else "node0:29400"
        raise fail(where, f"the {backend} backend needs an endpoint, such as --rdzv-endpoint {example}")
    free_port = backend == "c10d" and _free_port(endpoint)
    try:
        if backend in ETCD_NAMES:
            make_spec: SpecMaker = partial(etcd_spec, backend, etcd_endpoints(endpoint))
        else:
            make_spec = partial(store_spec, backend,
                                store_endpoint(backend, endpoint.rpartition(":")[0] if free_port else endpoint))
    except RendezvousConfigError as error:
        raise fail(where, sentence_tail(error)) from error
    if free_port:
        if max_nodes != 1:
            raise fail(where, f"port 0 (a free port) only works for a single node (--nnodes is {max_nodes})")
        return standalone_spec, f"a standalone store (c10d on {endpoint})"
    if not sources.explicit("rdzv_id"):
        warn(f"--rdzv-id is not set: every job using the id {_run_id(sources)!r} on {endpoint} joins the same "
             "rendezvous; give each job its own id")
    return make_spec, f"the {backend} backend"


def _free_port(endpoint: str) -> bool:
    """``HOST:0``: c10d's request for a free port (a standalone store)."""
    _, colon, port = endpoint.rpartition(":")
    return bool(colon) and port == "0" and "," not in endpoint


def _endpoint(text: str, default_port: int, where: str) -> Endpoint:
    try:
        return parse_endpoint(text, default_port)
    except EndpointError as error:
        raise fail(where, sentence_tail(error)) from error


def _warn_static_only(sources: Sources, node_rank: int, why: str, warn: Callable[[str], None]) -> None:
    """torchrun warns that these flags only serve the static backend; so do we, when they were set."""
    for dest in ("master_addr", "master_port", "node_rank"):
        if sources.explicit(dest) and (dest != "node_rank" or node_rank != 0):
            warn(f"{as_given(sources, dest)} is ignored: only the static backend uses it, and this run uses {why}")


def _settings(sources: Sources, run_id: str, min_nodes: int, max_nodes: int,
              conf: Mapping[str, str]) -> RendezvousSettings:
    """The engine's settings, built once here so a bad id or option fails now, not on a node later."""
    try:
        RendezvousSettings(run_id, min_nodes, max_nodes)
    except RendezvousConfigError as error:
        raise fail(sources.text("rdzv_id")[1], sentence_tail(error)) from error
    try:
        return settings_from_conf(run_id, min_nodes, max_nodes, conf)
    except RendezvousConfigError as error:
        raise fail(sources.texts("rdzv_conf")[1], sentence_tail(error)) from error
