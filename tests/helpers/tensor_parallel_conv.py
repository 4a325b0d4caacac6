"""What the tensor-parallel convolution tests share: the 2-device mesh, image arrays, and
training a model on one device and split, compared (SGD with momentum, float32)."""

import keras
import numpy as np

from tfdist.training import Trainer

RTOL, ATOL = 1e-5, 1e-5
CLASSES = 4


def mesh():
    return keras.distribution.DeviceMesh((2,), ["model"], devices=["cpu:0", "cpu:1"])


def images(rows, size, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.normal(size=(rows, size, size, 3)).astype("float32"),
            rng.integers(0, CLASSES, size=(rows,)).astype("int32"))


def train(model, layout_map, x, y, batch):
    model.compile(keras.optimizers.SGD(0.05, momentum=0.9),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    extra = dict(tensor_parallel=2, layout_map=layout_map) if layout_map is not None else {}
    trainer = Trainer(model, **extra)
    history = trainer.fit(x, y, batch_size=batch, epochs=1, shuffle=False, verbose=0)
    return history.history["loss"], trainer


def assert_trains_like_one_device(build, layout_map, x, y, batch):
    one_model, two_model = build(), build()
    one_loss, _ = train(one_model, None, x, y, batch)
    two_loss, trainer = train(two_model, layout_map, x, y, batch)
    np.testing.assert_allclose(two_loss, one_loss, rtol=RTOL)
    for a, b in zip(two_model.get_weights(), one_model.get_weights(), strict=True):
        np.testing.assert_allclose(a, b, rtol=RTOL, atol=ATOL)
    assert not np.allclose(two_model.get_weights()[0], build().get_weights()[0])  # it trained
    return trainer


def adam_trained(build, layout_map, x, y):
    """`build()` trained one epoch with Adam (split when `layout_map` is given): the model
    and its Trainer."""
    model = build()
    model.compile(keras.optimizers.Adam(0.01),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    extra = dict(tensor_parallel=2, layout_map=layout_map) if layout_map is not None else {}
    trainer = Trainer(model, **extra)
    trainer.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
    return model, trainer


def assert_same_state(ours, reference):
    """Two loaded models' weights and optimizer variables agree, in order."""
    for a, b in zip(ours.weights + ours.optimizer.variables,
                    reference.weights + reference.optimizer.variables, strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=RTOL, atol=ATOL)
