"""One worker of a multi-worker training test (run under tfdist.launch).

Creates a `MultiWorkerMirroredStrategy` from TF_CONFIG, signals readiness, runs
the requested phases with `tfdist.training.Trainer` and writes what it saw to
`<out>/rank<R>_<phase>.npz` / `.json` for the test to compare:

* `sgd`: SGD, sample-weighted `"mean_with_sample_weight"` loss, binding
  global-norm clipping, short last batch; final weights and losses.
* `xla`: the same with `jit_compile=True`.
* `seq2seq`: the translation recipe's smallest encoder-decoder on padded sentence
  pairs (`seq2seq_common.equivalence_run`); per-step losses and final weights, and
  the decoding of validation sentences split over the workers.
* `callbacks`: fit with validation data and standard Keras callbacks
  (per-rank paths; tfdist makes them write on the chief only) beside tfdist's
  `PreemptionGuard` (what ended its stop-step watcher), then evaluate and
  predict; then one more fit with a new `PreemptionGuard`, where worker 1
  gets SIGTERM mid-epoch (`phase_second_fit_signalled`).

Usage: python tests/helpers/workers/train_worker.py --out DIR [--phases sgd,xla,seq2seq,callbacks]
"""

import argparse
import importlib.util
import json
import os
import signal
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import seq2seq_common  # noqa: E402
import train_common as common  # noqa: E402
from tfdist.callbacks import Preempted, PreemptionGuard  # noqa: E402
from tfdist.training import Trainer  # noqa: E402

GLOBAL_BATCH = 16
EPOCHS = 2


def rank():
    if "TFDIST_RANK" in os.environ:
        return int(os.environ["TFDIST_RANK"])
    return json.loads(os.environ["TF_CONFIG"])["task"]["index"]


def sgd_trainer(strategy, jit_compile):
    model = common.dense_model(strategy)
    with strategy.scope():
        optimizer = keras.optimizers.SGD(0.2)
    loss = keras.losses.MeanSquaredError(reduction="mean_with_sample_weight")
    return model, Trainer(model, optimizer, loss, strategy=strategy, jit_compile=jit_compile,
                          clip_norm=0.3)


def phase_sgd(strategy, out, jit_compile=False, name="sgd"):
    data = common.dataset(common.regression_arrays(weighted=True), GLOBAL_BATCH)
    model, trainer = sgd_trainer(strategy, jit_compile)
    history = trainer.fit(data, epochs=EPOCHS, verbose=0)
    np.savez(os.path.join(out, f"rank{rank()}_{name}.npz"), *common.weights_of(model))
    with open(os.path.join(out, f"rank{rank()}_{name}.json"), "w") as f:
        json.dump(history.history, f)


ON_BATCH_ROWS = 8


def on_batch_batches():
    """Three weighted batches of `ON_BATCH_ROWS` rows for the on-batch phase."""
    x, y, w = common.regression_arrays(n=3 * ON_BATCH_ROWS, seed=4, weighted=True)
    return [(x[i:i + ON_BATCH_ROWS], y[i:i + ON_BATCH_ROWS], w[i:i + ON_BATCH_ROWS])
            for i in range(0, 3 * ON_BATCH_ROWS, ON_BATCH_ROWS)]


def on_batch_run(model, owner):
    """Trains on the three batches one call at a time, then tests and predicts one:
    `(train logs, test logs, predictions)` from `owner` (a Trainer or the Keras model)."""
    batches = on_batch_batches()
    trained = [owner.train_on_batch(x, y, sample_weight=w, return_dict=True)
               for x, y, w in batches]
    x, y, _ = batches[0]
    return trained, owner.test_on_batch(x, y, return_dict=True), owner.predict_on_batch(x)


def phase_on_batch(strategy, out):
    """`Trainer.train_on_batch` & co. on the whole cluster: each worker gets its rows of
    every global batch; the weights and figures must be one process's."""
    model = common.dense_model(strategy)
    with strategy.scope():
        optimizer = keras.optimizers.SGD(0.2)
    trainer = Trainer(model, optimizer, keras.losses.MeanSquaredError(
        reduction="mean_with_sample_weight"), strategy=strategy)
    trained, tested, predicted = on_batch_run(model, trainer)
    np.savez(os.path.join(out, f"rank{rank()}_on_batch.npz"), *common.weights_of(model),
             predicted)
    with open(os.path.join(out, f"rank{rank()}_on_batch.json"), "w") as f:
        json.dump({"trained": trained, "tested": tested}, f)


def phase_seq2seq(strategy, out):
    losses, weights = seq2seq_common.equivalence_run(strategy)
    np.savez(os.path.join(out, f"rank{rank()}_seq2seq.npz"), *weights)
    # BLEU decoding split over both workers' replicas, outputs gathered on each.
    np.save(os.path.join(out, f"rank{rank()}_seq2seq_decoded.npy"),
            seq2seq_common.decode_validation(strategy, weights))
    with open(os.path.join(out, f"rank{rank()}_seq2seq.json"), "w") as f:
        json.dump({"loss": losses, "replicas": strategy.num_replicas_in_sync}, f)


class TrainTestBatchRecorder(keras.callbacks.Callback):
    """Records the train and test batch indices, and each epoch's logs with whether
    the callback had its model."""

    def __init__(self):
        super().__init__()
        self.train_batches, self.test_batches, self.epochs = [], [], []

    def on_train_batch_end(self, batch, logs=None):
        self.train_batches.append(batch)

    def on_test_batch_end(self, batch, logs=None):
        self.test_batches.append(batch)

    def on_epoch_end(self, epoch, logs=None):
        self.epochs.append({"epoch": epoch, "has_model": self.model is not None, **logs})


def phase_callbacks(strategy, out):
    r = rank()
    rank_dir = os.path.join(out, f"rank{r}")
    os.makedirs(rank_dir, exist_ok=True)
    train = common.dataset(common.regression_arrays(n=64), GLOBAL_BATCH)
    val = common.dataset(common.regression_arrays(n=35, seed=5), GLOBAL_BATCH)
    model = common.dense_model(strategy)
    with strategy.scope():
        optimizer = keras.optimizers.SGD(0.1)
    trainer = Trainer(model, optimizer, "mse", metrics=["mae"], strategy=strategy,
                      steps_per_execution=2)
    recorder = TrainTestBatchRecorder()
    callbacks = [
        keras.callbacks.ModelCheckpoint(os.path.join(rank_dir, "best.keras"),
                                        monitor="val_loss", save_best_only=True),
        keras.callbacks.ModelCheckpoint(os.path.join(rank_dir, "last.weights.h5"),
                                        save_weights_only=True),
        keras.callbacks.EarlyStopping(monitor="val_loss", patience=5),
        keras.callbacks.ReduceLROnPlateau(monitor="val_loss", patience=1, factor=0.5),
        keras.callbacks.CSVLogger(os.path.join(rank_dir, "log.csv")),
        keras.callbacks.TerminateOnNaN(),
        recorder,
    ]
    guard = PreemptionGuard()  # no backup: a signal would stop without one
    callbacks.append(guard)
    if importlib.util.find_spec("tensorboard") is not None:  # not a TF 2.21 dependency
        callbacks.append(keras.callbacks.TensorBoard(os.path.join(rank_dir, "tb")))
    history = trainer.fit(train, epochs=3, validation_data=val, callbacks=callbacks, verbose=1)
    evaluation = trainer.evaluate(val, return_dict=True, verbose=0)
    predictions = trainer.predict(common.dataset(common.regression_arrays(n=35, seed=5)[0],
                                                 GLOBAL_BATCH), verbose=0)
    np.save(os.path.join(out, f"rank{r}_predictions.npy"), predictions)
    np.savez(os.path.join(out, f"rank{r}_callbacks_weights.npz"), *common.weights_of(model))
    with open(os.path.join(out, f"rank{r}_callbacks.json"), "w") as f:
        json.dump({"history": history.history, "evaluate": evaluation,
                   "train_batches": recorder.train_batches,
                   "test_batches": recorder.test_batches, "epochs": recorder.epochs,
                   "watch_ended_by": guard.watch_ended_by}, f)
    phase_second_fit_signalled(strategy, out)


class SignalAt(keras.callbacks.Callback):
    """Sends this process SIGTERM at training batch `batch` of the first epoch; the
    `PreemptionGuard` after it finds the signal pending at that same batch."""

    def __init__(self, batch):
        super().__init__()
        self.batch, self.epoch = batch, 0

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        if self.epoch == 0 and batch == self.batch:
            os.kill(os.getpid(), signal.SIGTERM)


def phase_second_fit_signalled(strategy, out):
    """One more fit in the same processes with a guard of its own (as a program
    that fine-tunes in a second `fit` makes one): worker 1's SIGTERM after batch
    0 must stop both workers at the step it names, whatever the earlier fit
    left in the coordination service (its "fit ended" mark)."""
    model = common.dense_model(strategy)
    with strategy.scope():
        optimizer = keras.optimizers.SGD(0.1)
    trainer = Trainer(model, optimizer, "mse", strategy=strategy)
    guard = PreemptionGuard()  # no backup: a signal stops without one
    callbacks = ([SignalAt(batch=0)] if rank() == 1 else []) + [guard]
    stopped = None
    try:  # 64 examples in batches of 16: 4 steps an epoch
        trainer.fit(common.dataset(common.regression_arrays(n=64), GLOBAL_BATCH), epochs=3,
                    callbacks=callbacks, verbose=0)
    except Preempted as stop:
        stopped = {"epoch": stop.epoch, "step": stop.step, "signal": stop.signal_name}
    with open(os.path.join(out, f"rank{rank()}_second_fit.json"), "w") as f:
        json.dump({"stopped": stopped, "watch_ended_by": guard.watch_ended_by}, f)


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", required=True)
    parser.add_argument("--phases", default="sgd,xla,seq2seq,on_batch,callbacks")
    args = parser.parse_args()
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    ready = os.environ.get("TFDIST_READY_FILE")
    if ready:
        open(ready, "a").close()
    phases = args.phases.split(",")
    allowed = {"sgd", "xla", "seq2seq", "on_batch", "callbacks"}
    if not set(phases) <= allowed:
        parser.error(f"--phases must be from {sorted(allowed)}, got {phases}")
    if "sgd" in phases:
        phase_sgd(strategy, args.out)
    if "xla" in phases:
        phase_sgd(strategy, args.out, jit_compile=True, name="xla")
    if "seq2seq" in phases:
        phase_seq2seq(strategy, args.out)
    if "on_batch" in phases:
        phase_on_batch(strategy, args.out)
    if "callbacks" in phases:
        phase_callbacks(strategy, args.out)
    print(f"worker {rank()} done", flush=True)


if __name__ == "__main__":
    from tfdist.runtime.quick_exit import skip_exit_garbage_collection

    skip_exit_garbage_collection()  # the test waits for this process to end
    main()
