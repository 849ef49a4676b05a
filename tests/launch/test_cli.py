"""elasticrun's command line: torchrun's flags, spellings, PET_* twins and defaults; one-line errors."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from dataclasses import fields

import pytest

from backends.endpoints import Endpoint
from elastic.launch.cli import ConfigError, HelpRequested, config_from_args, parse_or_exit
from elastic.launch.describe import describe
from elastic.config import Entrypoint, LaunchConfig, Std, StdMask
from elastic.launch.devices import (
    DeviceCountError, FixedDevices, HostDevices, count_nvidia_gpus, count_xpus, intel_gpu_listed, visible_gpu_count,
)
from elastic.launch.flags import OPTIONS, format_help
from elastic.rendezvous.backend_spec import (
    ClientCertificate, EtcdCredentials, EtcdSpec, Hosting, Secret, SecretFile, StandaloneSpec, StaticSpec, StoreSpec,
    Timeouts,
)
from elastic.rendezvous.settings import RendezvousSettings

ETCD = ("--rdzv-backend=etcd", "--rdzv-endpoint=etcd-0:2379", "--rdzv-id=job-1")
"""A complete dynamic rendezvous, so a case can vary one flag without tripping another's check."""
ETCD_SPEC = EtcdSpec("etcd", (Endpoint("etcd-0", 2379),))
"""What ETCD parses to with no --rdzv-conf."""

RUN_ID = "run-from-test"


class NoDevices:
    """A probe that fails the test if asked: a plain number must not probe the host."""

    def cpu_count(self) -> int:
        raise AssertionError("cpu_count was called")

    def gpu_count(self) -> int:
        raise AssertionError("gpu_count was called")

    def may_have_xpus(self) -> bool:
        raise AssertionError("may_have_xpus was called")

    def xpu_count(self) -> int:
        raise AssertionError("xpu_count was called")


def parse(*argv: str, environ: dict[str, str] | None = None, devices=None) -> LaunchConfig:
    return parse_with_warnings(*argv, environ=environ, devices=devices)[0]


def parse_with_warnings(*argv: str, environ=None, devices=None) -> tuple[LaunchConfig, list[str]]:
    warnings: list[str] = []
    config = config_from_args(list(argv), environ or {}, devices=devices or FixedDevices(cpus=8, gpus=0),
                              new_run_id=lambda: RUN_ID, warn=warnings.append)
    return config, warnings


def parse_error(*argv: str, environ=None, devices=None) -> str:
    with pytest.raises(ConfigError) as raised:
        parse(*argv, environ=environ, devices=devices)
    return str(raised.value)


def clean_environ() -> dict[str, str]:
    """This process's environment without PET_* twins, for the subprocess tests."""
    return {key: value for key, value in os.environ.items()
            if not key.startswith("PET_") and key != "TORCH_ELASTIC_SHUTDOWN_TIMEOUT"}


def run_cli(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "elastic.run", *argv], capture_output=True, text=True,
                          env=clean_environ(), timeout=60, check=False)


# -- defaults ----------------------------------------------------------------------------------


def test_a_bare_script_gets_torchruns_defaults_and_runs_standalone_like_torchrun():
    config, warnings = parse_with_warnings("train.py")
    assert (config.min_nodes, config.max_nodes, config.nproc_per_node, config.nproc_source) == (1, 1, 1, "1")
    assert (config.backend, config.run_id, config.standalone) == (StandaloneSpec(), RUN_ID, True)
    assert config.rendezvous == RendezvousSettings(RUN_ID, 1, 1)
    assert config.entrypoint == Entrypoint("script", "train.py", ())
    assert (config.max_restarts, config.monitor_interval) == (0, 0.1)
    assert (config.start_method, config.role) == ("spawn", "default")
    assert config.redirects == config.tee == StdMask() and config.local_ranks_filter is None
    assert config.signals_to_handle == ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT")
    assert (config.shutdown_timeout, config.exit_barrier_timeout) == (30.0, 300.0)
    assert (config.metrics_port, config.event_log, config.log_dir, config.dry_run) == (None, None, None, False)
    assert warnings == []


def test_unset_flags_resolve_to_the_launch_config_defaults():
    config = parse(*ETCD, "train.py")
    for name in ("max_restarts", "monitor_interval", "start_method", "role", "log_dir", "redirects", "tee",
                 "local_ranks_filter", "local_addr", "signals_to_handle", "shutdown_timeout", "exit_barrier_timeout",
                 "metrics_port", "metrics_addr", "event_log", "dry_run"):
        default = next(field for field in fields(LaunchConfig) if field.name == name)
        expected = default.default_factory() if callable(default.default_factory) else default.default
        assert getattr(config, name) == expected, name
    assert (config.backend, config.rendezvous, config.standalone) == (
        ETCD_SPEC, RendezvousSettings("job-1", 1, 1), False)


@pytest.mark.needs_torch
def test_every_torchrun_flag_is_accepted_with_its_spellings_default_and_twin(monkeypatch):
    for name in list(os.environ):
        if name.startswith("PET_"):
            monkeypatch.delenv(name)
    from torch.distributed.run import get_args_parser  # the installed torchrun is the reference

    ours = {flag: option for option in OPTIONS for flag in option.flags}
    for action in get_args_parser()._actions:
        if not action.option_strings or action.dest == "help":
            continue
        option = ours.get(action.option_strings[0])
        assert option is not None, action.option_strings
        assert set(action.option_strings) == set(option.flags)
        has_twin = type(action).__name__ in ("env", "check_env")
        assert (option.env_name is not None) == has_twin, option.flags
        if action.default not in (None, False, [], "127.0.0.1"):
            assert option.default == str(action.default), option.flags
        if action.choices:
            assert set(action.choices) == set(option.metavar.split("|")), option.flags


def test_every_multiword_flag_has_a_hyphen_and_an_underscore_spelling():
    for option in OPTIONS:
        long_flags = [flag for flag in option.flags if flag.startswith("--")]
        if "-" in option.long_flag[2:]:
            assert long_flags == [option.long_flag, option.long_flag.replace("-", "_").replace("__", "--", 1)]


# -- both spellings ----------------------------------------------------------------------------

SPELLINGS = [
    # (hyphenated flag, value or None for a switch, flags it needs, attribute, expected)
    ("--nproc-per-node", "3", (), "nproc_per_node", 3),
    ("--rdzv-backend", "tcp", ("--rdzv-endpoint=store:29400", "--rdzv-id=j"), "backend",
     StoreSpec("tcp", Endpoint("store", 29400))),
    ("--rdzv-endpoint", "e1:2379,e2:2379", ("--rdzv-backend=etcd", "--rdzv-id=j"), "backend",
     EtcdSpec("etcd", (Endpoint("e1", 2379), Endpoint("e2", 2379)))),
    ("--rdzv-id", "job-7", ("--rdzv-backend=etcd", "--rdzv-endpoint=e:1"), "run_id", "job-7"),
    ("--rdzv-conf", "lease_ttl=7", ETCD, "rendezvous", RendezvousSettings("job-1", 1, 1, lease_ttl=7.0)),
    ("--no-python", None, (), "entrypoint", Entrypoint("command", "train.py", ())),
    ("--run-path", None, (), "entrypoint", Entrypoint("run_path", "train.py", ())),
    ("--log-dir", "/var/log/job", (), "log_dir", "/var/log/job"),
    ("--local-ranks-filter", "0,2", (), "local_ranks_filter", frozenset({0, 2})),
    ("--node-rank", "1", ("--nnodes=2",), "backend", StaticSpec(1)),
    ("--master-addr", "node0", ("--nnodes=2",), "backend", StaticSpec(0, Endpoint("node0", 29500))),
    ("--master-port", "1234", (), "backend", StaticSpec(0, Endpoint("127.0.0.1", 1234))),
    ("--local-addr", "10.0.0.7", (), "local_addr", "10.0.0.7"),
    ("--local-addr", "fd00::7", (), "local_addr", "fd00::7"),
    ("--local-addr", "[fd00::7]", (), "local_addr", "fd00::7"),  # URL brackets dropped: MASTER_ADDR is raw
    ("--max-restarts", "3", (), "max_restarts", 3),
    ("--monitor-interval", "0.5", (), "monitor_interval", 0.5),
    ("--signals-to-handle", "SIGTERM,SIGUSR1", (), "signals_to_handle", ("SIGTERM", "SIGUSR1")),
    ("--shutdown-timeout", "12", (), "shutdown_timeout", 12.0),
    ("--start-method", "fork", (), "start_method", "fork"),
    ("--exit-barrier-timeout", "60", (), "exit_barrier_timeout", 60.0),
    ("--metrics-port", "9090", (), "metrics_port", 9090),
    ("--metrics-addr", "0.0.0.0", (), "metrics_addr", "0.0.0.0"),
    ("--metrics-addr", "[::]", (), "metrics_addr", "::"),
    ("--event-log", "/tmp/events.jsonl", (), "event_log", "/tmp/events.jsonl"),
    ("--dry-run", None, (), "dry_run", True),
    ("--prewarm-modules", "torch,numpy", ("--prewarm",), "prewarm_modules", ("torch", "numpy")),
    ("--no-prewarm", None, ("--standalone", "--live-recovery"), "prewarm", False),
    ("--live-recovery", None, (), "live_recovery", True),
    ("--live-recovery-timeout", "12.5", (), "live_recovery_timeout", 12.5),
    ("--event-log-handler", "console", (), "event_log", None),
    ("--logs-specs", "default", (), "logs_specs", "default"),  # torch registers its DefaultLogsSpecs
    ("--numa-binding", "node", (), "event_log", None),
    ("--duplicate-stdout-filters", "apple", (), "event_log", None),
    ("--duplicate-stderr-filters", "pear", (), "event_log", None),
    ("--virtual-local-rank", None, (), "event_log", None),
]


@pytest.mark.parametrize("flag, value, needs, attribute, expected", SPELLINGS, ids=[case[0] for case in SPELLINGS])
def test_hyphen_and_underscore_spellings_mean_the_same(flag, value, needs, attribute, expected):
    underscored = "--" + flag[2:].replace("-", "_")
    spelled = []
    for spelling in (flag, underscored):
        given = [spelling] if value is None else [spelling, value]
        spelled.append(parse(*needs, *given, "train.py"))
    assert getattr(spelled[0], attribute) == expected
    assert spelled[0] == spelled[1]
    if value is not None:
        assert parse(*needs, f"{underscored}={value}", "train.py") == spelled[0]


def test_every_two_spelling_flag_is_in_the_spelling_table():
    two_spellings = {option.long_flag for option in OPTIONS
                     if len([flag for flag in option.flags if flag.startswith("--")]) == 2}
    assert two_spellings == {case[0] for case in SPELLINGS}


@pytest.mark.parametrize("argv, attribute, expected", [
    (("-m",), "entrypoint", Entrypoint("module", "train.py", ())),
    (("-v",), "verbose", True),
    (("--verbose",), "verbose", True),
    (("--verb",), "verbose", True),  # our flag: abbreviates where no torchrun flag shares the prefix
    (("--module",), "entrypoint", Entrypoint("module", "train.py", ())),
    (("-r", "3"), "redirects", StdMask(Std.ALL)),
    (("-r3",), "redirects", StdMask(Std.ALL)),
    (("-r=3",), "redirects", StdMask(Std.ALL)),
    (("--redirects=3",), "redirects", StdMask(Std.ALL)),
    (("-t", "0:1"), "tee", StdMask(Std.NONE, {0: Std.OUT})),
    (("--tee", "0:1"), "tee", StdMask(Std.NONE, {0: Std.OUT})),
    (("--role", "trainer"), "role", "trainer"),
    (("--role=trainer",), "role", "trainer"),
])
def test_short_and_single_word_flags_take_every_form(argv, attribute, expected):
    assert getattr(parse(*argv, "train.py"), attribute) == expected


# -- environment twins -------------------------------------------------------------------------

TWINS = [
    # (variable, value, flags it needs, attribute, expected)
    ("PET_NNODES", "2:4", ETCD, "max_nodes", 4),
    ("PET_NPROC_PER_NODE", "5", (), "nproc_per_node", 5),
    ("PET_RDZV_BACKEND", "etcd-v3", ("--rdzv-endpoint=e:2379", "--rdzv-id=j"), "backend",
     EtcdSpec("etcd-v3", (Endpoint("e", 2379),))),
    ("PET_RDZV_ENDPOINT", "e:2379", ("--rdzv-backend=etcd", "--rdzv-id=j"), "backend",
     EtcdSpec("etcd", (Endpoint("e", 2379),))),
    ("PET_RDZV_ID", "job-9", ("--rdzv-backend=etcd", "--rdzv-endpoint=e:2379"), "run_id", "job-9"),
    ("PET_RDZV_CONF", "join_timeout=99", ETCD, "rendezvous", RendezvousSettings("job-1", 1, 1, join_timeout=99.0)),
    ("PET_STANDALONE", "1", ETCD, "standalone", True),
    ("PET_MODULE", "1", (), "entrypoint", Entrypoint("module", "train.py", ())),
    ("PET_NO_PYTHON", "true", (), "entrypoint", Entrypoint("command", "train.py", ())),
    ("PET_RUN_PATH", "1", (), "entrypoint", Entrypoint("run_path", "train.py", ())),
    ("PET_ROLE", "trainer", (), "role", "trainer"),
    ("PET_LOG_DIR", "/logs", (), "log_dir", "/logs"),
    ("PET_REDIRECTS", "2", (), "redirects", StdMask(Std.ERR)),
    ("PET_TEE", "0:3", (), "tee", StdMask(Std.NONE, {0: Std.ALL})),
    ("PET_LOCAL_RANKS_FILTER", "1", (), "local_ranks_filter", frozenset({1})),
    ("PET_NODE_RANK", "1", ("--nnodes=2",), "backend", StaticSpec(1)),
    ("PET_MASTER_ADDR", "node0", ("--nnodes=2",), "backend", StaticSpec(0, Endpoint("node0", 29500))),
    ("PET_MASTER_PORT", "2345", (), "backend", StaticSpec(0, Endpoint("127.0.0.1", 2345))),
    ("PET_LOCAL_ADDR", "10.1.1.1", (), "local_addr", "10.1.1.1"),
    ("PET_MAX_RESTARTS", "4", (), "max_restarts", 4),
    ("PET_MONITOR_INTERVAL", "2", (), "monitor_interval", 2.0),
    ("PET_START_METHOD", "forkserver", (), "start_method", "forkserver"),
    ("PET_SIGNALS_TO_HANDLE", "SIGUSR2", (), "signals_to_handle", ("SIGUSR2",)),
    ("PET_SHUTDOWN_TIMEOUT", "7", (), "shutdown_timeout", 7.0),
    ("PET_EXIT_BARRIER_TIMEOUT", "9", (), "exit_barrier_timeout", 9.0),
    ("PET_METRICS_PORT", "9100", (), "metrics_port", 9100),
    ("PET_METRICS_ADDR", "0.0.0.0", (), "metrics_addr", "0.0.0.0"),
    ("PET_EVENT_LOG", "/e.jsonl", (), "event_log", "/e.jsonl"),
    ("PET_PREWARM", "1", (), "prewarm", True),
    ("PET_VERBOSE", "1", (), "verbose", True),
    ("PET_PREWARM_MODULES", "torch.distributed", ("--prewarm",), "prewarm_modules", ("torch.distributed",)),
    ("PET_NO_PREWARM", "1", ("--standalone", "--live-recovery"), "prewarm", False),
    ("PET_LIVE_RECOVERY", "1", (), "live_recovery", True),
    ("PET_LIVE_RECOVERY_TIMEOUT", "30", (), "live_recovery_timeout", 30.0),
]


@pytest.mark.parametrize("variable, value, needs, attribute, expected", TWINS, ids=[case[0] for case in TWINS])
def test_pet_twins_set_their_flag(variable, value, needs, attribute, expected):
    assert getattr(parse(*needs, "train.py", environ={variable: value}), attribute) == expected


def test_every_twin_in_the_table_is_tested_except_the_inert_ones():
    twins = {option.env_name for option in OPTIONS if option.env_name}
    inert = {"PET_EVENT_LOG_HANDLER", "PET_DUPLICATE_STDOUT_FILTERS", "PET_DUPLICATE_STDERR_FILTERS",
             "PET_VIRTUAL_LOCAL_RANK"}
    assert twins - inert == {case[0] for case in TWINS}


@pytest.mark.parametrize("argv, environ, attribute, expected", [
    (("--nproc-per-node=2",), {"PET_NPROC_PER_NODE": "6"}, "nproc_per_node", 2),
    (("--max_restarts", "1"), {"PET_MAX_RESTARTS": "9"}, "max_restarts", 1),
    (("-m",), {"PET_MODULE": "0"}, "entrypoint", Entrypoint("module", "train.py", ())),
    ((*ETCD, "--rdzv-conf=lease_ttl=9"), {"PET_RDZV_CONF": "join_timeout=5"}, "rendezvous",
     RendezvousSettings("job-1", 1, 1, lease_ttl=9.0)),
    (("--shutdown-timeout=3",), {"PET_SHUTDOWN_TIMEOUT": "4", "TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "5"},
     "shutdown_timeout", 3.0),
    ((), {"PET_SHUTDOWN_TIMEOUT": "4", "TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "5"}, "shutdown_timeout", 4.0),
    ((), {"TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "5"}, "shutdown_timeout", 5.0),
    ((), {"PET_NPROC_PER_NODE": ""}, "nproc_per_node", 1),
    ((), {"PET_MODULE": "0"}, "entrypoint", Entrypoint("script", "train.py", ())),
])
def test_the_command_line_wins_over_the_environment_and_empty_twins_count_as_unset(argv, environ, attribute, expected):
    assert getattr(parse(*argv, "train.py", environ=environ), attribute) == expected


# -- nodes and workers -------------------------------------------------------------------------


@pytest.mark.parametrize("text, nodes", [("1", (1, 1)), ("4", (4, 4)), ("2:8", (2, 8)), ("1:1", (1, 1)),
                                         (" 3 : 5 ", (3, 5))])
def test_nnodes_takes_n_or_min_max(text, nodes):
    config = parse(*ETCD, "--nnodes", text, "train.py")
    assert (config.min_nodes, config.max_nodes) == nodes


@pytest.mark.parametrize("text", ["0", "3:2", "0:2", "a", "1:2:3", "", ":4", "4:", "-1", "1.5"])
def test_malformed_nnodes_name_the_flag_and_the_forms(text):
    assert parse_error(*ETCD, f"--nnodes={text}", "train.py") == (
        f"--nnodes: {text!r} is not N or MIN:MAX with 1 <= MIN <= MAX")


@pytest.mark.parametrize("text, cpus, gpus, xpus, expected", [
    ("4", None, None, None, (4, "4")),
    ("cpu", 8, 2, 0, (8, "cpu: 8 cores")),
    ("gpu", 8, 2, 0, (2, "gpu: 2 GPUs")),
    ("gpu", 8, 1, 0, (1, "gpu: 1 GPU")),
    ("auto", 8, 4, 0, (4, "auto: 4 GPUs")),
    ("auto", 6, 0, 0, (6, "auto: no GPU, 6 cores")),
    ("AUTO", 6, 0, 0, (6, "auto: no GPU, 6 cores")),
    ("xpu", 8, 0, 3, (3, "xpu: 3 XPUs")),
    ("auto", 8, 0, 1, (1, "auto: 1 XPU")),
    ("auto", 8, 2, 3, (2, "auto: 2 GPUs")),  # CUDA comes first in torch.accelerator too
])
def test_nproc_per_node_resolves_numbers_and_device_counts(text, cpus, gpus, xpus, expected):
    devices = NoDevices() if cpus is None else FixedDevices(cpus=cpus, gpus=gpus, xpus=xpus)
    config = parse("--nproc-per-node", text, "train.py", devices=devices)
    assert (config.nproc_per_node, config.nproc_source) == expected


@pytest.mark.parametrize("text, says", [
    ("0", "'0' is not a positive number, auto, cpu, gpu or xpu"),
    ("-2", "'-2' is not a positive number, auto, cpu, gpu or xpu"),
    ("many", "'many' is not a positive number, auto, cpu, gpu or xpu"),
    ("gpu", "'gpu' needs an NVIDIA GPU and none is visible"),
    ("xpu", "'xpu' needs an Intel XPU and torch sees none"),
])
def test_bad_nproc_per_node_names_the_flag_and_the_forms(text, says):
    message = parse_error(f"--nproc-per-node={text}", "train.py", devices=FixedDevices(cpus=4, gpus=0))
    assert message.startswith("--nproc-per-node: ") and says in message


@pytest.mark.parametrize("physical, visible, expected", [
    (4, None, 4), (4, "", 0), (4, "-1", 0), (4, "0,1", 2), (4, "2, 3", 2), (4, "0,7,1", 1),
    (2, "GPU-8f2a,GPU-77c1", 2), (1, "0,1,2", 1), (0, "0", 0), (4, "1,-1,2", 1),
])
def test_cuda_visible_devices_narrows_the_gpu_count_like_cuda(physical, visible, expected):
    assert visible_gpu_count(physical, visible) == expected
    environ = {} if visible is None else {"CUDA_VISIBLE_DEVICES": visible}
    assert HostDevices(environ, list_gpus=lambda: physical).gpu_count() == expected


def test_nvidia_gpus_are_counted_from_the_driver_then_nvidia_smi(tmp_path):
    proc = tmp_path / "gpus"
    proc.mkdir()
    for bus in ("0000:3b:00.0", "0000:5e:00.0"):
        (proc / bus).mkdir()

    def smi(lines: str, code: int = 0):
        return lambda argv, **_: subprocess.CompletedProcess(argv, code, stdout=lines, stderr="")

    def missing(argv, **_):
        raise FileNotFoundError(argv[0])

    listing = "GPU 0: NVIDIA A100 (UUID: GPU-1)\nGPU 1: NVIDIA A100 (UUID: GPU-2)\nGPU 2: NVIDIA A100 (UUID: GPU-3)\n"
    assert count_nvidia_gpus(str(proc), run=missing) == 2
    assert count_nvidia_gpus(str(tmp_path / "absent"), run=smi(listing)) == 3
    assert count_nvidia_gpus(str(tmp_path / "absent"), run=smi("", code=9)) == 0
    assert count_nvidia_gpus(str(tmp_path / "absent"), run=missing) == 0


def test_host_devices_count_the_cpus_this_process_may_use():
    expected = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    assert HostDevices({}).cpu_count() == expected


def test_an_intel_gpu_is_a_render_node_with_intels_pci_vendor(tmp_path):
    def node(name: str, vendor: str | None) -> None:
        (tmp_path / name / "device").mkdir(parents=True)
        if vendor is not None:
            (tmp_path / name / "device" / "vendor").write_text(vendor + "\n")

    node("card0", "0x8086")  # a card node, not a render node
    node("renderD128", "0x1a03")  # a BMC's graphics
    node("renderD129", None)
    assert not intel_gpu_listed(str(tmp_path)) and not intel_gpu_listed(str(tmp_path / "absent"))
    node("renderD130", "0x8086")
    assert intel_gpu_listed(str(tmp_path))


def fake_torch(root, body: str) -> dict[str, str]:
    """An environment whose interpreter imports ``body`` as torch."""
    (root / "torch").mkdir()
    (root / "torch" / "__init__.py").write_text(body)
    return {**os.environ, "PYTHONPATH": str(root)}


def test_xpus_are_counted_by_torch_in_the_workers_interpreter(tmp_path):
    environ = fake_torch(tmp_path, "import os\nclass xpu:\n    is_available = staticmethod(lambda: True)\n"
                                   "    device_count = staticmethod(lambda: int(os.environ['ZE_AFFINITY_COUNT']))\n")
    assert count_xpus(sys.executable, {**environ, "ZE_AFFINITY_COUNT": "3"}) == 3  # torch reads the environment
    assert HostDevices({**environ, "ZE_AFFINITY_COUNT": "2", "PYTHON_EXEC": sys.executable}).xpu_count() == 2


def test_torch_that_cannot_count_xpus_is_one_line_for_xpu_and_the_cpus_for_auto(tmp_path):
    environ = fake_torch(tmp_path, "raise ImportError('libze_loader.so.1: cannot open shared object file')\n")
    with pytest.raises(DeviceCountError) as raised:
        count_xpus(sys.executable, environ)
    assert str(raised.value) == (f"torch in {sys.executable} did not count the XPUs: ImportError: "
                                 "libze_loader.so.1: cannot open shared object file")
    with pytest.raises(DeviceCountError, match="could not be asked for torch's XPU count"):
        count_xpus(str(tmp_path / "no-python"), environ)

    host = HostDevices({**environ, "PYTHON_EXEC": sys.executable}, list_gpus=lambda: 0, intel_gpu=lambda: True)
    assert parse_error("--nproc-per-node=xpu", "train.py", devices=host) == (
        f"--nproc-per-node: {raised.value}; give a number")
    assert parse("--nproc-per-node=auto", "train.py", devices=host).nproc_source.startswith("auto: no GPU, ")


@pytest.mark.parametrize("intel_gpu, nproc, asked", [(False, None, 0), (True, 4, 1)])
def test_auto_asks_torch_about_xpus_only_on_a_host_that_lists_an_intel_gpu(intel_gpu, nproc, asked):
    questions: list[str] = []

    class Host(HostDevices):  # torch's answer replaced by 4, each question recorded
        def xpu_count(self) -> int:
            questions.append("xpu_count")
            return 4

    host = Host({}, list_gpus=lambda: 0, intel_gpu=lambda: intel_gpu)
    config = parse("--nproc-per-node=auto", "train.py", devices=host)
    assert config.nproc_per_node == (nproc or host.cpu_count()) and len(questions) == asked


# -- worker output -----------------------------------------------------------------------------


@pytest.mark.parametrize("text, mask", [
    ("0", StdMask()), ("1", StdMask(Std.OUT)), ("2", StdMask(Std.ERR)), ("3", StdMask(Std.ALL)),
    ("0:1,1:2", StdMask(Std.NONE, {0: Std.OUT, 1: Std.ERR})),
    ("12:3", StdMask(Std.NONE, {12: Std.ALL})),
    ("0:1, 1:0", StdMask(Std.NONE, {0: Std.OUT, 1: Std.NONE})),
])
@pytest.mark.parametrize("flag, attribute", [("--redirects", "redirects"), ("--tee", "tee")])
def test_redirects_and_tee_take_a_mask_or_a_per_rank_map(flag, attribute, text, mask):
    config = parse(flag, text, "train.py")
    assert getattr(config, attribute) == mask
    assert getattr(config, attribute).for_rank(99) == mask.default


@pytest.mark.parametrize("flag", ["-r", "-t"])
@pytest.mark.parametrize("text", ["4", "0:4", "a", "0:1,", "1,2", "", ":1", "0=1"])
def test_malformed_redirects_and_tee_name_the_flag_and_the_forms(flag, text):
    message = parse_error(flag, text, "train.py")
    name = {"-r": "-r/--redirects", "-t": "-t/--tee"}[flag]
    assert message.startswith(f"{name}: {text!r} is not 0-3") and "0:1,1:2" in message


def test_signals_are_normalised_deduplicated_and_validated():
    assert parse("--signals-to-handle", "term, usr1,SIGTERM", "train.py").signals_to_handle == ("SIGTERM", "SIGUSR1")


# -- rendezvous --------------------------------------------------------------------------------


def test_rdzv_conf_repeats_and_merges_with_later_keys_winning():
    config = parse(*ETCD, "--rdzv-conf", "lease_ttl=5,join_timeout=10", "--rdzv_conf=join_timeout=20",
                   "--rdzv-conf", "namespace=/team,last-call-timeout=3", "train.py")
    assert config.rendezvous == RendezvousSettings("job-1", 1, 1, lease_ttl=5, join_timeout=20, namespace="/team",
                                                   last_call_timeout=3)


@pytest.mark.parametrize("text, says", [
    ("join_timout=5", "unknown rendezvous option(s) join_timout; valid options are:"),
    ("lease_ttl", "is not key=value"),
    ("lease_ttl=1", "lease TTL (1.0) must be at least 2"),
    ("join_timeout=soon", "must be a number of seconds"),
])
def test_bad_rdzv_conf_fails_at_parse_time(text, says):
    message = parse_error(*ETCD, "--rdzv-conf", text, "train.py")
    assert message.startswith("--rdzv-conf: ") and says in message


@pytest.mark.parametrize("text", ["'join_timeout=5,last_call_timeout=1,timeout=5'",
                                  '"join_timeout=5,last_call_timeout=1,timeout=5"'])
def test_one_pair_of_quotes_around_the_whole_rdzv_conf_is_taken_off_and_said_once(text):
    # torch's own launcher test (test_launch_elastic) passes the value with its quotes, as a
    # Kubernetes args: list does with a pasted shell line; torchrun runs it.
    config, warnings = parse_with_warnings(*ETCD, f"--rdzv-conf={text}", "train.py")
    assert (config.rendezvous.join_timeout, config.rendezvous.last_call_timeout) == (5.0, 1.0)
    assert [line for line in warnings if "quotes" in line] == [
        f"--rdzv-conf: took the quotes off {text} (a shell would have removed them)"]


@pytest.mark.parametrize("text, says", [
    ("'join_timeout=5,timeout=5", "unknown rendezvous option(s) 'join_timeout"),
    ("'join_timeout=5,timeout=5\"", "unknown rendezvous option(s) 'join_timeout"),
    ("'join_timeout='5',timeout=5'", "unknown rendezvous option(s) 'join_timeout"),
    ("'join_timout=5'", "unknown rendezvous option(s) join_timout"),
])
def test_unmatched_or_nested_quotes_and_typos_inside_quotes_are_still_refused(text, says):
    message = parse_error(*ETCD, "--rdzv-conf", text, "train.py")
    assert message.startswith("--rdzv-conf: ") and says in message and "\n" not in message


def test_quotes_around_an_inline_password_still_warn_that_ps_shows_it():
    _config, warnings = parse_with_warnings(*ETCD, "--rdzv-conf='user=alice,password=hunter2'", "train.py")
    assert any("password" in line and "ps" in line for line in warnings), warnings


@pytest.mark.parametrize("argv, conf, says", [
    (ETCD, "dial_timeout=0", "rendezvous option dial_timeout='0' must be a positive number"),
    (ETCD, "read_timeout=soon", "rendezvous option read_timeout='soon' must be a number of seconds"),
    (ETCD, "max_response_bytes=lots", "rendezvous option max_response_bytes='lots' must be a whole number of bytes"),
    (ETCD, "etcd_transport=builtin", "rendezvous option etcd_transport=builtin was removed"),
    (ETCD, "protocol=ftp", "rendezvous option protocol='ftp' must be one of http, https"),
    (ETCD, "user=alice", "etcd user 'alice' was given without a password"),
    (ETCD, "password_file=/p", "etcd password was given without a user name"),
    (ETCD, "cert=/c.pem", "client certificate needs its key"),
    (("--rdzv-backend=c10d", "--rdzv-endpoint=node0:29400", "--rdzv-id=j"), "is_host=maybe",
     "rendezvous option is_host='maybe' must be 1 or 0 (true or false)"),
    (("--standalone",), "request_timeout=-1", "rendezvous option request_timeout='-1' must be a positive number"),
])
def test_bad_backend_options_fail_at_parse_time_naming_the_option(argv, conf, says):
    message = parse_error(*argv, "--rdzv-conf", conf, "train.py")
    assert message.startswith("--rdzv-conf: ") and says in message and "\n" not in message


def test_etcd_connection_options_are_parsed_into_the_spec_once():
    config = parse(*ETCD, "--rdzv-endpoint=etcd-0,https://etcd-1:2380", "--rdzv-conf",
                   "cacert=/tls/ca.crt,cert=/tls/c.crt,key=/tls/c.key,user=alice,password_file=/auth/pw,"
                   "dial_timeout=2,request_timeout=3,read_timeout=4,max_response_bytes=4096,token=ignored-here",
                   "train.py")
    assert config.backend == EtcdSpec(
        "etcd", (Endpoint("etcd-0", 2379), Endpoint("etcd-1", 2380, "https")), ca_cert="/tls/ca.crt",
        client_certificate=ClientCertificate("/tls/c.crt", "/tls/c.key"),
        credentials=EtcdCredentials("alice", SecretFile("password_file", "/auth/pw")),
        timeouts=Timeouts(dial=2, request=4), max_response_bytes=4096)  # read_timeout is torch's request_timeout
    assert config.rendezvous == RendezvousSettings("job-1", 1, 1)  # connection keys leave the engine alone


def test_protocol_https_turns_plain_etcd_endpoints_into_tls_ones():
    config = parse(*ETCD, "--rdzv-endpoint=e0,e1:2380", "--rdzv-conf=protocol=HTTPS", "train.py")
    assert config.backend.endpoints == (Endpoint("e0", 2379, "https"), Endpoint("e1", 2380, "https"))


@pytest.mark.parametrize("argv, conf, spec", [
    (("--rdzv-backend=c10d", "--rdzv-endpoint=node0", "--rdzv-id=j"), "token_file=/t,is_host=1,insecure_open_store=yes",
     StoreSpec("c10d", Endpoint("node0", 29400), SecretFile("token_file", "/t"), Hosting.HOST, True)),
    (("--rdzv-backend=c10d", "--rdzv-endpoint=node0:1", "--rdzv-id=j"), "is_host=0,token=s3cret,read_timeout=7",
     StoreSpec("c10d", Endpoint("node0", 1), Secret("token", "s3cret"), Hosting.CONNECT, timeouts=Timeouts(5, 7))),
    (("--rdzv-backend=tcp", "--rdzv-endpoint=store:2", "--rdzv-id=j"), "is_host=1,cacert=/unused",
     StoreSpec("tcp", Endpoint("store", 2), hosting=Hosting.CONNECT)),  # tcp never hosts; etcd keys unused
    (("--standalone",), "dial_timeout=1,token=overridden", StandaloneSpec(Timeouts(dial=1, request=10))),
])
def test_store_options_are_parsed_into_the_spec_once(argv, conf, spec):
    assert parse(*argv, f"--rdzv-conf={conf}", "train.py").backend == spec


def test_secrets_are_in_neither_the_config_repr_nor_the_dry_run_but_file_paths_are():
    config = parse(*ETCD, "--rdzv-conf=user=alice,password=hunter2", "train.py")
    assert "hunter2" not in repr(config) and "hunter2" not in describe(config)
    config = parse("--rdzv-backend=c10d", "--rdzv-endpoint=n:1", "--rdzv-id=j", "--rdzv-conf=token=s3cret", "train.py")
    assert "s3cret" not in repr(config) and "token=***" in describe(config)
    config = parse(*ETCD, "--rdzv-conf=user=alice,password_file=/auth/pw", "train.py")
    assert "password_file=/auth/pw" in describe(config)


def test_standalone_hosts_a_store_on_a_free_port_under_a_random_id_and_warns_about_ignored_flags():
    config, warnings = parse_with_warnings("--standalone", "--rdzv-backend=etcd", "--rdzv-endpoint=e:2379",
                                           "train.py", environ={"PET_RDZV_ID": "job-1"})
    assert (config.backend, config.run_id, config.standalone) == (StandaloneSpec(), RUN_ID, True)
    assert warnings == ["--standalone ignores --rdzv-backend=etcd", "--standalone ignores --rdzv-endpoint=e:2379",
                        "--standalone ignores PET_RDZV_ID=job-1"]


@pytest.mark.parametrize("nnodes", ["1", "1:1"])
def test_standalone_accepts_one_node(nnodes):
    assert parse("--standalone", "--nnodes", nnodes, "train.py").standalone


@pytest.mark.parametrize("nnodes", ["2", "1:2"])
def test_standalone_refuses_several_nodes(nnodes):
    assert parse_error("--standalone", "--nnodes", nnodes, "train.py") == (
        f"--standalone: runs a single node, so --nnodes must be 1 or 1:1 (got {nnodes})")


@pytest.mark.parametrize("argv, backend, run_id", [
    (("--rdzv-id=mine",), StandaloneSpec(), "mine"),
    (("--master-port=29600",), StaticSpec(0, Endpoint("127.0.0.1", 29600)), "none"),
    (("--rdzv-backend=c10d", "--rdzv-endpoint=localhost:0", "--rdzv-id=stack-1"), StandaloneSpec(), "stack-1"),
    (("--rdzv-backend=c10d", "--rdzv-endpoint=node0:29400", "--rdzv-id=j"),
     StoreSpec("c10d", Endpoint("node0", 29400), hosting=Hosting.BY_ADDRESS), "j"),
])
def test_single_node_shortcuts_match_torchrun(argv, backend, run_id):
    config = parse(*argv, "train.py")
    assert (config.backend, config.run_id) == (backend, run_id)
    assert config.rendezvous.run_id == run_id


def test_static_nodes_meet_at_the_master_address_and_port():
    config, warnings = parse_with_warnings("--nnodes=2", "--node-rank=1", "--master-addr=node0",
                                           "--master-port=1234", "train.py")
    assert (config.backend, config.backend.endpoint_text) == (StaticSpec(1, Endpoint("node0", 1234)), "node0:1234")
    assert not config.standalone
    assert warnings == []


@pytest.mark.parametrize("argv, endpoint, master", [
    (("--nnodes=2",), "127.0.0.1:29500", Endpoint("127.0.0.1", 29500)),
    (("--nnodes=2", "--master-addr=[::1]"), "[::1]:29500", Endpoint("::1", 29500)),
    (("--nnodes=2", "--rdzv-endpoint=node3"), "node3:29500", Endpoint("node3", 29500)),
])
def test_static_master_defaults_follow_torchrun(argv, endpoint, master):
    config = parse(*argv, "train.py")
    assert (config.backend.endpoint_text, config.backend) == (endpoint, StaticSpec(0, master))


def test_a_static_endpoint_overrides_master_flags_with_a_warning():
    config, warnings = parse_with_warnings("--nnodes=2", "--rdzv-endpoint=node3:4000", "--master-addr=node0",
                                           "train.py")
    assert config.backend.master == Endpoint("node3", 4000)
    assert warnings == ["--master-addr=node0 is ignored: --rdzv-endpoint node3:4000 names the master"]


def test_static_only_flags_are_ignored_with_a_warning_on_dynamic_backends():
    config, warnings = parse_with_warnings(*ETCD, "--node-rank=3", "--master-port=1234", "train.py")
    assert config.backend == ETCD_SPEC
    assert warnings == [
        "--master-port=1234 is ignored: only the static backend uses it, and this run uses the etcd backend",
        "--node-rank=3 is ignored: only the static backend uses it, and this run uses the etcd backend",
    ]


def test_a_dynamic_job_without_an_id_is_warned_about():
    _, warnings = parse_with_warnings("--rdzv-backend=etcd", "--rdzv-endpoint=e:2379", "train.py")
    assert warnings == ["--rdzv-id is not set: every job using the id 'none' on e:2379 joins the same "
                        "rendezvous; give each job its own id"]


# -- what the workers run ----------------------------------------------------------------------


@pytest.mark.parametrize("argv, entrypoint", [
    (("train.py", "--nnodes", "5", "-m", "--standalone"),
     Entrypoint("script", "train.py", ("--nnodes", "5", "-m", "--standalone"))),
    (("--nproc-per-node", "2", "--", "train.py", "--", "--x"), Entrypoint("script", "train.py", ("--", "--x"))),
    (("train.py", "--", "x"), Entrypoint("script", "train.py", ("--", "x"))),
    (("--", "-weird.py", "a"), Entrypoint("script", "-weird.py", ("a",))),
    (("train.py", "-h", "--help"), Entrypoint("script", "train.py", ("-h", "--help"))),
    (("train.py", "--lr=0.1", "a b", "", "--rdzv-conf", "x"),
     Entrypoint("script", "train.py", ("--lr=0.1", "a b", "", "--rdzv-conf", "x"))),
    (("-m", "pkg.train", "--epochs", "3"), Entrypoint("module", "pkg.train", ("--epochs", "3"))),
    (("--no-python", "./train.sh", "-m"), Entrypoint("command", "./train.sh", ("-m",))),
    (("--run-path", "/abs/train.py", "x"), Entrypoint("run_path", "/abs/train.py", ("x",))),
])
def test_the_training_command_reaches_the_workers_untouched(argv, entrypoint):
    assert parse(*argv).entrypoint == entrypoint


def test_run_path_takes_precedence_over_module_and_no_python_with_a_warning():
    config, warnings = parse_with_warnings("--run-path", "-m", "train.py")
    assert config.entrypoint.kind == "run_path"
    assert warnings == ["-m/--module is ignored: --run-path takes precedence (as in torchrun)"]


# -- bad input: one line, naming the flag ------------------------------------------------------

BAD = [
    # (argv, environ, the message starts with)
    (("--nnodes", "3:2", "t.py"), {}, "--nnodes: '3:2' is not N or MIN:MAX"),
    (("--nnodes=1:2", "t.py"), {}, "--nnodes: the static backend needs a fixed node count (got 1:2)"),
    (("--nnodes=2", "--node-rank=2", "t.py"), {}, "--node-rank: 2 is not below the node count (2)"),
    (("--rdzv-backend", "zookeeper", "t.py"), {},
     "--rdzv-backend: 'zookeeper' is not one of etcd, etcd-v3, tcp, c10d, static"),
    (("--rdzv-backend=etcd-v2", "t.py"), {}, "--rdzv-backend: 'etcd-v2' is not one of"),
    (("--rdzv-backend", "etcd", "t.py"), {}, "--rdzv-endpoint: the etcd backend needs an endpoint"),
    (("--rdzv-backend=etcd", "--rdzv-endpoint=e:99999", "t.py"), {},
     "--rdzv-endpoint: the endpoint 'e:99999' has port"),
    (("--rdzv-backend=tcp", "--rdzv-endpoint=a:1,b:2", "t.py"), {},
     "--rdzv-endpoint: the tcp backend takes one HOST[:PORT]"),
    (("--rdzv-backend=c10d", "--rdzv-endpoint=localhost:0", "--nnodes=2", "t.py"), {}, "--rdzv-endpoint: port 0"),
    (("--rdzv-backend=tcp", "--rdzv-endpoint=https://s:1", "t.py"), {},
     "--rdzv-endpoint: the tcp backend's endpoint 'https://s:1' asks for TLS"),
    (("--rdzv-backend=c10d", "--rdzv-endpoint=:0", "t.py"), {}, "--rdzv-endpoint: the endpoint '' has no host"),
    ((*ETCD, "--rdzv-id", "a/b", "t.py"), {}, "--rdzv-id: the run id ('a/b') must be"),
    ((*ETCD, "--rdzv-conf", "bogus=1", "t.py"), {}, "--rdzv-conf: unknown rendezvous option(s) bogus"),
    (("--standalone", "--nnodes", "2", "t.py"), {}, "--standalone: runs a single node"),
    (("--max-restarts", "-1", "t.py"), {}, "--max-restarts: '-1' is not a whole number >= 0"),
    (("--monitor-interval", "0", "t.py"), {}, "--monitor-interval: '0' is not a positive number of seconds"),
    (("--monitor-interval", "nan", "t.py"), {}, "--monitor-interval: 'nan' is not a positive number of seconds"),
    (("--start-method", "thread", "t.py"), {}, "--start-method: 'thread' is not one of spawn, fork, forkserver"),
    (("--local-ranks-filter", "0,a", "t.py"), {}, "--local-ranks-filter: '0,a' is not a comma-separated list"),
    (("--node-rank", "x", "t.py"), {}, "--node-rank: 'x' is not a whole number >= 0"),
    (("--master-port", "70000", "t.py"), {}, "--master-port: '70000' is not a whole number from 1 to 65535"),
    (("--signals-to-handle", "SIGFOO", "t.py"), {}, "--signals-to-handle: 'SIGFOO' is not a signal name"),
    (("--signals-to-handle", "SIGKILL", "t.py"), {}, "--signals-to-handle: SIGKILL cannot be caught"),
    (("--signals-to-handle", ",", "t.py"), {}, "--signals-to-handle: ',' names no signal"),
    (("--shutdown-timeout", "-1", "t.py"), {}, "--shutdown-timeout: '-1' is not a number of seconds >= 0"),
    (("--exit-barrier-timeout", "0", "t.py"), {}, "--exit-barrier-timeout: '0' is not a positive number"),
    (("--metrics-port", "0", "t.py"), {}, "--metrics-port: '0' is not a whole number from 1 to 65535"),
    (("--numa-binding", "bogus", "t.py"), {}, "--numa-binding: 'bogus' is not one of node, socket"),
    (("--role", " ", "t.py"), {}, "--role: the role name must not be empty"),
    (("--prewarm-modules", ",", "t.py"), {}, "--prewarm-modules: name at least one module"),
    (("--prewarm-modules", "torch,os.path;rm", "t.py"), {}, "--prewarm-modules: 'os.path;rm' is not a module name"),
    (("t.py",), {"PET_PREWARM": "sure"}, "--prewarm (from PET_PREWARM): 'sure' is not 1 or 0"),
    (("--live-recovery-timeout", "0", "t.py"), {}, "--live-recovery-timeout: '0' is not a positive number"),
    (("--nnodes", "2", "--node-rank", "0", "--master-addr", "h", "--live-recovery", "t.py"), {},
     "--live-recovery: needs a rendezvous with rounds (etcd, c10d/tcp or --standalone), not the static backend"),
    (("--bogus", "t.py"), {}, "--bogus: unknown flag (see elasticrun --help)"),
    (("--nproc", "2", "t.py"), {}, "--nproc: ambiguous abbreviation, could match --nproc-per-node, "
                                   "--nproc_per_node; did you mean --nproc-per-node?"),  # as torchrun's argparse
    (("--nnodez=2", "t.py"), {}, "--nnodez: unknown flag; did you mean --nnodes?"),
    (("--nnodes",), {}, "--nnodes: expects a value (N|MIN:MAX)"),
    (("--nnodes", "--standalone", "t.py"), {}, "--nnodes: expects a value"),
    (("--standalone=1", "t.py"), {}, "--standalone: a switch takes no value (got '1')"),
    (("-m", "--no-python", "t.py"), {}, "-m/--module and --no-python cannot be used together"),
    ((), {}, "no training script given"),
    (("--nproc-per-node", "2"), {}, "no training script given"),
    (("--",), {}, "no training script given"),
    (("t.py",), {"PET_NNODES": "x"}, "--nnodes (from PET_NNODES): 'x' is not N or MIN:MAX"),
    (("t.py",), {"PET_STANDALONE": "maybe"}, "--standalone (from PET_STANDALONE): 'maybe' is not 1 or 0"),
    (("t.py",), {"TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "soon"},
     "--shutdown-timeout (from TORCH_ELASTIC_SHUTDOWN_TIMEOUT): 'soon'"),
]


@pytest.mark.parametrize("argv, environ, starts", BAD, ids=[" ".join(case[0]) or "(nothing)" for case in BAD])
def test_bad_input_raises_one_line_naming_the_flag(argv, environ, starts):
    message = parse_error(*argv, environ=environ)
    assert message.startswith(starts)
    assert "\n" not in message


def test_prewarm_is_off_by_default_and_imports_torch_when_on():
    config = parse("t.py")
    assert config.prewarm is False
    assert parse("--prewarm", "t.py").prewarm_modules == ("torch",)


def test_live_recovery_is_off_by_default_with_a_60_s_answer_deadline():
    config = parse("t.py")
    assert (config.live_recovery, config.live_recovery_timeout) == (False, 60.0)
    assert parse("--live-recovery", "--prewarm", "t.py").prewarm  # forked workers get the pipes too


def test_prewarm_with_no_python_is_accepted_with_one_warning_and_not_used():
    config, warnings = parse_with_warnings("--prewarm", "--no-python", "t.sh")
    assert not config.prewarm and config.entrypoint.kind == "command"
    assert warnings == ["--prewarm is ignored with --no-python: the workers are not Python, so they start as usual"]


def test_parse_or_exit_prints_one_error_line_and_exits_2():
    out, err = io.StringIO(), io.StringIO()
    with pytest.raises(SystemExit) as exited:
        parse_or_exit(["--nnodes", "3:2", "t.py"], {}, stdout=out, stderr=err)
    assert exited.value.code == 2 and out.getvalue() == ""
    assert err.getvalue() == "elasticrun: error: --nnodes: '3:2' is not N or MIN:MAX with 1 <= MIN <= MAX\n"


def test_parse_or_exit_prints_warnings_as_elasticrun_lines(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "t.py").write_text("")
    err = io.StringIO()
    parse_or_exit(["--virtual-local-rank", "t.py"], {}, stderr=err, new_run_id=lambda: RUN_ID)
    assert err.getvalue() == ("elasticrun: warning: --virtual-local-rank is accepted for torchrun "
                              "compatibility and has no effect in elasticrun\n")


@pytest.mark.parametrize("argv", [
    ("--nnodes", "3:2", "t.py"),
    ("--bogus", "t.py"),
    (),
    ("--rdzv-backend=etcd", "--rdzv-endpoint=e:1", "--rdzv-conf", "bogus=1", "t.py"),
    ("-m", "--no-python", "t.py"),
    ("--nproc-per-node", "gpu", "t.py"),
])
def test_the_entry_point_exits_2_with_one_stderr_line_and_no_traceback(argv):
    if argv[:2] == ("--nproc-per-node", "gpu") and HostDevices(os.environ).gpu_count() > 0:
        argv = ("--nproc-per-node", "0", "t.py")
    result = run_cli(*argv)
    assert result.returncode == 2, result.stderr
    assert result.stdout == "" and "Traceback" not in result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("elasticrun: error: ")


# -- compatibility-only flags ------------------------------------------------------------------


@pytest.mark.parametrize("argv, warning", [
    (("--event-log-handler=console",), "--event-log-handler=console"),
    (("--numa-binding=node",), "--numa-binding=node"),
    (("--duplicate-stdout-filters=a,b",), "--duplicate-stdout-filters=a,b"),
    (("--virtual-local-rank",), "--virtual-local-rank"),
])
def test_compatibility_flags_are_accepted_and_said_to_have_no_effect(argv, warning):
    config, warnings = parse_with_warnings(*argv, "train.py")
    assert config == parse("train.py")
    assert warnings == [f"{warning} is accepted for torchrun compatibility and has no effect in elasticrun"]


def test_compatibility_flags_at_their_defaults_say_nothing():
    _, warnings = parse_with_warnings(*ETCD, "--event-log-handler=null", "--start-method=fork", "train.py")
    assert warnings == []


# -- help and --dry-run ------------------------------------------------------------------------


def test_help_lists_every_flag_with_its_twin_and_is_not_a_parse_error():
    with pytest.raises(HelpRequested) as raised:
        parse("--nnodes=2", "-h", "train.py")
    text = raised.value.text
    assert text == format_help()
    for option in OPTIONS:
        for flag in option.flags:
            assert flag in text
        if option.env_name:
            assert option.env_name in text
    assert text.count("accepted for torchrun compatibility") >= 1


def test_help_shows_the_log_layout_with_its_node_level_and_no_removed_key():
    text = " ".join(format_help().split())
    assert "DIR/RUN_ID/NODE_ID/ attempt_K/LOCAL_RANK" in text or "DIR/RUN_ID/NODE_ID/attempt_K/LOCAL_RANK" in text
    assert "etcd_transport" not in text


def test_the_entry_point_prints_help_and_exits_0():
    result = run_cli("--help")
    assert result.returncode == 0 and result.stderr == ""
    assert "--nproc-per-node, --nproc_per_node N|auto|cpu|gpu|xpu" in result.stdout


def test_the_entry_point_prints_the_installed_version_and_exits_0():
    from importlib import metadata

    import elastic

    result = run_cli("--version")
    assert result.returncode == 0 and result.stderr == ""
    assert result.stdout == f"elasticrun {metadata.version('etcd-elastic')}\n"
    assert elastic.__version__ == metadata.version("etcd-elastic")


def test_describe_prints_every_setting_once_in_a_fixed_order_with_secrets_masked():
    config = parse("--nnodes=2:4", "--nproc-per-node=auto", "--rdzv-backend=etcd", "--rdzv-endpoint=e:2379",
                   "--rdzv-id=job-1", "--rdzv-conf=user=u,password=hunter2", "-t", "0:3,1:1",
                   "train.py", "--lr", "0.1 0.2", devices=FixedDevices(cpus=8, gpus=4))
    text = describe(config)
    assert describe(config) == text and text.endswith("\n") and "hunter2" not in text
    pairs = [line.split(":", 1) for line in text.splitlines()]
    values = {key: value.strip() for key, value in pairs}
    assert len(values) == len(pairs)
    assert [key for key, _ in pairs][:3] == ["entrypoint", "nnodes", "nproc_per_node"]
    assert values["entrypoint"] == "script train.py --lr '0.1 0.2'"
    assert values["nnodes"] == "2:4 (elastic)" and values["nproc_per_node"] == "4 (auto: 4 GPUs)"
    assert values["backend"].startswith("user=u,password=***,") and values["tee"] == "0:3,1:1"
    assert values["rendezvous"].startswith("join_timeout=600,") and "hunter2" not in repr(config)
    covered = {"min_nodes", "max_nodes", "nproc_source"}
    assert {field.name for field in fields(LaunchConfig)} - covered <= set(values)


def test_dry_run_prints_the_resolved_config_and_exits_0():
    result = run_cli("--dry-run", "--nnodes=1:4", "--nproc-per-node=3", "--rdzv-backend=etcd",
                     "--rdzv-endpoint=etcd-0:2379", "--rdzv-id=job-42", "train.py", "--epochs", "2")
    assert result.returncode == 0 and result.stderr == ""
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["entrypoint:", "script", "train.py", "--epochs", "2"]
    for expected in (["nnodes:", "1:4", "(elastic)"], ["nproc_per_node:", "3"], ["rdzv_backend:", "etcd"],
                     ["run_id:", "job-42"], ["dry_run:", "yes"]):
        assert expected in [line.split() for line in lines]


# -- the launcher path never imports torch -----------------------------------------------------


@pytest.mark.parametrize("code", [
    "import elastic.run, sys; assert 'torch' not in sys.modules, 'torch imported'",
    "import sys; from elastic.launch.cli import config_from_args; from elastic.launch.describe import describe; "
    "describe(config_from_args(['--nnodes=1:4', '--nproc-per-node=auto', '--rdzv-backend=etcd', "
    "'--rdzv-endpoint=e:2379', '--rdzv-id=j', 'train.py', '--lr', '1'], {}, warn=print)); "
    "assert 'torch' not in sys.modules, 'torch imported'",
    "import sys, elastic.run; elastic.run.main(['--dry-run', '--standalone', '-r', '3', 'train.py']); "
    "assert 'torch' not in sys.modules, 'torch imported'",
])
def test_the_cli_path_does_not_import_torch(code):
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=clean_environ(),
                            timeout=60, check=False)
    assert result.returncode == 0, result.stderr
