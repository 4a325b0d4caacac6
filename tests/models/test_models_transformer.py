"""Tests of tfdist.models: the Transformer decoder LM, its config, its masked
loss and accuracy, and its FLOP count."""

import math

import keras
import numpy as np
import pytest
import tensorflow as tf

from tfdist.models import (TRANSFORMER_SIZES, MaskedAccuracy, MaskedSparseCategoricalCrossentropy,
                           TransformerConfig, build_decoder_lm, decoder_lm_flops_per_token,
                           decoder_lm_matmul_params, decoder_lm_param_count, transformer_config)
from tfdist.distribute.strategy_factory import create_strategy

BOS, SEP, EOS = 1, 2, 3


def micro_config(**overrides):
    """A very small decoder for fast structural tests."""
    values = dict(vocab_size=12, max_len=10, num_layers=2, d_model=16, num_heads=2,
                  d_ff=32)
    values.update(overrides)
    return TransformerConfig(**values)


# ---------------------------------------------------------------- config


def test_named_sizes_have_the_documented_dimensions():
    assert list(TRANSFORMER_SIZES) == ["tiny", "small", "base", "large"]
    small = transformer_config("small", vocab_size=8000, max_len=128)
    assert (small.num_layers, small.d_model, small.num_heads, small.d_ff) == (4, 256, 8, 1024)
    base = transformer_config("base", vocab_size=100, max_len=64)
    assert (base.num_layers, base.d_model, base.num_heads, base.d_ff) == (6, 512, 8, 2048)
    tiny = transformer_config("tiny", 64, 40, dropout=0.25)
    assert tiny.dropout == 0.25 and tiny.vocab_size == 64 and tiny.max_len == 40
    # The benchmark decoder (transformer_small, README Performance) has 7.3 M parameters.
    assert decoder_lm_param_count(small) == 7_296_320


def test_unknown_size_and_field_raise_listing_the_choices():
    with pytest.raises(ValueError, match="'huge'.*tiny.*small.*base.*large"):
        transformer_config("huge", 64, 40)
    with pytest.raises(ValueError, match="d_modle.*d_model"):
        transformer_config("tiny", 64, 40, d_modle=64)


@pytest.mark.parametrize("overrides, message", [
    (dict(d_model=100, num_heads=8), r"d_model=100 is not divisible by num_heads=8.*\[1, 2, 4, 5"),
    (dict(num_layers=0), r"num_layers must be an integer >= 1, got 0"),
    (dict(d_model=64.0), r"d_model must be an integer >= 1, got 64.0"),
    (dict(num_heads=True), r"num_heads must be an integer >= 1, got True"),
    (dict(vocab_size=1), r"vocab_size must be >= 2"),
    (dict(dropout=1.0), r"dropout must be a finite number in \[0, 1\), got 1.0"),
    (dict(position_embedding="rotary"), r"'rotary'.*\['learned', 'sinusoidal'\]"),
    (dict(layer_norm_epsilon=0.0), r"layer_norm_epsilon must be a finite number > 0, got 0.0"),
    (dict(layer_norm_epsilon=float("inf")), r"layer_norm_epsilon must be a finite number > 0, got inf"),
    (dict(pad_id=12), r"pad_id must be an integer in \[0, vocab_size=12\), got 12"),
])
def test_bad_config_values_raise_teaching_errors(overrides, message):
    with pytest.raises(ValueError, match=message):
        micro_config(**overrides)


def test_padding_mask_names_a_pad_id_that_is_not_a_token_id():
    """It was Python's `invalid literal for int()` for a string."""
    from tfdist.models import PaddingMask

    assert PaddingMask(pad_id=np.int64(3))(np.array([[3, 4]])).numpy().tolist() == [[False, True]]
    for pad_id, shown in (("a", "'a'"), (-1, "-1"), (1.5, "1.5")):
        with pytest.raises(ValueError, match=rf"^pad_id must be an integer >= 0, got {shown}\.$"):
            PaddingMask(pad_id=pad_id)


def test_build_rejects_a_non_config_and_too_long_sequences():
    with pytest.raises(TypeError, match="TransformerConfig, got dict"):
        build_decoder_lm({"vocab_size": 12})
    model = build_decoder_lm(micro_config())
    with pytest.raises(ValueError, match="length 11 .* max_len=10"):
        model(np.ones((1, 11), "int32"))


# ---------------------------------------------------------------- model


@pytest.mark.parametrize("position_embedding", ["learned", "sinusoidal"])
def test_param_count_matches_the_built_model(position_embedding):
    config = micro_config(position_embedding=position_embedding)
    model = build_decoder_lm(config)
    assert model.count_params() == decoder_lm_param_count(config)


def test_float32_logits_and_variables_under_mixed_bfloat16(mixed_bfloat16):
    config = micro_config()
    model = build_decoder_lm(config)
    ids = np.random.default_rng(0).integers(1, 12, (3, 7)).astype("int32")
    logits = model(ids)
    assert tuple(logits.shape) == (3, 7, 12)
    assert logits.dtype == tf.float32
    assert model.get_layer("lm_head").compute_dtype == "bfloat16"
    assert model.get_layer("block_0").compute_dtype == "bfloat16"
    assert model.get_layer("logits").compute_dtype == "float32"
    assert {v.dtype for v in model.weights} == {"float32"}
    model.compile(keras.optimizers.SGD(0.1), loss=MaskedSparseCategoricalCrossentropy(),
                  metrics=[MaskedAccuracy()])
    before = model.get_layer("lm_head").kernel.numpy().copy()
    logs = model.train_on_batch(ids, ids, return_dict=True)
    assert np.isfinite(logs["loss"]) and logs["loss"] > 0
    assert not np.allclose(before, model.get_layer("lm_head").kernel.numpy())


def test_logits_are_causal():
    model = build_decoder_lm(micro_config())
    rng = np.random.default_rng(1)
    ids = rng.integers(4, 12, (2, 10)).astype("int32")
    t = 4
    changed = ids.copy()
    changed[:, t + 1:] = rng.integers(4, 12, (2, 10 - t - 1))
    changed[:, t + 1] = np.where(ids[:, t + 1] == 4, 5, 4)  # surely different
    a, b = model(ids).numpy(), model(changed).numpy()
    np.testing.assert_allclose(a[:, :t + 1], b[:, :t + 1], atol=1e-5)
    assert np.abs(a[:, t + 1:] - b[:, t + 1:]).max() > 1e-3


def test_pad_keys_are_not_attended_and_left_padding_is_finite():
    model = build_decoder_lm(micro_config())
    ids = np.array([[0, 0, 0, 5, 6, 7, 8], [0, 4, 9, 10, 11, 5, 0]], "int32")
    before = model(ids).numpy()
    assert np.isfinite(before).all()
    # Change what a pad token looks like: real tokens must not notice.
    embedding = model.get_layer("embedding").token_embedding.embeddings
    table = embedding.numpy()
    table[0] = np.random.default_rng(2).normal(0, 3, table.shape[1])
    embedding.assign(table)
    after = model(ids).numpy()
    real = ids != 0
    np.testing.assert_allclose(before[real], after[real], atol=1e-5)
    assert np.abs(before[~real] - after[~real]).max() > 1e-3


@pytest.mark.parametrize("position_embedding", ["learned", "sinusoidal"])
def test_save_and_load_round_trip(tmp_path, position_embedding):
    model = build_decoder_lm(micro_config(position_embedding=position_embedding,
                                          dropout=0.1))
    model.compile("adam", loss=MaskedSparseCategoricalCrossentropy(pad_id=0),
                  metrics=[MaskedAccuracy()])
    ids = np.random.default_rng(3).integers(0, 12, (2, 10)).astype("int32")
    path = tmp_path / "decoder.keras"
    model.save(path)
    loaded = keras.saving.load_model(path)
    np.testing.assert_array_equal(model(ids).numpy(), loaded(ids).numpy())
    assert isinstance(loaded.loss, MaskedSparseCategoricalCrossentropy)
    assert loaded.get_layer("block_1").get_config()["dropout"] == 0.1


# ---------------------------------------------------------------- loss and metric


def _numpy_masked_ce(targets, logits, pad_id=0):
    shifted = logits - logits.max(-1, keepdims=True)
    log_probs = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
    token_ce = -np.take_along_axis(log_probs, targets[..., None], -1)[..., 0]
    mask = targets != pad_id
    return token_ce * mask, mask


def _batch_with_padding(seed, batch=4, seq=7, vocab=11):
    rng = np.random.default_rng(seed)
    logits = rng.normal(0, 2, (batch, seq, vocab)).astype("float32")
    targets = rng.integers(4, vocab, (batch, seq)).astype("int32")
    lengths = [seq, 3, 0, 5][:batch]
    for row, length in enumerate(lengths):
        targets[row, length:] = 0
    return targets, logits


def test_loss_ignores_padding_like_numpy():
    targets, logits = _batch_with_padding(4)
    token_ce, mask = _numpy_masked_ce(targets, logits)
    expected_mean = token_ce.sum() / mask.sum()

    loss = MaskedSparseCategoricalCrossentropy()
    np.testing.assert_allclose(float(loss(targets, logits)), expected_mean, rtol=1e-5)
    total = MaskedSparseCategoricalCrossentropy(reduction="sum")(targets, logits)
    np.testing.assert_allclose(float(total), token_ce.sum(), rtol=1e-5)
    per_token = MaskedSparseCategoricalCrossentropy(reduction=None)(targets, logits)
    np.testing.assert_allclose(np.asarray(per_token), token_ce, rtol=1e-5, atol=1e-6)
    loss_sum, count = loss.sum_and_count(targets, logits)
    np.testing.assert_allclose(float(loss_sum), token_ce.sum(), rtol=1e-5)
    assert float(count) == mask.sum() == float(loss.count_tokens(targets))
    # The pads matter: counting them gives a different value.
    unmasked = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    assert abs(float(unmasked(targets, logits)) - expected_mean) > 1e-2


def _loss_and_gradient(loss, targets, logits):
    logits = tf.constant(logits)
    with tf.GradientTape() as tape:
        tape.watch(logits)
        value = loss(targets, logits)
    return float(value), tape.gradient(value, logits).numpy()


def test_the_compiled_loss_agrees_with_keras_ignore_class_and_pads_get_no_gradient():
    targets, logits = _batch_with_padding(6)
    logits = (logits * 4).astype("float32")
    keras_own = keras.losses.SparseCategoricalCrossentropy(from_logits=True, ignore_class=0)
    expected, expected_grad = _loss_and_gradient(keras_own, targets, logits)
    for jit_compile in (True, False):
        loss = MaskedSparseCategoricalCrossentropy(jit_compile=jit_compile)
        value, grad = _loss_and_gradient(loss, targets, logits)
        np.testing.assert_allclose(value, expected, rtol=1e-6)
        np.testing.assert_allclose(grad, expected_grad, rtol=1e-5, atol=1e-7)
        assert not grad[targets == 0].any()  # exactly 0 at every pad target
        assert grad[targets != 0].any()
    restored = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(
        MaskedSparseCategoricalCrossentropy(jit_compile=False)))
    assert restored.jit_compile is False


def test_accuracy_counts_the_first_highest_score_like_keras():
    targets, logits = _batch_with_padding(7)
    logits[0, 0, :] = 1.0  # a tie: the first index wins, as in Keras
    targets[0, 0] = 1  # a real token whose score ties with index 0: counted wrong
    mine = MaskedAccuracy()
    mine.update_state(targets, logits)
    keras_own = keras.metrics.SparseCategoricalAccuracy()
    keras_own.update_state(targets, logits, sample_weight=(targets != 0).astype("float32"))
    assert float(mine.result()) == pytest.approx(float(keras_own.result()), abs=1e-7)


def test_loss_with_sample_weight_and_all_pad_batch():
    targets, logits = _batch_with_padding(5)
    token_ce, mask = _numpy_masked_ce(targets, logits)
    weights = np.array([1.0, 0.5, 2.0, 0.0], "float32")
    loss = MaskedSparseCategoricalCrossentropy()
    loss_sum, count = loss.sum_and_count(targets, logits, sample_weight=weights)
    np.testing.assert_allclose(float(loss_sum), (token_ce * weights[:, None]).sum(), rtol=1e-5)
    np.testing.assert_allclose(float(count), (mask * weights[:, None]).sum())
    empty = np.zeros_like(targets)
    assert float(loss(empty, logits)) == 0.0


def test_loss_and_metric_serialise_and_validate():
    loss = MaskedSparseCategoricalCrossentropy(pad_id=3, from_logits=False, reduction="sum")
    restored = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(loss))
    assert isinstance(restored, MaskedSparseCategoricalCrossentropy)
    assert (restored.pad_id, restored.from_logits, restored.reduction) == (3, False, "sum")
    metric = MaskedAccuracy(pad_id=2, name="acc")
    restored = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(metric))
    assert isinstance(restored, MaskedAccuracy) and (restored.pad_id, restored.name) == (2, "acc")
    with pytest.raises(ValueError, match="pad_id must be .* got -1"):
        MaskedSparseCategoricalCrossentropy(pad_id=-1)
    with pytest.raises(ValueError, match="pad_id must be .* got 'pad'"):
        MaskedAccuracy(pad_id="pad")


def test_accuracy_counts_only_non_pad_tokens():
    metric = MaskedAccuracy()
    correct = total = 0
    for seed in (6, 7):
        targets, logits = _batch_with_padding(seed)
        predicted = logits.argmax(-1)
        predicted[:, ::2] = targets[:, ::2]  # make about half the tokens right
        logits = np.eye(11, dtype="float32")[predicted] * 5.0
        mask = targets != 0
        correct += ((predicted == targets) & mask).sum()
        total += mask.sum()
        metric.update_state(targets, logits)
    expected = correct / total
    np.testing.assert_allclose(float(metric.result()), expected, rtol=1e-6)
    # Counting pads (which are never predicted here) would give a lower value.
    assert expected > correct / (2 * 4 * 7) + 0.1
    metric.reset_state()
    assert float(metric.result()) == 0.0


def test_global_mean_on_two_replicas_equals_one_device():
    strategy = create_strategy("mirrored", devices=["/cpu:0", "/cpu:1"])
    targets, logits = _batch_with_padding(8)  # rows hold 7, 3, 0 and 5 real tokens
    single = float(MaskedSparseCategoricalCrossentropy()(targets, logits))

    with strategy.scope():
        loss = MaskedSparseCategoricalCrossentropy()
        metric = MaskedAccuracy()

    def shard(context):
        rows = slice(2 * context.replica_id_in_sync_group, 2 * context.replica_id_in_sync_group + 2)
        return tf.constant(targets[rows]), tf.constant(logits[rows])

    per_replica = strategy.experimental_distribute_values_from_function(shard)

    @tf.function
    def step(batch):
        y, pred = batch
        loss_sum, count = loss.sum_and_count(y, pred)
        global_count = tf.distribute.get_replica_context().all_reduce("sum", count)
        metric.update_state(y, pred)
        return loss_sum / global_count, loss(y, pred)

    exact, keras_default = strategy.run(step, args=(per_replica,))
    exact = float(strategy.reduce("sum", exact, axis=None))
    keras_default = float(strategy.reduce("sum", keras_default, axis=None))
    np.testing.assert_allclose(exact, single, rtol=1e-5)
    # The replicas hold 10 and 5 real tokens: the mean of per-replica means
    # (Keras's default reduction) is not the global mean.
    assert abs(keras_default - single) > 1e-3
    mask = targets != 0
    expected_accuracy = ((logits.argmax(-1) == targets) & mask).sum() / mask.sum()
    np.testing.assert_allclose(float(metric.result()), expected_accuracy, rtol=1e-6)


# ---------------------------------------------------------------- learning


def reverse_task(n, seq_len, vocab_size, max_payload, seed):
    """BOS x SEP reversed(x) EOS, shifted by one; only the answer is scored."""
    rng = np.random.default_rng(seed)
    inputs = np.zeros((n, seq_len), "int32")
    targets = np.zeros((n, seq_len), "int32")
    for row in range(n):
        k = rng.integers(2, max_payload + 1)
        payload = rng.integers(4, vocab_size, k)
        seq = np.concatenate([[BOS], payload, [SEP], payload[::-1], [EOS]])
        inputs[row, :len(seq) - 1] = seq[:-1]
        targets[row, :len(seq) - 1] = seq[1:]
        targets[row, :k + 1] = 0  # the payload and SEP are not predictable
    return inputs, targets


def test_tiny_model_learns_to_reverse():
    vocab, seq_len = 16, 16
    keras.utils.set_random_seed(0)
    config = transformer_config("tiny", vocab, seq_len, d_model=64, num_heads=4, d_ff=128)
    model = build_decoder_lm(config)
    model.compile(keras.optimizers.Adam(3e-3), loss=MaskedSparseCategoricalCrossentropy(),
                  metrics=[MaskedAccuracy()])
    x, y = reverse_task(64 * 200, seq_len, vocab, max_payload=6, seed=0)
    model.fit(x, y, batch_size=64, epochs=1, verbose=0)
    x_val, y_val = reverse_task(256, seq_len, vocab, max_payload=6, seed=1)
    loss, accuracy = model.evaluate(x_val, y_val, verbose=0)
    assert loss < 0.25 * math.log(vocab), loss
    assert accuracy > 0.8, accuracy


# ---------------------------------------------------------------- FLOPs


def test_flops_per_token_matches_a_hand_count():
    config = TransformerConfig(vocab_size=10, max_len=8, num_layers=2, d_model=4,
                               num_heads=2, d_ff=8)
    # matmul weights: 2 layers * (4*4*4 + 2*4*8) + 4*10 = 2 * 128 + 40 = 296
    assert decoder_lm_matmul_params(config) == 296
    # forward: 2*296 + 2 layers * 2*2 * seq 8 * d 4 = 592 + 256 = 848
    assert decoder_lm_flops_per_token(config, training=False) == 848
    assert decoder_lm_flops_per_token(config) == 3 * 848
    assert decoder_lm_flops_per_token(config, training=False, seq_len=4) == 592 + 128
    # The matmul weights are exactly the built model's kernels.
    model = build_decoder_lm(config)
    kernels = sum(int(np.prod(w.shape)) for w in model.weights if w.name == "kernel")
    assert kernels == 296
    with pytest.raises(ValueError, match="seq_len must be an integer >= 1.*got 0"):
        decoder_lm_flops_per_token(config, seq_len=0)


def test_tanh_gelu_is_an_option_within_1e3_of_exact_and_round_trips():
    import keras
    import numpy as np

    from tfdist.models import build_decoder_lm, transformer_config
    from tfdist.models.layers import DecoderBlock

    tokens = np.random.RandomState(0).randint(1, 30, size=(2, 10)).astype("int32")
    exact = build_decoder_lm(transformer_config("tiny", 30, 10, num_layers=1))
    tanh = build_decoder_lm(transformer_config("tiny", 30, 10, num_layers=1, gelu="tanh"))
    tanh.set_weights(exact.get_weights())
    a, b = np.asarray(exact(tokens)), np.asarray(tanh(tokens))
    assert 0 < np.max(np.abs(a - b)) < 1e-3  # a different function, but close
    block = tanh.get_layer("block_0")
    assert block.ffn_in.activation.__name__ == "gelu_tanh"
    clone = DecoderBlock.from_config(block.get_config())
    assert clone.gelu == "tanh"
    copy = keras.models.clone_model(tanh)
    copy.set_weights(tanh.get_weights())
    np.testing.assert_allclose(np.asarray(copy(tokens)), b, rtol=1e-6, atol=1e-6)
    with pytest.raises(ValueError, match=r"gelu must be one of \['exact', 'tanh'\], got 'fast'"):
        transformer_config("tiny", 30, 10, gelu="fast")
