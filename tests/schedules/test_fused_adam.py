"""FusedAdam/FusedAdamW: Keras's Adam with TensorFlow's one-kernel update.

With betas whose `1 - beta` is exact in float32 the fused update equals
Keras's to the bit (same formula, operation for operation); with Keras's
default betas it differs only by how `1 - beta` is rounded, bounded here.
"""

import numpy as np
import pytest
import keras
import tensorflow as tf

from helpers.workers.train_common import mirrored
from tfdist.schedules import make_schedule
from tfdist.schedules.fused_adam import FusedAdam, FusedAdamW
from tfdist.schedules.optimizers import build_optimizer

EXACT_BETAS = {"beta_1": 0.5, "beta_2": 0.75}  # 1 - beta is exact in float32


def _gradients(shape, steps, seed=0):
    rng = np.random.default_rng(seed)
    return [(rng.normal(size=shape) * 10 ** rng.uniform(-4, 0)).astype("float32")
            for _ in range(steps)]


def _train(optimizer, initial, gradients, jit_compile=False):
    """The variable after applying `gradients` one by one, as Keras's `fit` applies them."""
    variable = keras.Variable(initial)

    @tf.function(jit_compile=jit_compile)
    def step(gradient):
        optimizer.apply([gradient], [variable])

    for gradient in gradients:
        step(tf.constant(gradient))
    return variable.numpy()


def _op_types(optimizer, initial):
    variable = keras.Variable(initial)
    optimizer.build([variable])
    graph = tf.function(lambda g: optimizer.apply([g], [variable])).get_concrete_function(
        tf.TensorSpec(np.shape(initial), variable.dtype)).graph
    return {op.type for op in graph.get_operations()}


@pytest.mark.parametrize("fused, keras_class, options", [
    (FusedAdam, keras.optimizers.Adam, {}),
    (FusedAdamW, keras.optimizers.AdamW, {"weight_decay": 0.05}),
])
def test_with_exact_betas_the_fused_update_is_keras_to_the_bit(fused, keras_class, options):
    initial = np.random.default_rng(1).normal(size=(33, 17)).astype("float32")
    gradients = _gradients(initial.shape, 40)

    def optimizer(cls):
        schedule = make_schedule("cosine", 3e-3, warmup_steps=5, total_steps=40)
        return cls(schedule, epsilon=1e-6, **EXACT_BETAS, **options)

    ours = _train(optimizer(fused), initial, gradients)
    theirs = _train(optimizer(keras_class), initial, gradients)
    np.testing.assert_array_equal(ours, theirs)
    assert not np.array_equal(ours, initial)


def test_with_keras_default_betas_it_differs_only_by_the_rounding_of_one_minus_beta():
    initial = np.random.default_rng(2).normal(size=(64, 64)).astype("float32")
    gradients = _gradients(initial.shape, 200, seed=3)
    ours = _train(FusedAdamW(3e-3, weight_decay=0.01), initial, gradients)
    theirs = _train(keras.optimizers.AdamW(3e-3, weight_decay=0.01), initial, gradients)
    moved = np.abs(theirs - initial).max()
    # 200 steps moved the weights by up to ~0.17; the rounding by ~1e-5 of that (1.7e-6).
    assert np.abs(ours - theirs).max() <= 1e-4 * moved, np.abs(ours - theirs).max()
    # The bound can fail: beta_2 = 0.998 instead of 0.999 lands far outside it.
    other = _train(keras.optimizers.AdamW(3e-3, weight_decay=0.01, beta_2=0.998), initial,
                   gradients)
    assert np.abs(other - theirs).max() > 1e-2 * moved, np.abs(other - theirs).max()


def test_float32_variables_take_the_one_kernel_and_the_others_keras_update():
    float32 = _op_types(FusedAdam(1e-3), np.ones((4, 4), "float32"))
    assert "ResourceApplyAdam" in float32 and "Sqrt" not in float32
    keras_ops = _op_types(keras.optimizers.Adam(1e-3), np.ones((4, 4), "float32"))
    assert "ResourceApplyAdam" not in keras_ops and "Sqrt" in keras_ops
    bfloat16 = _op_types(FusedAdam(1e-3), tf.ones((4, 4), tf.bfloat16))
    assert "ResourceApplyAdam" not in bfloat16 and "Sqrt" in bfloat16
    amsgrad = _op_types(FusedAdam(1e-3, amsgrad=True), np.ones((4, 4), "float32"))
    assert "ResourceApplyAdam" not in amsgrad and "Maximum" in amsgrad


def test_amsgrad_and_bfloat16_variables_update_exactly_as_keras():
    gradients = _gradients((8, 8), 10, seed=4)
    initial = np.random.default_rng(5).normal(size=(8, 8)).astype("float32")
    np.testing.assert_array_equal(
        _train(FusedAdam(1e-2, amsgrad=True), initial, gradients),
        _train(keras.optimizers.Adam(1e-2, amsgrad=True), initial, gradients))
    low = tf.cast(initial, tf.bfloat16)
    np.testing.assert_array_equal(
        _train(FusedAdam(1e-2), low, [tf.cast(g, tf.bfloat16) for g in gradients]),
        _train(keras.optimizers.Adam(1e-2), low, [tf.cast(g, tf.bfloat16) for g in gradients]))


def test_under_xla_it_updates_as_without():
    initial = np.random.default_rng(6).normal(size=(16, 16)).astype("float32")
    gradients = _gradients(initial.shape, 20, seed=7)
    compiled = _train(FusedAdamW(1e-2, weight_decay=0.01, **EXACT_BETAS), initial, gradients,
                      jit_compile=True)
    plain = _train(FusedAdamW(1e-2, weight_decay=0.01, **EXACT_BETAS), initial, gradients)
    np.testing.assert_allclose(compiled, plain, rtol=1e-6, atol=1e-7)


def test_sparse_embedding_gradients_take_keras_update_and_match_it_to_the_bit():
    def trained(cls):
        tf.keras.utils.set_random_seed(8)
        model = keras.Sequential([keras.Input((3,), dtype="int32"), keras.layers.Embedding(10, 4),
                                  keras.layers.GlobalAveragePooling1D(), keras.layers.Dense(2)])
        optimizer = cls(1e-2, **EXACT_BETAS)
        ids = tf.constant([[1, 2, 2], [5, 1, 0]])
        for _ in range(5):
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(model(ids) ** 2)
            grads = tape.gradient(loss, model.trainable_variables)
            assert isinstance(grads[0], tf.IndexedSlices)
            optimizer.apply(grads, model.trainable_variables)
        return [v.numpy() for v in model.trainable_variables]

    # Keras squares each slice of an embedding's gradient before it sums the
    # rows an id repeats in; the fused kernel would square the sum.
    for ours, theirs in zip(trained(FusedAdam), trained(keras.optimizers.Adam), strict=True):
        np.testing.assert_array_equal(ours, theirs)


def test_on_two_replicas_every_copy_gets_the_one_device_update():
    strategy = mirrored(2)
    initial = np.random.default_rng(9).normal(size=(6, 5)).astype("float32")
    gradients = _gradients(initial.shape, 10, seed=10)
    with strategy.scope():
        variable = keras.Variable(initial)
        optimizer = FusedAdamW(1e-2, weight_decay=0.01)
        optimizer.build([variable])

    @tf.function
    def step(gradient):
        strategy.run(lambda g: optimizer.apply([g / 2.0], [variable]), args=(gradient,))

    for gradient in gradients:
        step(tf.constant(gradient))
    one_device = _train(FusedAdamW(1e-2, weight_decay=0.01), initial, gradients)
    copies = strategy.experimental_local_results(variable.value)
    assert len(copies) == 2
    for copy in copies:
        np.testing.assert_array_equal(copy.numpy(), one_device)


def test_serialises_by_name_and_a_keras_adamw_backup_loads_into_it(tmp_path):
    optimizer = build_optimizer("adamw", 1e-3, schedule="cosine", warmup_steps=2,
                                total_steps=20, weight_decay=0.01)
    assert type(optimizer) is FusedAdamW
    again = keras.optimizers.deserialize(keras.optimizers.serialize(optimizer))
    assert type(again) is FusedAdamW and again.get_config() == optimizer.get_config()

    variable = keras.Variable(np.ones((3,), "float32"))
    theirs = keras.optimizers.AdamW(1e-3, weight_decay=0.01)
    theirs.apply([tf.constant([1.0, -2.0, 3.0])], [variable])
    path = tf.train.Checkpoint(optimizer=theirs, variable=variable).write(str(tmp_path / "c"))
    fresh = keras.Variable(np.zeros((3,), "float32"))
    ours = FusedAdamW(1e-3, weight_decay=0.01)
    ours.build([fresh])
    tf.train.Checkpoint(optimizer=ours, variable=fresh).read(path).assert_consumed()
    assert int(ours.iterations.numpy()) == 1
    for mine, keras_own in zip(ours.variables, theirs.variables, strict=True):
        np.testing.assert_array_equal(mine.numpy(), keras_own.numpy())


def test_build_optimizer_builds_keras_own_classes_when_not_fused():
    assert type(build_optimizer("adam", 1e-3)) is FusedAdam
    assert type(build_optimizer("adam", 1e-3, fused=False)) is keras.optimizers.Adam
    assert type(build_optimizer("adamw", 1e-3, fused=False)) is keras.optimizers.AdamW
    assert type(build_optimizer("sgd", 1e-3, fused=False)) is keras.optimizers.SGD
