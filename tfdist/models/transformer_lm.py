"""The Transformer model family: configuration, named sizes, the causal
decoder-only language model, and its analytic parameter and FLOP counts.

Example:

    from tfdist.models import (build_decoder_lm, transformer_config,
                               MaskedSparseCategoricalCrossentropy, MaskedAccuracy)

    config = transformer_config("tiny", vocab_size=64, max_len=40)
    model = build_decoder_lm(config)
    model.compile("adam", loss=MaskedSparseCategoricalCrossentropy(),
                  metrics=[MaskedAccuracy()])
"""

import dataclasses
import types

import keras

from tfdist.models.config_checks import check_transformer_fields, is_int
from tfdist.models.layer_norm import LayerNormalization
from tfdist.models.layers import DecoderBlock, PaddingMask, TokenAndPositionEmbedding

_INT_FIELDS = ("vocab_size", "max_len", "num_layers", "d_model", "num_heads", "d_ff")


@dataclasses.dataclass(frozen=True)
class TransformerConfig:
    """Architecture of a Transformer model (immutable, validated on creation).

    Args:
        vocab_size: number of token ids, including pad and special ids.
        max_len: longest input sequence (number of learned positions).
        num_layers: number of decoder blocks.
        d_model: width of the residual stream; a multiple of `num_heads`.
        num_heads: attention heads per block.
        d_ff: hidden width of each block's feed-forward network.
        dropout: dropout rate for attention probabilities, residual branches and
            embeddings, in `[0, 1)`.
        position_embedding: "learned" (GPT-2) or "sinusoidal" (Vaswani et al.).
        layer_norm_epsilon: epsilon of every LayerNormalization, > 0.
        pad_id: the padding token id; keys holding it are never attended to.
        gelu: the feed-forward activation, "exact" (erf GELU) or "tanh" (the
            tanh approximation: faster, within 1e-3 of exact).

    Raises:
        ValueError: a field is of the wrong type or out of range, with the
            value received and what is allowed.

    Example:

    >>> TransformerConfig(vocab_size=64, max_len=40, num_layers=2, d_model=128,
    ...                   num_heads=4, d_ff=512).head_dim
    32
    """

    vocab_size: int
    max_len: int
    num_layers: int = 2
    d_model: int = 128
    num_heads: int = 4
    d_ff: int = 512
    dropout: float = 0.0
    position_embedding: str = "learned"
    layer_norm_epsilon: float = 1e-5
    pad_id: int = 0
    gelu: str = "exact"

    def __post_init__(self):
        check_transformer_fields(self, _INT_FIELDS)
        if self.vocab_size < 2:
            raise ValueError(
                f"TransformerConfig.vocab_size must be >= 2 (a pad id and at least one "
                f"real token), got {self.vocab_size}.")
        if not is_int(self.pad_id) or not 0 <= self.pad_id < self.vocab_size:
            raise ValueError(
                f"TransformerConfig.pad_id must be an integer in [0, vocab_size="
                f"{self.vocab_size}), got {self.pad_id!r}.")

    @property
    def head_dim(self):
        """Width of each attention head, `d_model // num_heads`."""
        return self.d_model // self.num_heads


TRANSFORMER_SIZES = types.MappingProxyType({
    # Learns the embedded copy/reverse/sort task in minutes on 2 CPU cores.
    "tiny": types.MappingProxyType(
        dict(num_layers=2, d_model=128, num_heads=4, d_ff=512, dropout=0.0)),
    # The benchmark decoder: 4 layers, d=256, 8 heads (7.3 M parameters with
    # vocab 8000 and seq 128).
    "small": types.MappingProxyType(
        dict(num_layers=4, d_model=256, num_heads=8, d_ff=1024, dropout=0.1)),
    # "Attention is all you need" base dimensions (Vaswani et al. 2017, Table 3).
    "base": types.MappingProxyType(
        dict(num_layers=6, d_model=512, num_heads=8, d_ff=2048, dropout=0.1)),
    # "Attention is all you need" big dimensions.
    "large": types.MappingProxyType(
        dict(num_layers=6, d_model=1024, num_heads=16, d_ff=4096, dropout=0.3)),
})
"""Named architectures: size name -> the TransformerConfig fields it sets."""


def transformer_config(size, vocab_size, max_len, **overrides):
    """Returns the `TransformerConfig` of a named size.

    Args:
        size: one of `TRANSFORMER_SIZES`: "tiny", "small", "base", "large".
        vocab_size: number of token ids (from the data).
        max_len: longest sequence (from the data).
        **overrides: any other `TransformerConfig` field, replacing the size's
            value (e.g. `dropout=0.0`, `num_layers=3`).

    Returns:
        A validated `TransformerConfig`.

    Raises:
        ValueError: unknown size or field, or an invalid value.

    Example:

    >>> transformer_config("small", vocab_size=8000, max_len=128).d_model
    256
    >>> transformer_config("tiny", 64, 40, dropout=0.1).dropout
    0.1
    """
    if size not in TRANSFORMER_SIZES:
        raise ValueError(
            f"Unknown transformer size {size!r}; choose one of "
            f"{list(TRANSFORMER_SIZES)}.")
    fields = [f.name for f in dataclasses.fields(TransformerConfig)]
    unknown = sorted(set(overrides) - set(fields))
    if unknown:
        raise ValueError(
            f"Unknown TransformerConfig field(s) {unknown}; the fields are {fields}.")
    values = dict(TRANSFORMER_SIZES[size])
    values.update(overrides)
    return TransformerConfig(vocab_size=vocab_size, max_len=max_len, **values)


def _check_config(config):
    if not isinstance(config, TransformerConfig):
        raise TypeError(
            f"Expected a tfdist.models.TransformerConfig, got {type(config).__name__}; "
            "make one with transformer_config(size, vocab_size, max_len).")


def build_decoder_lm(config, name="decoder_lm", embedding_shards=1):
    """Builds a causal decoder-only Transformer language model.

    Token + position embedding, `config.num_layers` pre-LN `DecoderBlock`s
    (causal self-attention that also ignores pad keys, GELU feed-forward), a
    final LayerNormalization and a projection to `vocab_size` logits. Layers
    follow the global `keras.mixed_precision` policy, except the final
    `logits` Activation, which is float32 so that the softmax and the loss
    are computed in float32 under "mixed_bfloat16"/"mixed_float16" (the
    projection itself stays in the fast compute dtype).

    Args:
        config: a `TransformerConfig`.
        name: the model's name.
        embedding_shards: split the token embedding into this many row blocks
            (`ShardedEmbedding`: under parameter_server, one per ps task, so
            that the ps tasks share the table and its optimizer slots).

    Returns:
        A functional `keras.Model` mapping int token ids `[batch, seq_len]`
        (seq_len <= max_len) to float32 logits `[batch, seq_len, vocab_size]`;
        the logits at position t depend only on tokens 0..t.

    Example:

    >>> model = build_decoder_lm(transformer_config("tiny", 64, 40))
    >>> tuple(model(np.ones((2, 40), "int32")).shape)
    (2, 40, 64)
    """
    _check_config(config)
    token_ids = keras.Input(shape=(None,), dtype="int32", name="token_ids")
    padding_mask = PaddingMask(config.pad_id, name="padding_mask")(token_ids)
    x = TokenAndPositionEmbedding(
        config.vocab_size, config.max_len, config.d_model,
        position_embedding=config.position_embedding, dropout=config.dropout,
        embedding_shards=embedding_shards, name="embedding")(token_ids)
    for i in range(config.num_layers):
        x = DecoderBlock(config.d_model, config.num_heads, config.d_ff,
                         dropout=config.dropout,
                         layer_norm_epsilon=config.layer_norm_epsilon, gelu=config.gelu,
                         name=f"block_{i}")(x, padding_mask=padding_mask)
    x = LayerNormalization(epsilon=config.layer_norm_epsilon, name="final_norm")(x)
    x = keras.layers.Dense(config.vocab_size, name="lm_head")(x)
    logits = keras.layers.Activation("linear", dtype="float32", name="logits")(x)
    return keras.Model(token_ids, logits, name=name)


def decoder_lm_param_count(config):
    """Returns the exact number of parameters of `build_decoder_lm(config)`.

    Token embedding `V*d`, learned positions `max_len*d` (none if
    sinusoidal), per block `4d^2 + 4d` (attention with biases) `+ 2*d*d_ff +
    d_ff + d` (feed-forward) `+ 4d` (two LayerNorms), final LayerNorm `2d`,
    output projection `d*V + V`.

    Args:
        config: a `TransformerConfig`.

    Returns:
        An int.

    Example:

    >>> decoder_lm_param_count(transformer_config("small", 8000, 128))
    7296320
    """
    _check_config(config)
    d, f, v = config.d_model, config.d_ff, config.vocab_size
    embedding = v * d + (config.max_len * d if config.position_embedding == "learned" else 0)
    block = (4 * d * d + 4 * d) + (2 * d * f + f + d) + 4 * d
    return embedding + config.num_layers * block + 2 * d + (d * v + v)


def decoder_lm_matmul_params(config):
    """Returns the number of weights that take part in matrix multiplies per
    token: `num_layers * (4*d^2 + 2*d*d_ff) + d*vocab_size`.

    These are the attention projections (Q, K, V, output), the two
    feed-forward matrices and the output projection. Embedding look-ups,
    biases and LayerNorm scales do no matmul and are left out.

    Args:
        config: a `TransformerConfig`.

    Returns:
        An int.

    Example:

    >>> decoder_lm_matmul_params(transformer_config("small", 8000, 128))
    5193728
    """
    _check_config(config)
    d = config.d_model
    return config.num_layers * (4 * d * d + 2 * d * config.d_ff) + d * config.vocab_size


def decoder_lm_flops_per_token(config, training=True, seq_len=None):
    """Analytic model FLOPs per token of `build_decoder_lm(config)`, for MFU.

    Forward, per token (a multiply-add counts 2 FLOPs):

        F = 2 * N_matmul + num_layers * 2 * 2 * seq_len * d_model

    where `N_matmul = num_layers * (4 d^2 + 2 d d_ff) + d * vocab_size` (see
    `decoder_lm_matmul_params`) and the second term is attention: scores
    `Q K^T` and the weighted sum `A V`, each `2 * seq_len * d_model` per token
    and layer. Training (forward + backward, the backward pass costing twice
    the forward) is `3 * F`, i.e. `6 N + 12 L T d`. This is Kaplan et al.
    2020 ("Scaling Laws for Neural Language Models", Table 1, `C_forward ~ 2N
    + 2 n_layer n_ctx d_attn`, with the output projection counted) and the
    PaLM paper (Chowdhery et al. 2022, Appendix B, `6N + 12 L H Q T`). As in
    PaLM, the full `seq_len` is counted even though a causal mask makes half
    the scores unused, and rematerialisation is not counted (model FLOPs, not
    hardware FLOPs). Embedding look-ups, biases, LayerNorm, softmax and GELU
    are negligible and left out.

    Args:
        config: a `TransformerConfig`.
        training: True for forward + backward (x3), False for forward only.
        seq_len: the sequence length trained on; defaults to `config.max_len`.

    Returns:
        FLOPs per token, an int. Multiply by tokens per second for model
        FLOP/s; by `seq_len` for FLOPs per example.

    Example:

    >>> decoder_lm_flops_per_token(transformer_config("small", 8000, 128))
    32735232
    """
    _check_config(config)
    if seq_len is None:
        seq_len = config.max_len
    if not is_int(seq_len) or seq_len < 1:
        raise ValueError(f"seq_len must be an integer >= 1 (or None), got {seq_len!r}.")
    forward = (2 * decoder_lm_matmul_params(config)
               + config.num_layers * 2 * 2 * seq_len * config.d_model)
    return 3 * forward if training else forward
