"""Launcher test task: prints the environment the launcher gave it as one JSON
line ("ENV {...}") on stdout, for any task type (ps tasks have no TFDIST_RANK).

Usage: launch_ps_env.py DIR [CHIEF_EXIT]
Each task then creates DIR/<type>-<index>. Workers and ps tasks wait to be
stopped, like servers; the chief waits until every task of TF_CONFIG has
printed (20 s at most) and exits with CHIEF_EXIT (default 0).
"""

import json
import os
import sys
import time

names = ["TF_CONFIG", "TFDIST_RANK", "TFDIST_WORLD_SIZE", "TFDIST_DEVICES_PER_WORKER",
         "TFDIST_READY_FILE", "CUDA_VISIBLE_DEVICES"]
print("ENV " + json.dumps({name: os.environ.get(name) for name in names}), flush=True)
config = json.loads(os.environ["TF_CONFIG"])
kind, index = config["task"]["type"], config["task"]["index"]
open(os.path.join(sys.argv[1], f"{kind}-{index}"), "w").close()
everyone = [os.path.join(sys.argv[1], f"{k}-{i}")
            for k, addresses in config["cluster"].items() for i in range(len(addresses))]
deadline = time.monotonic() + (20 if kind == "chief" else 60)
while time.monotonic() < deadline and (kind != "chief" or not all(map(os.path.exists, everyone))):
    time.sleep(0.05)
os._exit(int(sys.argv[2]) if kind == "chief" and len(sys.argv) > 2 else 0)
