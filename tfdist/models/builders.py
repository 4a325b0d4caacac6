"""The models the recipes train and the benchmarks measure, each built
with its loss, metrics and figures: a decoder language model, an
encoder-decoder translation model and a ResNet image classifier.

`tfdist.recipes.transformer` and `tfdist.recipes.cnn` call these with their
flags; `tfdist.bench.workloads` calls them with a benchmark's sizes, so a
benchmark measures the very model a recipe trains. Call inside the
strategy scope.

Example:

    with strategy.scope():
        built = build_language_model("tiny", vocab_size=64, sequence_length=32)
    built.model, built.loss, built.metrics, built.flops_per_example
"""

import dataclasses
from typing import Callable

from tfdist.xla import FUSED_BATCH_NORM_BEATS_XLA, SYNC_BN_XLA_BLOCKER


@dataclasses.dataclass(frozen=True)
class BuiltModel:
    """A model with what training it needs (what a recipe's model builder returns, its `RecipeModel`).

    Attributes:
        model: a `keras.Model`.
        loss: a Keras loss.
        metrics: a list of Keras metrics.
        description: one line for the start-up block.
        flops_per_example: model training FLOPs per example, for MFU.
        prepare_optimizer: called with the optimizer once it is built (still
            in the strategy scope), e.g. to exclude variables from weight
            decay, and optionally the model it will train (default `model`;
            a tensor-parallel split copy has variables of its own); None
            for nothing.
        xla_blocker: why the replica step of this model cannot be compiled
            with XLA, or None when it can.
        xla_slower_on_cpu: why `--xla auto` leaves this model's step
            uncompiled on CPUs although XLA can compile it (`--xla on` still
            does), or None.

    Example:

    >>> BuiltModel(model, "mse", [], "a test model").xla_blocker is None
    True
    """

    model: object
    loss: object
    metrics: list
    description: str
    flops_per_example: float = None
    prepare_optimizer: Callable = None
    xla_blocker: str = None
    xla_slower_on_cpu: str = None


def build_language_model(model_size, vocab_size, sequence_length, *, dropout=None, gelu="exact",
                         embedding_shards=0):
    """The decoder LM of `model_size` for the data, its masked loss and accuracy.

    Args:
        model_size: a `TRANSFORMER_SIZES` name ("tiny", "small", "base", "large").
        vocab_size: token ids of the data.
        sequence_length: tokens per example.
        dropout: the dropout rate; None for the size's (0 for "tiny").
        gelu: "exact" (erf) or "tanh".
        embedding_shards: ps tasks to shard the token embedding over (0 or 1: one piece).

    Example:

    >>> with strategy.scope():
    ...     built = build_language_model("tiny", vocab_size=64, sequence_length=32)
    >>> built.description[:21]
    "decoder LM 'tiny': 2 "
    """
    from tfdist.models import (MaskedAccuracy, MaskedSparseCategoricalCrossentropy,
                               build_decoder_lm, decoder_lm_flops_per_token,
                               decoder_lm_param_count, transformer_config)

    overrides = {"gelu": gelu}
    if dropout is not None:
        overrides["dropout"] = dropout
    if model_size == "tiny" and dropout is None:
        overrides["dropout"] = 0.0
    model_config = transformer_config(model_size, vocab_size=vocab_size, max_len=sequence_length,
                                      **overrides)
    shards = embedding_shards
    model = build_decoder_lm(model_config, embedding_shards=max(shards, 1))
    length = sequence_length
    return BuiltModel(
        model=model,
        loss=MaskedSparseCategoricalCrossentropy(),
        metrics=[MaskedAccuracy(name="accuracy")],
        description=(f"decoder LM '{model_size}': {model_config.num_layers} layers, "
                     f"d={model_config.d_model}, {model_config.num_heads} heads, "
                     f"{decoder_lm_param_count(model_config) / 1e6:.2f} M params"
                     + (", tanh GELU" if model_config.gelu == "tanh" else "")
                     + (f", token embedding in {shards} shards (one per ps task)"
                        if shards > 1 else "")),
        flops_per_example=decoder_lm_flops_per_token(model_config, seq_len=length) * length)


def build_translation_model(model_size, vocab_size, source_length, target_length, *,
                            dropout=None, label_smoothing=0.1, tie_embeddings=True):
    """The encoder-decoder Transformer of `model_size` for the data, its
    label-smoothed masked loss and masked token accuracy.

    Args:
        model_size: a `SEQ2SEQ_SIZES` name ("tiny", "small", "base", "big").
        vocab_size: the shared source/target id space of the data.
        source_length: source tokens per example.
        target_length: decoder positions per example (target words + 1).
        dropout: the dropout rate; None for the size's (0 for "tiny").
        label_smoothing: of the cross-entropy over non-pad targets, in [0, 1).
        tie_embeddings: one embedding table for source, target and output.

    Example:

    >>> with strategy.scope():
    ...     built = build_translation_model("tiny", 237, source_length=20, target_length=31)
    >>> built.description[:28]
    "encoder-decoder 'tiny': 2+2 "
    """
    from tfdist.models import (MaskedAccuracy, MaskedSparseCategoricalCrossentropy,
                               build_seq2seq, seq2seq_config)

    overrides = {"tie_embeddings": tie_embeddings}
    if dropout is not None:
        overrides["dropout"] = dropout
    config = seq2seq_config(model_size, vocab_size, vocab_size, source_length, target_length,
                            **overrides)
    model = build_seq2seq(config)
    params = model.count_params()
    return BuiltModel(
        model=model,
        loss=MaskedSparseCategoricalCrossentropy(label_smoothing=label_smoothing),
        metrics=[MaskedAccuracy(name="accuracy")],
        description=(f"encoder-decoder '{model_size}': {config.num_encoder_layers}+"
                     f"{config.num_decoder_layers} layers, d={config.d_model}, "
                     f"{config.num_heads} heads, {params / 1e6:.2f} M params"
                     + (", tied embeddings" if tie_embeddings else "")
                     + (f", label smoothing {label_smoothing:g}" if label_smoothing else "")),
        # About 6 FLOPs per parameter per token (forward and backward), over
        # the source and target tokens: a rough figure for MFU.
        flops_per_example=6.0 * params * (source_length + target_length))


def build_image_classifier(model_name, num_classes, image_size, *, sync_bn=False,
                           label_smoothing=0.0):
    """The ResNet `model_name` for the data, its loss and accuracy.

    Batch-norm scales/offsets and biases are excluded from weight decay
    (`prepare_optimizer`).

    Args:
        model_name: a `RESNET_NAMES` name ("resnet_tiny", "resnet18", ...).
        num_classes: classes of the labels.
        image_size: the square image side in pixels.
        sync_bn: synchronised batch norm (statistics over the global batch).
        label_smoothing: label smoothing of the cross-entropy (0..1).

    Example:

    >>> with strategy.scope():
    ...     built = build_image_classifier("resnet_tiny", num_classes=8, image_size=32)
    >>> built.description.endswith("per-replica batch norm")
    True
    """
    import keras

    from tfdist.models import (build_resnet, exclude_from_weight_decay, resnet_flops_per_example,
                               sparse_label_smoothing_loss)

    model = build_resnet(model_name, num_classes, image_size, synchronized_bn=sync_bn)
    if label_smoothing:
        loss = sparse_label_smoothing_loss(num_classes, label_smoothing, from_logits=True)
    else:
        loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    return BuiltModel(
        model=model, loss=loss,
        metrics=[keras.metrics.SparseCategoricalAccuracy(name="accuracy")],
        description=(f"{model_name}: {model.count_params() / 1e6:.2f} M params, "
                     f"{'synchronised' if sync_bn else 'per-replica'} batch norm"),
        flops_per_example=resnet_flops_per_example(model, image_size),
        # Batch-norm scales/offsets and biases are not decayed.
        prepare_optimizer=lambda optimizer, trained=None: exclude_from_weight_decay(
            optimizer, model if trained is None else trained),
        xla_blocker=SYNC_BN_XLA_BLOCKER if sync_bn else None,
        xla_slower_on_cpu=None if sync_bn else FUSED_BATCH_NORM_BEATS_XLA)
