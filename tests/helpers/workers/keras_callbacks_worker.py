"""One worker of the worker-safe Keras callbacks test (run under tfdist.launch).

Trains a tiny classifier with `tfdist.training.Trainer` under
`MultiWorkerMirroredStrategy`, passing Keras's own callbacks exactly as
TensorFlow's multi-worker tutorial does, with the SAME paths on every worker:
`BackupAndRestore(<shared>/backup)`, `ModelCheckpoint`, `CSVLogger` (append)
and, when the tensorboard package is installed, `TensorBoard`. tfdist must
make them write once (make_callback_list -> make_worker_safe).

* `--phase first`: an uninterrupted reference run without callbacks (its
  final weights), then run 1, interrupted by an exception raised on every
  worker at the start of epoch 2 (0-based) of 4.
* `--phase resume`: run 2, the same callbacks: resumes from the backup.

Every `model.save_weights` call is recorded (path, whether the file existed
afterwards), as are the epochs each run trained and the INFO lines of
tfdist's callback modules. Results go to `<out>/<phase>_rank<R>.json` and
final weights to `<out>/<name>_rank<R>.npz`.

Usage: python tests/helpers/workers/keras_callbacks_worker.py --out DIR --phase first|resume
"""

import argparse
import importlib.util
import json
import logging
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# tests/ on the path (run as a script, only this folder is): the shared helpers.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from tfdist.callbacks.chief import task_info  # noqa: E402
from tfdist.training import Trainer  # noqa: E402
from helpers.interrupt import Interrupted, InterruptAtEpochStart  # noqa: E402
from helpers.recorders import EpochRecorder  # noqa: E402

EXAMPLES = 64
GLOBAL_BATCH = 16
STEPS = EXAMPLES // GLOBAL_BATCH  # one pass over the data per epoch
EPOCHS = 4
INTERRUPT_AT = 2
HAS_TENSORBOARD = importlib.util.find_spec("tensorboard") is not None


class Messages(logging.Handler):
    def __init__(self):
        super().__init__(logging.INFO)
        self.lines = []

    def emit(self, record):
        self.lines.append(f"{record.name}: {record.getMessage()}")


def data():
    rs = np.random.RandomState(1)
    x = rs.standard_normal((EXAMPLES, 4)).astype("float32")
    y = ((x[:, 0] + x[:, 1] > 0).astype("int32") + (x[:, 2] > 0.5)).astype("int32")
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(GLOBAL_BATCH).repeat()


def classifier():
    """The model (its weights are set by `build`)."""
    return keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="tanh"),
                             keras.layers.Dense(3, activation="softmax")])


def build(strategy, saves):
    """Model and Trainer in the strategy's scope, fixed weights; `saves`
    collects every `model.save_weights` call."""
    keras.utils.set_random_seed(0)
    with strategy.scope():
        model = classifier()
        trainer = Trainer(model, keras.optimizers.SGD(0.05), "sparse_categorical_crossentropy",
                          metrics=["accuracy"], strategy=strategy)
    rs = np.random.RandomState(0)
    model.set_weights([(0.5 * rs.standard_normal(w.shape)).astype("float32")
                       for w in model.get_weights()])
    save_weights = model.save_weights

    def recording_save_weights(filepath, *args, **kwargs):
        result = save_weights(filepath, *args, **kwargs)
        saves.append([os.fspath(filepath), os.path.exists(filepath)])
        return result

    model.save_weights = recording_save_weights
    return model, trainer


def keras_callbacks(shared):
    """The user's callbacks: the same paths on every worker, as in the tutorial."""
    callbacks = [
        keras.callbacks.BackupAndRestore(backup_dir=os.path.join(shared, "backup")),
        keras.callbacks.ModelCheckpoint(os.path.join(shared, "ckpt", "epoch_{epoch}.weights.h5"),
                                        save_weights_only=True),
        keras.callbacks.CSVLogger(os.path.join(shared, "log.csv"), append=True),
    ]
    if HAS_TENSORBOARD:
        callbacks.append(keras.callbacks.TensorBoard(os.path.join(shared, "tb")))
    return callbacks


def save_npz(path, model):
    np.savez(path, *model.get_weights())


def listing(folder):
    return sorted(os.listdir(folder)) if os.path.isdir(folder) else None


def phase_first(strategy, args, rank, shared, result):
    saves = []
    model, trainer = build(strategy, saves)
    trainer.fit(data(), epochs=EPOCHS, steps_per_epoch=STEPS, verbose=0)
    save_npz(os.path.join(args.out, f"reference_rank{rank}.npz"), model)

    saves = []
    model, trainer = build(strategy, saves)
    recorder = EpochRecorder()
    try:
        trainer.fit(data(), epochs=EPOCHS, steps_per_epoch=STEPS, verbose=0,
                    callbacks=keras_callbacks(shared) + [recorder, InterruptAtEpochStart(INTERRUPT_AT)])
        result["error"] = None
    except Interrupted as error:
        result["error"] = str(error)
    backup = os.path.join(shared, "backup")
    metadata = os.path.join(backup, "training_metadata.json")
    result.update(epochs=recorder.epochs, logs=recorder.logs, saves=saves,
                  backup_files=listing(backup),
                  backup_metadata=json.load(open(metadata)) if os.path.exists(metadata) else None)
    save_npz(os.path.join(args.out, f"interrupted_rank{rank}.npz"), model)


def phase_resume(strategy, args, rank, shared, result):
    saves = []
    model, trainer = build(strategy, saves)
    recorder = EpochRecorder()
    history = trainer.fit(data(), epochs=EPOCHS, steps_per_epoch=STEPS, verbose=0,
                          callbacks=keras_callbacks(shared) + [recorder])
    result.update(epochs=recorder.epochs, logs=recorder.logs, saves=saves,
                  history_epochs=list(history.epoch))
    save_npz(os.path.join(args.out, f"resumed_rank{rank}.npz"), model)


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", required=True)
    parser.add_argument("--phase", required=True, choices=("first", "resume"))
    args = parser.parse_args()
    messages = Messages()
    tfdist_callbacks = logging.getLogger("tfdist.callbacks")
    tfdist_callbacks.setLevel(logging.INFO)
    tfdist_callbacks.addHandler(messages)
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    ready = os.environ.get("TFDIST_READY_FILE")
    if ready:
        open(ready, "a").close()
    rank = int(os.environ["TFDIST_RANK"])
    shared = os.path.join(args.out, "shared")
    result = {"rank": rank, "pid": os.getpid(), "task_info": list(task_info(strategy)),
              "tmpdir": os.environ.get("TMPDIR")}
    if args.phase == "first":
        phase_first(strategy, args, rank, shared, result)
    else:
        phase_resume(strategy, args, rank, shared, result)
    result["messages"] = messages.lines
    with open(os.path.join(args.out, f"{args.phase}_rank{rank}.json"), "w") as f:
        json.dump(result, f)
    print(f"worker {rank} done", flush=True)


if __name__ == "__main__":
    from tfdist.runtime.quick_exit import skip_exit_garbage_collection

    skip_exit_garbage_collection()  # the test waits for this process to end
    main()
