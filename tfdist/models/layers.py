"""Keras 3 layers of tfdist's Transformer models.

Written with `keras.layers` and `keras.ops` only (the feed-forward GELUs
come XLA-compiled from `tfdist.models.activations`, the layer norms with
their gradient written out from `tfdist.models.layer_norm`), registered for
serialisation under the package name "tfdist", so a `.keras` file that holds
them loads back with `keras.saving.load_model` once `tfdist.models` has been
imported.
"""

import math

import keras
import numpy as np
from keras import ops

from tfdist.models.activations import GELU_FORMS
from tfdist.models.dropout import BitsDropout, use_bits_dropout
from tfdist.models.layer_norm import LayerNormalization
from tfdist.models.sharded_embedding import ShardedEmbedding
from tfdist.runtime.argtypes import check_int_at_least

POSITION_EMBEDDINGS = ("learned", "sinusoidal")


def sinusoidal_position_table(max_len, d_model):
    """Returns the fixed sine/cosine position table of Vaswani et al. (2017).

    Row `p` holds `sin(p / 10000^(2i/d))` in its first `ceil(d/2)` columns and
    `cos(p / 10000^(2i/d))` in the rest (concatenated, not interleaved).

    Args:
        max_len: number of positions (rows).
        d_model: width of each position vector (columns).

    Returns:
        A float32 numpy array of shape `(max_len, d_model)`.

    Example:

    >>> sinusoidal_position_table(4, 6).shape
    (4, 6)
    """
    half = (d_model + 1) // 2
    positions = np.arange(max_len, dtype=np.float64)[:, None]
    rates = 1.0 / np.power(10000.0, 2.0 * np.arange(half, dtype=np.float64) / d_model)
    angles = positions * rates[None, :]
    table = np.concatenate([np.sin(angles), np.cos(angles)], axis=-1)
    return table[:, :d_model].astype("float32")


@keras.saving.register_keras_serializable(package="tfdist")
class PaddingMask(keras.layers.Layer):
    """Turns token ids into a boolean mask that is True at real (non-pad) tokens.

    Args:
        pad_id: the id of the padding token.

    Example:

    >>> PaddingMask(pad_id=0)(np.array([[5, 6, 0]])).numpy().tolist()
    [[True, True, False]]
    """

    def __init__(self, pad_id=0, **kwargs):
        super().__init__(**kwargs)
        self.pad_id = int(check_int_at_least("pad_id", pad_id, 0))
        self.built = True

    def call(self, token_ids):
        return ops.not_equal(token_ids, self.pad_id)

    def compute_output_shape(self, input_shape):
        return input_shape

    def compute_output_spec(self, token_ids):
        return keras.KerasTensor(token_ids.shape, dtype="bool")

    def get_config(self):
        config = super().get_config()
        config.update({"pad_id": self.pad_id})
        return config


@keras.saving.register_keras_serializable(package="tfdist")
class TokenAndPositionEmbedding(keras.layers.Layer):
    """Token embedding plus a learned or sinusoidal position embedding.

    Maps int token ids `[batch, seq_len]` to vectors `[batch, seq_len,
    d_model]`; `seq_len` may be anything up to `max_len`. With sinusoidal
    positions the token vectors are scaled by `sqrt(d_model)` as in Vaswani
    et al. (2017), so that the fixed, unit-amplitude position signal does not
    swamp them; learned positions are added unscaled (as in GPT-2).

    Args:
        vocab_size: number of token ids.
        max_len: longest sequence the layer accepts.
        d_model: embedding width.
        position_embedding: "learned" or "sinusoidal".
        dropout: dropout rate applied to the sum, in training only.
        embedding_shards: split the token table into this many row blocks
            (`ShardedEmbedding`, e.g. one per parameter server); 1 keeps one
            `keras.layers.Embedding`.

    Example:

    >>> layer = TokenAndPositionEmbedding(vocab_size=20, max_len=8, d_model=16)
    >>> tuple(layer(np.ones((2, 5), "int32")).shape)
    (2, 5, 16)
    """

    def __init__(self, vocab_size, max_len, d_model, position_embedding="learned",
                 dropout=0.0, embedding_shards=1, **kwargs):
        super().__init__(**kwargs)
        if position_embedding not in POSITION_EMBEDDINGS:
            raise ValueError(
                f"position_embedding={position_embedding!r} is not supported; "
                f"choose one of {list(POSITION_EMBEDDINGS)}."
            )
        self.vocab_size = int(vocab_size)
        self.max_len = int(max_len)
        self.d_model = int(d_model)
        self.position_embedding = position_embedding
        self.dropout = float(dropout)
        self.embedding_shards = int(embedding_shards)
        if self.embedding_shards > 1:
            self.token_embedding = ShardedEmbedding(
                self.vocab_size, self.d_model, self.embedding_shards, dtype=self.dtype_policy,
                name="token_embedding")
        else:
            self.token_embedding = keras.layers.Embedding(
                self.vocab_size, self.d_model, dtype=self.dtype_policy, name="token_embedding")
        self.dropout_layer = BitsDropout(self.dropout, dtype=self.dtype_policy)
        self._sinusoids = None

    def build(self, input_shape):
        self._check_length(input_shape[-1])
        self.token_embedding.build(input_shape)
        if self.position_embedding == "learned":
            self.positions = self.add_weight(
                name="positions",
                shape=(self.max_len, self.d_model),
                initializer=keras.initializers.RandomUniform(-0.05, 0.05),
            )
        else:
            self._sinusoids = sinusoidal_position_table(self.max_len, self.d_model)
        self.built = True

    def _check_length(self, seq_len):
        if seq_len is not None and seq_len > self.max_len:
            raise ValueError(
                f"Sequences of length {seq_len} are longer than max_len="
                f"{self.max_len} of this model; use sequences of at most "
                f"{self.max_len} tokens or build the model with a larger max_len."
            )

    def call(self, token_ids, training=None):
        self._check_length(token_ids.shape[-1])
        seq_len = ops.shape(token_ids)[-1]
        tokens = self.token_embedding(token_ids)
        if self.position_embedding == "learned":
            positions = ops.cast(self.positions, tokens.dtype)
        else:
            tokens = tokens * ops.cast(math.sqrt(self.d_model), tokens.dtype)
            positions = ops.convert_to_tensor(self._sinusoids, dtype=tokens.dtype)
        positions = ops.slice(positions, (0, 0), (seq_len, self.d_model))
        return self.dropout_layer(tokens + positions[None, :, :], training=training)

    def compute_output_shape(self, input_shape):
        return tuple(input_shape) + (self.d_model,)

    def get_config(self):
        config = super().get_config()
        config.update({
            "vocab_size": self.vocab_size,
            "max_len": self.max_len,
            "d_model": self.d_model,
            "position_embedding": self.position_embedding,
            "dropout": self.dropout,
            "embedding_shards": self.embedding_shards,
        })
        return config


@keras.saving.register_keras_serializable(package="tfdist")
class DecoderBlock(keras.layers.Layer):
    """A pre-LayerNorm Transformer decoder block with causal self-attention.

    `x + Dropout(MHA(LN(x)))` with a causal mask (and, if given, a padding mask
    on the keys), then `x + Dropout(FFN(LN(x)))` with a GELU feed-forward
    network `Dense(d_ff, gelu) -> Dense(d_model)` (Radford et al. 2019,
    Xiong et al. 2020).

    Args:
        d_model: width of the residual stream.
        num_heads: attention heads; must divide `d_model`.
        d_ff: hidden width of the feed-forward network.
        dropout: rate for the attention probabilities and both residual
            branches.
        layer_norm_epsilon: epsilon of both LayerNormalizations.
        gelu: the feed-forward GELU, "exact" (erf) or "tanh" (`gelu_tanh`,
            faster, within 1e-3).

    Call args:
        x: float tensor `[batch, seq_len, d_model]`.
        padding_mask: optional bool tensor `[batch, seq_len]`, True at real
            tokens; no position attends to a key where it is False.
        training: Python bool, enables dropout.

    Example:

    >>> block = DecoderBlock(d_model=16, num_heads=2, d_ff=32)
    >>> tuple(block(np.zeros((2, 5, 16), "float32")).shape)
    (2, 5, 16)
    """

    def __init__(self, d_model, num_heads, d_ff, dropout=0.0, layer_norm_epsilon=1e-5,
                 gelu="exact", **kwargs):
        super().__init__(**kwargs)
        if d_model % num_heads:
            raise ValueError(
                f"d_model={d_model} must be divisible by num_heads={num_heads}.")
        if gelu not in GELU_FORMS:
            raise ValueError(f"gelu={gelu!r} is not supported; choose one of {list(GELU_FORMS)}.")
        self.gelu = gelu
        self.d_model = int(d_model)
        self.num_heads = int(num_heads)
        self.d_ff = int(d_ff)
        self.dropout = float(dropout)
        self.layer_norm_epsilon = float(layer_norm_epsilon)
        policy = self.dtype_policy
        self.attention_norm = LayerNormalization(
            epsilon=self.layer_norm_epsilon, dtype=policy, name="attention_norm")
        self.attention = keras.layers.MultiHeadAttention(
            num_heads=self.num_heads, key_dim=self.d_model // self.num_heads,
            dropout=self.dropout, dtype=policy, name="attention")
        self.attention_dropout = BitsDropout(self.dropout, dtype=policy)
        self.ffn_norm = LayerNormalization(
            epsilon=self.layer_norm_epsilon, dtype=policy, name="ffn_norm")
        self.ffn_in = keras.layers.Dense(self.d_ff, activation=GELU_FORMS[gelu], dtype=policy,
                                         name="ffn_in")
        self.ffn_out = keras.layers.Dense(self.d_model, dtype=policy, name="ffn_out")
        self.ffn_dropout = BitsDropout(self.dropout, dtype=policy)

    def build(self, input_shape):
        if input_shape[-1] != self.d_model:
            raise ValueError(
                f"DecoderBlock(d_model={self.d_model}) got inputs of width "
                f"{input_shape[-1]} (shape {tuple(input_shape)}); the last axis must "
                f"be d_model.")
        self.attention_norm.build(input_shape)
        self.attention.build(input_shape, input_shape)
        use_bits_dropout(self.attention)
        self.ffn_norm.build(input_shape)
        self.ffn_in.build(input_shape)
        self.ffn_out.build(tuple(input_shape[:-1]) + (self.d_ff,))
        self.built = True

    def call(self, x, padding_mask=None, training=None):
        h = self.attention_norm(x)
        h = self.attention(h, h, value_mask=padding_mask, use_causal_mask=True,
                           training=training)
        x = x + self.attention_dropout(h, training=training)
        h = self.ffn_out(self.ffn_in(self.ffn_norm(x)))
        return x + self.ffn_dropout(h, training=training)

    def get_config(self):
        config = super().get_config()
        config.update({
            "d_model": self.d_model,
            "num_heads": self.num_heads,
            "d_ff": self.d_ff,
            "gelu": self.gelu,
            "dropout": self.dropout,
            "layer_norm_epsilon": self.layer_norm_epsilon,
        })
        return config
