"""Callbacks that stop a `fit()` part-way, as a killed or interrupted job would.

Two meanings, two names: `InterruptAtEpochStart` stops when an epoch begins
(TensorFlow's multi-worker tutorial's way); `InterruptAfterSteps` stops at the
batch end where a number of batches (the global step of this fit) have run.
Both raise `Interrupted`, which a test expects with `pytest.raises`.

    from helpers.interrupt import Interrupted, InterruptAfterSteps

    with pytest.raises(Interrupted):
        trainer.fit(data, epochs=3, callbacks=[backup, InterruptAfterSteps(7)])
"""

import keras


class Interrupted(Exception):
    """What the interrupting callbacks raise (a stand-in for a killed job).

    Example: `with pytest.raises(Interrupted): model.fit(..., callbacks=[InterruptAfterSteps(5)])`
    """


class InterruptAtEpochStart(keras.callbacks.Callback):
    """Raises `Interrupted` when epoch `epoch` (0-based) begins.

    Example: `InterruptAtEpochStart(2)` lets epochs 0 and 1 finish, then stops.
    """

    def __init__(self, epoch):
        super().__init__()
        self.epoch = epoch

    def on_epoch_begin(self, epoch, logs=None):
        if epoch == self.epoch:
            raise Interrupted(f"interrupted at the start of epoch {epoch}")


class GlobalStepCounter(keras.callbacks.Callback):
    """Counts the batches of this fit over its epochs: `seen` after each batch end,
    `global_step(batch)` for the batch about to run or just run (1-based).

    Example: with 9 batches per epoch, batch 1 of epoch 1 is `global_step(1) == 11`.
    """

    def __init__(self):
        super().__init__()
        self.seen, self.epoch_base = 0, 0

    def global_step(self, batch):
        """The 1-based number of batch `batch` of this epoch within the whole fit."""
        return self.epoch_base + batch + 1

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch_base = self.seen

    def on_train_batch_end(self, batch, logs=None):
        self.seen = self.global_step(batch)


class InterruptAfterSteps(GlobalStepCounter):
    """Raises `Interrupted` at the batch end where `steps` batches have run in
    this fit (over epochs: the batches of each epoch are added to those before).

    Example: with 9 batches per epoch, `InterruptAfterSteps(11)` stops after the
    second batch of the second epoch.
    """

    def __init__(self, steps):
        super().__init__()
        self.steps = steps

    def on_train_batch_end(self, batch, logs=None):
        super().on_train_batch_end(batch, logs)
        if self.seen >= self.steps:
            raise Interrupted(f"interrupted at global step {self.seen}")
