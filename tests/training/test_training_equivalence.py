"""Two replicas train exactly like one device (SGD: no scale-invariance to hide errors)."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from tfdist import seam
from tfdist.schedules import WarmUp
from tfdist.training import Trainer
from helpers.compare import assert_same_training
from helpers.workers import train_common as common

RTOL = 1e-5


def train(devices, data, loss, *, model_fn=common.dense_model, learning_rate=0.2,
          epochs=2, callbacks=None, optimizer_kwargs=None, make_optimizer=None,
          **trainer_kwargs):
    """Trains on `devices` logical CPUs (MirroredStrategy), or under `devices`
    when it is a strategy."""
    strategy = devices if isinstance(devices, tf.distribute.Strategy) else common.mirrored(devices)
    model = model_fn(strategy)
    with strategy.scope():
        optimizer = (make_optimizer() if make_optimizer
                     else keras.optimizers.SGD(learning_rate, **(optimizer_kwargs or {})))
    trainer = Trainer(model, optimizer, loss, strategy=strategy, **trainer_kwargs)
    history = trainer.fit(data, epochs=epochs, verbose=0, callbacks=callbacks)
    return common.weights_of(model), history.history, trainer


@pytest.mark.parametrize("reduction,learning_rate", [("sum_over_batch_size", 0.2), ("sum", 0.005)])
def test_plain_sgd_with_regularization_matches_one_device(reduction, learning_rate):
    data = common.dataset(common.regression_arrays(n=70), 16)  # last batch: 6 rows
    model_fn = lambda s: common.dense_model(s, regularized=True)  # noqa: E731
    loss = keras.losses.MeanSquaredError(reduction=reduction)
    one = train(1, data, loss, model_fn=model_fn, learning_rate=learning_rate)
    two = train(2, data, loss, model_fn=model_fn, learning_rate=learning_rate)
    assert_same_training(two, one)
    assert two[2].strategy.num_replicas_in_sync == 2


def test_adamw_with_moving_average_matches_one_device():
    data = common.dataset(common.regression_arrays(n=64), 16)
    make = lambda: keras.optimizers.AdamW(0.01, weight_decay=0.1, use_ema=True)  # noqa: E731
    one = train(1, data, "mse", make_optimizer=make)
    two = train(2, data, "mse", make_optimizer=make)
    assert_same_training(two, one)
    averages = two[2].optimizer._model_variables_moving_average
    for weight, average in zip(two[0], averages, strict=True):  # fit() ends with the averages
        np.testing.assert_array_equal(weight, average.numpy())


class CountedWarmUp(WarmUp):
    """tfdist's warmup schedule, counting the calls that put it in a graph."""

    traced = 0

    def __call__(self, step):
        if not tf.executing_eagerly():
            CountedWarmUp.traced += 1
        return super().__call__(step)


def test_a_schedule_is_put_in_the_step_once_not_per_variable_and_trains_the_same():
    """Keras reads the learning rate again for every variable's weight decay on
    every replica; the step evaluates the schedule once and trains exactly as
    Keras's own fit with the same optimizer does on one device."""
    data = common.dataset(common.regression_arrays(n=64), 16)
    schedule = lambda: CountedWarmUp(keras.optimizers.schedules.CosineDecay(0.01, 8),  # noqa: E731
                                     warmup_steps=3)
    make = lambda: keras.optimizers.AdamW(schedule(), weight_decay=0.1)  # noqa: E731
    CountedWarmUp.traced = 0
    two = train(2, data, "mse", make_optimizer=make)
    variables = len(two[2].model.trainable_variables)
    assert variables >= 4
    # Once in the update and once for all weight decay, in the one traced loop body.
    assert 1 <= CountedWarmUp.traced <= 2, CountedWarmUp.traced
    optimizer = two[2].optimizer
    assert isinstance(seam.held_learning_rate(optimizer), CountedWarmUp)  # its own again
    assert "WarmUp" in str(optimizer.get_config()["learning_rate"])

    model = common.dense_model(tf.distribute.get_strategy())  # Keras's fit, one device
    model.compile(make(), "mse")
    CountedWarmUp.traced = 0
    history = model.fit(data, epochs=2, verbose=0, shuffle=False)
    assert CountedWarmUp.traced > variables  # Keras's own step: once more per variable
    keras_weights = common.weights_of(model)
    for ours, theirs in zip(two[0], keras_weights, strict=True):
        np.testing.assert_allclose(ours, theirs, rtol=RTOL, atol=1e-6)
    np.testing.assert_allclose(two[1]["loss"], history.history["loss"], rtol=RTOL)


@pytest.mark.parametrize("kind", ["default", "one_device"])
def test_default_and_one_device_strategies_match_mirrored(kind):
    data = common.dataset(common.regression_arrays(n=70), 16)
    strategy = (tf.distribute.get_strategy() if kind == "default"
                else tf.distribute.OneDeviceStrategy("/cpu:1"))
    reference = train(1, data, "mse", clip_norm=0.5, jit_compile=True)
    assert_same_training(train(strategy, data, "mse", clip_norm=0.5, jit_compile=True),
                         reference)


@pytest.mark.parametrize("where", ["trainer_clip_norm", "optimizer_global_clipnorm"])
def test_global_norm_clipping_matches_one_device_and_binds(where):
    data = common.dataset(common.regression_arrays(n=64), 16)
    kwargs = ({"clip_norm": 0.05} if where == "trainer_clip_norm"
              else {"optimizer_kwargs": {"global_clipnorm": 0.05}})
    one = train(1, data, "mse", **kwargs)
    two = train(2, data, "mse", **kwargs)
    assert_same_training(two, one)
    unclipped = train(1, data, "mse")
    assert max(np.max(np.abs(a - b)) for a, b in zip(one[0], unclipped[0], strict=True)) > 1e-2


def test_sample_weighted_loss_matches_one_device_when_replicas_weigh_differently():
    # 65 rows: the last global batch has 1 row, so the second replica gets none.
    x, y, sample_weight = common.regression_arrays(n=65, weighted=True)
    halves = sample_weight[:64].reshape(4, 2, 8).sum(axis=2)  # per global batch, per replica
    assert np.all(np.abs(halves[:, 0] - halves[:, 1]) > 0.5) and sample_weight[64] > 0
    data = common.dataset((x, y, sample_weight), 16)
    loss = keras.losses.MeanSquaredError(reduction="mean_with_sample_weight")
    assert_same_training(train(2, data, loss), train(1, data, loss))


def test_token_masked_loss_and_metrics_match_one_device():
    tokens, targets = common.token_arrays(n=48)
    counts = (tokens.reshape(3, 2, 8, -1) != 0).sum(axis=(2, 3))  # unmasked tokens per replica
    assert np.all(counts[:, 0] != counts[:, 1])
    data = common.dataset((tokens, targets), 16)
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    kwargs = {"model_fn": common.token_model, "learning_rate": 0.5, "metrics": ["accuracy"]}
    one = train(1, data, loss, **kwargs)
    two = train(2, data, loss, **kwargs)
    assert_same_training(two, one)
    np.testing.assert_allclose(two[1]["accuracy"], one[1]["accuracy"], rtol=RTOL)


def test_xla_matches_no_xla_on_two_replicas():
    data = common.dataset(common.token_arrays(n=48), 16)
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    kwargs = {"model_fn": common.token_model, "learning_rate": 0.5}
    plain = train(2, data, loss, **kwargs)
    xla = train(2, data, loss, jit_compile=True, **kwargs)
    np.testing.assert_allclose(xla[1]["loss"], plain[1]["loss"], rtol=1e-5)
    for a, b in zip(xla[0], plain[0], strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def test_accumulating_k_micro_batches_equals_one_large_batch():
    x, y = common.regression_arrays(n=96)
    schedule = lambda: keras.optimizers.schedules.PiecewiseConstantDecay(  # noqa: E731
        [2], [0.3, 0.05])  # changes after 2 *optimizer* steps
    results = {}
    for name, devices, batch, k in [("large", 1, 32, 1), ("accumulated", 2, 16, 2)]:
        strategy = common.mirrored(devices)
        model = common.dense_model(strategy)
        with strategy.scope():
            optimizer = keras.optimizers.SGD(schedule())
        trainer = Trainer(model, optimizer, "mse", strategy=strategy, grad_accum_steps=k)
        history = trainer.fit(common.dataset((x, y), batch), epochs=2, verbose=0)
        iterations = int(optimizer.iterations.numpy())
        results[name] = (common.weights_of(model), history.history, iterations)
    assert results["accumulated"][2] == results["large"][2] == 6
    assert_same_training(results["accumulated"], results["large"])


class BatchLogs(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.batches, self.losses = [], []

    def on_train_batch_end(self, batch, logs=None):
        self.batches.append(batch)
        self.losses.append(logs["loss"])


def test_steps_per_execution_matches_single_steps_and_reports_last_batch_of_group():
    data = common.dataset(common.regression_arrays(n=100), 16)  # 7 batches per epoch
    single, grouped = BatchLogs(), BatchLogs()
    one = train(2, data, "mse", callbacks=[single])
    three = train(2, data, "mse", callbacks=[grouped], steps_per_execution=3)
    assert_same_training(three, one)
    assert single.batches == list(range(7)) * 2
    assert grouped.batches == [2, 5, 6] * 2
    expected = [single.losses[e * 7 + b] for e in range(2) for b in (2, 5, 6)]
    np.testing.assert_allclose(grouped.losses, expected, rtol=RTOL)


def test_every_input_form_gives_the_same_training():
    x, y = common.regression_arrays(n=64)
    global_batches = common.dataset((x, y), 16)

    def dataset_fn(context):
        batch = context.get_per_replica_batch_size(16)
        return (tf.data.Dataset.from_tensor_slices((x, y))
                .shard(context.num_input_pipelines, context.input_pipeline_id).batch(batch))

    reference = train(1, global_batches, "mse")
    from_function = train(2, dataset_fn, "mse")
    assert_same_training(from_function, reference)

    strategy = common.mirrored(2)
    model = common.dense_model(strategy)
    with strategy.scope():
        optimizer = keras.optimizers.SGD(0.2)
    distributed = strategy.experimental_distribute_dataset(global_batches)
    history = Trainer(model, optimizer, "mse", strategy=strategy).fit(
        distributed, epochs=2, verbose=0)
    assert_same_training((common.weights_of(model), history.history), reference)


def test_one_device_matches_keras_fit():
    data = common.dataset(common.regression_arrays(n=70, weighted=True), 16)
    strategy = tf.distribute.get_strategy()
    keras_model = common.dense_model(strategy, regularized=True)
    keras_model.compile(keras.optimizers.SGD(0.2), "mse", metrics=["mae"])
    keras_history = keras_model.fit(data, epochs=2, verbose=0).history
    ours = train(strategy, data, "mse", metrics=["mae"],
                 model_fn=lambda s: common.dense_model(s, regularized=True))
    assert_same_training(ours, (common.weights_of(keras_model), keras_history))
    np.testing.assert_allclose(ours[1]["mae"], keras_history["mae"], rtol=RTOL)


def test_clipping_an_embedding_gradient_matches_one_device():
    # The embedding's gradient is IndexedSlices with one row per token
    # occurrence; after the all-reduce the two replicas' rows are the same
    # rows as one device's, so the global norm, and the clipping, are the same.
    tokens, targets = common.token_arrays(n=48)
    data = common.dataset((tokens, targets), 16)
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    kwargs = {"model_fn": common.token_model, "learning_rate": 0.5, "clip_norm": 0.1}
    one = train(1, data, loss, **kwargs)
    two = train(2, data, loss, **kwargs)
    assert_same_training(two, one)
    unclipped = train(1, data, loss, model_fn=common.token_model, learning_rate=0.5)
    assert max(np.max(np.abs(a - b)) for a, b in zip(one[0], unclipped[0], strict=True)) > 1e-2
