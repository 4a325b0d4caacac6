"""LearningRateScheduleCallback and LearningRateLogger under plain model.fit."""

import keras
import numpy as np
import pytest

from helpers.recorders import BatchRecorder
from tfdist.callbacks.learning_rate import LearningRateLogger
from tfdist.callbacks.learning_rate import LearningRateScheduleCallback
from tfdist.schedules import WarmUp
from tfdist.schedules import make_schedule
from tfdist.distribute.strategy_factory import create_strategy


def _ones_model():
    """y = w * x with w = 0: with x = y = 1 and MSE, each SGD update is
    w <- w - lr * 2 * (w - 1), so the weight records every rate used."""
    return keras.Sequential(
        [keras.Input((1,)), keras.layers.Dense(1, use_bias=False, kernel_initializer="zeros")]
    )


def _expected_weight(rates):
    w = 0.0
    for rate in rates:
        w -= rate * 2.0 * (w - 1.0)
    return w


def _fit(model, optimizer, callbacks, samples, batch_size=1, epochs=1):
    model.compile(optimizer=optimizer, loss="mse")
    x = np.ones((samples, 1), "float32")
    return model.fit(
        x, x, batch_size=batch_size, epochs=epochs, shuffle=False, verbose=0, callbacks=callbacks
    )


def test_step_schedule_advances_per_optimizer_step_under_gradient_accumulation():
    model = _ones_model()
    optimizer = keras.optimizers.SGD(learning_rate=0.5, gradient_accumulation_steps=2)
    recorder = BatchRecorder()
    schedule = LearningRateScheduleCallback(lambda step: 0.1 * (step + 1))
    _fit(model, optimizer, [schedule, recorder], samples=8)

    # 8 micro-batches = 4 optimizer updates; each pair shares one rate.
    np.testing.assert_allclose(recorder.values("learning_rate"),
                               [0.1, 0.1, 0.2, 0.2, 0.3, 0.3, 0.4, 0.4], rtol=1e-6)
    assert int(optimizer.iterations) == 4
    # The updates used 0.1 .. 0.4 (not 0.2, 0.4, 0.6, 0.8 of a micro-batch count).
    assert model.get_weights()[0][0, 0] == pytest.approx(
        _expected_weight([0.1, 0.2, 0.3, 0.4]), rel=1e-5
    )


def test_step_schedule_from_a_learning_rate_schedule_and_history():
    warm = WarmUp(0.4, warmup_steps=4, initial_learning_rate=0.2)  # .2 .25 .3 .35 .4 .4
    model = _ones_model()
    optimizer = keras.optimizers.SGD(learning_rate=0.0)
    recorder = BatchRecorder()
    history = _fit(
        model, optimizer, [LearningRateScheduleCallback(warm), recorder], samples=3, epochs=2
    )
    np.testing.assert_allclose(recorder.values("learning_rate"),
                               [0.2, 0.25, 0.3, 0.35, 0.4, 0.4], rtol=1e-6)
    # Epoch logs: the optimizer's rate at the end of each epoch (last rate set).
    np.testing.assert_allclose(history.history["learning_rate"], [0.3, 0.4], rtol=1e-6)
    assert model.get_weights()[0][0, 0] == pytest.approx(
        _expected_weight([0.2, 0.25, 0.3, 0.35, 0.4, 0.4]), rel=1e-5
    )


def test_step_schedule_resumes_from_the_optimizer_step():
    model = _ones_model()
    optimizer = keras.optimizers.SGD(learning_rate=0.0)
    recorder = BatchRecorder()
    callbacks = [LearningRateScheduleCallback(lambda step: 0.01 * step), recorder]
    _fit(model, optimizer, callbacks, samples=3)
    _fit(model, optimizer, callbacks, samples=2)  # a second fit, as after a restore
    np.testing.assert_allclose(recorder.values("learning_rate"),
                               [0.0, 0.01, 0.02, 0.03, 0.04], rtol=1e-6)


def test_epoch_schedule_sets_the_rate_per_epoch_and_logs_it_in_history():
    model = _ones_model()
    optimizer = keras.optimizers.SGD(learning_rate=0.9)
    callback = LearningRateScheduleCallback(lambda epoch: 0.1 * 0.5**epoch, unit="epoch")
    recorder = BatchRecorder()
    history = _fit(model, optimizer, [callback, recorder], samples=2, epochs=3)
    assert history.history["learning_rate"] == pytest.approx([0.1, 0.05, 0.025], rel=1e-6)
    np.testing.assert_allclose(recorder.values("learning_rate"),
                               [0.1, 0.1, 0.05, 0.05, 0.025, 0.025], rtol=1e-6)
    assert model.get_weights()[0][0, 0] == pytest.approx(
        _expected_weight([0.1, 0.1, 0.05, 0.05, 0.025, 0.025]), rel=1e-5
    )


def test_step_schedule_under_two_replica_mirrored_strategy():
    strategy = create_strategy("mirrored", devices=["/cpu:0", "/cpu:1"])
    schedule = make_schedule("cosine", 0.2, warmup_steps=2, total_steps=6)
    with strategy.scope():
        model = _ones_model()
        optimizer = keras.optimizers.SGD(learning_rate=0.0)
    _fit(model, optimizer, [LearningRateScheduleCallback(schedule)], samples=24, batch_size=4)
    rates = [float(schedule(n)) for n in range(6)]
    assert float(keras.ops.copy(optimizer.learning_rate)) == pytest.approx(rates[-1], rel=1e-6)
    assert model.get_weights()[0][0, 0] == pytest.approx(_expected_weight(rates), rel=1e-5)


def test_optimizer_holding_a_schedule_is_a_clear_type_error():
    model = _ones_model()
    optimizer = keras.optimizers.SGD(learning_rate=make_schedule("constant", 0.1, warmup_steps=2))
    callback = LearningRateScheduleCallback(lambda step: 0.1)
    with pytest.raises(TypeError, match=r"built with the schedule WarmUp .*float learning_rate"):
        _fit(model, optimizer, [callback], samples=2)


def test_loss_scale_optimizer_holding_a_schedule_is_detected():
    model = _ones_model()
    inner = keras.optimizers.SGD(learning_rate=make_schedule("constant", 0.1, warmup_steps=2))
    model.compile(optimizer=keras.optimizers.LossScaleOptimizer(inner), loss="mse")
    callback = LearningRateScheduleCallback(lambda step: 0.1)
    callback.set_model(model)
    with pytest.raises(TypeError, match="LearningRateSchedule"):
        callback.on_train_begin()


@pytest.mark.parametrize(
    "returned,message",
    [(-0.1, r"returned -0\.1 at step 0"), (float("inf"), "returned inf at step 0"),
     ("fast", "returned 'fast' at step 0")],
)
def test_bad_schedule_output_names_the_value_and_step(returned, message):
    model = _ones_model()
    callback = LearningRateScheduleCallback(lambda step: returned)
    with pytest.raises(ValueError, match=message):
        _fit(model, keras.optimizers.SGD(learning_rate=0.1), [callback], samples=1)


@pytest.mark.parametrize(
    "kwargs,message",
    [({"schedule": 0.1}, "schedule=0.1"), ({"schedule": abs, "unit": "batch"}, "unit='batch'"),
     ({"schedule": abs, "verbose": 2}, "verbose=2")],
)
def test_bad_callback_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        LearningRateScheduleCallback(**kwargs)


def test_logger_with_a_schedule_in_the_optimizer():
    schedule = WarmUp(0.4, warmup_steps=4)  # 0 .1 .2 .3 .4 .4
    model = _ones_model()
    recorder = BatchRecorder()
    history = _fit(
        model, keras.optimizers.SGD(learning_rate=schedule), [LearningRateLogger(), recorder],
        samples=3, epochs=2,
    )
    # Batch logs: the rate each update used, schedule(0..5).
    np.testing.assert_allclose(recorder.values("learning_rate"),
                               [0.0, 0.1, 0.2, 0.3, 0.4, 0.4], atol=1e-7)
    # Epoch logs: the optimizer's rate at epoch end, schedule(3) and schedule(6).
    np.testing.assert_allclose(history.history["learning_rate"], [0.3, 0.4], rtol=1e-6)


def test_logger_with_a_float_rate_and_without_batch_logs():
    model = _ones_model()
    logger = LearningRateLogger(log_batches=False)

    class NoRate(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            assert "learning_rate" not in logs

    history = _fit(model, keras.optimizers.SGD(learning_rate=0.125), [logger, NoRate()],
                   samples=2, epochs=2)
    assert history.history["learning_rate"] == [0.125, 0.125]
