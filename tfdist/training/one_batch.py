"""Keras's `train_on_batch`, `test_on_batch` and `predict_on_batch` for the `Trainer`.

A program that drives training itself (a loop over its own batches, a GAN
alternating two models) calls these instead of `fit`. Each runs one global
batch through the trainer's own step, so every replica gets its share of the
batch and the update equals one device's, as in `fit`. As in Keras, the
metrics are reset first (the figures returned are the batch's own), and no
callbacks run.

Example:

    for x_batch, y_batch in batches:
        logs = trainer.train_on_batch(x_batch, y_batch, return_dict=True)
"""

import tensorflow as tf

from tfdist.training.inputs import distribute, evaluation_inputs, training_inputs
from tfdist.training.loop import pythonify


def run_one_batch(trainer, mode, x, y=None, sample_weight=None, class_weight=None):
    """The logs of one `mode` ("train" or "test") step of `trainer` on the batch `x`.

    Args:
        trainer: a `tfdist.training.Trainer`.
        mode: "train" or "test".
        x, y, sample_weight, class_weight: one global batch, as Keras's
            `train_on_batch` / `test_on_batch` take it (arrays or tensors, or
            lists / dicts of them); `class_weight` for "train" only.

    Returns:
        `{name: value}` after the step (the metrics reset before it).

    Raises:
        ValueError: a dataset or function instead of one batch, or an empty
            batch.

    Example:

    >>> run_one_batch(trainer, "test", x_batch, y_batch)
    {'loss': 0.42, 'accuracy': 0.81}
    """
    rows = batch_rows(x, f"{mode}_on_batch")
    if mode == "train":
        source, _ = training_inputs(trainer.strategy, x, y, batch_size=rows,
                                    sample_weight=sample_weight, class_weight=class_weight,
                                    shuffle=False)
    else:
        source = evaluation_inputs(x, y, batch_size=rows, sample_weight=sample_weight)
    data = distribute(trainer.strategy, source, "x")
    steps = trainer.prepare(data, mode=mode)
    trainer.model.reset_metrics()
    function = steps.train_function if mode == "train" else steps.test_function
    ran, logs = function(iter(data), tf.constant(1, tf.int32))
    if int(ran) != 1:
        raise ValueError(f"{mode}_on_batch ran no step: the batch of {rows} rows gave the "
                         "replicas nothing to run.")
    return pythonify(logs)


def batch_rows(x, method):
    """The number of rows of the one batch `x` (its first array's length).

    Raises:
        ValueError: `x` is a dataset, a function or empty.

    Example:

    >>> batch_rows(np.zeros((8, 3)), "train_on_batch")
    8
    """
    kind = ("a tf.data.Dataset" if isinstance(x, tf.data.Dataset) else
            "a distributed dataset" if isinstance(x, tf.distribute.DistributedDataset) else
            "a function" if callable(x) else None)
    if kind:
        raise ValueError(f"{method} takes one batch of arrays or tensors (or a list / dict of "
                         f"them), got {kind}; for a dataset use fit, evaluate or predict.")
    leaves = tf.nest.flatten(x)
    if not leaves or leaves[0] is None or not getattr(leaves[0], "shape", None):
        raise ValueError(f"{method} needs x as arrays or tensors with a batch dimension, got "
                         f"{x!r}.")
    rows = int(leaves[0].shape[0])
    if rows < 1:
        raise ValueError(f"{method} got an empty batch (0 rows).")
    return rows
