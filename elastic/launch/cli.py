"""Turn an ``elasticrun`` command line and its environment into a validated :class:`LaunchConfig`.

Every torchrun 2.13 flag is accepted with its default, both spellings (``--nproc-per-node`` and
``--nproc_per_node``) and its ``PET_*`` environment twin (the command line wins; an empty
variable counts as unset); :mod:`elastic.launch.flags` is the table the scanning, the validation
and ``--help`` are built from.

:mod:`.scan` splits the command line into the launcher's flags (abbreviations expanded as
torchrun's argparse parser expands them; ``PET_*`` names never are) and the training command,
which reaches the workers untouched.

:func:`config_from_args` is pure: the environment, the device counts, the run-id generator and
the warning sink are injected. Bad input raises :class:`ConfigError` with one line naming the
flag (or its ``PET_*`` twin) and the accepted forms; :func:`parse_or_exit` prints that line and
exits with status 2, as argparse does.

Beside this module: :mod:`.scan`, :mod:`.values` (where a flag's text comes from, and the value parsers),
:mod:`.rendezvous_flags` (the rendezvous flags as typed settings and a backend spec) and
:mod:`.describe` (``--dry-run``'s text).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
import signal
import sys
import uuid
from dataclasses import fields
from typing import Any, Callable, Mapping, Sequence, TextIO

from elastic.agent.processes.log_dir import log_dir_problem
from elastic.config import Entrypoint, LaunchConfig, Std, StdMask
from elastic.launch.devices import DeviceCountError, DeviceProbe, HostDevices
from elastic.launch.flags import (
    COMPAT, LOG_LINE_PREFIX_TEMPLATE_ENV, NUMA_MODES, OPTIONS, PROG, SHUTDOWN_TIMEOUT_ENV, START_METHODS,
)
from elastic.launch.prewarm_flags import prewarm_fields
from elastic.launch.rendezvous_flags import rendezvous_fields
from elastic.launch.scan import HelpRequested, split_command_line
from elastic.launch.script_path import script_problem
from elastic.rendezvous.backend_spec import StaticSpec
from elastic.rendezvous.job import job_identity

__all__ = ["ConfigError", "HelpRequested", "config_from_args", "installed_logs_specs", "parse_or_exit",
           "split_command_line"]
from elastic.rendezvous.conf import parse_rdzv_conf, unquote_conf
from elastic.rendezvous.secret_sources import command_line_secret_warning, inline_secret_options
from elastic.launch.values import (
    ConfigError, Sources, as_given, choice, fail, host_address, integer, optional_port, optional_text, seconds,
)

log = logging.getLogger(__name__)

_UNCATCHABLE_SIGNALS = ("SIGKILL", "SIGSTOP")


def _nnodes(text: str | None, where: str) -> tuple[int, int]:
    match = re.fullmatch(r"\s*([0-9]+)\s*(?::\s*([0-9]+)\s*)?", text or "")
    low = int(match[1]) if match else 0
    high = int(match[2]) if match and match[2] else low
    if not match or low < 1 or high < low:
        raise fail(where, f"{text!r} is not N or MIN:MAX with 1 <= MIN <= MAX")
    return low, high


def _nproc(text: str | None, where: str, devices: DeviceProbe) -> tuple[int, str]:
    """The worker count and how it was decided (``"2"``, ``"auto: 4 GPUs"``, ``"cpu: 8 cores"``).

    ``auto`` takes NVIDIA GPUs, else XPUs, else CPUs, as torchrun's ``torch.accelerator`` does.
    """
    word = (text or "").strip().lower()
    if re.fullmatch(r"[0-9]+", word):
        if int(word) < 1:
            raise fail(where, f"{text!r} is not a positive number, auto, cpu, gpu or xpu")
        return int(word), str(int(word))
    if word == "cpu":
        cores = devices.cpu_count()
        return cores, f"cpu: {cores} cores"
    if word in ("gpu", "auto"):
        gpus = devices.gpu_count()
        if gpus > 0:
            return gpus, f"{word}: {gpus} GPU{'s' if gpus != 1 else ''}"
        if word == "gpu":
            raise fail(where, "'gpu' needs an NVIDIA GPU and none is visible (driver, nvidia-smi, "
                              "CUDA_VISIBLE_DEVICES); give a number, auto or cpu")
        xpus = _auto_xpus(devices)
        if xpus > 0:
            return xpus, f"auto: {xpus} XPU{'s' if xpus != 1 else ''}"
        cores = devices.cpu_count()
        return cores, f"auto: no GPU, {cores} cores"
    if word == "xpu":
        xpus = _xpus(where, devices)
        if xpus > 0:
            return xpus, f"xpu: {xpus} XPU{'s' if xpus != 1 else ''}"
        raise fail(where, "'xpu' needs an Intel XPU and torch sees none (torch.xpu.is_available() is False); "
                          "give a number, auto or cpu")
    raise fail(where, f"{text!r} is not a positive number, auto, cpu, gpu or xpu")


def _xpus(where: str, devices: DeviceProbe) -> int:
    try:
        return devices.xpu_count()
    except DeviceCountError as error:
        raise fail(where, f"{error}; give a number") from None


def _auto_xpus(devices: DeviceProbe) -> int:
    """``auto``'s XPUs: none unless the host may have some and torch counts them (a worker
    interpreter without torch, say for ``--no-python`` workers, runs on the CPUs)."""
    if not devices.may_have_xpus():
        return 0
    try:
        return devices.xpu_count()
    except DeviceCountError as error:
        log.info("--nproc-per-node auto: %s; counting CPU cores", error)
        return 0


_STD_FORMS = "0-3 (0 none, 1 stdout, 2 stderr, 3 both) or LOCAL_RANK:0-3,... such as 0:1,1:2"


def _std_mask(text: str | None, where: str) -> StdMask:
    stripped = (text or "").strip()
    if re.fullmatch(r"[0-3]", stripped):
        return StdMask(Std(int(stripped)))
    per_rank: dict[int, Std] = {}
    for item in stripped.split(","):
        match = re.fullmatch(r"\s*([0-9]+)\s*:\s*([0-3])\s*", item)
        if match is None:
            raise fail(where, f"{text!r} is not {_STD_FORMS}")
        per_rank[int(match[1])] = Std(int(match[2]))
    return StdMask(Std.NONE, per_rank)


def _local_ranks(text: str | None, where: str) -> frozenset[int] | None:
    if not text or not text.strip():
        return None
    items = [item.strip() for item in text.split(",")]
    if not all(re.fullmatch(r"[0-9]+", item) for item in items):
        raise fail(where, f"{text!r} is not a comma-separated list of local ranks, such as 0,1")
    return frozenset(int(item) for item in items)


def _signals(text: str | None, where: str) -> tuple[str, ...]:
    names: list[str] = []
    for item in (text or "").split(","):
        item = item.strip().upper()
        if not item:
            continue
        name = item if item.startswith("SIG") else f"SIG{item}"
        if name in _UNCATCHABLE_SIGNALS:
            raise fail(where, f"{name} cannot be caught, so it cannot be forwarded")
        if name not in signal.Signals.__members__:
            raise fail(where, f"{item!r} is not a signal name here; expected names such as SIGTERM,SIGINT,SIGUSR1")
        if name not in names:
            names.append(name)
    if not names:
        raise fail(where, f"{text!r} names no signal; expected names such as SIGTERM,SIGINT,SIGHUP,SIGQUIT")
    return tuple(names)


LOGS_SPECS_GROUP = "torchrun.logs_specs"


def installed_logs_specs() -> list[str]:
    """The names in the ``torchrun.logs_specs`` entry-point group, read from the installed
    distributions' metadata without loading any (so without importing torch)."""
    from importlib.metadata import entry_points

    return sorted({point.name for point in entry_points(group=LOGS_SPECS_GROUP)})


def _logs_specs(sources: Sources, installed: Callable[[], Sequence[str]]) -> str | None:
    """``--logs-specs``: a name torchrun would find in its entry-point group, checked now, as
    torchrun checks it before starting anything."""
    name, where = sources.text("logs_specs")
    if name is None:
        return None
    names = installed()
    if name not in names:
        raise fail(where, f"no entry point {name!r} in the {LOGS_SPECS_GROUP} group (installed: "
                          f"{', '.join(names) or 'none'}); install the package that provides it")
    return name


def _shutdown_timeout(sources: Sources) -> float:
    text, where = sources.text("shutdown_timeout")
    if text is None and sources.environ.get(SHUTDOWN_TIMEOUT_ENV, "").strip():
        text, where = sources.environ[SHUTDOWN_TIMEOUT_ENV], f"--shutdown-timeout (from {SHUTDOWN_TIMEOUT_ENV})"
    if text is None:
        return _launch_default("shutdown_timeout")
    return seconds(text, where, zero_allowed=True)


def _launch_default(name: str) -> Any:
    return next(field.default for field in fields(LaunchConfig) if field.name == name)


# -- the training command ----------------------------------------------------------------------


def _entrypoint(sources: Sources, command: Sequence[str], warn: Callable[[str], None]) -> Entrypoint:
    if not command:
        raise ConfigError(f"no training script given; usage: {PROG} [flags] SCRIPT [ARGS...] "
                          "(or -m MODULE, or --no-python COMMAND)")
    module, no_python, run_path = (sources.switch(dest) for dest in ("module", "no_python", "run_path"))
    target, args = command[0], tuple(command[1:])
    if run_path:
        for dest, given in (("module", module), ("no_python", no_python)):
            if given:
                warn(f"{as_given(sources, dest)} is ignored: --run-path takes precedence (as in torchrun)")
        return Entrypoint("run_path", target, args)
    if module and no_python:
        raise ConfigError("-m/--module and --no-python cannot be used together: a module runs under python")
    return Entrypoint("module" if module else "command" if no_python else "script", target, args)


def _warn_compat_only(sources: Sources, warn: Callable[[str], None]) -> None:
    """Flags kept for torchrun command lines: validated where torchrun validates, then noted as inert."""
    numa, numa_where = sources.text("numa_binding")
    if numa is not None:
        choice(numa, numa_where, NUMA_MODES)
    for option in OPTIONS:
        if option.group != COMPAT:
            continue
        text = sources.text(option.dest)[0]
        inert = (text or "") != (option.default or "") if option.takes_value else sources.switch(option.dest)
        if inert:
            warn(f"{as_given(sources, option.dest)} is accepted for torchrun compatibility and has no "
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
    logs_specs_names: Callable[[], Sequence[str]] = installed_logs_specs,
) -> LaunchConfig:
    """Resolve an ``elasticrun`` command line (without the program name) into a :class:`LaunchConfig`.

    ``environ`` supplies the ``PET_*`` twins (and ``CUDA_VISIBLE_DEVICES``,
    ``TORCH_ELASTIC_SHUTDOWN_TIMEOUT``, ``TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE``); ``devices`` counts CPUs and GPUs for
    ``--nproc-per-node auto|cpu|gpu`` (default: this host, asked only then); ``new_run_id`` names
    standalone runs; ``warn`` receives one line per flag that is accepted but ignored, once the
    whole command line is valid (default: this module's logger); ``logs_specs_names`` lists the
    ``--logs-specs`` names installed (asked only when the flag is given).

    Raises:
        ConfigError: a flag, a ``PET_*`` value or the training command is invalid; the message
            is one line naming the flag and the accepted forms.
        HelpRequested: ``-h``/``--help`` was given before the script.
    """
    pending: list[str] = []  # warnings are given only for a command line that parses
    given, command = split_command_line(argv)
    sources = Sources(given, environ)
    min_nodes, max_nodes = _nnodes(*sources.text("nnodes"))
    nproc, nproc_source = _nproc(*sources.text("nproc_per_node"), devices or HostDevices(environ))
    rendezvous = rendezvous_fields(sources, min_nodes, max_nodes, new_run_id, pending.append)
    entrypoint = _entrypoint(sources, command, pending.append)
    role_text, role_where = sources.text("role")
    if not (role_text or "").strip():
        raise fail(role_where, "the role name must not be empty")
    _warn_compat_only(sources, pending.append)
    given_conf = [unquote_conf(text) or text for text in given.get("rdzv_conf", ())]
    secrets = inline_secret_options(parse_rdzv_conf(given_conf)) if given_conf else ()
    if secrets:  # on the command line, every user of the machine reads it in ps
        pending.append(command_line_secret_warning(secrets))
    live_recovery = _live_recovery(sources, rendezvous)
    prewarm = prewarm_fields(sources, entrypoint, live_recovery, pending.append)
    config = LaunchConfig(
        min_nodes=min_nodes,
        max_nodes=max_nodes,
        nproc_per_node=nproc,
        nproc_source=nproc_source,
        entrypoint=entrypoint,
        max_restarts=integer(*sources.text("max_restarts"), minimum=0),
        monitor_interval=seconds(*sources.text("monitor_interval")),
        start_method=choice(*sources.text("start_method"), START_METHODS),
        role=(role_text or "").strip(),
        log_dir=optional_text(sources.text("log_dir")[0]),
        redirects=_std_mask(*sources.text("redirects")),
        tee=_std_mask(*sources.text("tee")),
        local_ranks_filter=_local_ranks(*sources.text("local_ranks_filter")),
        log_line_prefix_template=environ.get(LOG_LINE_PREFIX_TEMPLATE_ENV) or None,
        logs_specs=_logs_specs(sources, logs_specs_names),
        local_addr=host_address(optional_text(sources.text("local_addr")[0])),
        signals_to_handle=_signals(*sources.text("signals_to_handle")),
        shutdown_timeout=_shutdown_timeout(sources),
        exit_barrier_timeout=seconds(*sources.text("exit_barrier_timeout")),
        metrics_port=optional_port(*sources.text("metrics_port")),
        metrics_addr=host_address(optional_text(sources.text("metrics_addr")[0])) or "127.0.0.1",
        event_log=optional_text(sources.text("event_log")[0]),
        dry_run=sources.switch("dry_run"),
        verbose=sources.switch("verbose"),
        live_recovery=live_recovery,
        live_recovery_timeout=seconds(*sources.text("live_recovery_timeout")),
        **prewarm,
        **rendezvous,
    )
    config = _with_job_identity(config)
    for message in pending:
        (warn or _log_warning)(message)
    return config


def _live_recovery(sources: Sources, rendezvous: Mapping[str, Any]) -> bool:
    """``--live-recovery``, refused where the agent cannot publish rounds to its workers.

    Raises:
        ConfigError: with the static rendezvous (no rounds, and no agent-hosted store for a new round).
    """
    if not sources.switch("live_recovery"):
        return False
    if isinstance(rendezvous.get("backend"), StaticSpec):
        raise fail(as_given(sources, "live_recovery"), "needs a rendezvous with rounds (etcd, c10d/tcp or "
                   "--standalone), not the static backend")
    return True


def _with_job_identity(config: LaunchConfig) -> LaunchConfig:
    """The config whose rendezvous settings carry this node's job identity (its fingerprint,
    :mod:`elastic.rendezvous.job`), from the entrypoint or ``--rdzv-conf job_fingerprint``."""
    settings, entrypoint = config.rendezvous, config.entrypoint
    job = job_identity(entrypoint.kind, entrypoint.target, entrypoint.args, settings.job_fingerprint or None)
    return dataclasses.replace(config, rendezvous=dataclasses.replace(settings, job=job))


def parse_or_exit(
    argv: Sequence[str],
    environ: Mapping[str, str],
    *,
    stdout: TextIO | None = None,
    stderr: TextIO | None = None,
    **injected: Any,
) -> LaunchConfig:
    """:func:`config_from_args` for the entry point: warnings go to stderr as ``elasticrun: warning: ...``.

    Also refuses, as only the filesystem can tell, a ``--log-dir`` that cannot hold logs (a file,
    ``/dev/null``, under ``/proc``, read-only) and a training script that does not exist
    (:mod:`elastic.launch.script_path`; not with ``--dry-run``, whose command line may be meant
    for another machine).

    Raises:
        SystemExit: status 2 after printing ``elasticrun: error: <one line>`` to stderr for bad
            input; status 0 after printing the help to stdout for ``-h``/``--help``.
    """
    out, err = stdout or sys.stdout, stderr or sys.stderr
    injected.setdefault("warn", lambda message: print(f"{PROG}: warning: {message}", file=err))
    try:
        config = config_from_args(argv, environ, **injected)
        problem = config.log_dir and log_dir_problem(config.log_dir)  # reads the filesystem: not in the pure part
        if problem:
            raise fail("--log-dir", f"{config.log_dir[:200]!r}: {problem}; give a writable directory")
        missing = None if config.dry_run else script_problem(config.entrypoint, os.getcwd())
        if missing:
            raise ConfigError(missing)
        return config
    except HelpRequested as help_:
        print(help_.text, file=out, end="")
        raise SystemExit(0) from None
    except ConfigError as error:
        print(f"{PROG}: error: {' '.join(str(error).split())}", file=err)
        raise SystemExit(2) from None
