import json
import pickle
import warnings

import keras
import numpy as np
import pytest

from tfdist.callbacks.nan_guard import NanGuard, NonFiniteLossError
from helpers.workers.train_common import PoisonWeights

STEPS = 4  # batches per epoch in these tests


def data():
    rs = np.random.RandomState(0)
    x = rs.standard_normal((8 * STEPS, 4)).astype("float32")
    return x, np.tanh(x[:, :2])


def build_model(metrics=()):
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse", metrics=list(metrics))
    return model


def fit(model, callbacks, epochs=4, **kwargs):
    x, y = data()
    return model.fit(x, y, batch_size=8, epochs=epochs, verbose=0, callbacks=callbacks,
                     shuffle=False, **kwargs)


def test_nan_loss_raises_naming_the_value_epoch_batch_and_step():
    model = build_model()
    with pytest.raises(NonFiniteLossError) as caught:
        fit(model, [PoisonWeights(epoch=1, batch=2, layer=0), NanGuard()])
    error = caught.value
    assert isinstance(error, RuntimeError)
    assert (error.name, error.epoch, error.batch, error.step) == ("loss", 1, 2, STEPS + 2)
    assert np.isnan(error.value)
    assert error.iterations == STEPS + 3  # the optimizer applied the NaN step too
    message = str(error)
    assert "loss is nan at batch 2 of epoch index 1" in message and "global step 6" in message
    assert model.stop_training is True


def test_the_last_good_backup_survives_and_training_resumes_from_it(tmp_path):
    backup_dir = tmp_path / "backup"
    model = build_model()
    with pytest.raises(NonFiniteLossError):
        fit(model, [PoisonWeights(epoch=2, batch=1, layer=0), NanGuard(),
                    keras.callbacks.BackupAndRestore(str(backup_dir))])
    assert backup_dir.is_dir()
    assert json.loads((backup_dir / "training_metadata.json").read_text())["epoch"] == 2
    restored = build_model()
    restored.load_weights(str(backup_dir / "latest.weights.h5"))
    assert all(np.all(np.isfinite(w)) for w in restored.get_weights())

    resumed = build_model()
    history = fit(resumed, [NanGuard(), keras.callbacks.BackupAndRestore(str(backup_dir))])
    assert len(history.history["loss"]) == 2  # epochs 2 and 3 only
    assert np.all(np.isfinite(history.history["loss"]))


def test_terminate_on_nan_stops_gracefully_and_the_backup_is_deleted(tmp_path):
    # What NanGuard is for: Keras's graceful stop runs on_train_end, and
    # BackupAndRestore(delete_checkpoint=True) deletes the backup there.
    backup_dir = tmp_path / "backup"
    fit(build_model(), [PoisonWeights(epoch=2, batch=1, layer=0),
                        keras.callbacks.TerminateOnNaN(),
                        keras.callbacks.BackupAndRestore(str(backup_dir))])
    assert not backup_dir.exists()


def test_check_freq_checks_every_nth_step_and_still_catches_the_nan():
    # NaN from step 4 (epoch 1, batch 0); checked steps are 2, 5, 8, ... -> seen at step 5.
    with pytest.raises(NonFiniteLossError) as caught:
        fit(build_model(), [PoisonWeights(epoch=1, batch=0, layer=0), NanGuard(check_freq=3)])
    assert (caught.value.epoch, caught.value.batch, caught.value.step) == (1, 1, 5)


def test_epoch_only_checks_catch_it_at_the_epoch_end():
    guard = NanGuard(check_freq="epoch")
    assert getattr(guard.on_train_batch_end, "_is_default", False)  # no per-batch sync
    with pytest.raises(NonFiniteLossError) as caught:
        fit(build_model(), [PoisonWeights(epoch=1, batch=2, layer=0), guard])
    assert (caught.value.epoch, caught.value.batch) == (1, None)
    assert "at the end of epoch index 1" in str(caught.value)


def nan_metric(y_true, y_pred):
    return keras.ops.log(keras.ops.mean(y_pred - y_pred) - 1.0)  # log(-1): NaN


def test_a_nan_metric_is_named_when_monitored_and_ignored_otherwise():
    history = fit(build_model([nan_metric]), [NanGuard()], epochs=1)
    assert np.isnan(history.history["nan_metric"][0])
    with pytest.raises(NonFiniteLossError, match="nan_metric is nan at batch 0") as caught:
        fit(build_model([nan_metric]), [NanGuard(monitor="all")], epochs=1)
    assert caught.value.name == "nan_metric"


def test_inf_validation_loss_is_caught_at_the_epoch_end():
    x, y = data()
    x_val = x.copy()
    x_val[0, 0] = np.inf
    with pytest.raises(NonFiniteLossError, match="val_loss is inf") as caught:
        fit(build_model(), [NanGuard(monitor=["loss", "val_loss"])], epochs=2,
            validation_data=(x_val, y))
    assert (caught.value.name, caught.value.epoch, caught.value.batch) == ("val_loss", 0, None)


def test_a_monitored_name_never_logged_is_warned_about():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fit(build_model(), [NanGuard(monitor=["loss", "val_los"])], epochs=2)
    messages = [str(w.message) for w in caught if "NanGuard" in str(w.message)]
    assert len(messages) == 1 and "['val_los']" in messages[0]


def test_the_error_pickles_with_its_fields():
    error = NonFiniteLossError("boom", name="loss", value=float("nan"), epoch=1, batch=2,
                               step=6, iterations=7)
    copy = pickle.loads(pickle.dumps(error))
    assert (str(copy), copy.name, copy.epoch, copy.batch, copy.step, copy.iterations) == (
        "boom", "loss", 1, 2, 6, 7)


@pytest.mark.parametrize("kwargs, name", [
    ({"monitor": []}, "monitor"), ({"monitor": 3}, "monitor"),
    ({"check_freq": 0}, "check_freq"), ({"check_freq": "batch"}, "check_freq"),
])
def test_bad_arguments_are_named(kwargs, name):
    with pytest.raises(ValueError, match=name):
        NanGuard(**kwargs)


def test_get_config_round_trips():
    guard = NanGuard(monitor=["loss", "val_loss"], check_freq=5)
    assert NanGuard(**guard.get_config()).get_config() == guard.get_config()
