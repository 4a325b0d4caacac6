"""Mixed precision under two replicas: float16 with dynamic loss scaling, bfloat16 without."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from tfdist.training import Trainer
from helpers.workers import train_common as common

DATA = common.dataset(common.regression_arrays(n=256), 32)
EPOCHS = 4


@pytest.fixture
def policy():
    def use(name):
        keras.mixed_precision.set_global_policy(name)

    yield use
    keras.mixed_precision.set_global_policy("float32")


def fit(make_optimizer=lambda: keras.optimizers.Adam(0.01), callbacks=None, epochs=EPOCHS,
        **trainer_kwargs):
    strategy = common.mirrored(2)
    model = common.dense_model(strategy)
    with strategy.scope():
        optimizer = make_optimizer()
    trainer = Trainer(model, optimizer, "mse", strategy=strategy, **trainer_kwargs)
    history = trainer.fit(DATA, epochs=epochs, verbose=0, callbacks=callbacks)
    return model, trainer, history.history["loss"]


@pytest.fixture(scope="module")
def float32_losses():
    return fit()[2]


@pytest.mark.parametrize("name,margin", [("mixed_float16", 0.01), ("mixed_bfloat16", 0.03)])
def test_mixed_policy_trains_like_float32(policy, float32_losses, name, margin):
    policy(name)
    model, trainer, losses = fit()
    assert all(np.isfinite(losses))
    # Within `margin` (relative) of the float32 run at every epoch, and learning.
    np.testing.assert_allclose(losses, float32_losses, rtol=margin)
    assert losses[-1] < 0.5 * losses[0]
    assert model.layers[0].compute_dtype == name.split("_")[1]
    assert {v.dtype for v in model.trainable_variables} == {"float32"}
    wrapped = isinstance(trainer.optimizer, keras.optimizers.LossScaleOptimizer)
    assert wrapped == (name == "mixed_float16")


def test_float16_clipping_acts_on_unscaled_gradients(policy):
    sgd = lambda: keras.optimizers.SGD(0.5)  # noqa: E731
    float32_losses = fit(sgd, clip_norm=0.05, epochs=2)[2]
    unclipped_losses = fit(sgd, epochs=2)[2]
    policy("mixed_float16")
    float16_losses = fit(sgd, clip_norm=0.05, epochs=2)[2]
    np.testing.assert_allclose(float16_losses, float32_losses, rtol=0.01)
    assert abs(unclipped_losses[-1] - float32_losses[-1]) > 0.05 * float32_losses[-1]


class ScaleRecorder(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.scales, self.iterations, self.first_weights = [], [], None

    def on_train_batch_end(self, batch, logs=None):
        optimizer = self.model.optimizer
        replicas = optimizer.dynamic_scale.value.values  # one copy per replica
        assert len({float(v.numpy()) for v in replicas}) == 1
        self.scales.append(float(optimizer.dynamic_scale.numpy()))
        self.iterations.append(int(optimizer.iterations.numpy()))
        if self.first_weights is None:
            self.first_weights = self.model.get_weights()


def test_float16_loss_scale_skips_overflows_then_grows(policy):
    policy("mixed_float16")
    initial_weights = common.dense_model(tf.distribute.get_strategy()).get_weights()
    recorder = ScaleRecorder()
    model, trainer, losses = fit(
        lambda: keras.optimizers.LossScaleOptimizer(
            keras.optimizers.SGD(0.05), initial_scale=2.0 ** 28, dynamic_growth_steps=2),
        callbacks=[recorder], epochs=3)
    scales = np.array(recorder.scales)
    # Overflowing steps are skipped: weights and the inner step counter do not move.
    assert scales[0] == 2.0 ** 27 and recorder.iterations[0] == 0
    for before, after in zip(initial_weights, recorder.first_weights, strict=True):
        np.testing.assert_array_equal(before, after)
    halvings = np.flatnonzero(scales[1:] == scales[:-1] / 2)
    doublings = np.flatnonzero(scales[1:] == scales[:-1] * 2)
    assert len(halvings) >= 1 and len(doublings) >= 1
    assert doublings[0] > halvings[0]
    assert recorder.iterations[-1] > 0 and np.isfinite(losses[-1]) and losses[-1] < losses[0]
