"""Launcher test task for a parameter-server job, in plain TensorFlow.

Usage: launch_ps_task.py [--chief-exit N] [--steps N] [--kill-worker I] [--sync-dir DIR]

Reads the launcher's TF_CONFIG and acts by its task type:
Every task first writes its pid to DIR/<type>-<index>.pid when --sync-dir is
given. Then:
- worker / ps: starts a `tf.distribute.Server` for its task, creates
  TFDIST_READY_FILE and serves until it is stopped (it never exits by itself). With
  --kill-worker I, worker I SIGKILLs itself once the chief has created
  DIR/kill-worker (mid-training).
- chief: creates `ParameterServerStrategy` and a `ClusterCoordinator`,
  creates TFDIST_READY_FILE, builds a tiny Keras model under the strategy's
  scope and schedules --steps training closures (default 20), in two halves.
  With --kill-worker I it creates DIR/kill-worker after the first half and
  waits until worker I's process is gone before scheduling the second half,
  which the coordinator must then run on the other workers. Prints
  "RESULT steps=<n> loss=<mean loss>" and exits with --chief-exit (default 0).

A watchdog ends any task after 150 s, so that no test leaves it behind.
"""

import argparse
import json
import os
import signal
import sys
import threading
import time

watchdog = threading.Timer(150, lambda: os._exit(98))  # never outlive the test
watchdog.daemon = True
watchdog.start()

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402


def parse_args():
    parser = argparse.ArgumentParser()
    parser.add_argument("--chief-exit", type=int, default=0)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--kill-worker", type=int, default=None)
    parser.add_argument("--sync-dir", default=None)
    return parser.parse_args()


def mark_ready():
    open(os.environ["TFDIST_READY_FILE"], "w").close()


def wait_for(condition, seconds, what):
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            print(f"timed out waiting for {what}", file=sys.stderr, flush=True)
            os._exit(97)
        time.sleep(0.05)


def is_gone(pid):
    """True once `pid` has exited (a zombie not yet reaped counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] == "Z"
    except (FileNotFoundError, ProcessLookupError):
        # Reaped between open() and read(): reading its stat then fails with ESRCH.
        return True


def serve(config, args):
    """A worker or ps task: serve the chief until stopped."""
    task = config["task"]
    server = tf.distribute.Server(tf.train.ClusterSpec(config["cluster"]),
                                  job_name=task["type"], task_index=task["index"],
                                  protocol="grpc", start=True)
    mark_ready()
    print(f"serving {task['type']} {task['index']}", flush=True)
    if task["type"] == "worker" and task["index"] == args.kill_worker:
        signal_file = os.path.join(args.sync_dir, "kill-worker")
        wait_for(lambda: os.path.exists(signal_file), 120, signal_file)
        print("killing myself", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    server.join()


def train(args):
    """The chief: the coordinator that drives the workers."""
    import keras

    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    strategy = tf.distribute.ParameterServerStrategy(resolver)
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    mark_ready()
    with strategy.scope():
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
                                  keras.layers.Dense(1)])
        optimizer = keras.optimizers.SGD(0.1)
        optimizer.build(model.trainable_variables)

    def dataset_fn(context):
        x = np.random.RandomState(0).randn(256, 8).astype("float32")
        y = x.sum(1, keepdims=True)
        return tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(32)

    per_worker = coordinator.create_per_worker_dataset(
        lambda: strategy.distribute_datasets_from_function(dataset_fn))
    iterator = iter(per_worker)

    @tf.function
    def step(iterator):
        def replica(x, y):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean((model(x, training=True) - y) ** 2)
            optimizer.apply(tape.gradient(loss, model.trainable_variables),
                            model.trainable_variables)
            return loss
        x, y = next(iterator)
        return strategy.run(replica, args=(x, y))

    first = args.steps // 2
    results = [coordinator.schedule(step, args=(iterator,)) for _ in range(first)]
    coordinator.join()
    if args.kill_worker is not None:
        open(os.path.join(args.sync_dir, "kill-worker"), "w").close()
        pid_file = os.path.join(args.sync_dir, f"worker-{args.kill_worker}.pid")
        with open(pid_file) as f:
            pid = int(f.read())
        wait_for(lambda: is_gone(pid), 60, f"worker {args.kill_worker} (pid {pid}) to die")
        print(f"worker {args.kill_worker} is gone", flush=True)
    results += [coordinator.schedule(step, args=(iterator,)) for _ in range(args.steps - first)]
    coordinator.join()
    loss = np.mean([result.fetch() for result in results])
    print(f"RESULT steps={len(results)} loss={loss:.4f}", flush=True)


def main():
    args = parse_args()
    config = json.loads(os.environ["TF_CONFIG"])
    task = config["task"]
    if args.sync_dir:
        with open(os.path.join(args.sync_dir, f"{task['type']}-{task['index']}.pid"), "w") as f:
            f.write(str(os.getpid()))
    if task["type"] == "chief":
        train(args)
        os._exit(args.chief_exit)  # the coordinator's threads never end by themselves
    serve(config, args)


if __name__ == "__main__":
    from tfdist.runtime.quick_exit import skip_exit_garbage_collection

    skip_exit_garbage_collection()  # the test waits for this process to end
    main()
