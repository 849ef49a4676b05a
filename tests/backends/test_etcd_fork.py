"""Forking while the etcd client is busy: the children must live (grpcio's fork handlers are off)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from elastic.testing.etcd_server import ROOT_USER

pytestmark = [pytest.mark.etcd, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
FORKS = 400

SCRIPT = """
import ctypes, json, os, shutil, subprocess, sys, threading
import psutil
TRUE = shutil.which("true") or "/bin/true"
import backends.etcd  # first: sets GRPC_ENABLE_FORK_SUPPORT before grpcio is imported
from backends.etcd import EtcdBackend, EtcdConfig

config = EtcdConfig(**json.loads(sys.argv[1]))
backend = EtcdBackend(config)
stop = threading.Event()
errors = []

def busy():
    while not stop.is_set():
        try:
            backend.put("/fork-test/k", b"v")
            backend.get("/fork-test/k")
        except Exception as error:
            errors.append(str(error))

def die_with_parent():  # what the agent's preexec_fn does: Python code in the forked child
    ctypes.CDLL(None).prctl(1, 9)

threads = [threading.Thread(target=busy) for _ in range(4)]
for thread in threads:
    thread.start()
watch = backend.watch_prefix("/fork-test/")
codes = {}

def give_up():  # a child stuck in a fork handler before its exec blocks Popen itself
    for stuck in psutil.Process().children():
        stuck.kill()
    codes["hung"] = 1
    print(json.dumps({"codes": codes, "errors": errors[:3], "env": os.environ.get("GRPC_ENABLE_FORK_SUPPORT")}))
    sys.stdout.flush()
    os._exit(0)

for _ in range(int(sys.argv[2])):
    watchdog = threading.Timer(20, give_up)
    watchdog.start()
    # The risk is between fork and exec (gRPC's fork handlers, the preexec_fn); what is exec'd
    # does not matter, so exec the cheapest program there is rather than an interpreter.
    child = subprocess.Popen([TRUE], preexec_fn=die_with_parent, close_fds=True,
                             start_new_session=True, stderr=subprocess.DEVNULL)
    code = child.wait()
    watchdog.cancel()
    codes[code] = codes.get(code, 0) + 1
stop.set()
for thread in threads:
    thread.join()
watch.cancel()
backend.close()
print(json.dumps({"codes": codes, "errors": errors[:3], "env": os.environ.get("GRPC_ENABLE_FORK_SUPPORT")}))
"""


def test_children_forked_while_the_client_makes_calls_all_exit_normally(etcd_server):
    settings = {"endpoints": etcd_server.endpoints, "request_timeout": 10.0}
    if etcd_server.options.auth:
        settings.update(user=ROOT_USER, password=etcd_server.options.password)
    environ = {key: value for key, value in os.environ.items() if key != "GRPC_ENABLE_FORK_SUPPORT"}
    done = subprocess.run([sys.executable, "-c", SCRIPT, json.dumps(settings), str(FORKS)], cwd=REPO, env=environ,
                          capture_output=True, text=True, timeout=280)
    assert done.returncode == 0, done.stderr[-3000:]
    outcome = json.loads(done.stdout.strip().splitlines()[-1])
    assert outcome["env"] == "false"
    assert outcome["codes"] == {"0": FORKS}, outcome
    assert outcome["errors"] == [], outcome
