"""Distributed autograd in real processes: the design note's example and what introspection sees.

Two workers (``worker0``, ``worker1``, gloo/TensorPipe on CPU, the environment elasticrun gives)
each run the design note's step towards the other at the same time:
``t3 = rpc_sync(peer, torch.add, (t1, t2)); t5 = t3 * t4; loss = t5.sum()``, then a step with
three RPCs. One run serves every test of this file (see ``workers/scenarios.py``).
"""

from __future__ import annotations

import re

import pytest

from rpc.introspect import split_id

# Slow: three workers import torch and form an RPC group (seconds); CI runs it (--all).
pytestmark = [pytest.mark.slow, pytest.mark.needs_torch]


@pytest.fixture(scope="module")
def results(module_spawn) -> list[dict]:
    return module_spawn.run("design_note", 2)


def ids(functions: list[dict]) -> list[int]:
    return [function["message_id"] for function in functions]


def id_text(message_id: int) -> str:
    worker, counter = split_id(message_id)
    return f"{worker}:{counter}"


@pytest.mark.parametrize("rank", [0, 1])
def test_design_note_gradients_equal_the_local_computation_exactly(results, rank):
    result = results[rank]
    assert result["grads_bitwise_equal"] is True
    assert result["dist_grads"] == result["local_grads"]  # the floats themselves, t1, t2 and t4
    assert result["dot_grad_untouched"] is True  # gradients accumulate in the context, not in .grad


@pytest.mark.parametrize("rank", [0, 1])
def test_the_context_id_carries_the_creating_workers_id_in_its_top_16_bits(results, rank):
    result = results[rank]
    peer = 1 - rank
    assert split_id(result["context_id"])[0] == rank
    local, remote = result["local_info"], result["remote_info"]
    assert (local["context_id"], local["worker_id"], local["creator_id"]) == (result["context_id"], rank, rank)
    # The peer holds the same context, created by us.
    assert (remote["context_id"], remote["worker_id"], remote["creator_id"]) == (result["context_id"], peer, rank)
    assert local["known_workers"] == [peer] and remote["known_workers"] == [rank]


@pytest.mark.parametrize("rank", [0, 1])
def test_one_rpc_records_exactly_one_send_recv_pair_matched_across_workers(results, rank):
    result = results[rank]
    peer = 1 - rank
    local, remote = result["local_info"], result["remote_info"]
    assert len(local["sends"]) == len(local["recvs"]) == 1
    assert len(remote["sends"]) == len(remote["recvs"]) == 1
    assert ids(local["sends"]) == ids(remote["recvs"])  # our request arrived there
    assert ids(remote["sends"]) == ids(local["recvs"])  # its response arrived here
    assert split_id(local["sends"][0]["message_id"])[0] == rank  # a message id names its sender
    assert split_id(remote["sends"][0]["message_id"])[0] == peer
    assert {f["name"] for f in local["sends"] + remote["sends"]} == {"SendRpcBackward"}
    assert {f["name"] for f in local["recvs"] + remote["recvs"]} == {"RecvRpcBackward"}
    # Asking the peer about the context is an RPC without tensors: it records nothing.
    assert result["local_info_after_remote_query"] == local


@pytest.mark.parametrize("rank", [0, 1])
def test_three_rpcs_record_three_pairs(results, rank):
    result = results[rank]
    peer = str(1 - rank)
    local, everywhere = result["three_local"], result["three_all"]
    assert sorted(everywhere) == ["0", "1"]
    assert everywhere[str(rank)] == local
    assert len(local["sends"]) == len(local["recvs"]) == 3
    assert ids(local["sends"]) == ids(everywhere[peer]["recvs"])
    assert ids(everywhere[peer]["sends"]) == ids(local["recvs"])
    assert len(set(ids(local["sends"]) + ids(local["recvs"]))) == 6


def test_the_graph_text_shows_both_workers_and_joins_each_recv_to_its_send(results):
    result = results[0]
    send, recv = result["local_info"]["sends"][0]["message_id"], result["local_info"]["recvs"][0]["message_id"]
    context = result["context_id"]
    expected = (
        f"distributed autograd graph of context {context} (created by worker0, id 0; counter {split_id(context)[1]})\n"
        "worker0 (id 0):\n"
        "  SumBackward0\n"
        "    MulBackward0\n"
        f"      RecvRpcBackward  recv msg {id_text(recv)} from worker1\n"
        "      AccumulateGrad  [3, 3]\n"
        f"  SendRpcBackward  send msg {id_text(send)} to worker1\n"
        "    AccumulateGrad  [3, 3]\n"
        "    AccumulateGrad  [3, 3]\n"
        "worker1 (id 1):\n"
        f"  SendRpcBackward  send msg {id_text(recv)} to worker0\n"
        "    AddBackward0\n"
        f"      RecvRpcBackward  recv msg {id_text(send)} from worker0\n"
    )
    assert result["graph_text"] == expected


def test_the_graph_dot_has_a_cluster_per_worker_and_a_dashed_edge_per_message(results):
    result = results[0]
    dot = result["graph_dot"]
    nodes = {node["key"]: node for node in result["graph_nodes"]}
    assert dot.startswith(f'digraph "dist_autograd_context_{result["context_id"]}" {{') and dot.rstrip().endswith("}")
    assert dot.count("{") == dot.count("}")
    assert re.findall(r'subgraph "(cluster_w\d)"', dot) == ["cluster_w0", "cluster_w1"]
    declared = set(re.findall(r'^\s+"(w\d+n\d+)" \[label=', dot, re.M))
    assert declared == set(nodes)
    edges = re.findall(r'^\s+"(w\d+n\d+)" -> "(w\d+n\d+)"(.*);$', dot, re.M)
    assert {key for edge in edges for key in edge[:2]} <= declared
    dashed = [(a, b) for a, b, attrs in edges if "dashed" in attrs]
    assert sorted(dashed) == sorted(tuple(edge) for edge in result["graph_rpc_edges"])
    assert len(dashed) == 2
    for recv, send in dashed:  # each RPC edge joins a recv to the send of the same message, across workers
        assert (nodes[recv]["kind"], nodes[send]["kind"]) == ("recv", "send")
        assert nodes[recv]["message_id"] == nodes[send]["message_id"]
        assert nodes[recv]["worker_id"] != nodes[send]["worker_id"]


def test_workers_are_found_by_role_and_rank(results):
    for rank, result in enumerate(results):
        assert result["name"] == f"worker{rank}" and result["peer"] == f"worker{1 - rank}"
        assert result["lookup"] == {"workers": ["worker0", "worker1"], "roles": {"worker": 2}}
