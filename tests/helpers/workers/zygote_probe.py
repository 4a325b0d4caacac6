"""A module run by tests/test_zygote.py, forked (helpers.zygote) and fresh, to compare the two.

    python -m helpers.workers.zygote_probe report|exit N|raise|terminate|kill|sleep S|carriage-return
"""

import json
import os
import random
import signal
import sys
import tempfile
import time

TENSORFLOW_IMPORTED_AT_START = "tensorflow" in sys.modules


def report():
    """What a run of this module sees of its start."""
    print(json.dumps({"argv": sys.argv[1:], "cwd": os.getcwd(), "name": __name__,
                      "probe_variable": os.environ.get("ZYGOTE_PROBE"), "path0": sys.path[0],
                      "tensorflow_imported_at_start": TENSORFLOW_IMPORTED_AT_START,
                      "random": random.random(), "pid": os.getpid(),
                      "tempdir": tempfile.gettempdir()}))
    print("on stderr", file=sys.stderr)


def main(action, *rest):
    if action == "report":
        report()
    elif action == "exit":
        sys.exit(int(rest[0]))
    elif action == "raise":
        raise ValueError("the probe raised")
    elif action == "terminate":
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(30)
    elif action == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif action == "sleep":
        print(os.getpid(), flush=True)
        time.sleep(float(rest[0]))
    elif action == "carriage-return":
        sys.stdout.write("a\rb\r\nc\n")


if __name__ == "__main__":
    main(*sys.argv[1:])
