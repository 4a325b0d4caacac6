"""A token embedding split by vocabulary (its table's rows) over K devices.

`keras.layers.Embedding(V, d)` laid out `("model", None)`: device i holds
rows `i*V/K .. (i+1)*V/K` of the table. Each device looks up the ids that
fall in its rows (the others give zero vectors), and the K partial lookups
are summed on the first device (`sum_partial_products`): one sum of
`[batch, seq, d]` forward, as Megatron-LM's vocabulary-parallel embedding.
Backward, each shard's gradient is the upstream gradient at its own ids (an
`IndexedSlices`, as for `Embedding`), applied to its rows on its device. A
lookup costs no arithmetic, so, unlike the split matmuls, the backward's
masking is left where TensorFlow puts it (the first device).

Example:

    layer = VocabParallelEmbedding.from_embedding(model.get_layer("embedding").token_embedding,
                                                  ["/device:CPU:0", "/device:CPU:1"])
"""

import keras
import numpy as np
import tensorflow as tf

from tfdist.training.tensor_parallel.layers import sum_partial_products


@keras.saving.register_keras_serializable(package="tfdist")
class VocabParallelEmbedding(keras.layers.Layer):
    """`keras.layers.Embedding` whose table is split by rows over K devices.

    Args:
        input_dim: the vocabulary (rows of the whole table); K must divide it.
        output_dim: the embedding width.
        devices: the K device names; shard i holds rows `i*V/K .. (i+1)*V/K`.
        mask_zero: as in `keras.layers.Embedding`.
        embeddings_initializer: as in `keras.layers.Embedding` (used only when
            no weights are loaded).
        **kwargs: `keras.layers.Layer` arguments (`name`, `dtype`, ...).

    Example:

    >>> layer = VocabParallelEmbedding(20, 8, ["/device:CPU:0", "/device:CPU:1"])
    >>> layer(np.array([[0, 19]])).shape
    TensorShape([1, 2, 8])
    """

    def __init__(self, input_dim, output_dim, devices, mask_zero=False,
                 embeddings_initializer="uniform", **kwargs):
        super().__init__(**kwargs)
        self.input_dim = int(input_dim)
        self.output_dim = int(output_dim)
        self.devices = list(devices)
        self.mask_zero = bool(mask_zero)
        self.embeddings_initializer = keras.initializers.get(embeddings_initializer)
        if self.input_dim % len(self.devices):
            raise ValueError(
                f"The embedding {self.name!r} has {self.input_dim} rows (its vocabulary), which "
                f"do not divide by {len(self.devices)} devices. Lay out only embeddings whose "
                "vocabulary divides by the tensor-parallel degree.")
        self.tables = []
        self.supports_masking = self.mask_zero

    @classmethod
    def from_embedding(cls, layer, devices):
        """The split of `layer`, a `keras.layers.Embedding` (same name, dtype policy, masking).

        Example:

        >>> VocabParallelEmbedding.from_embedding(keras.layers.Embedding(20, 8), devices)
        <VocabParallelEmbedding name=embedding, built=False>
        """
        return cls(layer.input_dim, layer.output_dim, devices, mask_zero=layer.mask_zero,
                   embeddings_initializer=layer.embeddings_initializer, name=layer.name,
                   dtype=layer.dtype_policy, trainable=layer.trainable)

    @property
    def rows_per_shard(self):
        """The rows (vocabulary entries) each device holds.

        Example:

        >>> VocabParallelEmbedding(20, 8, devices).rows_per_shard
        10
        """
        return self.input_dim // len(self.devices)

    def build(self, input_shape=None):
        for index, device in enumerate(self.devices):
            with tf.device(device):
                self.tables.append(self.add_weight(
                    name=f"embeddings_shard_{index}", shape=(self.rows_per_shard, self.output_dim),
                    initializer=self.embeddings_initializer))
        self.built = True

    def call(self, inputs):
        ids = tf.cast(inputs, tf.int32) if inputs.dtype not in (tf.int32, tf.int64) else inputs
        rows = self.rows_per_shard
        partials = []
        for index, (device, table) in enumerate(zip(self.devices, self.tables, strict=True)):
            with tf.device(device):
                local = ids - tf.cast(index * rows, ids.dtype)
                inside = tf.logical_and(local >= 0, local < rows)
                found = tf.gather(table, tf.where(inside, local, tf.zeros_like(local)))
                found = found * tf.cast(inside, found.dtype)[..., tf.newaxis]
                partials.append(tf.cast(found, self.compute_dtype))
        with tf.device(self.devices[0]):
            return sum_partial_products(partials)

    def compute_mask(self, inputs, mask=None):
        if not self.mask_zero:
            return None
        return tf.not_equal(inputs, 0)

    def compute_output_shape(self, input_shape):
        return tuple(input_shape) + (self.output_dim,)

    def load_from(self, embedding):
        """Loads the table of `embedding`, the `keras.layers.Embedding` this layer splits.

        Example:

        >>> layer.load_from(model.get_layer("embedding").token_embedding)
        """
        for table, rows in zip(self.tables, np.split(np.asarray(embedding.embeddings),
                                                     len(self.devices)), strict=True):
            table.assign(rows)

    def gather_into(self, embedding):
        """Writes the gathered table into `embedding` (the Embedding this layer splits).

        Example:

        >>> layer.gather_into(model.get_layer("embedding").token_embedding)
        """
        embedding.embeddings.assign(np.concatenate([np.asarray(t) for t in self.tables]))

    def get_config(self):
        config = super().get_config()
        config.update({"input_dim": self.input_dim, "output_dim": self.output_dim,
                       "devices": self.devices, "mask_zero": self.mask_zero,
                       "embeddings_initializer":
                           keras.initializers.serialize(self.embeddings_initializer)})
        return config
