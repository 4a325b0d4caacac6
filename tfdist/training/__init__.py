"""tfdist.training: the distributed training engine.

`Trainer` fits, evaluates and predicts a compiled Keras 3 model under any
`tf.distribute` strategy with a step that tfdist owns (global loss reduction,
one gradient all-reduce, global-norm clipping, XLA per replica, loss scaling,
gradient accumulation, several steps per call), Keras's `fit` arguments and
standard Keras callbacks.

Example:

>>> from tfdist.training import Trainer
>>> with strategy.scope():
...     model = make_model()
...     model.compile("adam", "sparse_categorical_crossentropy", metrics=["accuracy"])
>>> Trainer(model).fit(x, y, batch_size=64, epochs=3, validation_split=0.1)
"""

from tfdist.training.accumulate import GradientAccumulator
from tfdist.training.loss import GlobalLoss
from tfdist.training.trainer import Trainer

__all__ = ["Trainer", "GlobalLoss", "GradientAccumulator"]
