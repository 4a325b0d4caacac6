"""tfdist.training: the distributed training engine.

`Trainer` fits, evaluates and predicts a Keras 3 model under any
`tf.distribute` strategy with a step that tfdist owns (global loss reduction,
one gradient all-reduce, global-norm clipping, XLA per replica, loss scaling,
gradient accumulation, several steps per call) and standard Keras callbacks.

Example:

>>> from tfdist.training import Trainer
>>> trainer = Trainer(model, optimizer, "sparse_categorical_crossentropy",
...                   metrics=["accuracy"], strategy=strategy, jit_compile=True)
>>> trainer.fit(train_ds, epochs=3, validation_data=val_ds)
"""

from tfdist.training.accumulate import GradientAccumulator
from tfdist.training.loss import GlobalLoss
from tfdist.training.trainer import Trainer

__all__ = ["Trainer", "GlobalLoss", "GradientAccumulator"]
