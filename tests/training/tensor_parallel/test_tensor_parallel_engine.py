"""The engine's features under tensor parallelism (`Trainer(tensor_parallel=2, layout_map=...)`)
on the session's 2 logical CPUs: an interrupted run resumed from tfdist's backup by a new
Trainer ends exactly like an uninterrupted one (same degree); mixed bfloat16 and float16 (with
loss scaling) train like one device under the same policy; K accumulated micro-batches
equal one K-times larger batch.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

from helpers.interrupt import Interrupted, InterruptAfterSteps
from tfdist.callbacks.backup import BackupAndResume
from tfdist.training.tensor_parallel.layers import sum_partial_products
from tfdist.training import Trainer

FEATURES, CLASSES, ROWS, BATCH = 12, 5, 72, 8  # 9 batches per epoch


def mlp(seed=3):
    """Input -> up (column) -> down (row) -> head (replicated); SGD with momentum."""
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((FEATURES,), name="features")
    hidden = keras.layers.Dense(32, activation="gelu", name="up")(inputs)
    back = keras.layers.Dense(FEATURES, name="down")(hidden)
    logits = keras.layers.Dense(CLASSES, name="head")(back)
    model = keras.Model(inputs, logits, name="mlp")
    model.compile(keras.optimizers.SGD(0.05, momentum=0.9),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    return model


def layout():
    mesh = keras.distribution.DeviceMesh((2,), ["model"], devices=["cpu:0", "cpu:1"])
    layout_map = keras.distribution.LayoutMap(mesh)
    layout_map["up/kernel"] = (None, "model")
    layout_map["up/bias"] = ("model",)
    layout_map["down/kernel"] = ("model", None)
    return layout_map


def dataset(seed=0, rows=ROWS, batch=BATCH):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, FEATURES)).astype("float32")
    y = rng.integers(0, CLASSES, size=(rows,)).astype("int32")
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(batch)


def tensor_parallel_fit(callbacks=(), epochs=2):
    model = mlp()
    trainer = Trainer(model, tensor_parallel=2, layout_map=layout())
    history = trainer.fit(dataset(), epochs=epochs, callbacks=list(callbacks), verbose=0)
    return model, trainer, history.history


def test_resume_from_a_backup_mid_epoch_equals_an_uninterrupted_run_exactly(tmp_path):
    reference, _, reference_history = tensor_parallel_fit()
    first = BackupAndResume(tmp_path / "backup", save_freq=4, verbose=0)
    with pytest.raises(Interrupted):
        tensor_parallel_fit([first, InterruptAfterSteps(14)])
    saved = first.last_backup
    assert saved.epoch == 1 and 0 < saved.step and saved.global_step < 14  # mid-epoch

    second = BackupAndResume(tmp_path / "backup", save_freq=4, verbose=0)
    resumed, trainer, history = tensor_parallel_fit([second])
    assert second.restored == saved and second.exact is True
    assert int(trainer.optimizer.iterations.numpy()) == 2 * ROWS // BATCH
    for a, b in zip(resumed.get_weights(), reference.get_weights(), strict=True):
        assert np.max(np.abs(a - b)) == 0
    # (the shards' momentum slots were restored too, else the weights would differ)
    # The resumed epoch's logs cover the whole epoch (its metric totals were restored).
    np.testing.assert_allclose(history["loss"], reference_history["loss"][1:], rtol=1e-6)


# Relative margins of the repo's mixed-precision equivalence tests
# (tests/training/test_training_precision.py).
MARGINS = {"mixed_bfloat16": 0.03, "mixed_float16": 0.01}


@pytest.mark.parametrize("policy", list(MARGINS))
def test_mixed_precision_trains_like_one_device_under_the_same_policy(request, policy):
    request.getfixturevalue(policy)
    one = mlp()
    one_losses = Trainer(one).fit(dataset(), epochs=2, verbose=0).history["loss"]
    two, trainer, history = tensor_parallel_fit()
    margin = MARGINS[policy]
    assert all(np.isfinite(history["loss"]))
    np.testing.assert_allclose(history["loss"], one_losses, rtol=margin)
    for a, b in zip(two.get_weights(), one.get_weights(), strict=True):
        np.testing.assert_allclose(a, b, rtol=margin, atol=margin)
    assert not np.allclose(two.get_layer("up").kernel, mlp().get_layer("up").kernel, atol=1e-3)
    compute = policy.split("_")[1]
    split = trainer.model
    for name in ("up", "down"):
        layer = split.get_layer(name)
        assert layer.compute_dtype == compute and {v.dtype for v in layer.weights} == {"float32"}
    features = tf.zeros((2, FEATURES))
    assert split.get_layer("down")(split.get_layer("up")(features)).dtype == compute
    wrapped = isinstance(trainer.optimizer, keras.optimizers.LossScaleOptimizer)
    assert wrapped == (policy == "mixed_float16")



def test_partial_products_are_summed_in_float32_and_rounded_once():
    # bfloat16 spaces numbers near 1 by 2**-7: adding 2**-8 twice in bfloat16 rounds back to
    # 1 each time; in float32 the two make 2**-7, and the sum rounds to 1 + 2**-7 once.
    partials = [tf.constant([1.0], tf.bfloat16)] + [tf.constant([2.0 ** -8], tf.bfloat16)] * 2
    total = sum_partial_products(partials)
    assert total.dtype == tf.bfloat16
    assert float(total[0]) == 1.0 + 2.0 ** -7
    assert float(sum_partial_products([tf.constant([1.5])] * 2)[0]) == 3.0

def test_accumulated_micro_batches_equal_one_big_batch_on_one_device():
    one = mlp()
    one_history = Trainer(one).fit(dataset(rows=64, batch=2 * BATCH), epochs=2,
                                   verbose=0).history
    two = mlp()
    trainer = Trainer(two, tensor_parallel=2, layout_map=layout(), grad_accum_steps=2)
    history = trainer.fit(dataset(rows=64, batch=BATCH), epochs=2, verbose=0).history
    assert int(trainer.optimizer.iterations.numpy()) == 2 * 64 // (2 * BATCH)
    np.testing.assert_allclose(history["loss"], one_history["loss"], rtol=1e-5)
    for a, b in zip(two.get_weights(), one.get_weights(), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
    assert not np.allclose(two.get_layer("up").kernel, mlp().get_layer("up").kernel, atol=1e-3)
    # One float32 buffer per variable of the split copy (each shard its own), beside it.
    buffers = trainer.step_functions.accumulator.gradients
    variables = trainer.model.trainable_variables
    assert [b.shape for b in buffers] == [v.shape for v in variables]
    assert [b.device for b in buffers] == [v.value.device for v in variables]
    assert {b.device.rsplit(":", 1)[-1] for b in buffers} == {"0", "1"}
