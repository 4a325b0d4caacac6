"""A tiny launcher test worker that performs a list of steps, chosen per rank.

Usage: launch_actions.py STEPS_FOR_RANK_0 [STEPS_FOR_RANK_1 ...]
Rank i runs argv[1 + i] (the last one when there are fewer). STEPS is a
comma-separated list of:
  ready          create TFDIST_READY_FILE
  pid=PATH       write this process's pid to PATH
  sleep=S        sleep S seconds
  write=PATH     write "done" to PATH
  trap=PATH[:N]  on SIGTERM/SIGINT/SIGHUP write the signal name to PATH and exit N (default 0)
  ignore         ignore SIGTERM and SIGINT
  print=TEXT     print TEXT to stdout
  kill=N         send signal N to itself
  exit=N         exit with code N
  once=PATH:N    exit with code N if PATH does not exist (creating it), else go on
"{rank}" in any PATH/TEXT is replaced by the rank. Exits 0 after the last step.
A watchdog ends the process after 60 s so that no test leaves it behind.
"""

import os
import signal
import sys
import threading
import time

watchdog = threading.Timer(60, lambda: os._exit(99))
watchdog.daemon = True
watchdog.start()
rank = int(os.environ["TFDIST_RANK"])
steps = sys.argv[1 + min(rank, len(sys.argv) - 2)]


def trap(value):
    path, _, code = value.rpartition(":") if ":" in value else (value, "", "0")

    def handler(signum, frame):
        with open(path, "w") as f:
            f.write(signal.Signals(signum).name)
        os._exit(int(code))
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, handler)


for step in steps.split(","):
    name, _, value = step.partition("=")
    value = value.replace("{rank}", str(rank))
    if name == "ready":
        open(os.environ["TFDIST_READY_FILE"], "w").close()
    elif name == "pid":
        with open(value, "w") as f:
            f.write(str(os.getpid()))
    elif name == "sleep":
        time.sleep(float(value))
    elif name == "write":
        with open(value, "w") as f:
            f.write("done")
    elif name == "trap":
        trap(value)
    elif name == "ignore":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    elif name == "print":
        print(value)
    elif name == "kill":
        os.kill(os.getpid(), int(value))
        time.sleep(10)
    elif name == "exit":
        os._exit(int(value))
    elif name == "once":
        path, _, code = value.rpartition(":")
        if not os.path.exists(path):
            open(path, "w").close()
            os._exit(int(code))
    else:
        sys.exit(f"launch_actions.py: unknown step {step!r}")
os._exit(0)
