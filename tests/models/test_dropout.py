"""tfdist's dropout (tfdist.models.dropout): Keras's `Dropout` with a keep mask drawn
from 16 random bits per element, in the Transformers' layers and attention."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from tfdist import seam
from tfdist.callbacks.backup.random_state import random_seed_states
from tfdist.models.dropout import LEVELS, BitsDropout, keep_threshold, use_bits_dropout
from tfdist.models.layers import DecoderBlock, TokenAndPositionEmbedding
from tfdist.models.seq2seq import CrossAttentionDecoderBlock, EncoderBlock


def test_the_threshold_is_the_rate_in_65536ths_and_never_drops_everything():
    assert keep_threshold(0.1) == 6554
    assert keep_threshold(0.5) == 32768
    assert keep_threshold(0.0) == 0
    assert keep_threshold(1 - 1e-9) == LEVELS - 1


@pytest.mark.parametrize("rate", [0.1, 0.5, 0.9])
def test_it_drops_at_the_rate_and_scales_the_rest_to_keep_the_mean(rate):
    x = tf.random.uniform([1000, 1000], 1.0, 2.0, seed=1)
    y = BitsDropout(rate, seed=3)(x, training=True).numpy()
    x = x.numpy()
    kept = y != 0
    keep = 1 - keep_threshold(rate) / LEVELS
    # 1e6 Bernoulli draws: the kept share is within 5 standard deviations of its probability.
    assert abs(kept.mean() - keep) < 5 * np.sqrt(keep * (1 - keep) / kept.size)
    scale = np.float32(LEVELS / (LEVELS - keep_threshold(rate)))
    np.testing.assert_array_equal(y[kept], x[kept] * scale)
    assert abs(scale * keep - 1) < 1e-6  # the expected output is the input


def test_the_same_seed_gives_the_same_masks_and_each_call_new_ones():
    x = tf.ones([64, 64])
    first, second = BitsDropout(0.5, seed=7), BitsDropout(0.5, seed=7)
    a1, a2 = first(x, training=True), first(x, training=True)
    b1, b2 = second(x, training=True), second(x, training=True)
    np.testing.assert_array_equal(a1, b1)
    np.testing.assert_array_equal(a2, b2)
    assert (a1.numpy() != a2.numpy()).mean() > 0.3  # about half the elements differ
    other = BitsDropout(0.5, seed=8)(x, training=True)
    assert (a1.numpy() != other.numpy()).mean() > 0.3


def test_outside_training_and_at_rate_zero_it_returns_the_input():
    x = tf.random.normal([4, 5])
    np.testing.assert_array_equal(BitsDropout(0.5)(x, training=False), x)
    np.testing.assert_array_equal(BitsDropout(0.5)(x), x)
    np.testing.assert_array_equal(BitsDropout(0.0)(x, training=True), x)
    np.testing.assert_array_equal(BitsDropout(1.0)(x, training=True), tf.zeros_like(x))


def test_it_keeps_the_dtype_of_a_bfloat16_policy():
    layer = BitsDropout(0.2, dtype="mixed_bfloat16")
    y = layer(tf.ones([8, 8]), training=True)
    assert y.dtype == tf.bfloat16
    assert set(np.unique(y.numpy().astype("float32"))) <= {0.0, float(tf.cast(
        LEVELS / (LEVELS - keep_threshold(0.2)), tf.bfloat16))}


def test_a_noise_shape_shares_one_mask_along_its_size_one_axes():
    x = tf.ones([3, 50, 4])
    y = BitsDropout(0.5, noise_shape=(None, 1, 4), seed=2)(x, training=True).numpy()
    for row in range(3):
        assert (y[row] == y[row, :1]).all()  # the same mask at every position of axis 1
    assert 0 < (y == 0).sum() < y.size


def test_the_gradient_is_the_mask_times_the_scale():
    layer = BitsDropout(0.4, seed=9)
    x = tf.random.normal([32, 16])
    upstream = tf.random.normal([32, 16])
    state = layer.seed_generator.state.numpy()
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = layer(x, training=True)
    gradient = tape.gradient(y, x, output_gradients=upstream).numpy()
    layer.seed_generator.state.assign(state)
    mask = layer(tf.ones_like(x), training=True).numpy()  # the same draw: 0 or the scale
    np.testing.assert_array_equal(gradient, upstream.numpy() * mask)


def test_xla_draws_the_same_masks():
    eager, compiled = BitsDropout(0.3, seed=5), BitsDropout(0.3, seed=5)
    x = tf.ones([64, 33], tf.float32)
    jit = tf.function(lambda x: compiled(x, training=True), jit_compile=True)
    for _ in range(2):
        np.testing.assert_array_equal(eager(x, training=True), jit(x))


def test_a_keras_dropout_backup_restores_into_it_and_it_serialises(tmp_path):
    def model(dropout):
        return keras.Sequential([keras.Input((2,)), dropout, keras.layers.Dense(1)])

    theirs = model(keras.layers.Dropout(0.1, seed=4))
    for _ in range(3):
        theirs(tf.ones([2, 2]), training=True)  # the generator moves on
    path = tf.train.Checkpoint(random_seeds=random_seed_states(theirs)).write(
        str(tmp_path / "ckpt"))  # as BackupAndResume saves them
    ours = model(BitsDropout(0.1, seed=11))
    tf.train.Checkpoint(random_seeds=random_seed_states(ours)).read(path).assert_consumed()
    np.testing.assert_array_equal(ours.layers[0].seed_generator.state,
                                  theirs.layers[0].seed_generator.state)

    layer = ours.layers[0]
    again = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(layer))
    assert type(again) is BitsDropout and again.get_config() == layer.get_config()


def test_the_transformers_drop_with_it_everywhere():
    block = DecoderBlock(d_model=16, num_heads=2, d_ff=32, dropout=0.1)
    block(np.zeros((2, 5, 16), "float32"))
    assert isinstance(seam.attention_dropout_layer(block.attention), BitsDropout)
    assert isinstance(block.attention_dropout, BitsDropout)
    assert isinstance(block.ffn_dropout, BitsDropout)
    embedding = TokenAndPositionEmbedding(vocab_size=10, max_len=8, d_model=16, dropout=0.1)
    assert isinstance(embedding.dropout_layer, BitsDropout)

    encoder = EncoderBlock(d_model=16, num_heads=2, d_ff=32, dropout=0.1)
    encoder(np.zeros((2, 5, 16), "float32"))
    decoder = CrossAttentionDecoderBlock(d_model=16, num_heads=2, d_ff=32, dropout=0.1)
    decoder(np.zeros((2, 4, 16), "float32"), np.zeros((2, 5, 16), "float32"))
    for attention in (encoder.self_attention, decoder.self_attention, decoder.cross_attention):
        assert isinstance(seam.attention_dropout_layer(attention), BitsDropout)
        assert seam.attention_dropout_layer(attention).rate == 0.1
    assert isinstance(decoder.residual_dropout, BitsDropout)


def test_use_bits_dropout_keeps_the_rate_and_seed_and_runs_once():
    attention = keras.layers.MultiHeadAttention(2, 4, dropout=0.25, seed=3)
    attention.build((2, 3, 8), (2, 3, 8))
    count = len(attention.variables)
    use_bits_dropout(attention)
    first = seam.attention_dropout_layer(attention)
    assert isinstance(first, BitsDropout) and (first.rate, first.seed) == (0.25, 3)
    use_bits_dropout(attention)
    assert seam.attention_dropout_layer(attention) is first
    assert len(attention.variables) == count
    dense = keras.layers.Dense(2)  # not a MultiHeadAttention (a split one, say): left alone
    use_bits_dropout(dense)
    assert dense.get_config() == keras.layers.Dense(2, name=dense.name).get_config()
