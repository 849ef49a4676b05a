"""torch's ``--rdzv-conf`` keys: every one torch 2.13's handlers read is mapped onto ours or noted."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from elastic.rendezvous.conf import OurConf, from_torch, valid_keys
from elastic.rendezvous.errors import RendezvousConfigError


def keys_torch_reads() -> set[str]:
    """The keys torch's rendezvous handlers and launcher read from the rendezvous parameters,
    scanned from the installed sources (``params.get_as_int("read_timeout"``, ``_get_timeout(params,
    "join")`` → ``join_timeout``, ``rdzv_configs["timeout"]``, ...)."""
    import torch.distributed

    root = Path(torch.distributed.__file__).parent
    files = [*(root / "elastic" / "rendezvous").glob("*.py"), root / "launcher" / "api.py", root / "run.py"]
    patterns = (
        r'params\.(?:get|get_as_int|get_as_bool)\(\s*"([a-z_]+)"',
        r'params\.config(?:\.get\(|\[)\s*"([a-z_]+)"',
        r'rdzv_configs\["([a-z_]+)"\]',
    )
    keys = set()
    for path in files:
        text = path.read_text()
        for pattern in patterns:
            keys.update(re.findall(pattern, text))
        keys.update(f"{name}_timeout" for name in re.findall(r'_get_timeout\(\s*params,\s*"([a-z_]+)"\)', text))
    return keys


def test_every_key_torchs_handlers_read_is_accepted():
    read = keys_torch_reads()
    # the scan must see what we know torch reads, or it proves nothing
    assert {"join_timeout", "heartbeat_timeout", "keep_alive_interval", "is_host", "read_timeout", "store_type",
            "ssl_cert_key", "ca_cert", "etcd_prefix", "cacert", "timeout", "rank", "last_call_timeout"} <= read
    assert read - set(valid_keys()) == set()


@pytest.mark.parametrize("conf, backend, values", [
    ({"timeout": "5"}, "etcd", {"join_timeout": "5"}),
    ({"timeout": "5"}, "etcd-v3", {"join_timeout": "5"}),
    ({"timeout": "5"}, "tcp", {"join_timeout": "5"}),
    ({"timeout": "5", "join_timeout": "9"}, "etcd", {"join_timeout": "9"}),  # ours wins
    ({"join_timeout": "9", "timeout": "5"}, "etcd", {"join_timeout": "9"}),  # whatever the order
    ({"timeout": "5"}, "c10d", {}),  # torch's c10d does not read it
    ({"timeout": "5"}, "static", {}),
    ({"ca_cert": "/ca", "ssl_cert": "/c", "ssl_cert_key": "/k"}, "etcd", {"cacert": "/ca", "cert": "/c", "key": "/k"}),
    ({"cacert": "/ours", "ca_cert": "/torch"}, "etcd", {"cacert": "/ours"}),
    ({"heartbeat_timeout": "30", "heartbeat": "3", "rank": "1", "use_libuv": "0", "store_type": "tcp"}, "c10d", {}),
    ({"store_type": "file"}, "etcd", {}),  # only the built-in store reads it
    ({"last_call_timeout": "1", "is_host": "0", "read_timeout": "7", "etcd_prefix": "/p", "protocol": "https",
      "keep_alive_interval": "1", "keep_alive_max_attempt": "2", "lease_ttl": "3"}, "c10d",
     {"last_call_timeout": "1", "is_host": "0", "read_timeout": "7", "etcd_prefix": "/p", "protocol": "https",
      "keep_alive_interval": "1", "keep_alive_max_attempt": "2", "lease_ttl": "3"}),
])
def test_torch_keys_map_onto_ours(conf, backend, values):
    assert from_torch(conf, backend).values == values


@pytest.mark.parametrize("conf, backend, note", [
    ({"timeout": "5"}, "c10d", "--rdzv-conf timeout=5 has no effect: torch's c10d rendezvous does not read it either"),
    ({"timeout": "5"}, "static", "--rdzv-conf timeout=5 has no effect: the static backend waits for no rendezvous"),
    ({"heartbeat_timeout": "30"}, "etcd", "--rdzv-conf heartbeat_timeout=30 has no effect: torch's dynamic "
                                          "rendezvous reads it as its keep-alive deadline; liveness here is"),
    ({"heartbeat": "3"}, "etcd", "--rdzv-conf heartbeat=3 has no effect: torch documents it"),
    ({"rank": "1"}, "etcd", "--rdzv-conf rank=1 has no effect: torchrun's static rendezvous takes it from --node-rank"),
    ({"use_libuv": "0"}, "c10d", "--rdzv-conf use_libuv=0 has no effect: older torch's c10d store switch"),
    ({"store_type": "TCP"}, "c10d", "--rdzv-conf store_type=TCP has no effect: only torch's c10d"),
])
def test_keys_without_effect_are_noted_once_with_the_reason(conf, backend, note):
    notes = from_torch(conf, backend).notes
    assert len(notes) == 1 and notes[0].startswith(note) and "\n" not in notes[0]


def test_mapped_and_our_own_keys_say_nothing():
    assert from_torch({"timeout": "5", "ca_cert": "/ca", "join_timeout": "9"}, "etcd") == OurConf(
        {"join_timeout": "9", "cacert": "/ca"}, ())


@pytest.mark.parametrize("conf, backend, says", [
    ({"join_timout": "5"}, "c10d", "Unknown rendezvous option(s) join_timout; valid options are: "),
    ({"local_addr": "x"}, "etcd", "Unknown rendezvous option(s) local_addr"),  # a parameter, not a key
    ({"store_type": "file"}, "c10d", "store_type='file' is not supported: the built-in store is a TCP store"),
    ({"store_type": "file"}, "tcp", "store_type='file' is not supported"),
])
def test_keys_no_torch_handler_reads_stay_errors(conf, backend, says):
    with pytest.raises(RendezvousConfigError) as raised:
        from_torch(conf, backend)
    assert says in str(raised.value) and "\n" not in str(raised.value)


def test_the_valid_keys_list_ours_then_torchs():
    keys = valid_keys()
    assert len(keys) == len(set(keys))
    assert keys.index("join_timeout") < keys.index("ca_cert") and keys[-1] == "use_libuv"


def test_a_removed_key_is_accepted_but_not_offered_in_the_unknown_key_message():
    from elastic.rendezvous.conf import check_known_keys
    from elastic.rendezvous.errors import RendezvousConfigError

    check_known_keys({"etcd_transport": "grpcio"})
    with pytest.raises(RendezvousConfigError) as raised:
        check_known_keys({"bogus": "1"})
    assert "etcd_transport" not in str(raised.value) and "join_timeout" in str(raised.value)
