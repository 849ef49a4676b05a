"""The ``rpc`` package surface: torch-free import, lazy exports, the error tree, early env errors."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

import rpc
from rpc import errors


def run_python(code: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=60, env=env)


def test_importing_rpc_and_its_api_names_does_not_import_torch():
    result = run_python("""
        import json, sys
        import rpc
        names = [rpc.start, rpc.init, rpc.shutdown, rpc.RpcWorkerEnv, rpc.worker_name, rpc.WorkerEnvError]
        import rpc.env, rpc.errors, rpc.rendezvous, rpc.signals, rpc.bootstrap, rpc.lookup, rpc.training
        import rpc.remote, rpc.pipeline, rpc.introspect, rpc.graph, rpc.checkpoint
        print(json.dumps(sorted(m for m in sys.modules if m == "torch" or m.startswith("torch."))))
    """)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == []


def test_starting_without_a_worker_environment_fails_before_importing_torch():
    result = run_python("""
        import sys
        import rpc
        try:
            rpc.start().__enter__()
        except rpc.WorkerEnvError as error:
            print("torch imported:", "torch" in sys.modules)
            print(error)
    """, env={"PATH": "/usr/bin:/bin"})
    assert result.returncode == 0, result.stderr
    assert "torch imported: False" in result.stdout
    assert "missing RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT" in result.stdout


def test_every_exported_name_resolves_and_unknown_names_raise():
    for name in rpc.__all__:
        assert getattr(rpc, name) is not None, name
    assert rpc.checkpoint.save is not None  # submodules too
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        rpc.nope  # noqa: B018


@pytest.mark.parametrize(
    "error, bases",
    [
        (errors.WorkerEnvError, (errors.RpcSetupError, ValueError)),
        (errors.RpcOptionsError, (errors.RpcSetupError, ValueError)),
        (errors.RpcInitError, (errors.RpcSetupError,)),
        (errors.RpcNotStartedError, (errors.RpcSetupError,)),
        (errors.RpcShutdownError, (errors.RpcError,)),
        (errors.WorkerLookupError, (errors.RpcError, LookupError)),
        (errors.IntrospectionError, (errors.RpcError,)),
        (errors.CheckpointError, (errors.RpcError,)),
    ],
)
def test_errors_form_one_tree_under_rpc_error(error, bases):
    assert issubclass(error, errors.RpcError)
    assert all(issubclass(error, base) for base in bases)


@pytest.mark.needs_torch
def test_using_rpc_before_start_says_so():
    with pytest.raises(errors.RpcNotStartedError, match=r"call rpc\.start\(\)"):
        rpc.current()
    with pytest.raises(errors.RpcNotStartedError, match=r"call rpc\.start\(\)"):
        rpc.workers("worker")
    rpc.shutdown()  # a no-op when not started


def test_a_missing_numpy_is_reported_with_the_install_command(monkeypatch):
    import importlib.util

    from rpc import bootstrap

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *args: None if name == "numpy" else real_find_spec(name, *args))
    with pytest.raises(errors.RpcInitError, match=r"needs numpy .* pip install 'etcd-elastic\[rpc\]'"):
        bootstrap._torch_rpc()
