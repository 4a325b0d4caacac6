"""An embedding table split by rows into shards, one ordinary variable each.

Under `ParameterServerStrategy` each variable lives whole on one ps task
(round-robin), so a large table held in one variable sits on one ps task with
its optimizer slots. TensorFlow's own `variable_partitioner` would split it,
but a partitioned (`ShardedVariable`) Keras 3 weight cannot be
differentiated (`'ShardedVariable' object has no attribute 'handle'`) and
Keras's optimizer keeps its slots whole. `ShardedEmbedding` splits the table
itself: shard i holds a contiguous block of rows (TensorFlow's "div"
partitioning, the first `input_dim % num_shards` shards one row longer), so
the ps tasks share the table, its gradient (only the rows looked up, as
`IndexedSlices`) and its optimizer slots. Lookups give exactly what
`keras.layers.Embedding` gives on the concatenated table.
"""

import keras
import tensorflow as tf


@keras.saving.register_keras_serializable(package="tfdist")
class ShardedEmbedding(keras.layers.Layer):
    """`keras.layers.Embedding` whose table is `num_shards` row blocks.

    Args:
        input_dim: vocabulary size (rows of the whole table), >= `num_shards`.
        output_dim: embedding width.
        num_shards: number of row blocks (e.g. the number of ps tasks), >= 1.
        embeddings_initializer: initializer of every shard (Keras's default
            "uniform" as in `Embedding`).
        **kwargs: `keras.layers.Layer` arguments (name, dtype policy).

    Example:

    >>> layer = ShardedEmbedding(10, 4, num_shards=3)
    >>> layer.shard_rows()
    [4, 3, 3]
    >>> tuple(layer(np.array([[0, 9]])).shape)
    (1, 2, 4)
    """

    def __init__(self, input_dim, output_dim, num_shards, embeddings_initializer="uniform",
                 **kwargs):
        super().__init__(**kwargs)
        for name, value, least in (("input_dim", input_dim, 1), ("output_dim", output_dim, 1),
                                   ("num_shards", num_shards, 1)):
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ValueError(f"ShardedEmbedding {name} must be an integer >= {least}, "
                                 f"got {value!r}.")
        if num_shards > input_dim:
            raise ValueError(f"ShardedEmbedding num_shards={num_shards} is more than the "
                             f"{input_dim} rows of the table; use at most {input_dim} shards.")
        self.input_dim = input_dim
        self.output_dim = output_dim
        self.num_shards = num_shards
        self.embeddings_initializer = keras.initializers.get(embeddings_initializer)
        self.shards = []

    def shard_rows(self):
        """Rows of each shard ("div" partitioning: the first shards take the remainder).

        Example:

        >>> ShardedEmbedding(10, 4, num_shards=3).shard_rows()
        [4, 3, 3]
        """
        base, extra = divmod(self.input_dim, self.num_shards)
        return [base + (1 if i < extra else 0) for i in range(self.num_shards)]

    def build(self, input_shape=None):
        self.shards = [
            self.add_weight(name=f"shard_{i}", shape=(rows, self.output_dim),
                            initializer=self.embeddings_initializer, autocast=False)
            for i, rows in enumerate(self.shard_rows())]
        self.built = True

    def call(self, inputs):
        ids = tf.cast(inputs, "int32") if inputs.dtype not in (tf.int32, tf.int64) else inputs
        vectors = tf.nn.embedding_lookup([shard.value for shard in self.shards], ids)
        return tf.cast(vectors, self.compute_dtype)

    def compute_output_shape(self, input_shape):
        return tuple(input_shape) + (self.output_dim,)

    def get_config(self):
        config = super().get_config()
        config.update(input_dim=self.input_dim, output_dim=self.output_dim,
                      num_shards=self.num_shards,
                      embeddings_initializer=keras.initializers.serialize(
                          self.embeddings_initializer))
        return config
