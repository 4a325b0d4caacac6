"""The small Functional MLP the tensor-parallel tests split, its hand-written layout and data.

`mlp()` has a Megatron pair (`up` column-parallel, `down` row-parallel) with a
skip around it and a second pair (`wide`, `narrow`) with an `Activation`
layer between; `layout()` is the Keras `LayoutMap` that splits both pairs.
"""

import keras
import numpy as np

FEATURES, CLASSES, ROWS, BATCH = 12, 5, 64, 16


def mlp(optimizer=None, seed=3):
    """Input -> [up (column) -> down (row)] Megatron pair + skip -> [wide (column) ->
    Activation layer -> narrow (row)] -> head (replicated)."""
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((FEATURES,), name="features")
    hidden = keras.layers.Dense(32, activation="gelu", name="up")(inputs)
    back = keras.layers.Dense(FEATURES, name="down")(hidden)
    mixed = keras.layers.Add(name="skip")([back, inputs])
    wide = keras.layers.Dense(16, name="wide")(mixed)
    wide = keras.layers.Activation("tanh", name="tanh")(wide)  # the row layer slices here
    narrow = keras.layers.Dense(8, activation="relu", name="narrow")(wide)
    logits = keras.layers.Dense(CLASSES, name="head")(narrow)
    model = keras.Model(inputs, logits, name="mlp")
    model.compile(optimizer or keras.optimizers.SGD(0.1),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    return model


def layout(axes=("model",), shape=(2,)):
    mesh = keras.distribution.DeviceMesh(shape, list(axes),
                                         devices=[f"cpu:{i}" for i in range(int(np.prod(shape)))])
    layout_map = keras.distribution.LayoutMap(mesh)
    layout_map["(up|wide)/kernel"] = (None, "model")
    layout_map["(up|wide)/bias"] = ("model",)
    layout_map["(down|narrow)/kernel"] = ("model", None)
    return layout_map


def arrays(seed=0):
    rng = np.random.default_rng(seed)
    return (rng.normal(size=(ROWS, FEATURES)).astype("float32"),
            rng.integers(0, CLASSES, size=(ROWS,)).astype("int32"))
