"""A worker with two grandchildren (a ``subprocess.Popen`` child and a ``fork`` child, as a
DataLoader worker), for benchmarks/orphans.py: appends ``{"pids": [self, popen, fork]}`` to
the file ``argv[1]`` names, then sleeps until killed (at most ``argv[2]`` seconds)."""

import json
import multiprocessing
import os
import subprocess
import sys
import time

if __name__ == "__main__":
    out, linger = sys.argv[1], float(sys.argv[2])
    popen = subprocess.Popen([sys.executable, "-c", f"import time; time.sleep({linger})", __file__])
    forked = multiprocessing.get_context("fork").Process(target=time.sleep, args=(linger,))
    forked.start()
    line = json.dumps({"pids": [os.getpid(), popen.pid, forked.pid]}) + "\n"
    fd = os.open(out, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.write(fd, line.encode())
    os.close(fd)
    time.sleep(linger)
