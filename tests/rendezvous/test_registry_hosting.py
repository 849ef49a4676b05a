"""When a c10d host may serve its store: a case table of ``check_open_hosting``."""

import pytest

from backends.endpoints import is_loopback_only
from elastic.rendezvous.errors import RendezvousConfigError
from elastic.rendezvous.registry import check_open_hosting


@pytest.mark.parametrize("bind_host, token, allow_open, refused", [
    ("127.0.0.1", None, False, False),  # loopback: nobody else can reach it
    ("::1", None, False, False),
    ("localhost", None, False, False),
    ("0.0.0.0", None, False, True),  # every interface, no token: refused
    ("::", None, False, True),
    ("192.0.2.7", None, False, True),  # a routable address
    ("0.0.0.0", "s3cret", False, False),  # a token makes it safe
    ("0.0.0.0", None, True, False),  # the explicit torchrun-style opt-out
])
def test_open_hosting_is_refused_only_off_loopback_without_token_or_opt_out(bind_host, token, allow_open, refused):
    if refused:
        with pytest.raises(RendezvousConfigError, match="token_file=.*insecure_open_store=1"):
            check_open_hosting(bind_host, 29400, token, allow_open)
    else:
        check_open_hosting(bind_host, 29400, token, allow_open)


@pytest.mark.parametrize("host, expected", [
    ("127.0.0.1", True), ("127.0.1.1", True), ("::1", True), ("localhost", True),
    ("0.0.0.0", False), ("::", False), ("", False), ("192.0.2.7", False),
])
def test_loopback_only_hosts(host, expected):
    assert is_loopback_only(host) is expected
