"""Pure pieces: pipeline splits, id splitting, the SIGTERM guard's once-only bounded exit."""

from __future__ import annotations

import threading
import time

import pytest

from rpc.introspect import split_id
from rpc.pipeline import split_sizes
from rpc.signals import SigtermGuard


@pytest.mark.parametrize(
    "layers, stages, balance, expected",
    [(5, 2, None, [3, 2]), (4, 2, None, [2, 2]), (7, 3, None, [3, 2, 2]), (3, 3, None, [1, 1, 1]),
     (5, 2, [1, 4], [1, 4])],
)
def test_layers_are_split_evenly_or_as_balanced(layers, stages, balance, expected):
    assert split_sizes(layers, stages, balance) == expected


@pytest.mark.parametrize(
    "layers, stages, balance, message",
    [(2, 3, None, "fewer than the 3 stages"), (5, 2, [5, 0], "at least one layer"),
     (5, 2, [2, 2], "add up to the model's 5 layers"), (5, 0, None, "at least one stage")],
)
def test_impossible_splits_are_refused(layers, stages, balance, message):
    with pytest.raises(ValueError, match=message):
        split_sizes(layers, stages, balance)


@pytest.mark.parametrize(
    "autograd_id, parts",
    [(0, (0, 0)), (5, (0, 5)), (1 << 48, (1, 0)), ((3 << 48) + 17, (3, 17)), ((1 << 64) - 1, (65535, (1 << 48) - 1))],
)
def test_ids_split_into_worker_id_and_counter(autograd_id, parts):
    assert split_id(autograd_id) == parts


@pytest.mark.parametrize("autograd_id", [-1, 1 << 64])
def test_ids_outside_64_bits_are_refused(autograd_id):
    with pytest.raises(ValueError, match="64-bit"):
        split_id(autograd_id)


def test_the_sigterm_path_exits_143_once_even_if_the_local_shutdown_hangs():
    exits: list[int] = []
    release = threading.Event()
    guard = SigtermGuard(on_signal=lambda: release.wait(30), timeout=0.3, exit=exits.append)
    started = time.monotonic()
    threads = [threading.Thread(target=guard._terminate) for _ in range(2)]  # both paths at once
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    release.set()
    assert exits == [143]
    assert time.monotonic() - started < 10  # bounded by the timeout, not by the hanging shutdown


def test_the_local_shutdown_runs_before_the_exit():
    order: list[str] = []
    guard = SigtermGuard(on_signal=lambda: order.append("shutdown"), timeout=5, exit=lambda code: order.append(code))
    guard._terminate()
    assert order == ["shutdown", 143]


# -- torch's private distributed autograd API, which rpc.introspect reads ----------------------


@pytest.mark.needs_torch
def test_torch_still_has_the_private_distributed_autograd_api_introspection_reads():
    import torch.distributed.autograd as dist_autograd
    from torch._C._distributed_autograd import DistAutogradContext

    assert callable(dist_autograd._current_context) and callable(dist_autograd._retrieve_context)
    for method in ("_context_id", "_send_functions", "_recv_functions", "_known_worker_ids"):
        assert callable(getattr(DistAutogradContext, method, None)), method


@pytest.mark.needs_torch
def test_a_missing_private_api_is_named_in_the_error(monkeypatch):
    import torch.distributed.autograd as dist_autograd

    from rpc.errors import IntrospectionError
    from rpc.introspect import describe_context

    monkeypatch.delattr(dist_autograd, "_retrieve_context")
    with pytest.raises(IntrospectionError, match=r"has no torch\.distributed\.autograd\._retrieve_context; .*2\.13"):
        describe_context(5)


@pytest.mark.needs_torch
def test_no_context_is_an_introspection_error_with_torchs_reason():
    from rpc.errors import IntrospectionError
    from rpc.introspect import describe_context

    with pytest.raises(IntrospectionError, match="No distributed autograd context is active on this thread: Need to"):
        describe_context()
