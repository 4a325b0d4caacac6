"""The encoder-decoder Transformer (Vaswani et al. 2017) for translation, as a Keras 3 model.

Pre-layer-norm blocks (Xiong et al. 2020): the encoder's self-attention
ignores source pads; the decoder's self-attention is causal and ignores
target pads, and its cross-attention reads the encoder output except at
source pads; both stacks end with a LayerNormalization. Optionally one
embedding table serves the source, the target and (transposed) the output
projection (`tie_embeddings`, Press & Wolf 2017), which needs one shared
vocabulary.

Example:

    from tfdist.models import build_seq2seq, seq2seq_config, MaskedSparseCategoricalCrossentropy
    config = seq2seq_config("tiny", source_vocab_size=237, target_vocab_size=237,
                            source_max_len=20, target_max_len=31)
    model = build_seq2seq(config)
    model.compile("adam", loss=MaskedSparseCategoricalCrossentropy())
    model.fit(dataset)  # elements ((source_ids, target_input_ids), target_output_ids)
"""

import dataclasses
import math
import types

import keras
from keras import ops

from tfdist.models.config_checks import check_transformer_fields, is_int
from tfdist.models.activations import GELU_FORMS
from tfdist.models.dropout import BitsDropout, use_bits_dropout
from tfdist.models.layer_norm import LayerNormalization
from tfdist.models.layers import POSITION_EMBEDDINGS, PaddingMask, sinusoidal_position_table

_INT_FIELDS = ("source_vocab_size", "target_vocab_size", "source_max_len", "target_max_len",
               "num_encoder_layers", "num_decoder_layers", "d_model", "num_heads", "d_ff")


@dataclasses.dataclass(frozen=True)
class Seq2SeqConfig:
    """Architecture of an encoder-decoder Transformer (immutable, validated on creation).

    Args:
        source_vocab_size: number of source token ids, pad and special ids included.
        target_vocab_size: number of target token ids, pad and special ids included.
        source_max_len: longest source sequence.
        target_max_len: longest decoder input (target length + 1 for BOS/EOS).
        num_encoder_layers: encoder blocks.
        num_decoder_layers: decoder blocks.
        d_model: width of the residual stream; a multiple of `num_heads`.
        num_heads: attention heads per attention layer.
        d_ff: hidden width of each feed-forward network.
        dropout: rate for attention probabilities, residual branches and
            embeddings, in `[0, 1)`.
        tie_embeddings: one embedding table for source and target tokens,
            also used (transposed) as the output projection. Needs
            `source_vocab_size == target_vocab_size` (one shared vocabulary).
        position_embedding: "sinusoidal" (Vaswani et al.) or "learned".
        layer_norm_epsilon: epsilon of every LayerNormalization, > 0.
        pad_id: the padding id of both sides; pad keys are never attended to.
        gelu: the feed-forward GELU, "exact" or "tanh".

    Raises:
        ValueError: a field is of the wrong type or out of range, with the
            value received and what is allowed.

    Example:

    >>> Seq2SeqConfig(source_vocab_size=100, target_vocab_size=120, source_max_len=20,
    ...               target_max_len=21).head_dim
    32
    """

    source_vocab_size: int
    target_vocab_size: int
    source_max_len: int
    target_max_len: int
    num_encoder_layers: int = 2
    num_decoder_layers: int = 2
    d_model: int = 128
    num_heads: int = 4
    d_ff: int = 512
    dropout: float = 0.0
    tie_embeddings: bool = False
    position_embedding: str = "sinusoidal"
    layer_norm_epsilon: float = 1e-5
    pad_id: int = 0
    gelu: str = "exact"

    def __post_init__(self):
        check_transformer_fields(self, _INT_FIELDS)
        for name in ("source_vocab_size", "target_vocab_size"):
            if getattr(self, name) < 2:
                raise ValueError(
                    f"Seq2SeqConfig.{name} must be >= 2 (a pad id and at least one real "
                    f"token), got {getattr(self, name)}.")
        if not isinstance(self.tie_embeddings, bool):
            raise ValueError(
                f"Seq2SeqConfig.tie_embeddings must be True or False, got "
                f"{self.tie_embeddings!r}.")
        if self.tie_embeddings and self.source_vocab_size != self.target_vocab_size:
            raise ValueError(
                f"Seq2SeqConfig.tie_embeddings=True needs one shared vocabulary, but "
                f"source_vocab_size={self.source_vocab_size} != target_vocab_size="
                f"{self.target_vocab_size}. Build one vocabulary for both languages, or set "
                f"tie_embeddings=False.")
        smallest = min(self.source_vocab_size, self.target_vocab_size)
        if not is_int(self.pad_id) or not 0 <= self.pad_id < smallest:
            raise ValueError(
                f"Seq2SeqConfig.pad_id must be an integer in [0, {smallest}) (below both "
                f"vocabulary sizes), got {self.pad_id!r}.")

    @property
    def head_dim(self):
        """Width of each attention head, `d_model // num_heads`."""
        return self.d_model // self.num_heads


SEQ2SEQ_SIZES = types.MappingProxyType({
    # Learns the embedded translation task on 2 CPU cores in about a minute: 200
    # Adam steps of 64 pairs of at most 10 source words took 35-41 s on 2 busy
    # cores and reached 0.81 greedy token accuracy (copying the source: 0.02);
    # 300 steps on pairs of up to 20 words, 99 s and 0.90.
    "tiny": types.MappingProxyType(dict(
        num_encoder_layers=2, num_decoder_layers=2, d_model=64, num_heads=4, d_ff=256,
        dropout=0.0)),
    "small": types.MappingProxyType(dict(
        num_encoder_layers=3, num_decoder_layers=3, d_model=256, num_heads=4, d_ff=1024,
        dropout=0.1)),
    # "Attention is all you need" base (Vaswani et al. 2017, Table 3).
    "base": types.MappingProxyType(dict(
        num_encoder_layers=6, num_decoder_layers=6, d_model=512, num_heads=8, d_ff=2048,
        dropout=0.1)),
    # "Attention is all you need" big.
    "big": types.MappingProxyType(dict(
        num_encoder_layers=6, num_decoder_layers=6, d_model=1024, num_heads=16, d_ff=4096,
        dropout=0.3)),
})
"""Named encoder-decoder architectures: size name -> the Seq2SeqConfig fields it sets."""


def seq2seq_config(size, source_vocab_size, target_vocab_size, source_max_len, target_max_len,
                   **overrides):
    """Returns the `Seq2SeqConfig` of a named size.

    Args:
        size: one of `SEQ2SEQ_SIZES`: "tiny", "small", "base", "big".
        source_vocab_size, target_vocab_size, source_max_len, target_max_len:
            from the data.
        **overrides: any other `Seq2SeqConfig` field (e.g. `tie_embeddings=True`).

    Raises:
        ValueError: unknown size or field, or an invalid value.

    Example:

    >>> seq2seq_config("base", 32000, 32000, 128, 129).num_encoder_layers
    6
    """
    if size not in SEQ2SEQ_SIZES:
        raise ValueError(
            f"Unknown seq2seq size {size!r}; choose one of {list(SEQ2SEQ_SIZES)}.")
    fields = [f.name for f in dataclasses.fields(Seq2SeqConfig)]
    unknown = sorted(set(overrides) - set(fields))
    if unknown:
        raise ValueError(f"Unknown Seq2SeqConfig field(s) {unknown}; the fields are {fields}.")
    values = dict(SEQ2SEQ_SIZES[size])
    values.update(overrides)
    return Seq2SeqConfig(source_vocab_size=source_vocab_size,
                         target_vocab_size=target_vocab_size, source_max_len=source_max_len,
                         target_max_len=target_max_len, **values)


@keras.saving.register_keras_serializable(package="tfdist")
class ReversibleEmbedding(keras.layers.Layer):
    """A token embedding that can also project vectors back onto the vocabulary.

    `layer(ids)` looks up `[..., d_model]` vectors; `layer(x, reverse=True)`
    returns the logits `x @ embeddings^T` (`[..., vocab_size]`). Calling one
    instance for the source, the target and the output ties all three.

    Args:
        vocab_size: number of token ids.
        d_model: embedding width.

    Example:

    >>> layer = ReversibleEmbedding(10, 4)
    >>> tuple(layer(layer(np.array([[1, 2]])), reverse=True).shape)
    (1, 2, 10)
    """

    def __init__(self, vocab_size, d_model, **kwargs):
        super().__init__(**kwargs)
        self.vocab_size = int(vocab_size)
        self.d_model = int(d_model)

    def build(self, input_shape=None):
        if self.built:
            return
        self.embeddings = self.add_weight(
            name="embeddings", shape=(self.vocab_size, self.d_model),
            initializer=keras.initializers.RandomNormal(stddev=self.d_model ** -0.5))
        self.built = True

    def call(self, inputs, reverse=False):
        if reverse:
            return ops.matmul(inputs, ops.transpose(ops.cast(self.embeddings, inputs.dtype)))
        return ops.take(ops.cast(self.embeddings, self.compute_dtype),
                        ops.cast(inputs, "int32"), axis=0)

    def compute_output_spec(self, inputs, reverse=False):
        if reverse:
            return keras.KerasTensor(tuple(inputs.shape[:-1]) + (self.vocab_size,),
                                     dtype=self.compute_dtype)
        return keras.KerasTensor(tuple(inputs.shape) + (self.d_model,), dtype=self.compute_dtype)

    def get_config(self):
        config = super().get_config()
        config.update({"vocab_size": self.vocab_size, "d_model": self.d_model})
        return config


@keras.saving.register_keras_serializable(package="tfdist")
class AddPositions(keras.layers.Layer):
    """Adds positions to token vectors, then dropout.

    Sinusoidal positions (Vaswani et al.) scale the token vectors by
    `sqrt(d_model)` first; learned positions are added unscaled.

    Args:
        max_len: longest sequence accepted.
        d_model: vector width.
        position_embedding: "sinusoidal" or "learned".
        dropout: rate applied to the sum in training.

    Example:

    >>> tuple(AddPositions(8, 4)(np.zeros((2, 5, 4), "float32")).shape)
    (2, 5, 4)
    """

    def __init__(self, max_len, d_model, position_embedding="sinusoidal", dropout=0.0,
                 **kwargs):
        super().__init__(**kwargs)
        if position_embedding not in POSITION_EMBEDDINGS:
            raise ValueError(f"position_embedding={position_embedding!r} is not supported; "
                             f"choose one of {list(POSITION_EMBEDDINGS)}.")
        self.max_len = int(max_len)
        self.d_model = int(d_model)
        self.position_embedding = position_embedding
        self.dropout = float(dropout)
        self.dropout_layer = BitsDropout(self.dropout, dtype=self.dtype_policy)

    def build(self, input_shape):
        if input_shape[-2] is not None and input_shape[-2] > self.max_len:
            raise ValueError(
                f"Sequences of length {input_shape[-2]} are longer than max_len="
                f"{self.max_len}; build the model with a larger max length.")
        if self.position_embedding == "learned":
            self.positions = self.add_weight(
                name="positions", shape=(self.max_len, self.d_model),
                initializer=keras.initializers.RandomUniform(-0.05, 0.05))
        else:
            self.sinusoids = sinusoidal_position_table(self.max_len, self.d_model)
        self.built = True

    def call(self, tokens, training=None):
        seq_len = ops.shape(tokens)[-2]
        if self.position_embedding == "learned":
            positions = ops.cast(self.positions, tokens.dtype)
        else:
            tokens = tokens * ops.cast(math.sqrt(self.d_model), tokens.dtype)
            positions = ops.convert_to_tensor(self.sinusoids, dtype=tokens.dtype)
        positions = ops.slice(positions, (0, 0), (seq_len, self.d_model))
        return self.dropout_layer(tokens + positions[None], training=training)

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        config = super().get_config()
        config.update({"max_len": self.max_len, "d_model": self.d_model,
                       "position_embedding": self.position_embedding, "dropout": self.dropout})
        return config


class _Block(keras.layers.Layer):
    """Shared pieces of the encoder and decoder blocks (sublayers, config)."""

    def __init__(self, d_model, num_heads, d_ff, dropout=0.0, layer_norm_epsilon=1e-5,
                 gelu="exact", **kwargs):
        super().__init__(**kwargs)
        if d_model % num_heads:
            raise ValueError(f"d_model={d_model} must be divisible by num_heads={num_heads}.")
        if gelu not in GELU_FORMS:
            raise ValueError(f"gelu={gelu!r} is not supported; choose one of {list(GELU_FORMS)}.")
        self.d_model, self.num_heads, self.d_ff = int(d_model), int(num_heads), int(d_ff)
        self.dropout = float(dropout)
        self.layer_norm_epsilon = float(layer_norm_epsilon)
        self.gelu = gelu
        policy = self.dtype_policy
        self.self_attention_norm = self._norm("self_attention_norm")
        self.self_attention = self._attention("self_attention")
        self.ffn_norm = self._norm("ffn_norm")
        self.ffn_in = keras.layers.Dense(self.d_ff, activation=GELU_FORMS[gelu], dtype=policy,
                                         name="ffn_in")
        self.ffn_out = keras.layers.Dense(self.d_model, dtype=policy, name="ffn_out")
        self.residual_dropout = BitsDropout(self.dropout, dtype=policy)

    def _norm(self, name):
        return LayerNormalization(epsilon=self.layer_norm_epsilon, dtype=self.dtype_policy,
                                  name=name)

    def _attention(self, name):
        return keras.layers.MultiHeadAttention(
            num_heads=self.num_heads, key_dim=self.d_model // self.num_heads,
            dropout=self.dropout, dtype=self.dtype_policy, name=name)

    def _feed_forward(self, x, training):
        h = self.ffn_out(self.ffn_in(self.ffn_norm(x)))
        return x + self.residual_dropout(h, training=training)

    def compute_output_shape(self, input_shape, *args, **kwargs):
        return input_shape

    def get_config(self):
        config = super().get_config()
        config.update({"d_model": self.d_model, "num_heads": self.num_heads, "d_ff": self.d_ff,
                       "dropout": self.dropout, "layer_norm_epsilon": self.layer_norm_epsilon,
                       "gelu": self.gelu})
        return config


@keras.saving.register_keras_serializable(package="tfdist")
class EncoderBlock(_Block):
    """A pre-LayerNorm Transformer encoder block: bidirectional self-attention, then FFN.

    `x + Dropout(MHA(LN(x)))` with no key at a source pad, then
    `x + Dropout(FFN(LN(x)))`.

    Args:
        d_model, num_heads, d_ff, dropout, layer_norm_epsilon, gelu: as in
            `Seq2SeqConfig`.

    Call args:
        x: float `[batch, source_len, d_model]`.
        padding_mask: optional bool `[batch, source_len]`, True at real tokens.
        training: enables dropout.

    Example:

    >>> block = EncoderBlock(d_model=16, num_heads=2, d_ff=32)
    >>> tuple(block(np.zeros((2, 5, 16), "float32")).shape)
    (2, 5, 16)
    """

    def build(self, input_shape):
        self.self_attention_norm.build(input_shape)
        self.self_attention.build(input_shape, input_shape)
        use_bits_dropout(self.self_attention)
        self.ffn_norm.build(input_shape)
        self.ffn_in.build(input_shape)
        self.ffn_out.build(tuple(input_shape[:-1]) + (self.d_ff,))
        self.built = True

    def call(self, x, padding_mask=None, training=None):
        h = self.self_attention_norm(x)
        h = self.self_attention(h, h, value_mask=padding_mask, training=training)
        x = x + self.residual_dropout(h, training=training)
        return self._feed_forward(x, training)


@keras.saving.register_keras_serializable(package="tfdist")
class CrossAttentionDecoderBlock(_Block):
    """A pre-LayerNorm decoder block: causal self-attention, cross-attention, FFN.

    `x + Dropout(MHA(LN(x)))` causal and with no key at a target pad, then
    `x + Dropout(MHA(LN(x), encoder_output))` with no key at a source pad,
    then `x + Dropout(FFN(LN(x)))`.

    Args:
        d_model, num_heads, d_ff, dropout, layer_norm_epsilon, gelu: as in
            `Seq2SeqConfig`.

    Call args:
        x: float `[batch, target_len, d_model]`.
        encoder_output: float `[batch, source_len, d_model]`.
        target_mask: optional bool `[batch, target_len]`, True at real tokens.
        source_mask: optional bool `[batch, source_len]`, True at real tokens.
        training: enables dropout.

    Example:

    >>> block = CrossAttentionDecoderBlock(d_model=16, num_heads=2, d_ff=32)
    >>> tuple(block(np.zeros((2, 5, 16), "float32"), np.zeros((2, 7, 16), "float32")).shape)
    (2, 5, 16)
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.cross_attention_norm = self._norm("cross_attention_norm")
        self.cross_attention = self._attention("cross_attention")

    def build(self, x_shape, encoder_output_shape=None):
        if encoder_output_shape is None:
            encoder_output_shape = x_shape
        self.self_attention_norm.build(x_shape)
        self.self_attention.build(x_shape, x_shape)
        use_bits_dropout(self.self_attention)
        self.cross_attention_norm.build(x_shape)
        self.cross_attention.build(x_shape, encoder_output_shape)
        use_bits_dropout(self.cross_attention)
        self.ffn_norm.build(x_shape)
        self.ffn_in.build(x_shape)
        self.ffn_out.build(tuple(x_shape[:-1]) + (self.d_ff,))
        self.built = True

    def call(self, x, encoder_output, target_mask=None, source_mask=None, training=None):
        h = self.self_attention_norm(x)
        h = self.self_attention(h, h, value_mask=target_mask, use_causal_mask=True,
                                training=training)
        x = x + self.residual_dropout(h, training=training)
        h = self.cross_attention(self.cross_attention_norm(x), encoder_output,
                                 value_mask=source_mask, training=training)
        x = x + self.residual_dropout(h, training=training)
        return self._feed_forward(x, training)


def _check_config(config):
    if not isinstance(config, Seq2SeqConfig):
        raise TypeError(
            f"Expected a tfdist.models.Seq2SeqConfig, got {type(config).__name__}; make one "
            "with seq2seq_config(size, source_vocab_size, target_vocab_size, source_max_len, "
            "target_max_len).")


def build_seq2seq(config, name="seq2seq"):
    """Builds the encoder-decoder Transformer of `config`.

    Layers follow the global `keras.mixed_precision` policy except the final
    `logits` Activation, which is float32 (as in `build_decoder_lm`), so the
    softmax and the loss run in float32 under a mixed policy.

    Args:
        config: a `Seq2SeqConfig`.
        name: the model's name.

    Returns:
        A functional `keras.Model` with inputs `(source_ids [batch, S],
        target_input_ids [batch, T])` (int32, S <= source_max_len, T <=
        target_max_len) and float32 logits `[batch, T, target_vocab_size]`;
        the logits at target position t depend on target tokens 0..t and on
        the non-pad source tokens only.

    Example:

    >>> model = build_seq2seq(seq2seq_config("tiny", 50, 60, 10, 12))
    >>> tuple(model((np.ones((2, 10), "int32"), np.ones((2, 12), "int32"))).shape)
    (2, 12, 60)
    """
    _check_config(config)
    source_ids = keras.Input(shape=(None,), dtype="int32", name="source_ids")
    target_ids = keras.Input(shape=(None,), dtype="int32", name="target_input_ids")
    source_mask = PaddingMask(config.pad_id, name="source_padding_mask")(source_ids)
    target_mask = PaddingMask(config.pad_id, name="target_padding_mask")(target_ids)
    if config.tie_embeddings:
        source_embedding = target_embedding = ReversibleEmbedding(
            config.source_vocab_size, config.d_model, name="shared_embedding")
    else:
        source_embedding = ReversibleEmbedding(config.source_vocab_size, config.d_model,
                                               name="source_embedding")
        target_embedding = ReversibleEmbedding(config.target_vocab_size, config.d_model,
                                               name="target_embedding")
    block_args = dict(d_model=config.d_model, num_heads=config.num_heads, d_ff=config.d_ff,
                      dropout=config.dropout, layer_norm_epsilon=config.layer_norm_epsilon,
                      gelu=config.gelu)

    x = AddPositions(config.source_max_len, config.d_model, config.position_embedding,
                     config.dropout, name="source_positions")(source_embedding(source_ids))
    for i in range(config.num_encoder_layers):
        x = EncoderBlock(**block_args, name=f"encoder_block_{i}")(x, padding_mask=source_mask)
    encoder_output = LayerNormalization(
        epsilon=config.layer_norm_epsilon, name="encoder_final_norm")(x)

    y = AddPositions(config.target_max_len, config.d_model, config.position_embedding,
                     config.dropout, name="target_positions")(target_embedding(target_ids))
    for i in range(config.num_decoder_layers):
        y = CrossAttentionDecoderBlock(**block_args, name=f"decoder_block_{i}")(
            y, encoder_output, target_mask=target_mask, source_mask=source_mask)
    y = LayerNormalization(epsilon=config.layer_norm_epsilon, name="decoder_final_norm")(y)
    if config.tie_embeddings:
        y = target_embedding(y, reverse=True)
    else:
        y = keras.layers.Dense(config.target_vocab_size, name="output_projection")(y)
    logits = keras.layers.Activation("linear", dtype="float32", name="logits")(y)
    return keras.Model((source_ids, target_ids), logits, name=name)
