"""A tiny launcher test task for parameter-server jobs: runs the steps of
launch_actions.py chosen by its TF_CONFIG task instead of its rank.

Usage: launch_ps_actions.py KEY=STEPS [KEY=STEPS ...]
KEY is a task type ("chief", "worker", "ps") or a task ("worker1", "ps0"); a
task runs the STEPS of its own task if given, else those of its type, else
none. "{task}" in STEPS is replaced by the task, e.g. "worker-1" (so each task
can write files of its own). The steps are launch_actions.py's: ready, pid=,
sleep=, write=, trap=, ignore, print=, kill=, exit=, once=.
Example: launch_ps_actions.py chief=ready,sleep=1,exit=3 worker=ready,sleep=30 ps=ready,sleep=30
"""

import json
import os
import runpy
import sys

task = json.loads(os.environ["TF_CONFIG"])["task"]
choices = dict(arg.split("=", 1) for arg in sys.argv[1:])
steps = choices.get(f"{task['type']}{task['index']}", choices.get(task["type"], ""))
steps = steps.replace("{task}", f"{task['type']}-{task['index']}")
os.environ["TFDIST_RANK"] = "0"  # launch_actions.py picks argv[1]; ps tasks have no rank
sys.argv = [sys.argv[0], steps or "print=no steps"]
runpy.run_path(os.path.join(os.path.dirname(os.path.abspath(__file__)), "launch_actions.py"),
               run_name="__main__")
