"""Starts two grandchildren, reports every pid, then sleeps until killed.

    grandchildren.py REPORTS

One grandchild is a ``subprocess.Popen`` child, the other a ``fork`` child (as a DataLoader
worker); both stay in the worker's session. Reports ``{"event": "grandchildren", "pid": ...,
"children": [popen pid, fork pid]}``. Imports no torch (fast).
"""

import multiprocessing
import subprocess
import sys
import time

from _report import report  # noqa: E402

if __name__ == "__main__":
    # (This script's path on the grandchild's command line lets a test's cleanup recognise it.)
    popen = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)", __file__])
    forked = multiprocessing.get_context("fork").Process(target=time.sleep, args=(300,), daemon=False)
    forked.start()
    report(sys.argv[1], "grandchildren", children=[popen.pid, forked.pid])
    time.sleep(300)
