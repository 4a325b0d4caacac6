"""GlobalLoss: per-replica pieces that add up to the single-device Keras loss."""

import keras
import numpy as np
import pytest
import tensorflow as tf
from keras.src.backend.common.masking import set_keras_mask

from tfdist.training import GlobalLoss

rs = np.random.RandomState(0)
Y_TRUE = rs.randint(0, 5, size=(6, 7)).astype("int32")
LOGITS = rs.standard_normal((6, 7, 5)).astype("float32")
WEIGHTS = rs.uniform(0, 2, size=(6, 7)).astype("float32")
MASK = np.arange(7)[None, :] < np.array([7, 1, 3, 0, 5, 2])[:, None]


def _pred(rows, masked):
    y_pred = tf.constant(LOGITS[rows])
    if masked:
        set_keras_mask(y_pred, tf.constant(MASK[rows]))
    return y_pred


def _keras_value(loss, rows, weighted, masked):
    return float(loss(tf.constant(Y_TRUE[rows]), _pred(rows, masked),
                      sample_weight=tf.constant(WEIGHTS[rows]) if weighted else None))


def _global_value(global_loss, row_slices, weighted, masked):
    numerator, count = 0.0, 0.0
    for rows in row_slices:
        n, c = global_loss.local_terms(tf.constant(Y_TRUE[rows]), _pred(rows, masked),
                                       tf.constant(WEIGHTS[rows]) if weighted else None)
        numerator, count = numerator + float(n), count + float(c)
    return numerator / count if global_loss.normalized else numerator


CASES = [(reduction, weighted, masked)
         for reduction in ("sum_over_batch_size", "mean_with_sample_weight", "sum")
         for weighted in (False, True) for masked in (False, True)]


@pytest.mark.parametrize("reduction,weighted,masked", CASES)
def test_one_slice_equals_keras(reduction, weighted, masked):
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=reduction)
    expected = _keras_value(loss, slice(None), weighted, masked)
    assert _global_value(GlobalLoss(loss), [slice(None)], weighted, masked) == pytest.approx(
        expected, rel=1e-6)


@pytest.mark.parametrize("reduction,weighted,masked", CASES)
def test_uneven_slices_add_up_to_the_global_batch(reduction, weighted, masked):
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=reduction)
    slices = [slice(0, 1), slice(1, 4), slice(4, 6)]  # replicas of different sizes
    expected = _keras_value(loss, slice(None), weighted, masked)
    assert _global_value(GlobalLoss(loss), slices, weighted, masked) == pytest.approx(
        expected, rel=1e-6)
    if masked and reduction != "sum":
        # The per-replica average that Keras computes under a strategy is off here.
        naive = np.mean([_keras_value(loss, s, weighted, masked) for s in slices])
        assert abs(naive - expected) > 1e-3


def test_names_and_functions_are_wrapped():
    y, p = tf.constant([[1.0], [2.0]]), tf.constant([[1.5], [1.0]])
    for loss in ("mse", keras.losses.mean_squared_error,
                 lambda t, q: keras.ops.mean(keras.ops.square(t - q), axis=-1)):
        n, c = GlobalLoss(loss).local_terms(y, p)
        assert float(n / c) == pytest.approx(0.625)


def test_self_reducing_loss_counts_one_per_replica():
    loss = lambda t, q: keras.ops.mean(keras.ops.square(t - q))  # noqa: E731 - returns a scalar
    n, c = GlobalLoss(loss).local_terms(tf.constant([1.0, 2.0]), tf.constant([2.0, 2.0]))
    assert (float(n), float(c)) == (0.5, 1.0)


@pytest.mark.parametrize("bad", [None, "none"])
def test_unreduced_loss_is_refused(bad):
    with pytest.raises(ValueError, match="reduction=.*Allowed reductions"):
        GlobalLoss(keras.losses.MeanSquaredError(reduction=bad))


def test_missing_or_unusable_loss_is_refused():
    with pytest.raises(ValueError, match="A loss is required"):
        GlobalLoss(None)
    with pytest.raises(ValueError, match="Cannot use 3"):
        GlobalLoss(3)
    with pytest.raises(ValueError):
        GlobalLoss("no_such_loss")


@pytest.mark.parametrize("jit_compile", [True, False])
def test_bfloat16_logits_reach_the_masked_loss_uncast_with_the_same_bits(jit_compile):
    """The engine hands bfloat16 logits to tfdist's masked cross-entropy as they are
    (it casts them inside its compiled kernel): no float32 copy of the logits in the
    step's graph, and the value and gradient of the cast-first path to the bit."""
    from tfdist.models.losses import MaskedSparseCategoricalCrossentropy

    loss = MaskedSparseCategoricalCrossentropy(jit_compile=jit_compile)
    y_true = tf.constant(np.where(MASK, Y_TRUE, 0).astype("int32"))
    logits = tf.constant(LOGITS * 3, tf.bfloat16)

    def terms(cast_first):
        with tf.GradientTape() as tape:
            tape.watch(logits)
            given = tf.cast(logits, tf.float32) if cast_first else logits
            numerator, count = GlobalLoss(loss).local_terms(y_true, given)
            value = numerator / count
        return value, tape.gradient(value, logits)

    value, gradient = tf.function(lambda: terms(False))()
    expected, expected_gradient = tf.function(lambda: terms(True))()
    assert gradient.dtype == tf.bfloat16
    assert float(value) == float(expected)
    np.testing.assert_array_equal(gradient.numpy().astype("float32"),
                                  expected_gradient.numpy().astype("float32"))
    graph = tf.function(
        lambda: GlobalLoss(loss).local_terms(y_true, logits)).get_concrete_function().graph
    float32_copies = [op.name for op in graph.get_operations() if op.type == "Cast"
                      and op.outputs[0].dtype == tf.float32
                      and op.outputs[0].shape == logits.shape]
    if jit_compile:  # the cast is inside the compiled kernel
        assert float32_copies == []
    else:  # the plain kernel casts once, in the step's own graph
        assert len(float32_copies) == 1, float32_copies
    # Keras's own losses keep Keras's rule: predictions are cast to the loss's dtype first.
    graph = tf.function(lambda: GlobalLoss(keras.losses.SparseCategoricalCrossentropy(
        from_logits=True)).local_terms(y_true, logits)).get_concrete_function().graph
    assert any(op.type == "Cast" and op.outputs[0].dtype == tf.float32
               and op.outputs[0].shape == logits.shape for op in graph.get_operations())


def test_tfdist_masked_token_loss_gives_its_sum_and_count():
    from tfdist.models.losses import MaskedSparseCategoricalCrossentropy

    loss = MaskedSparseCategoricalCrossentropy()
    y_true = np.where(MASK, Y_TRUE, 0).astype("int32")  # 0 = padding target
    for rows in (slice(0, 1), slice(1, 4), slice(None)):
        n, c = GlobalLoss(loss).local_terms(tf.constant(y_true[rows]), tf.constant(LOGITS[rows]))
        expected_sum, expected_count = loss.sum_and_count(y_true[rows], LOGITS[rows])
        assert float(n) == pytest.approx(float(expected_sum), rel=1e-6)
        assert float(c) == float(expected_count)
