"""Standard Keras callbacks drive and observe Trainer.fit under two replicas."""

import csv
import importlib.util

import keras
import numpy as np
import pytest

from tfdist.training import Trainer
from helpers.workers import train_common as common

TRAIN = common.dataset(common.regression_arrays(n=64), 16)
VAL = common.dataset(common.regression_arrays(n=35, seed=5), 16)


def make_trainer(learning_rate=0.1, **kwargs):
    strategy = common.mirrored(2)
    model = common.dense_model(strategy)
    with strategy.scope():
        optimizer = keras.optimizers.SGD(learning_rate)
    return Trainer(model, optimizer, "mse", metrics=["mae"], strategy=strategy, **kwargs)


class Recorder(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.events, self.epoch_logs = [], []

    def on_train_begin(self, logs=None):
        self.events.append(("train_begin", self.model is not None))

    def on_train_batch_end(self, batch, logs=None):
        self.events.append(("batch", batch))

    def on_epoch_end(self, epoch, logs=None):
        self.epoch_logs.append(dict(logs))


def test_standard_callbacks_on_two_replicas(tmp_path, capsys):
    trainer = make_trainer()
    recorder = Recorder()
    callbacks = [
        keras.callbacks.ModelCheckpoint(str(tmp_path / "best.keras"), monitor="val_loss",
                                        save_best_only=True),
        keras.callbacks.ModelCheckpoint(str(tmp_path / "epoch{epoch}.weights.h5"),
                                        save_weights_only=True),
        keras.callbacks.EarlyStopping(monitor="val_loss", min_delta=100.0, patience=1),
        keras.callbacks.ReduceLROnPlateau(monitor="loss", min_delta=100.0, patience=0,
                                          factor=0.5),
        keras.callbacks.CSVLogger(str(tmp_path / "log.csv")),
        keras.callbacks.TerminateOnNaN(),
        recorder,
    ]
    if importlib.util.find_spec("tensorboard") is not None:  # not a TF 2.21 dependency
        callbacks.append(keras.callbacks.TensorBoard(str(tmp_path / "tb")))
    history = trainer.fit(TRAIN, epochs=5, validation_data=VAL, callbacks=callbacks, verbose=1)

    # EarlyStopping ended training after 2 of 5 epochs; History saw exactly those.
    assert history is trainer.model.history
    assert history.epoch == [0, 1]
    assert recorder.events[0] == ("train_begin", True)
    assert [e for e in recorder.events if e[0] == "batch"] == [("batch", b) for b in range(4)] * 2
    for logs in recorder.epoch_logs:
        assert {"loss", "mae", "val_loss", "val_mae", "learning_rate"} <= set(logs)
    # ReduceLROnPlateau halved the learning rate after the epoch that did not improve.
    assert float(trainer.optimizer.learning_rate.numpy()) == pytest.approx(0.05)
    # The progress bar was shown.
    assert "Epoch 1/5" in capsys.readouterr().out

    with open(tmp_path / "log.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 2 and float(rows[1]["val_loss"]) == pytest.approx(
        history.history["val_loss"][1], rel=1e-5)

    # Checkpoints load back: the last weights equal the trained model's, the best
    # .keras file is the epoch with the lowest val_loss.
    fresh = common.dense_model(common.mirrored(1), seed=7)
    fresh.load_weights(str(tmp_path / "epoch2.weights.h5"))
    for a, b in zip(fresh.get_weights(), trainer.model.get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)
    best_epoch = int(np.argmin(history.history["val_loss"])) + 1
    fresh.load_weights(str(tmp_path / f"epoch{best_epoch}.weights.h5"))
    best = keras.saving.load_model(str(tmp_path / "best.keras"), compile=False)
    for a, b in zip(best.get_weights(), fresh.get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)
    if importlib.util.find_spec("tensorboard") is not None:
        assert list((tmp_path / "tb").rglob("events.out.tfevents.*"))


def test_terminate_on_nan_stops_training():
    trainer = make_trainer(learning_rate=1e6)
    recorder = Recorder()
    history = trainer.fit(TRAIN, epochs=3, callbacks=[keras.callbacks.TerminateOnNaN(), recorder],
                          verbose=0)
    batches = [e for e in recorder.events if e[0] == "batch"]
    assert len(batches) < 12 and len(history.epoch) == 1
    assert not np.isfinite(history.history["loss"][-1])


def test_learning_rate_scheduler_and_custom_stop():
    trainer = make_trainer()

    class StopAfterThreeBatches(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if batch == 2:
                self.model.stop_training = True

    history = trainer.fit(TRAIN, epochs=4, verbose=0, callbacks=[
        keras.callbacks.LearningRateScheduler(lambda epoch, lr: 0.05),
        StopAfterThreeBatches()])
    assert history.epoch == [0]
    assert history.history["learning_rate"] == [pytest.approx(0.05)]
    assert int(trainer.optimizer.iterations.numpy()) == 3


def test_steps_per_epoch_continues_the_data_and_restarts_when_it_runs_out():
    recorder = Recorder()
    repeated = make_trainer()
    repeated.fit(TRAIN.repeat(), epochs=2, steps_per_epoch=2, verbose=0)
    one_pass = make_trainer()
    one_pass.fit(TRAIN, epochs=1, verbose=0)  # the same 4 batches in one epoch
    for a, b in zip(repeated.model.get_weights(), one_pass.model.get_weights(), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6)

    finite = make_trainer()
    with pytest.warns(UserWarning, match="ran out of data after 1 of 3"):
        finite.fit(TRAIN, epochs=3, steps_per_epoch=3, verbose=0, callbacks=[recorder])
    batches = [e[1] for e in recorder.events if e[0] == "batch"]
    assert batches == [0, 1, 2, 0, 0, 1, 2]  # 4 batches: 3, then 1 and out, then a new pass


def test_one_callback_not_in_a_list_is_taken_as_keras_fit_takes_it():
    recorder = Recorder()
    make_trainer().fit(TRAIN, epochs=2, callbacks=recorder, verbose=0)
    assert [event for event in recorder.events if event[0] == "train_begin"] == [
        ("train_begin", True)]
    assert len(recorder.epoch_logs) == 2


def test_training_data_without_a_batch_warns_and_logs_no_training_figures():
    """As Keras's fit: a warning, and no `loss` for an epoch that trained nothing
    (not the metrics' initial zero)."""
    recorder = Recorder()
    trainer = make_trainer()
    with pytest.warns(UserWarning, match=r"The training data gave no batch .* nothing was "
                                         r"trained in this epoch"):
        history = trainer.fit(TRAIN.take(0), epochs=2, verbose=0, callbacks=[recorder])
    assert int(trainer.model.optimizer.iterations.numpy()) == 0
    assert [sorted(logs) for logs in recorder.epoch_logs] == [["learning_rate"]] * 2
    assert "loss" not in history.history
