"""Turn an ``elasticrun`` command line and its environment into a validated :class:`LaunchConfig`.

Every torchrun 2.13 flag is accepted with its default, both spellings (``--nproc-per-node`` and
``--nproc_per_node``) and its ``PET_*`` environment twin (the command line wins; an empty
variable counts as unset); :mod:`elastic.launch.flags` is the table the scanning, the validation
and ``--help`` are built from.

The command line is split by hand rather than by argparse's ``REMAINDER``, which drops a ``--``
that follows the script: everything from the first word that is not a launcher flag (or that
follows a ``--``) is the training command and reaches the workers untouched.

:func:`config_from_args` is pure: the environment, the device counts, the run-id generator and
the warning sink are injected. Bad input raises :class:`ConfigError` with one line naming the
flag (or its ``PET_*`` twin) and the accepted forms; :func:`parse_or_exit` prints that line and
exits with status 2, as argparse does.
"""

from __future__ import annotations

import difflib
import logging
import math
import re
import shlex
import signal
import sys
import uuid
from dataclasses import dataclass, fields
from functools import partial
from typing import Any, Callable, Mapping, Sequence, TextIO

from backends.endpoints import Endpoint, parse_endpoint
from backends.errors import EndpointError
from elastic import __version__
from elastic.config import Entrypoint, LaunchConfig, Std, StdMask
from elastic.launch.devices import DeviceProbe, HostDevices
from elastic.launch.flags import (
    COMPAT, HELP_FLAGS, NUMA_MODES, OPTIONS, OPTIONS_BY_DEST, OPTIONS_BY_FLAG, PROG, SHUTDOWN_TIMEOUT_ENV,
    START_METHODS, STATIC_DEFAULT_ADDR, STATIC_DEFAULT_PORT, VERSION_FLAGS, Option, format_help,
)
from elastic.rendezvous.errors import RendezvousConfigError
from elastic.rendezvous.backend_spec import (
    BACKEND_NAMES, ETCD_NAMES, BackendSpec, StaticSpec, etcd_endpoints, etcd_spec, standalone_spec, store_endpoint,
    store_spec,
)
from elastic.rendezvous.conf import parse_rdzv_conf
from elastic.rendezvous.settings import RendezvousSettings, settings_from_conf

log = logging.getLogger(__name__)

_UNCATCHABLE_SIGNALS = ("SIGKILL", "SIGSTOP")


class ConfigError(ValueError):
    """The command line or a ``PET_*`` variable is invalid; the message is one line naming it."""


class HelpRequested(Exception):
    """``-h``/``--help`` was given; :attr:`text` is the help to print (the run stops with status 0)."""

    def __init__(self, text: str) -> None:
        super().__init__("help requested")
        self.text = text


# -- splitting the command line ----------------------------------------------------------------


def split_command_line(argv: Sequence[str]) -> tuple[dict[str, list[str]], list[str]]:
    """Separate the launcher's flags from the training command.

    Returns ``({dest: [text, ...]}, [script, *script_args])``; a switch given records ``"1"``.
    The command starts at the first word that is not a flag or a flag's value, or after ``--``.

    Raises:
        ConfigError: an unknown flag, a missing value, or a value given to a switch.
        HelpRequested: ``-h``/``--help`` (or ``--version``) appeared before the script.
    """
    given: dict[str, list[str]] = {}
    index = 0
    while index < len(argv):
        word = argv[index]
        if word == "--":
            return given, list(argv[index + 1:])
        if not word.startswith("-") or word == "-":
            return given, list(argv[index:])
        if word in HELP_FLAGS:
            raise HelpRequested(format_help())
        if word in VERSION_FLAGS:
            raise HelpRequested(f"{PROG} {__version__}\n")
        flag, value = _split_flag(word)
        option = OPTIONS_BY_FLAG.get(flag)
        if option is None:
            raise ConfigError(f"{flag}: unknown flag{_did_you_mean(flag)} (see {PROG} --help)")
        if not option.takes_value:
            if value is not None:
                raise ConfigError(f"{option.name}: a switch takes no value (got {value!r})")
            value = "1"
        elif value is None:
            following = argv[index + 1] if index + 1 < len(argv) else None
            if following is None or (following.startswith("-") and _split_flag(following)[0] in OPTIONS_BY_FLAG):
                raise ConfigError(f"{option.name}: expects a value ({option.metavar})")
            value = following
            index += 1
        given.setdefault(option.dest, []).append(value)
        index += 1
    return given, []


def _split_flag(word: str) -> tuple[str, str | None]:
    """``--a=b`` -> (``--a``, ``b``); ``-r3`` / ``-r=3`` -> (``-r``, ``3``); ``--a`` -> (``--a``, None)."""
    if word.startswith("--"):
        flag, equals, value = word.partition("=")
        return flag, value if equals else None
    if len(word) > 2:
        return word[:2], word[3:] if word[2] == "=" else word[2:]
    return word, None


def _did_you_mean(flag: str) -> str:
    """A suggestion for a misspelt or abbreviated flag (flags are never abbreviated silently)."""
    longer = [known for known in OPTIONS_BY_FLAG if len(flag) > 2 and known.startswith(flag)]
    close = longer[:1] or difflib.get_close_matches(flag, list(OPTIONS_BY_FLAG), n=1, cutoff=0.75)
    return f"; did you mean {close[0]}?" if close else ""


@dataclass(frozen=True)
class _Sources:
    """Where each flag's text comes from: the command line (last one wins), else its ``PET_*``
    twin (if set and not empty), else the table's default. ``where`` names it in messages."""

    command_line: Mapping[str, list[str]]
    environ: Mapping[str, str]

    def text(self, dest: str) -> tuple[str | None, str]:
        option = OPTIONS_BY_DEST[dest]
        if dest in self.command_line:
            return self.command_line[dest][-1], option.name
        from_env = self._from_env(option)
        if from_env is not None:
            return from_env, f"{option.name} (from {option.env_name})"
        return option.default, option.name

    def texts(self, dest: str) -> tuple[list[str], str]:
        """All values of a repeatable flag; the command line replaces the environment, as for any flag."""
        option = OPTIONS_BY_DEST[dest]
        if dest in self.command_line:
            return list(self.command_line[dest]), option.name
        from_env = self._from_env(option)
        if from_env is not None:
            return [from_env], f"{option.name} (from {option.env_name})"
        return ([option.default] if option.default else []), option.name

    def switch(self, dest: str) -> bool:
        text, where = self.text(dest)
        if text is None:
            return False
        return _truth(text, where)

    def explicit(self, dest: str) -> bool:
        """Whether the user set this flag (on the command line or through its twin)."""
        return dest in self.command_line or self._from_env(OPTIONS_BY_DEST[dest]) is not None

    def _from_env(self, option: Option) -> str | None:
        if option.env_name is None:
            return None
        value = self.environ.get(option.env_name, "")
        return value if value.strip() else None


# -- values ------------------------------------------------------------------------------------


def _fail(where: str, problem: str) -> ConfigError:
    return ConfigError(f"{where}: {problem}")


def _sentence_tail(error: Exception) -> str:
    """A foreign error's message, lower-cased at the start so it reads after ``--flag: ``."""
    text = " ".join(str(error).split())
    return text[:1].lower() + text[1:] if text[:2] != text[:2].upper() else text


def _truth(text: str, where: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("true", "yes", "on"):
        return True
    if lowered in ("false", "no", "off"):
        return False
    try:
        return int(lowered) != 0
    except ValueError:
        raise _fail(where, f"{text!r} is not 1 or 0 (true or false)") from None


def _integer(text: str | None, where: str, minimum: int, maximum: int | None = None) -> int:
    stripped = (text or "").strip()
    value = int(stripped) if re.fullmatch(r"[0-9]+", stripped) else None
    if value is None or value < minimum or (maximum is not None and value > maximum):
        bounds = f"from {minimum} to {maximum}" if maximum is not None else f">= {minimum}"
        raise _fail(where, f"{text!r} is not a whole number {bounds}")
    return value


def _optional_port(text: str | None, where: str) -> int | None:
    if text is None or not text.strip():
        return None
    return _integer(text, where, 1, 65535)


def _seconds(text: str | None, where: str, *, zero_allowed: bool = False) -> float:
    try:
        value = float(text or "")
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0 or (value == 0 and not zero_allowed):
        kind = "a number of seconds >= 0" if zero_allowed else "a positive number of seconds"
        raise _fail(where, f"{text!r} is not {kind}")
    return value


def _choice(text: str | None, where: str, choices: Sequence[str]) -> str:
    if text not in choices:
        raise _fail(where, f"{text!r} is not one of {', '.join(choices)}")
    return text


def _optional_text(text: str | None) -> str | None:
    return text.strip() if text and text.strip() else None


def _host_address(text: str | None) -> str | None:
    """An address as workers and sockets take it: an IPv6 literal without its URL brackets."""
    if text and text.startswith("[") and text.endswith("]"):
        return text[1:-1]
    return text


def _nnodes(text: str | None, where: str) -> tuple[int, int]:
    match = re.fullmatch(r"\s*([0-9]+)\s*(?::\s*([0-9]+)\s*)?", text or "")
    low = int(match[1]) if match else 0
    high = int(match[2]) if match and match[2] else low
    if not match or low < 1 or high < low:
        raise _fail(where, f"{text!r} is not N or MIN:MAX with 1 <= MIN <= MAX")
    return low, high


def _nproc(text: str | None, where: str, devices: DeviceProbe) -> tuple[int, str]:
    """The worker count and how it was decided (``"2"``, ``"auto: 4 GPUs"``, ``"cpu: 8 cores"``)."""
    word = (text or "").strip().lower()
    if re.fullmatch(r"[0-9]+", word):
        if int(word) < 1:
            raise _fail(where, f"{text!r} is not a positive number, auto, cpu or gpu")
        return int(word), str(int(word))
    if word == "cpu":
        cores = devices.cpu_count()
        return cores, f"cpu: {cores} cores"
    if word in ("gpu", "auto"):
        gpus = devices.gpu_count()
        if gpus > 0:
            return gpus, f"{word}: {gpus} GPU{'s' if gpus != 1 else ''}"
        if word == "gpu":
            raise _fail(where, "'gpu' needs an NVIDIA GPU and none is visible (driver, nvidia-smi, "
                               "CUDA_VISIBLE_DEVICES); give a number, auto or cpu")
        cores = devices.cpu_count()
        return cores, f"auto: no GPU, {cores} cores"
    if word == "xpu":
        raise _fail(where, "'xpu' is not detected by elasticrun (NVIDIA GPUs only); give a number")
    raise _fail(where, f"{text!r} is not a positive number, auto, cpu or gpu")


_STD_FORMS = "0-3 (0 none, 1 stdout, 2 stderr, 3 both) or LOCAL_RANK:0-3,... such as 0:1,1:2"


def _std_mask(text: str | None, where: str) -> StdMask:
    stripped = (text or "").strip()
    if re.fullmatch(r"[0-3]", stripped):
        return StdMask(Std(int(stripped)))
    per_rank: dict[int, Std] = {}
    for item in stripped.split(","):
        match = re.fullmatch(r"\s*([0-9]+)\s*:\s*([0-3])\s*", item)
        if match is None:
            raise _fail(where, f"{text!r} is not {_STD_FORMS}")
        per_rank[int(match[1])] = Std(int(match[2]))
    return StdMask(Std.NONE, per_rank)


def _local_ranks(text: str | None, where: str) -> frozenset[int] | None:
    if not text or not text.strip():
        return None
    items = [item.strip() for item in text.split(",")]
    if not all(re.fullmatch(r"[0-9]+", item) for item in items):
        raise _fail(where, f"{text!r} is not a comma-separated list of local ranks, such as 0,1")
    return frozenset(int(item) for item in items)


def _modules(text: str | None, where: str) -> tuple[str, ...]:
    """``--prewarm-modules``: dotted module names, comma-separated, at least one."""
    names = tuple(name.strip() for name in (text or "").split(",") if name.strip())
    if not names:
        raise _fail(where, "name at least one module, e.g. torch or torch,numpy")
    for name in names:
        if not all(part.isidentifier() for part in name.split(".")):
            raise _fail(where, f"{name!r} is not a module name (dotted identifiers, e.g. torch.distributed)")
    return names


def _signals(text: str | None, where: str) -> tuple[str, ...]:
    names: list[str] = []
    for item in (text or "").split(","):
        item = item.strip().upper()
        if not item:
            continue
        name = item if item.startswith("SIG") else f"SIG{item}"
        if name in _UNCATCHABLE_SIGNALS:
            raise _fail(where, f"{name} cannot be caught, so it cannot be forwarded")
        if name not in signal.Signals.__members__:
            raise _fail(where, f"{item!r} is not a signal name here; expected names such as SIGTERM,SIGINT,SIGUSR1")
        if name not in names:
            names.append(name)
    if not names:
        raise _fail(where, f"{text!r} names no signal; expected names such as SIGTERM,SIGINT,SIGHUP,SIGQUIT")
    return tuple(names)


def _shutdown_timeout(sources: _Sources) -> float:
    text, where = sources.text("shutdown_timeout")
    if text is None and sources.environ.get(SHUTDOWN_TIMEOUT_ENV, "").strip():
        text, where = sources.environ[SHUTDOWN_TIMEOUT_ENV], f"--shutdown-timeout (from {SHUTDOWN_TIMEOUT_ENV})"
    if text is None:
        return _launch_default("shutdown_timeout")
    return _seconds(text, where, zero_allowed=True)


def _launch_default(name: str) -> Any:
    return next(field.default for field in fields(LaunchConfig) if field.name == name)


# -- rendezvous --------------------------------------------------------------------------------


SpecMaker = Callable[[Mapping[str, str]], BackendSpec]
"""Builds the backend spec from the parsed ``--rdzv-conf`` once the engine settings are valid."""


def _rendezvous(sources: _Sources, min_nodes: int, max_nodes: int,
                new_run_id: Callable[[], str], warn: Callable[[str], None]) -> dict[str, Any]:
    """The rendezvous fields of :class:`LaunchConfig` (``run_id``, ``backend``, ``rendezvous``),
    with torchrun's standalone shortcuts applied.

    Errors come in the order a reader meets the flags: backend, endpoint, id, then options.
    """
    backend_text, backend_where = sources.text("rdzv_backend")
    backend = (backend_text or "").strip().lower()
    if backend not in BACKEND_NAMES:
        hint = " (etcd's v2 API is not supported: use etcd with an etcd v3 server)" if backend == "etcd-v2" else ""
        raise _fail(backend_where, f"{backend_text!r} is not one of {', '.join(BACKEND_NAMES)}{hint}")
    endpoint = (sources.text("rdzv_endpoint")[0] or "").strip()
    node_rank = _integer(*sources.text("node_rank"), minimum=0)
    master_port = _optional_port(*sources.text("master_port"))
    conf = _rdzv_conf(sources)

    make_spec: SpecMaker = standalone_spec  # --standalone and the single-node shortcuts
    if sources.switch("standalone"):
        if (min_nodes, max_nodes) != (1, 1):
            raise _fail("--standalone", f"runs a single node, so --nnodes must be 1 or 1:1 "
                                        f"(got {sources.text('nnodes')[0]})")
        for dest in ("rdzv_backend", "rdzv_endpoint", "rdzv_id"):
            if sources.explicit(dest):
                warn(f"--standalone ignores {_as_given(sources, dest)}")
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
        raise _fail(sources.texts("rdzv_conf")[1], _sentence_tail(error)) from error
    return {"run_id": run_id, "backend": spec, "rendezvous": settings}


def _run_id(sources: _Sources) -> str:
    return (sources.text("rdzv_id")[0] or "").strip()


def _as_given(sources: _Sources, dest: str) -> str:
    """The setting as the user wrote it: ``--rdzv-id=job``, ``PET_RDZV_ID=job`` or ``--standalone``."""
    option = OPTIONS_BY_DEST[dest]
    text = sources.text(dest)[0]
    if dest not in sources.command_line:
        return f"{option.env_name}={text}"
    return f"{option.long_flag}={text}" if option.takes_value else option.name


def _rdzv_conf(sources: _Sources) -> dict[str, str]:
    texts, where = sources.texts("rdzv_conf")
    try:
        return parse_rdzv_conf(texts)
    except RendezvousConfigError as error:
        raise _fail(where, _sentence_tail(error)) from error


def _static(sources: _Sources, endpoint: str, min_nodes: int, max_nodes: int, node_rank: int,
            master_port: int | None, warn: Callable[[str], None]) -> SpecMaker:
    if min_nodes != max_nodes:
        raise _fail(sources.text("nnodes")[1], f"the static backend needs a fixed node count (got "
                    f"{min_nodes}:{max_nodes}); elastic ranges need --rdzv-backend etcd, c10d or tcp")
    if node_rank >= max_nodes:
        raise _fail(sources.text("node_rank")[1], f"{node_rank} is not below the node count ({max_nodes}) "
                                                  "of the static backend")
    if endpoint:
        master = _endpoint(endpoint, STATIC_DEFAULT_PORT, sources.text("rdzv_endpoint")[1])
        for dest in ("master_addr", "master_port"):
            if sources.explicit(dest):
                warn(f"{_as_given(sources, dest)} is ignored: --rdzv-endpoint {endpoint} names the master")
    else:
        addr_text, addr_where = sources.text("master_addr")
        addr = _host_address(_optional_text(addr_text)) or STATIC_DEFAULT_ADDR
        port = master_port or STATIC_DEFAULT_PORT
        master = _endpoint(Endpoint(addr, port).netloc, port, addr_where)
    return lambda _conf: StaticSpec(node_rank, master)  # the static backend reads no --rdzv-conf key


def _dynamic(sources: _Sources, backend: str, endpoint: str, max_nodes: int,
             warn: Callable[[str], None]) -> tuple[SpecMaker, str]:
    """The spec maker of an etcd or store backend, and why static-only flags are ignored."""
    where = sources.text("rdzv_endpoint")[1]
    if not endpoint:
        example = "etcd-0:2379,etcd-1:2379" if backend in ETCD_NAMES else "node0:29400"
        raise _fail(where, f"the {backend} backend needs an endpoint, such as --rdzv-endpoint {example}")
    free_port = backend == "c10d" and _free_port(endpoint)
    try:
        if backend in ETCD_NAMES:
            make_spec: SpecMaker = partial(etcd_spec, backend, etcd_endpoints(endpoint))
        else:
            make_spec = partial(store_spec, backend,
                                store_endpoint(backend, endpoint.rpartition(":")[0] if free_port else endpoint))
    except RendezvousConfigError as error:
        raise _fail(where, _sentence_tail(error)) from error
    if free_port:
        if max_nodes != 1:
            raise _fail(where, f"port 0 (a free port) only works for a single node (--nnodes is {max_nodes})")
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
        raise _fail(where, _sentence_tail(error)) from error


def _warn_static_only(sources: _Sources, node_rank: int, why: str, warn: Callable[[str], None]) -> None:
    """torchrun warns that these flags only serve the static backend; so do we, when they were set."""
    for dest in ("master_addr", "master_port", "node_rank"):
        if sources.explicit(dest) and (dest != "node_rank" or node_rank != 0):
            warn(f"{_as_given(sources, dest)} is ignored: only the static backend uses it, and this run uses {why}")


def _settings(sources: _Sources, run_id: str, min_nodes: int, max_nodes: int,
              conf: Mapping[str, str]) -> RendezvousSettings:
    """The engine's settings, built once here so a bad id or option fails now, not on a node later."""
    try:
        RendezvousSettings(run_id, min_nodes, max_nodes)
    except RendezvousConfigError as error:
        raise _fail(sources.text("rdzv_id")[1], _sentence_tail(error)) from error
    try:
        return settings_from_conf(run_id, min_nodes, max_nodes, conf)
    except RendezvousConfigError as error:
        raise _fail(sources.texts("rdzv_conf")[1], _sentence_tail(error)) from error


# -- the training command ----------------------------------------------------------------------


def _entrypoint(sources: _Sources, command: Sequence[str], warn: Callable[[str], None]) -> Entrypoint:
    if not command:
        raise ConfigError(f"no training script given; usage: {PROG} [flags] SCRIPT [ARGS...] "
                          "(or -m MODULE, or --no-python COMMAND)")
    module, no_python, run_path = (sources.switch(dest) for dest in ("module", "no_python", "run_path"))
    target, args = command[0], tuple(command[1:])
    if run_path:
        for dest, given in (("module", module), ("no_python", no_python)):
            if given:
                warn(f"{_as_given(sources, dest)} is ignored: --run-path takes precedence (as in torchrun)")
        return Entrypoint("run_path", target, args)
    if module and no_python:
        raise ConfigError("-m/--module and --no-python cannot be used together: a module runs under python")
    return Entrypoint("module" if module else "command" if no_python else "script", target, args)


def _warn_compat_only(sources: _Sources, warn: Callable[[str], None]) -> None:
    """Flags kept for torchrun command lines: validated where torchrun validates, then noted as inert."""
    numa, numa_where = sources.text("numa_binding")
    if numa is not None:
        _choice(numa, numa_where, NUMA_MODES)
    for option in OPTIONS:
        if option.group != COMPAT:
            continue
        text = sources.text(option.dest)[0]
        inert = (text or "") != (option.default or "") if option.takes_value else sources.switch(option.dest)
        if inert:
            warn(f"{_as_given(sources, option.dest)} is accepted for torchrun compatibility and has no "
                 f"effect in {PROG}")


# -- the whole config --------------------------------------------------------------------------


def _random_run_id() -> str:
    return str(uuid.uuid4())


def _log_warning(message: str) -> None:
    log.warning("%s", message)


def config_from_args(
    argv: Sequence[str],
    environ: Mapping[str, str],
    *,
    devices: DeviceProbe | None = None,
    new_run_id: Callable[[], str] = _random_run_id,
    warn: Callable[[str], None] | None = None,
) -> LaunchConfig:
    """Resolve an ``elasticrun`` command line (without the program name) into a :class:`LaunchConfig`.

    ``environ`` supplies the ``PET_*`` twins (and ``CUDA_VISIBLE_DEVICES``,
    ``TORCH_ELASTIC_SHUTDOWN_TIMEOUT``); ``devices`` counts CPUs and GPUs for
    ``--nproc-per-node auto|cpu|gpu`` (default: this host, asked only then); ``new_run_id`` names
    standalone runs; ``warn`` receives one line per flag that is accepted but ignored, once the
    whole command line is valid (default: this module's logger).

    Raises:
        ConfigError: a flag, a ``PET_*`` value or the training command is invalid; the message
            is one line naming the flag and the accepted forms.
        HelpRequested: ``-h``/``--help`` was given before the script.
    """
    pending: list[str] = []  # warnings are given only for a command line that parses
    given, command = split_command_line(argv)
    sources = _Sources(given, environ)
    min_nodes, max_nodes = _nnodes(*sources.text("nnodes"))
    nproc, nproc_source = _nproc(*sources.text("nproc_per_node"), devices or HostDevices(environ))
    rendezvous = _rendezvous(sources, min_nodes, max_nodes, new_run_id, pending.append)
    entrypoint = _entrypoint(sources, command, pending.append)
    role_text, role_where = sources.text("role")
    if not (role_text or "").strip():
        raise _fail(role_where, "the role name must not be empty")
    _warn_compat_only(sources, pending.append)
    if entrypoint.kind == "command" and sources.switch("prewarm"):
        pending.append(f"{_as_given(sources, 'prewarm')} is ignored with --no-python: the workers are not "
                       "Python, so they start as usual")
    config = LaunchConfig(
        min_nodes=min_nodes,
        max_nodes=max_nodes,
        nproc_per_node=nproc,
        nproc_source=nproc_source,
        entrypoint=entrypoint,
        max_restarts=_integer(*sources.text("max_restarts"), minimum=0),
        monitor_interval=_seconds(*sources.text("monitor_interval")),
        start_method=_choice(*sources.text("start_method"), START_METHODS),
        role=(role_text or "").strip(),
        log_dir=_optional_text(sources.text("log_dir")[0]),
        redirects=_std_mask(*sources.text("redirects")),
        tee=_std_mask(*sources.text("tee")),
        local_ranks_filter=_local_ranks(*sources.text("local_ranks_filter")),
        local_addr=_host_address(_optional_text(sources.text("local_addr")[0])),
        signals_to_handle=_signals(*sources.text("signals_to_handle")),
        shutdown_timeout=_shutdown_timeout(sources),
        exit_barrier_timeout=_seconds(*sources.text("exit_barrier_timeout")),
        metrics_port=_optional_port(*sources.text("metrics_port")),
        metrics_addr=_host_address(_optional_text(sources.text("metrics_addr")[0])) or "127.0.0.1",
        event_log=_optional_text(sources.text("event_log")[0]),
        dry_run=sources.switch("dry_run"),
        prewarm=sources.switch("prewarm"),
        prewarm_modules=_modules(*sources.text("prewarm_modules")),
        **rendezvous,
    )
    for message in pending:
        (warn or _log_warning)(message)
    return config


def parse_or_exit(
    argv: Sequence[str],
    environ: Mapping[str, str],
    *,
    stdout: TextIO | None = None,
    stderr: TextIO | None = None,
    **injected: Any,
) -> LaunchConfig:
    """:func:`config_from_args` for the entry point: warnings go to stderr as ``elasticrun: warning: ...``.

    Raises:
        SystemExit: status 2 after printing ``elasticrun: error: <one line>`` to stderr for bad
            input; status 0 after printing the help to stdout for ``-h``/``--help``.
    """
    out, err = stdout or sys.stdout, stderr or sys.stderr
    injected.setdefault("warn", lambda message: print(f"{PROG}: warning: {message}", file=err))
    try:
        return config_from_args(argv, environ, **injected)
    except HelpRequested as help_:
        print(help_.text, file=out, end="")
        raise SystemExit(0) from None
    except ConfigError as error:
        print(f"{PROG}: error: {' '.join(str(error).split())}", file=err)
        raise SystemExit(2) from None


# -- help and description ----------------------------------------------------------------------


def describe(config: LaunchConfig) -> str:
    """The resolved configuration, one ``key: value`` per line in a fixed order; secrets masked."""
    entry = config.entrypoint
    nodes = f"{config.min_nodes}" if config.min_nodes == config.max_nodes else f"{config.min_nodes}:{config.max_nodes}"
    nproc = str(config.nproc_per_node)
    if config.nproc_source and config.nproc_source != nproc:
        nproc += f" ({config.nproc_source})"
    rows = [
        ("entrypoint", f"{entry.kind} {shlex.join((entry.target, *entry.args))}"),
        ("nnodes", nodes + (" (elastic)" if config.min_nodes != config.max_nodes else "")),
        ("nproc_per_node", nproc),
        ("rdzv_backend", config.backend.name),
        ("rdzv_endpoint", config.backend.endpoint_text),
        ("run_id", config.run_id),
        ("standalone", _yes_no(config.standalone)),
        ("backend", config.backend.conf_text()),
        ("rendezvous", _settings_text(config.rendezvous)),
        ("local_addr", config.local_addr or "this host's name"),
        ("role", config.role),
        ("max_restarts", str(config.max_restarts)),
        ("monitor_interval", f"{config.monitor_interval:g}s"),
        ("start_method", config.start_method),
        ("log_dir", config.log_dir or "none"),
        ("redirects", _mask_text(config.redirects)),
        ("tee", _mask_text(config.tee)),
        ("local_ranks_filter", ",".join(map(str, sorted(config.local_ranks_filter)))
         if config.local_ranks_filter is not None else "all"),
        ("signals_to_handle", ",".join(config.signals_to_handle)),
        ("shutdown_timeout", f"{config.shutdown_timeout:g}s"),
        ("exit_barrier_timeout", f"{config.exit_barrier_timeout:g}s"),
        ("metrics_port", str(config.metrics_port) if config.metrics_port else "off"),
        ("metrics_addr", config.metrics_addr),
        ("event_log", config.event_log or "off"),
        ("prewarm", _yes_no(config.prewarm)),
        ("prewarm_modules", ",".join(config.prewarm_modules)),
        ("dry_run", _yes_no(config.dry_run)),
    ]
    width = max(len(key) for key, _ in rows) + 1
    return "".join(f"{key + ':':<{width}} {value}\n" for key, value in rows)


def _yes_no(flag: bool) -> str:
    return "yes" if flag else "no"


def _settings_text(settings: RendezvousSettings) -> str:
    """The engine's settings in ``--rdzv-conf`` form (run id and node range are shown above)."""
    return (f"join_timeout={settings.join_timeout:g},last_call_timeout={settings.last_call_timeout:g},"
            f"close_timeout={settings.close_timeout:g},lease_ttl={settings.lease_ttl:g},"
            f"namespace={settings.namespace},max_node_failures={settings.max_node_failures},"
            f"exclusion_cooldown={settings.exclusion_cooldown:g},store_outage_timeout={settings.store_outage_timeout:g}")


def _mask_text(mask: StdMask) -> str:
    """The mask in the flag's own syntax: ``3`` or ``0:1,1:2``."""
    if not mask.per_rank:
        return str(int(mask.default))
    return ",".join(f"{rank}:{int(std)}" for rank, std in sorted(mask.per_rank.items()))
