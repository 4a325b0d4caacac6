"""Launcher test worker: writes many long lines to stdout and stderr in small
pieces (so that lines could interleave if the launcher got it wrong), then a
last stdout line without a newline.

Usage: launch_chatty.py LINES
"""

import os
import sys

rank = os.environ["TFDIST_RANK"]
payload = rank * 300
for i in range(int(sys.argv[1])):
    for stream, name in ((sys.stdout, "out"), (sys.stderr, "err")):
        line = f"{name} rank={rank} i={i} {payload}\n"
        for start in range(0, len(line), 97):
            stream.write(line[start:start + 97])
            stream.flush()
sys.stdout.write(f"tail rank={rank} without newline")
sys.stdout.flush()
