"""Writes this worker's environment and command line to ``OUT_DIR/env_<LOCAL_RANK>.json``.

    dump_env.py OUT_DIR
"""

import json
import os
import sys

with open(os.path.join(sys.argv[1], f"env_{os.environ['LOCAL_RANK']}.json"), "w") as out:
    cmdline = open("/proc/self/cmdline", "rb").read().decode().split("\0")[:-1]
    json.dump({"env": dict(os.environ), "cmdline": cmdline}, out)
