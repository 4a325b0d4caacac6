"""The output projection split by vocabulary, and a cross-entropy that reads its logits shard by
shard (`tfdist.training.tensor_parallel.vocab_loss`), on the session's 2 logical CPUs."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from tfdist.models import MaskedSparseCategoricalCrossentropy, decoder_lm_layout_map
from tfdist.training import Trainer
from tfdist.training.tensor_parallel.layers import ShardedDense, attach_pieces, pieces_of
from tfdist.training.tensor_parallel.layout import plan_shards
from tfdist.training.tensor_parallel.split import shard_devices, split_model
from tfdist.training.tensor_parallel.vocab_loss import VocabParallelCrossEntropy
from helpers.workers import model_parallel_common as common

VOCAB = common.VOCAB


def vocabulary_layout(vocab_size=None):
    mesh = keras.distribution.DeviceMesh((2,), ["model"], devices=["cpu:0", "cpu:1"])
    return decoder_lm_layout_map(mesh, vocab_size=vocab_size)


def test_the_shipped_layout_splits_the_output_projection_when_the_vocabulary_divides():
    assert vocabulary_layout()["lm_head/kernel"].axes == (None, "model")
    assert vocabulary_layout(24)["lm_head/bias"].axes == ("model",)
    assert vocabulary_layout(25)["lm_head/kernel"] is None  # 25 words on 2 devices: replicated
    assert vocabulary_layout(25)["block_0/ffn_in/kernel"].axes == (None, "model")


def one_device_and_split():
    """The tiny decoder LM trained for an epoch on one device and split by the shipped layout
    (embedding and output projection by vocabulary): `((model, history), (split model's source,
    history), trainer, tokens, targets)`."""
    tokens, targets = common.token_arrays(n=24)
    data = common.dataset((tokens, targets), 8)
    one_model = common.transformer(tf.distribute.get_strategy())
    one = Trainer(one_model).fit(data, epochs=1, verbose=0).history
    two_model = common.transformer(tf.distribute.get_strategy())
    trainer = Trainer(two_model, tensor_parallel=2, layout_map=vocabulary_layout())
    two = trainer.fit(data, epochs=1, verbose=0).history
    return (one_model, one), (two_model, two), trainer, tokens, targets


@pytest.mark.parametrize("loss", [
    MaskedSparseCategoricalCrossentropy(),
    MaskedSparseCategoricalCrossentropy(label_smoothing=0.1, jit_compile=False),
    keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    keras.losses.SparseCategoricalCrossentropy(from_logits=True, ignore_class=0),
], ids=["masked", "masked-smoothed", "keras", "keras-ignore-class"])
def test_the_loss_from_vocabulary_slices_equals_the_loss_of_the_whole_logits(loss):
    rng = np.random.default_rng(0)
    logits = tf.constant(3 * rng.normal(size=(4, 5, VOCAB)), tf.float32)
    labels = tf.constant(rng.integers(0, VOCAB, size=(4, 5)), tf.int32)  # some are pads (0)
    parallel = VocabParallelCrossEntropy(loss)

    @tf.function
    def both(logits):
        with tf.GradientTape(persistent=True) as tape:
            tape.watch(logits)
            with tf.device("/cpu:0"):
                low = tf.identity(logits[..., :VOCAB // 2])
            with tf.device("/cpu:1"):
                high = tf.identity(logits[..., VOCAB // 2:])
            with tf.device("/cpu:0"):
                whole = tf.concat([low, high], axis=-1)
            attach_pieces(whole, (low, high))
            ours, theirs = parallel(labels, whole), loss(labels, whole)
        return ours, theirs, tape.gradient(ours, logits), tape.gradient(theirs, logits)

    ours, theirs, our_gradient, their_gradient = both(logits)
    assert float(theirs) > 0
    np.testing.assert_allclose(ours, theirs, rtol=1e-6)
    np.testing.assert_allclose(our_gradient, their_gradient, rtol=1e-5, atol=1e-7)


def test_an_lm_split_by_vocabulary_trains_like_one_device_and_its_loss_never_gathers():
    (one_model, one), (two_model, two), trainer, tokens, targets = one_device_and_split()
    head = trainer.model.get_layer("lm_head")
    assert isinstance(head, ShardedDense) and head.style == "column"
    assert [k.shape for k in head.kernels] == [(32, VOCAB // 2)] * 2
    assert isinstance(trainer.model.loss, VocabParallelCrossEntropy)
    for name in ("loss", "accuracy"):
        np.testing.assert_allclose(two[name], one[name], rtol=1e-5, err_msg=name)
    for a, b in zip(two_model.get_weights(), one_model.get_weights(), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)

    # What the loss (and its gradient) reads: the slices, never the gathered logits.
    split = trainer.model

    def ancestors(tensor):
        seen, todo = set(), [tensor.op]
        while todo:
            op = todo.pop()
            if op.name not in seen:
                seen.add(op.name)
                todo += [t.op for t in op.inputs] + list(op.control_inputs)
        return seen

    @tf.function
    def reads(x, y, loss):
        logits = split(x)
        with tf.GradientTape() as tape:
            value = loss(y, split(x))
        grads = tape.gradient(value, split.trainable_variables)
        read = ancestors(value) | set().union(*(ancestors(g) for g in grads if g is not None))
        return logits.op.name in read or any("lm_head" in name and "concat" in name.lower()
                                              for name in read)

    x, y = tokens[:8], targets[:8]
    assert not reads(x, y, split.loss)
    assert reads(x, y, split.loss.wrapped)  # the plain loss reads the gathered logits


def test_a_loss_it_cannot_read_by_slices_is_left_as_compiled():
    model = common.transformer(tf.distribute.get_strategy())
    model.compile(keras.optimizers.SGD(0.1), "mse")
    plan = plan_shards(model, vocabulary_layout(), 2).with_devices(shard_devices(2))
    from tfdist.training.tensor_parallel.split import compile_like

    split = split_model(model, plan)
    compile_like(split, model)
    assert not isinstance(split.loss, VocabParallelCrossEntropy)


def test_under_mixed_bfloat16_the_float32_logits_keep_their_slices(mixed_bfloat16):
    from tfdist.training.tensor_parallel.vocab_loss import SliceKeepingLinear

    (one_model, one), (two_model, two), trainer, tokens, targets = one_device_and_split()
    np.testing.assert_allclose(two["loss"], one["loss"], rtol=0.03)  # the repo's bf16 margin
    split = trainer.model
    assert isinstance(split.get_layer("logits"), SliceKeepingLinear)

    seen = {}

    @tf.function
    def slices(x):
        logits = split(x)
        pieces = pieces_of(logits)
        seen.update(dtype=logits.dtype, dtypes=[p.dtype for p in pieces],
                    devices=[p.device[-5:] for p in pieces])
        return logits

    slices(tokens[:8])
    assert seen == {"dtype": tf.float32, "dtypes": [tf.float32] * 2,
                    "devices": ["CPU:0", "CPU:1"]}


def test_the_embedding_split_by_rows_looks_up_and_learns_like_the_whole_table():
    from tfdist.training.tensor_parallel.embedding import VocabParallelEmbedding

    keras.utils.set_random_seed(4)
    whole = keras.layers.Embedding(VOCAB, 6, mask_zero=True)
    whole.build((None, 5))
    split = VocabParallelEmbedding.from_embedding(whole, shard_devices(2))
    split.build((None, 5))
    split.load_from(whole)
    assert [t.value.device[-5:] for t in split.tables] == ["CPU:0", "CPU:1"]
    assert [t.shape for t in split.tables] == [(VOCAB // 2, 6)] * 2
    ids = tf.constant(np.random.default_rng(1).integers(0, VOCAB, size=(3, 5)), tf.int32)
    upstream = tf.constant(np.random.default_rng(2).normal(size=(3, 5, 6)), tf.float32)

    def lookup(layer, variables):
        with tf.GradientTape() as tape:
            out = layer(ids)
            value = tf.reduce_sum(out * upstream)
        return out, [tf.convert_to_tensor(g) for g in tape.gradient(value, variables)]

    ours, our_grads = lookup(split, split.tables)
    theirs, (their_grad,) = lookup(whole, [whole.embeddings])
    np.testing.assert_allclose(ours, theirs, rtol=0, atol=0)
    np.testing.assert_array_equal(split.compute_mask(ids), whole.compute_mask(ids))
    np.testing.assert_allclose(np.concatenate(our_grads), their_grad, rtol=1e-6, atol=1e-7)
    fresh = keras.layers.Embedding(VOCAB, 6)
    fresh.build((None, 5))
    split.gather_into(fresh)
    np.testing.assert_array_equal(fresh.embeddings, whole.embeddings)


@pytest.mark.parametrize("axes,words", [
    ((None, "model"), "by vocabulary only"),
    (("model", None), "does not divide by 2 devices"),
])
def test_an_embedding_the_split_cannot_do_is_refused_by_name(axes, words):
    from tfdist.training.tensor_parallel.layout import ShardLayoutError

    rows = VOCAB + (1 if axes == ("model", None) else 0)
    inputs = keras.Input((4,), dtype="int32")
    model = keras.Model(inputs, keras.layers.Dense(3, name="head")(
        keras.layers.Embedding(rows, 8, name="tokens")(inputs)))
    mesh = keras.distribution.DeviceMesh((2,), ["model"], devices=["cpu:0", "cpu:1"])
    layout_map = keras.distribution.LayoutMap(mesh)
    layout_map["tokens/embeddings"] = axes
    with pytest.raises(ShardLayoutError, match=words) as raised:
        plan_shards(model, layout_map, 2)
    assert "'tokens'" in str(raised.value)
