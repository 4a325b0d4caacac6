"""Tests of tfdist.models.resnet and tfdist.models.regularization: the ResNet
family, synchronised batch norm under a 2-replica MirroredStrategy, weight
decay that skips BN and bias parameters, label smoothing on integer labels,
float32 logits under mixed precision, and the analytic FLOP count."""

import functools

import keras
import numpy as np
import pytest
import tensorflow as tf

from tfdist.models.regularization import (
    SparseLabelSmoothingCrossentropy,
    decay_mask,
    exclude_from_weight_decay,
    is_weight_decayed,
    no_decay_variables,
    sparse_label_smoothing_loss,
)
from tfdist.models.resnet import (
    RESNET_NAMES,
    build_resnet,
    resnet_flops_per_example,
    resnet_name,
)
from tfdist.distribute.strategy_factory import create_strategy

# torchvision's exact trainable parameter counts (1000 classes) and its
# published multiply-adds at 224x224 ("GFLOPS" in its model table counts
# multiply-adds); the published totals of He et al. / Keras Applications.
IMAGENET_FACTS = {
    "resnet18": dict(trainable=11_689_512, published=11.7e6, gmacs=1.81),
    "resnet34": dict(trainable=21_797_672, published=21.8e6, gmacs=3.66),
    "resnet50": dict(trainable=25_557_032, published=25.6e6, gmacs=4.09),
}


@functools.lru_cache(maxsize=None)
def imagenet_model(name):
    return build_resnet(name, 1000, (224, 224, 3))


@pytest.fixture(scope="module")
def strategy():
    return create_strategy("mirrored", devices=["/cpu:0", "/cpu:1"])


def per_replica(strategy, halves):
    """A distributed value whose replica r holds halves[r]."""
    return strategy.experimental_distribute_values_from_function(
        lambda ctx: tf.constant(halves[ctx.replica_id_in_sync_group]))


def replica_copies(variable):
    """The per-replica values of a Keras variable created under a strategy."""
    return [component.numpy() for component in variable.value.values]


# ----------------------------------------------------------- names and shapes


def test_names_and_depths_resolve_and_unknown_ones_list_the_valid_ones():
    assert RESNET_NAMES == ("resnet_tiny", "resnet18", "resnet34", "resnet50",
                            "resnet101", "resnet152")
    assert resnet_name(50) == "resnet50"
    assert resnet_name("ResNet18") == "resnet18"
    assert resnet_name(8) == resnet_name("resnet8") == "resnet_tiny"
    with pytest.raises(ValueError, match=r"'resnet20'.*resnet_tiny.*resnet152.*\[8, 18, 34"):
        build_resnet("resnet20", 10, (32, 32, 3))
    with pytest.raises(ValueError, match=r"Unknown ResNet 19"):
        resnet_name(19)


@pytest.mark.parametrize("kwargs, message", [
    (dict(num_classes=0), r"num_classes must be an integer >= 1, got 0"),
    (dict(input_shape=(32, 32)), r"input_shape must be \(height, width, channels\).*\(32, 32\)"),
    (dict(width=0), r"width must be an integer >= 1.*got 0"),
    (dict(bn_momentum=1.0), r"bn_momentum must be a finite number in \[0, 1\), got 1.0"),
    (dict(dropout=-0.1), r"dropout must be a finite number in \[0, 1\), got -0.1"),
    (dict(stem="resnetd"), r"Unknown stem 'resnetd'.*\['auto', 'imagenet', 'cifar'\]"),
])
def test_bad_arguments_raise_teaching_errors(kwargs, message):
    args = dict(num_classes=10, input_shape=(32, 32, 3))
    args.update(kwargs)
    with pytest.raises(ValueError, match=message):
        build_resnet("resnet_tiny", **args)


@pytest.mark.parametrize("name", list(IMAGENET_FACTS))
def test_imagenet_parameter_counts_match_published_figures(name):
    model = imagenet_model(name)
    facts = IMAGENET_FACTS[name]
    trainable = sum(int(np.prod(v.shape)) for v in model.trainable_variables)
    assert trainable == facts["trainable"]
    assert abs(model.count_params() - facts["published"]) / facts["published"] < 0.01
    assert model.output_shape == (None, 1000)
    # ImageNet stem: 7x7 stride-2 conv and a max pool; 7x7 final feature map.
    assert model.get_layer("stem_conv").kernel.shape[:2] == (7, 7)
    assert model.get_layer("stem_pool").output.shape[1:3] == (56, 56)
    assert model.get_layer("avg_pool").input.shape[1:3] == (7, 7)


def test_stem_follows_input_size_unless_given():
    small = build_resnet("resnet_tiny", 10, (64, 64, 3))
    assert small.get_layer("stem_conv").kernel.shape == (3, 3, 3, 16)
    assert small.get_layer("stem_conv").output.shape[1:3] == (64, 64)
    assert "stem_pool" not in [layer.name for layer in small.layers]
    large = build_resnet("resnet_tiny", 10, (65, 65, 1))
    assert large.get_layer("stem_conv").kernel.shape == (7, 7, 1, 16)
    assert large.get_layer("stem_pool").output.shape[1:3] == (17, 17)
    forced = build_resnet("resnet_tiny", 10, (32, 32, 3), stem="imagenet", width=8,
                          dropout=0.2, name="custom")
    assert forced.name == "custom"
    assert forced.get_layer("stem_conv").kernel.shape == (7, 7, 3, 8)
    assert forced.get_layer("stage3_block1_conv2").kernel.shape == (3, 3, 32, 32)
    assert forced.get_layer("dropout").rate == 0.2
    unknown_size = build_resnet("resnet_tiny", 10, (None, None, 3))
    assert unknown_size.get_layer("stem_conv").kernel.shape[:2] == (7, 7)
    assert tuple(unknown_size(np.zeros((2, 40, 24, 3), "float32")).shape) == (2, 10)


def test_synchronized_bn_flag_reaches_every_batch_norm_layer():
    model = build_resnet("resnet_tiny", 10, (16, 16, 3), synchronized_bn=True,
                         bn_momentum=0.8)
    bns = [l for l in model.layers if isinstance(l, keras.layers.BatchNormalization)]
    assert len(bns) == 9   # stem + 2 per block x 3 + 2 projections
    assert all(bn.synchronized and bn.momentum == 0.8 for bn in bns)
    plain = build_resnet("resnet_tiny", 10, (16, 16, 3))
    assert not any(l.synchronized for l in plain.layers
                   if isinstance(l, keras.layers.BatchNormalization))


# --------------------------------------------------- batch norm across replicas


@pytest.mark.parametrize("synchronized", [True, False])
def test_moving_statistics_after_a_mirrored_training_step(strategy, synchronized):
    momentum = 0.5
    with strategy.scope():
        model = build_resnet("resnet_tiny", 2, (8, 8, 3), synchronized_bn=synchronized,
                             bn_momentum=momentum)
        optimizer = keras.optimizers.SGD(0.1)
        optimizer.build(model.trainable_variables)
    rng = np.random.default_rng(0)
    halves = [rng.normal(0.0, 1.0, (4, 8, 8, 3)).astype("float32"),
              rng.normal(3.0, 2.0, (4, 8, 8, 3)).astype("float32")]
    labels = [np.array([0, 1, 0, 1], "int32"), np.array([1, 1, 0, 0], "int32")]
    # What the stem BN sees: the stem conv output, before the step changes it.
    stem_conv = keras.Model(model.input, model.get_layer("stem_conv").output)
    features = [np.asarray(stem_conv(h)).reshape(-1, 16) for h in halves]
    whole = np.concatenate(features)

    @tf.function
    def train_step(images, targets):
        def replica_step(x, y):
            with tf.GradientTape() as tape:
                logits = model(x, training=True)
                loss = tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(
                    y, logits, from_logits=True)) / strategy.num_replicas_in_sync
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply(grads, model.trainable_variables)
        strategy.run(replica_step, args=(images, targets))

    train_step(per_replica(strategy, halves), per_replica(strategy, labels))

    bn = model.get_layer("stem_bn")
    means, variances = replica_copies(bn.moving_mean), replica_copies(bn.moving_variance)

    def moved(initial, batch_value):
        return momentum * initial + (1.0 - momentum) * batch_value

    if synchronized:
        for mean, variance in zip(means, variances, strict=True):
            np.testing.assert_allclose(mean, moved(0.0, whole.mean(0)), rtol=1e-4, atol=1e-4)
            np.testing.assert_allclose(variance, moved(1.0, whole.var(0)), rtol=1e-4, atol=1e-4)
        deepest = model.get_layer("stage3_block1_bn2")
        for copies in (replica_copies(deepest.moving_mean),
                       replica_copies(deepest.moving_variance)):
            np.testing.assert_array_equal(copies[0], copies[1])
    else:
        # Each replica's copy holds its own half's statistics: the mirrored
        # copies diverge, and reading the variable gives replica 0's copy.
        for mean, variance, own in zip(means, variances, features, strict=True):
            np.testing.assert_allclose(mean, moved(0.0, own.mean(0)), rtol=1e-4, atol=1e-4)
            np.testing.assert_allclose(variance, moved(1.0, own.var(0)), rtol=1e-4, atol=1e-4)
        assert np.abs(means[0] - means[1]).max() > 0.1
        np.testing.assert_array_equal(np.asarray(bn.moving_mean), means[0])
    # The halves really differ, so the two expectations above are distinct.
    assert np.abs(features[0].mean(0) - whole.mean(0)).max() > 0.1


# ---------------------------------------------------------------- weight decay


def test_decay_mask_selects_kernels_only():
    model = build_resnet("resnet_tiny", 3, (8, 8, 3))
    mask = decay_mask(model)
    assert list(mask) == [v.path for v in model.trainable_variables]
    for path, decayed in mask.items():
        assert decayed == path.endswith("/kernel"), path
    assert sum(mask.values()) == 10   # 9 convolutions + the classifier
    assert {v.name for v in no_decay_variables(model)} == {"gamma", "beta", "bias"}
    assert is_weight_decayed(keras.Variable(np.ones((2, 2))))
    assert not is_weight_decayed(keras.Variable(np.ones((2,))))


def _set_non_kernels_to_random(model, rng):
    """Non-zero BN gamma/beta and biases, so that any decay would show."""
    for variable in no_decay_variables(model):
        variable.assign(rng.uniform(1.0, 2.0, variable.shape).astype("float32"))


@pytest.mark.parametrize("exclude", [True, False])
def test_sgd_weight_decay_shrinks_only_kernels_on_two_replicas(strategy, exclude):
    learning_rate, weight_decay = 0.1, 0.5
    with strategy.scope():
        model = build_resnet("resnet_tiny", 3, (8, 8, 3))
        optimizer = keras.optimizers.SGD(learning_rate, weight_decay=weight_decay)
        if exclude:
            assert exclude_from_weight_decay(optimizer, model) is optimizer
        optimizer.build(model.trainable_variables)
    _set_non_kernels_to_random(model, np.random.default_rng(1))
    before = [np.asarray(v) for v in model.trainable_variables]

    @tf.function
    def zero_gradient_step():
        def replica_step():
            variables = model.trainable_variables
            optimizer.apply([tf.zeros_like(v) for v in variables], variables)
        strategy.run(replica_step)

    zero_gradient_step()
    shrink = 1.0 - learning_rate * weight_decay   # applied once, not per replica
    for variable, old in zip(model.trainable_variables, before, strict=True):
        expected = old * shrink if (is_weight_decayed(variable) or not exclude) else old
        for copy in replica_copies(variable):
            np.testing.assert_allclose(copy, expected, rtol=1e-6, err_msg=variable.path)


def test_exclusion_must_precede_the_optimizer_build():
    model = build_resnet("resnet_tiny", 3, (8, 8, 3))
    optimizer = keras.optimizers.SGD(0.1, weight_decay=1e-4)
    optimizer.build(model.trainable_variables)
    with pytest.raises(ValueError, match="already built.*before its first step"):
        exclude_from_weight_decay(optimizer, model)
    with pytest.raises(TypeError, match="keras.optimizers.Optimizer, got str"):
        exclude_from_weight_decay("sgd", model)


# ------------------------------------------------------------- label smoothing


def numpy_smoothed_ce(labels, logits, smoothing):
    num_classes = logits.shape[-1]
    shifted = logits - logits.max(-1, keepdims=True)
    log_probs = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
    targets = np.full(logits.shape, smoothing / num_classes)
    targets[np.arange(len(labels)), labels] += 1.0 - smoothing
    return -(targets * log_probs).sum(-1)


def test_label_smoothing_loss_matches_numpy_on_integer_labels():
    rng = np.random.default_rng(2)
    logits = rng.normal(0, 3, (6, 5)).astype("float32")
    labels = np.array([0, 4, 2, 2, 1, 3])
    expected = numpy_smoothed_ce(labels, logits.astype("float64"), 0.2)
    loss = sparse_label_smoothing_loss(5, 0.2)
    np.testing.assert_allclose(float(loss(labels, logits)), expected.mean(), rtol=1e-5)
    np.testing.assert_allclose(float(loss(labels[:, None], logits)), expected.mean(), rtol=1e-5)
    per_example = SparseLabelSmoothingCrossentropy(5, 0.2, reduction=None)(labels, logits)
    np.testing.assert_allclose(np.asarray(per_example), expected, rtol=1e-5)
    # Probabilities instead of logits, and Keras's one-hot loss, agree.
    probs = np.asarray(keras.ops.softmax(logits))
    probability_loss = sparse_label_smoothing_loss(5, 0.2, from_logits=False)
    np.testing.assert_allclose(float(probability_loss(labels, probs)), expected.mean(),
                               rtol=1e-4)
    one_hot = keras.losses.CategoricalCrossentropy(from_logits=True, label_smoothing=0.2)
    np.testing.assert_allclose(float(loss(labels, logits)),
                               float(one_hot(np.eye(5)[labels], logits)), rtol=1e-5)
    # Smoothing 0 is the plain sparse cross-entropy.
    plain = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    np.testing.assert_allclose(float(sparse_label_smoothing_loss(5, 0.0)(labels, logits)),
                               float(plain(labels, logits)), rtol=1e-5)


def test_label_smoothing_loss_serialises_and_validates():
    loss = SparseLabelSmoothingCrossentropy(7, label_smoothing=0.15, from_logits=False,
                                            reduction="sum", name="smooth")
    restored = keras.losses.deserialize(keras.losses.serialize(loss))
    assert isinstance(restored, SparseLabelSmoothingCrossentropy)
    assert (restored.num_classes, restored.label_smoothing, restored.from_logits,
            restored.reduction, restored.name) == (7, 0.15, False, "sum", "smooth")
    with pytest.raises(ValueError, match=r"label_smoothing must be a finite number in \[0, 1\), got 1"):
        sparse_label_smoothing_loss(3, 1)
    with pytest.raises(ValueError, match=r"num_classes must be an integer >= 2, got 1"):
        sparse_label_smoothing_loss(1, 0.1)
    with pytest.raises(ValueError, match=r"4 classes.*num_classes=3"):
        sparse_label_smoothing_loss(3, 0.1)(np.array([0]), np.zeros((1, 4), "float32"))


# ------------------------------------------------------------ mixed precision


def test_logits_and_variables_are_float32_under_mixed_bfloat16(mixed_bfloat16):
    model = build_resnet("resnet_tiny", 4, (8, 8, 3), dropout=0.1)
    assert model.get_layer("classifier").compute_dtype == "bfloat16"
    assert model.get_layer("stage1_block1_conv1").compute_dtype == "bfloat16"
    logits = model(np.random.default_rng(3).normal(size=(2, 8, 8, 3)).astype("float32"),
                   training=True)
    assert keras.backend.standardize_dtype(logits.dtype) == "float32"
    # Every weight and BN statistic is float32 (Dropout's seed state is int64).
    assert {v.dtype for v in model.variables if "seed_generator" not in v.path} == {"float32"}
    loss = sparse_label_smoothing_loss(4, 0.1)(np.array([1, 3]), logits)
    assert keras.backend.standardize_dtype(loss.dtype) == "float32"


# ----------------------------------------------------------------------- FLOPs


def tiny_hand_count():
    """Forward multiply-adds x 2 of resnet_tiny, 32x32x3 input, 10 classes."""
    def conv(size, c_out, k, c_in):
        return 2 * size * size * c_out * k * k * c_in
    return (conv(32, 16, 3, 3)                                          # stem
            + 2 * conv(32, 16, 3, 16)                                   # stage 1
            + conv(16, 32, 3, 16) + conv(16, 32, 3, 32) + conv(16, 32, 1, 16)
            + conv(8, 64, 3, 32) + conv(8, 64, 3, 64) + conv(8, 64, 1, 32)
            + 2 * 64 * 10)                                              # classifier


def test_flops_of_the_tiny_variant_match_a_hand_count():
    model = build_resnet("resnet_tiny", 10, (32, 32, 3))
    forward = tiny_hand_count()
    assert forward == 25_003_264
    assert resnet_flops_per_example(model, training=False) == forward
    assert resnet_flops_per_example(model) == 3 * forward
    assert resnet_flops_per_example(model, (32, 32, 3)) == 3 * forward
    assert resnet_flops_per_example("resnet_tiny", (32, 32, 3), num_classes=10) == 3 * forward
    # A model with unknown image size is counted at the size asked for.
    any_size = build_resnet("resnet_tiny", 10, (None, None, 3), stem="cifar")
    assert resnet_flops_per_example(any_size, (32, 32, 3), training=False) == forward
    with pytest.raises(ValueError, match=r"unknown sizes; pass input_shape"):
        resnet_flops_per_example(any_size)
    with pytest.raises(ValueError, match=r"input_shape=\(16, 16, 3\) does not fit.*\(32, 32, 3\)"):
        resnet_flops_per_example(model, (16, 16, 3))
    with pytest.raises(ValueError, match=r"input_shape is required"):
        resnet_flops_per_example("resnet18")


def test_flops_agree_with_tensorflow_profiler():
    """TF's registered op statistics count Conv2D/MatMul the same way; its
    total also holds batch norm and additions, about 1% more."""
    from tensorflow.python.framework.convert_to_constants import (
        convert_variables_to_constants_v2)
    model = build_resnet("resnet_tiny", 10, (32, 32, 3))
    forward = tf.function(lambda x: model(x, training=False)).get_concrete_function(
        tf.TensorSpec((1, 32, 32, 3), tf.float32))
    graph = convert_variables_to_constants_v2(forward).graph
    options = tf.compat.v1.profiler.ProfileOptionBuilder.float_operation()
    options["output"] = "none"
    profiled = tf.compat.v1.profiler.profile(graph=graph, options=options).total_float_ops
    ours = resnet_flops_per_example(model, training=False)
    assert ours <= profiled <= 1.02 * ours


@pytest.mark.parametrize("name", list(IMAGENET_FACTS))
def test_imagenet_flops_match_published_multiply_adds(name):
    macs = resnet_flops_per_example(imagenet_model(name), training=False) / 2
    assert abs(macs / 1e9 - IMAGENET_FACTS[name]["gmacs"]) < 0.01


# ---------------------------------------------------------------- it learns


def separable_images(count, seed):
    """Class 1 images are brighter in their left half; class 0 in the right."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 2, count).astype("int32")
    images = rng.normal(0.0, 1.0, (count, 8, 8, 3)).astype("float32")
    images[labels == 1, :, :4] += 1.5
    images[labels == 0, :, 4:] += 1.5
    return images, labels


def test_tiny_resnet_learns_a_separable_task_with_fit_and_survives_saving(tmp_path):
    keras.utils.set_random_seed(4)
    model = build_resnet("resnet_tiny", 2, (8, 8, 3))
    optimizer = keras.optimizers.SGD(0.05, momentum=0.9, weight_decay=1e-3)
    exclude_from_weight_decay(optimizer, model)
    model.compile(optimizer, loss=sparse_label_smoothing_loss(2, 0.1),
                  metrics=["accuracy"])
    images, labels = separable_images(384, seed=5)
    test_images, test_labels = separable_images(256, seed=6)
    initial_loss, _ = model.evaluate(test_images, test_labels, batch_size=128, verbose=0)
    history = model.fit(images, labels, batch_size=32, epochs=3, verbose=0)
    losses = history.history["loss"]
    assert losses[-1] < losses[0], losses
    test_loss, accuracy = model.evaluate(test_images, test_labels, batch_size=128, verbose=0)
    # With smoothing 0.1 over 2 classes the lowest possible loss is the
    # entropy of (0.95, 0.05), 0.199; chance is log 2 = 0.693.
    assert test_loss < 0.35 and test_loss < 0.5 * initial_loss, (initial_loss, test_loss)
    assert accuracy > 0.9

    path = tmp_path / "tiny.keras"
    model.save(path)
    restored = keras.models.load_model(path)
    assert isinstance(restored.loss, SparseLabelSmoothingCrossentropy)
    np.testing.assert_allclose(np.asarray(restored(test_images[:8])),
                               np.asarray(model(test_images[:8])), rtol=1e-5, atol=1e-5)
