"""elasticrun's job fingerprint (issue 26 item 9): from the training command, or ``--rdzv-conf job_fingerprint``."""

from __future__ import annotations

from elastic.launch.cli import config_from_args

ETCD = ["--nnodes=1:2", "--rdzv-backend=etcd", "--rdzv-endpoint=localhost:2379", "--rdzv-id=job"]


def job_of(*argv: str):
    return config_from_args([*ETCD, *argv], {}).rendezvous.job


def test_nodes_of_one_job_with_node_local_values_share_a_fingerprint():
    a = job_of("--nproc-per-node=2", "train.py", "--ckpt", "/disk-a/ckpt.pt")
    b = job_of("--nproc-per-node=8", "train.py", "--ckpt", "/disk-b/ckpt.pt")
    assert a.fingerprint == b.fingerprint
    assert a.command == "train.py --ckpt /disk-a/ckpt.pt"


def test_another_script_or_module_has_another_fingerprint():
    assert job_of("train.py").fingerprint != job_of("probe.py").fingerprint
    assert job_of("-m", "pkg.train").fingerprint != job_of("pkg/train.py").fingerprint
    assert job_of("-m", "pkg.train").command == "-m pkg.train"


def test_job_fingerprint_names_the_job_whatever_its_command():
    a = job_of("--rdzv-conf=job_fingerprint=exp-7", "train.py")
    b = job_of("--rdzv-conf=job_fingerprint=exp-7", "eval.py", "--every", "10")
    assert a.fingerprint == b.fingerprint != job_of("train.py").fingerprint
