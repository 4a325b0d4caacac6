"""Launcher test worker using real TensorFlow: builds MultiWorkerMirroredStrategy
from the launcher's TF_CONFIG, creates TFDIST_READY_FILE, all-reduces
(rank + 1) across the workers and prints the result."""

import os
import threading

watchdog = threading.Timer(170, lambda: os._exit(98))  # never outlive the test
watchdog.daemon = True
watchdog.start()

import tensorflow as tf  # noqa: E402

rank = int(os.environ["TFDIST_RANK"])
strategy = tf.distribute.MultiWorkerMirroredStrategy()
open(os.environ["TFDIST_READY_FILE"], "w").close()


@tf.function
def all_reduce():
    def replica_fn():
        context = tf.distribute.get_replica_context()
        return context.all_reduce(tf.distribute.ReduceOp.SUM, tf.constant(float(rank + 1)))
    return strategy.run(replica_fn)


total = strategy.experimental_local_results(all_reduce())[0]
print(f"replicas={strategy.num_replicas_in_sync} task={strategy.cluster_resolver.task_id} "
      f"allreduce={float(total):g}", flush=True)
# A worker that exits as soon as its own all-reduce returns can close the
# gRPC server its peer is still fetching a ring buffer from ("Socket closed"):
# both wait at a coordination-service barrier, with a deadline, first.
from tensorflow.python.eager import context  # noqa: E402

context.context().wait_at_barrier("launch_tf_allreduce_done", 60_000)
os._exit(0)
