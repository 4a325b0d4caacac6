"""Launcher test worker: prints its launcher-provided environment as one JSON
line ("ENV {...}") on stdout, and one line on stderr."""

import json
import os
import sys

names = ["TF_CONFIG", "TFDIST_RANK", "TFDIST_WORLD_SIZE", "TFDIST_DEVICES_PER_WORKER",
         "TFDIST_READY_FILE", "PYTHONUNBUFFERED", "TFDIST_STARTUP_TIMEOUT",
         "CUDA_VISIBLE_DEVICES", "TF_CPP_MIN_LOG_LEVEL"]
print("ENV " + json.dumps({name: os.environ.get(name) for name in names}))
print(f"stderr of rank {os.environ['TFDIST_RANK']}", file=sys.stderr)
