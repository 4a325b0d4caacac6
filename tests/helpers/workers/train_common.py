"""Models, data, strategies and small Keras helpers shared by the training and
callback tests and their worker scripts.

Everything here is deterministic without relying on random seeds: weights and
data come from numpy `RandomState`s, so a worker process and the test process
build exactly the same model and batches.
"""


import json

import keras
import numpy as np
import tensorflow as tf

from tfdist.distribute.strategy_factory import create_strategy

FEATURES = 4
TARGETS = 3
VOCAB = 11
SEQ = 6

def mirrored(num_devices):
    """A fresh `MirroredStrategy` over the first `num_devices` logical CPUs,
    from tfdist's factory (which gives each strategy its own collective keys)."""
    return create_strategy("mirrored", devices=[f"/cpu:{i}" for i in range(num_devices)])


def set_deterministic_weights(model, seed=0):
    """Overwrites every weight of `model` with values from a fixed RandomState."""
    rs = np.random.RandomState(seed)
    model.set_weights([(0.5 * rs.standard_normal(w.shape)).astype(w.dtype)
                       for w in model.get_weights()])


def dense_model(strategy, seed=0, regularized=False, dtype=None):
    """A tiny regression MLP created and built in `strategy.scope()`."""
    with strategy.scope():
        reg = keras.regularizers.L2(0.01) if regularized else None
        model = keras.Sequential([
            keras.Input((FEATURES,)),
            keras.layers.Dense(8, activation="tanh", kernel_regularizer=reg, dtype=dtype),
            keras.layers.Dense(TARGETS, dtype=dtype),
        ])
    set_deterministic_weights(model, seed)
    return model


def token_model(strategy, seed=0):
    """A tiny masked "language model": Embedding(mask_zero) -> Dense(VOCAB)."""
    with strategy.scope():
        model = keras.Sequential([
            keras.Input((SEQ,), dtype="int32"),
            keras.layers.Embedding(VOCAB, 8, mask_zero=True),
            keras.layers.Dense(VOCAB),
        ])
    set_deterministic_weights(model, seed)
    return model


def regression_arrays(n=70, seed=1, weighted=False):
    """`(x, y)` or `(x, y, sample_weight)` numpy arrays; weights in [0, 2), some 0."""
    rs = np.random.RandomState(seed)
    x = rs.standard_normal((n, FEATURES)).astype("float32")
    y = np.tanh(x @ rs.standard_normal((FEATURES, TARGETS))).astype("float32")
    if not weighted:
        return x, y
    sample_weight = rs.uniform(0, 2, size=(n,)).astype("float32")
    sample_weight[rs.uniform(size=n) < 0.3] = 0.0
    return x, y, sample_weight


def token_arrays(n=40, seed=2, vocab=VOCAB, seq=SEQ):
    """Padded token sequences (0 = padding, lengths 1..seq: uneven masks) and next-token targets."""
    rs = np.random.RandomState(seed)
    lengths = rs.randint(1, seq + 1, size=n)
    tokens = rs.randint(1, vocab, size=(n, seq)).astype("int32")
    tokens[np.arange(seq)[None, :] >= lengths[:, None]] = 0
    targets = np.roll(tokens, -1, axis=1)
    targets[:, -1] = 0
    return tokens, targets


def dataset(arrays, global_batch):
    """A `tf.data.Dataset` of the arrays batched with the global batch size."""
    return tf.data.Dataset.from_tensor_slices(arrays).batch(global_batch)


def weights_of(model):
    return [np.array(w) for w in model.get_weights()]


def max_rel_diff(a, b):
    """Largest |a - b| / max(|b|, 1e-6 scale) over lists of arrays."""
    return max(float(np.max(np.abs(x - y) / (np.abs(y) + 1e-6))) for x, y in zip(a, b, strict=True))


def load_weights(path):
    """The arrays of an `.npz` file written by `np.savez(path, *weights)`, in order."""
    with np.load(path) as z:
        return [z[f"arr_{i}"] for i in range(len(z.files))]


def load_json(path):
    with open(path) as f:
        return json.load(f)


class OnReadCounter(keras.layers.Layer):
    """Counts the examples it sees in an ON_READ variable (summed across replicas on read)."""

    def build(self, input_shape):
        self.count = keras.Variable(0.0, trainable=False, synchronization="on_read",
                                    aggregation="sum", name="count")

    def call(self, x):
        self.count.assign_add(tf.cast(tf.shape(x)[0], "float32"))
        return x


class PoisonWeights(keras.callbacks.Callback):
    """Sets a Dense kernel (`model.layers[layer]`) to NaN just before batch
    `batch` of epoch `epoch` runs."""

    def __init__(self, epoch, batch, layer=-1):
        super().__init__()
        self.epoch, self.batch, self.layer, self._current = epoch, batch, layer, None

    def on_epoch_begin(self, epoch, logs=None):
        self._current = epoch

    def on_train_batch_begin(self, batch, logs=None):
        if (self._current, batch) == (self.epoch, self.batch):
            kernel = self.model.layers[self.layer].kernel
            kernel.assign(np.full(kernel.shape, np.nan, "float32"))
