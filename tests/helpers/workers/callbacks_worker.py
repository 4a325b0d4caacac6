"""One worker of the multi-worker callback tests (run under tfdist.launch).

Creates a `MultiWorkerMirroredStrategy` from TF_CONFIG, signals readiness and
trains with `tfdist.training.Trainer` three times, each worker writing under
`<out>/rank<R>/` so the test can tell who wrote what:

* `logging`: `make_logging_callbacks` (CSV, TensorBoard when installed,
  per-epoch checkpoint), `ProfilerWindow`, `DeviceMemoryMonitor`, `NanGuard`.
  Without the tensorboard package, a `ChiefOnly(TensorBoard)` is driven
  through `set_model`/`on_train_begin`/`on_train_end` only (its graph summary
  creates the event file; epoch scalars need tensorboard).
* `on_read`: a model holding an ON_READ variable, checkpointed through
  `ChiefOnly(ModelCheckpoint)`: reading that variable is an all-reduce, so the
  non-chief must save too (into a temporary folder that is deleted).
* `nan`: weights poisoned at epoch 1 batch 1; `NanGuard` must stop every
  worker at the same step.

What each worker saw goes to `<out>/rank<R>.json`.

Usage: python tests/helpers/workers/callbacks_worker.py --out DIR
"""

import argparse
import importlib.util
import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from tfdist.callbacks.chief import is_chief, task_info  # noqa: E402
from tfdist.callbacks.chief_logging import ChiefOnly, make_logging_callbacks  # noqa: E402
from tfdist.callbacks.learning_rate import LearningRateLogger  # noqa: E402
from tfdist.callbacks.throughput import ThroughputMeter  # noqa: E402
from tfdist.schedules import make_schedule  # noqa: E402
from tfdist.callbacks.memory import DeviceMemoryMonitor  # noqa: E402
from tfdist.callbacks.nan_guard import NanGuard, NonFiniteLossError  # noqa: E402
from tfdist.callbacks.profiler import ProfilerWindow  # noqa: E402
from tfdist.training import Trainer  # noqa: E402
from train_common import OnReadCounter, PoisonWeights  # noqa: E402

GLOBAL_BATCH = 16
EXAMPLES = 64  # 4 steps per epoch


class EpochLogsAndSavePathRecorder(keras.callbacks.Callback):
    """Records each epoch's logs and, given a ModelCheckpoint `probe`, the path it
    names at that epoch's end and whether that file exists."""

    def __init__(self, probe=None):
        super().__init__()
        self.epochs, self.probe, self.seen_paths = [], probe, []

    def on_epoch_end(self, epoch, logs=None):
        self.epochs.append(dict(logs))
        if self.probe is not None:
            path = self.probe.output_path
            self.seen_paths.append([path, bool(path) and os.path.exists(path)])


def data():
    rs = np.random.RandomState(1)
    x = rs.standard_normal((EXAMPLES, 4)).astype("float32")
    y = np.tanh(x[:, :3]).astype("float32")
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(GLOBAL_BATCH)


def trainer(strategy, on_read=False):
    with strategy.scope():
        layers = [keras.Input((4,))] + ([OnReadCounter()] if on_read else []) + [
            keras.layers.Dense(3)]
        model = keras.Sequential(layers)
        optimizer = keras.optimizers.SGD(
            make_schedule("cosine", 0.1, warmup_steps=2, total_steps=4 * EXAMPLES // GLOBAL_BATCH))
    rs = np.random.RandomState(0)
    model.set_weights([rs.standard_normal(w.shape).astype("float32") * 0.5
                       for w in model.get_weights()])
    return model, Trainer(model, optimizer, "mse", metrics=["mae"], strategy=strategy)


def phase_logging(strategy, rank_dir, result):
    model, fit_engine = trainer(strategy)
    logging = make_logging_callbacks(os.path.join(rank_dir, "logs"), checkpoint=True)
    recorder = EpochLogsAndSavePathRecorder()
    meter = ThroughputMeter(GLOBAL_BATCH, num_replicas=strategy.num_replicas_in_sync,
                            warmup_steps=1, print_fn=None)
    callbacks = ([meter, LearningRateLogger(), DeviceMemoryMonitor(warn_fraction=None)] + logging + [
        ProfilerWindow(os.path.join(rank_dir, "profile"), start_step=2, stop_step=4),
        NanGuard(), recorder])
    tensorboard = None
    if importlib.util.find_spec("tensorboard") is None:
        tensorboard = ChiefOnly(keras.callbacks.TensorBoard(os.path.join(rank_dir, "tb")))
        tensorboard.set_model(model)
        tensorboard.on_train_begin()
    fit_engine.fit(data(), epochs=2, callbacks=callbacks, verbose=0)
    if tensorboard is not None:
        tensorboard.on_train_end()
    result["logging"] = {"epochs": recorder.epochs,
                         "modes": [c.mode for c in logging],
                         "tensorboard_in_list": len(logging) == 3}


def phase_on_read(strategy, rank_dir, result):
    model, fit_engine = trainer(strategy, on_read=True)
    checkpoint = ChiefOnly(keras.callbacks.ModelCheckpoint(
        os.path.join(rank_dir, "on_read", "model.weights.h5"), save_weights_only=True))
    recorder = EpochLogsAndSavePathRecorder(probe=checkpoint)
    fit_engine.fit(data(), epochs=2, callbacks=[checkpoint, recorder], verbose=0)
    result["on_read"] = {"seen_paths": recorder.seen_paths,
                         "exists_after": [os.path.exists(p) for p, _ in recorder.seen_paths],
                         "filepath_after": checkpoint.callback.filepath,
                         "loss": [e["loss"] for e in recorder.epochs]}


def phase_nan(strategy, result):
    _, fit_engine = trainer(strategy)
    try:
        fit_engine.fit(data(), epochs=3, callbacks=[PoisonWeights(1, 1), NanGuard()], verbose=0)
        result["nan"] = None
    except NonFiniteLossError as error:
        result["nan"] = {"name": error.name, "epoch": error.epoch, "batch": error.batch,
                         "step": error.step}


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    ready = os.environ.get("TFDIST_READY_FILE")
    if ready:
        open(ready, "a").close()
    rank = int(os.environ["TFDIST_RANK"])
    rank_dir = os.path.join(args.out, f"rank{rank}")
    result = {"rank": rank, "task_info": list(task_info(strategy)),
              "is_chief_from_tf_config": is_chief()}
    phase_logging(strategy, rank_dir, result)
    phase_on_read(strategy, rank_dir, result)
    phase_nan(strategy, result)
    with open(os.path.join(args.out, f"rank{rank}.json"), "w") as f:
        json.dump(result, f)
    print(f"worker {rank} done", flush=True)
    sys.stdout.flush()


if __name__ == "__main__":
    from tfdist.runtime.quick_exit import skip_exit_garbage_collection

    skip_exit_garbage_collection()  # the test waits for this process to end
    main()
