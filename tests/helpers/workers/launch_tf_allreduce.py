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
# both wait at a coordination-service barrier, with a deadline, first. Task 0
# hosts the coordination service, so it leaves last: it waits (with a
# deadline) until every other task says it got through the barrier, or a
# peer's barrier reply could be lost with task 0's server ("Socket closed").
from tensorflow.python.eager import context  # noqa: E402

context.context().wait_at_barrier("launch_tf_allreduce_done", 60_000)
if rank == 0:
    for peer in range(1, strategy.cluster_resolver.cluster_spec().num_tasks("worker")):
        context.context().get_config_key_value(f"launch_tf_allreduce_left/{peer}", 60_000)
else:
    # A busy machine can drop the gRPC connection to task 0 for a moment ("Socket closed",
    # UnavailableError) while task 0 is still waiting for this key: try again until a deadline.
    import time  # noqa: E402

    deadline = time.monotonic() + 60
    while True:
        try:
            context.context().set_config_key_value(f"launch_tf_allreduce_left/{rank}", "1")
            break
        except tf.errors.AlreadyExistsError:  # an earlier try got through, its reply did not
            break
        except tf.errors.UnavailableError as error:
            if "Connection refused" in str(error):
                # Task 0's server is gone: it leaves only after reading this key
                # (an earlier try got through, its reply was lost) or by failing,
                # which its own exit code reports to the launcher.
                break
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)
os._exit(0)
