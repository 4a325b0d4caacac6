"""ShardedEmbedding: one table split by rows, looked up and differentiated exactly
as `keras.layers.Embedding` on the concatenated table."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from tfdist.models import ShardedEmbedding, TokenAndPositionEmbedding


def test_rows_follow_div_partitioning():
    assert ShardedEmbedding(10, 4, num_shards=3).shard_rows() == [4, 3, 3]
    assert ShardedEmbedding(9, 4, num_shards=3).shard_rows() == [3, 3, 3]


@pytest.mark.parametrize("shards", [1, 3, 4])
def test_lookup_and_gradient_equal_a_plain_embedding(shards):
    layer = ShardedEmbedding(11, 5, num_shards=shards)
    layer.build()
    plain = keras.layers.Embedding(11, 5)
    plain.build()
    plain.embeddings.assign(np.concatenate([w.numpy() for w in layer.shards]))
    ids = np.array([[0, 3, 10, 10], [4, 5, 6, 7]], "int32")
    weights = tf.constant(np.random.RandomState(0).randn(2, 4, 5), tf.float32)
    with tf.GradientTape(persistent=True) as tape:
        sharded_out = layer(ids)
        plain_out = plain(ids)
        sharded_loss = tf.reduce_sum(sharded_out * weights)
        plain_loss = tf.reduce_sum(plain_out * weights)
    np.testing.assert_allclose(sharded_out, plain_out, rtol=0, atol=0)
    sharded_grads = tape.gradient(sharded_loss, [w.value for w in layer.shards])
    plain_grad = tf.convert_to_tensor(tape.gradient(plain_loss, plain.embeddings.value))
    dense = tf.concat([tf.convert_to_tensor(g) if g is not None else
                       tf.zeros(w.shape)
                       for g, w in zip(sharded_grads, layer.shards, strict=True)], axis=0)
    np.testing.assert_allclose(dense, plain_grad, rtol=1e-6, atol=1e-6)


def test_mixed_precision_output_and_float32_table(mixed_bfloat16):
    layer = ShardedEmbedding(8, 4, num_shards=2)
    out = layer(np.array([[1, 7]], "int32"))
    assert out.dtype == "bfloat16" and all(w.dtype == "float32" for w in layer.shards)


def test_bad_arguments_name_the_value():
    with pytest.raises(ValueError, match="num_shards=5 is more than the 4 rows"):
        ShardedEmbedding(4, 2, num_shards=5)
    with pytest.raises(ValueError, match="num_shards must be an integer >= 1, got 0"):
        ShardedEmbedding(4, 2, num_shards=0)


def test_token_embedding_shards_round_trip_through_the_config():
    layer = TokenAndPositionEmbedding(20, 8, 16, embedding_shards=2)
    out = layer(np.ones((2, 5), "int32"))
    assert tuple(out.shape) == (2, 5, 16)
    assert [tuple(w.shape) for w in layer.token_embedding.shards] == [(10, 16), (10, 16)]
    clone = TokenAndPositionEmbedding.from_config(layer.get_config())
    assert clone.embedding_shards == 2
