"""A worker process that SIGKILLs itself when a file appears (TensorFlow-free).

A test decides the moment (it creates the file, or tfdist does: a backup's
temporary folder), and the process dies as a killed job does, without clean-up.

    from helpers.sigkill import sigkill_self_when_exists

    sigkill_self_when_exists(os.path.join(out, "lose"))
"""

import os
import signal
import threading
import time


def sigkill_self_when_exists(path, poll_seconds=0.05):
    """Starts a daemon thread that SIGKILLs this process once `path` exists, looking
    every `poll_seconds` (small, e.g. 0.0005, to die in the middle of a write).

    Example: `sigkill_self_when_exists("/tmp/run/ckpt-3_temp", poll_seconds=0.0005)`
    """
    def watch():
        while not os.path.exists(path):
            time.sleep(poll_seconds)
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, daemon=True).start()
