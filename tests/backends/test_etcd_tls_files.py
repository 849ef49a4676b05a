"""The etcd client's TLS files, read again before each new connection (backends/etcd/tls_files.py).

Real files in a temporary directory and certificates from :mod:`elastic.testing.tls`; no etcd
(the rotation against a real etcd is in test_etcd_backend.py and tests/chaos/test_etcd_tls.py).
"""

from __future__ import annotations

import logging
import os

import pytest

from backends.errors import EndpointError
from backends.etcd.tls_files import TlsFiles, takes, wall_time
from elastic.testing.tls import make_tls_files


@pytest.fixture
def files(tmp_path):
    made = make_tls_files(tmp_path / "old")
    ca_file = tmp_path / "ca.pem"
    ca_file.write_bytes(made.ca_cert.read_bytes())
    return made, ca_file


@pytest.mark.parametrize(
    ("old", "new", "taken"),
    [
        (b"-----BEGIN CERTIFICATE-----\nA\n", b"-----BEGIN CERTIFICATE-----\nA\n", False),  # unchanged
        (b"-----BEGIN CERTIFICATE-----\nA\n", b"-----BEGIN CERTIFICATE-----\nB\n", True),
        (b"-----BEGIN CERTIFICATE-----\nA\n", b"", False),  # truncated by a rewrite in progress
        (b"-----BEGIN CERTIFICATE-----\nA\n", b"-----BEG", False),  # cut before its first block
    ],
    ids=["unchanged", "rewritten", "empty", "cut"],
)
def test_a_file_is_taken_again_only_when_it_holds_other_bytes_with_a_pem_block(old, new, taken):
    assert takes(old, new) is taken


def test_an_unchanged_file_keeps_the_credentials_and_a_rewritten_one_gives_new_ones(files, tmp_path, caplog):
    made, ca_file = files
    tls = TlsFiles(ca_file, made.client_cert, made.client_key)
    generation, credentials = tls.credentials
    assert not tls.refresh()
    assert tls.credentials == (generation, credentials)

    ca_file.write_bytes(made.ca_cert.read_bytes() + make_tls_files(tmp_path / "new").ca_cert.read_bytes())
    with caplog.at_level(logging.INFO, logger="backends.etcd.tls_files"):
        assert tls.refresh()
    assert tls.credentials[0] == generation + 1 and tls.credentials[1] is not credentials
    changed_at = wall_time(os.stat(ca_file).st_mtime)
    assert [record.getMessage() for record in caplog.records if record.levelno == logging.INFO] == [
        f"etcd: re-read the CA file {ca_file} (changed at {changed_at}); new connections use it"]


def test_a_file_caught_half_way_through_a_rewrite_keeps_its_last_contents_with_one_warning(files, caplog):
    made, ca_file = files
    tls = TlsFiles(ca_file, None, None)
    generation = tls.credentials[0]
    ca_file.write_bytes(b"")
    with caplog.at_level(logging.WARNING, logger="backends.etcd.tls_files"):
        assert not any(tls.refresh() for _ in range(3))
    assert tls.credentials[0] == generation
    [warning] = [record.getMessage() for record in caplog.records]
    assert f"the CA file {ca_file} holds no PEM block" in warning and "keeping what was read at" in warning

    ca_file.write_bytes(made.ca_cert.read_bytes() + made.client_cert.read_bytes())
    assert tls.refresh() and tls.credentials[0] == generation + 1


def test_a_file_that_vanished_keeps_its_last_contents_until_it_is_back(files, caplog):
    made, ca_file = files
    tls = TlsFiles(ca_file, None, None)
    ca_file.unlink()
    with caplog.at_level(logging.WARNING, logger="backends.etcd.tls_files"):
        assert not tls.refresh()
    assert "cannot be read (No such file or directory)" in caplog.text
    ca_file.write_bytes(made.ca_cert.read_bytes())
    assert not tls.refresh()  # back with the same contents: nothing to renew


def test_which_file_was_read_when_is_named_for_messages(files):
    made, ca_file = files
    now = [1_000_000.0]
    tls = TlsFiles(ca_file, made.client_cert, made.client_key, clock=lambda: now[0])
    first = tls.describe()
    assert first.startswith(f"the CA file {ca_file} (read at {wall_time(1_000_000.0)}, changed at ")
    assert f"; the client certificate file {made.client_cert} (read at " in first
    assert f"; the client key file {made.client_key} (read at " in first
    now[0] += 60
    tls.refresh()
    assert f"the CA file {ca_file} (read at {wall_time(1_000_060.0)}, changed at " in tls.describe()
    assert "system's CA certificates" in TlsFiles(None, None, None).describe()


def test_a_tls_file_that_cannot_be_read_at_start_is_one_line_naming_it(tmp_path):
    missing = tmp_path / "missing.pem"
    with pytest.raises(EndpointError) as refused:
        TlsFiles(missing, None, None)
    assert str(refused.value) == f"Cannot read the etcd TLS file {str(missing)!r}: No such file or directory."
