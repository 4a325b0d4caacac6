"""Launcher test worker using real TensorFlow: builds MultiWorkerMirroredStrategy
(so its gRPC server listens), prints "PORT <its own port>", then waits until the
file named by argv[1] exists (60 s at most) and exits 0."""

import json
import os
import sys
import threading
import time

watchdog = threading.Timer(170, lambda: os._exit(98))  # never outlive the test
watchdog.daemon = True
watchdog.start()

import tensorflow as tf  # noqa: E402

strategy = tf.distribute.MultiWorkerMirroredStrategy()
config = json.loads(os.environ["TF_CONFIG"])
own = config["cluster"]["worker"][config["task"]["index"]]
print(f"PORT {own.rpartition(':')[2]}", flush=True)
deadline = time.monotonic() + 60
while not os.path.exists(sys.argv[1]) and time.monotonic() < deadline:
    time.sleep(0.1)
os._exit(0)
