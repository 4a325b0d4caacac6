"""`StepClock`: the wall time of every training step, for pooling across rounds.

`tfdist.callbacks.ThroughputMeter` turns step times into figures; the
benchmark needs the raw times of several short `fit` calls (alternating
rounds) pooled into one list, which this callback records.
"""

import time

import keras

from tfdist.runtime.argtypes import check_int_at_least


class StepClock(keras.callbacks.Callback):
    """Records the wall time of each training step after a warmup.

    The time of a step is the interval between consecutive
    `on_train_batch_end` calls (the first measured from `on_train_begin`),
    so it includes waiting for input. With `steps_per_execution > 1` one
    interval covers that many steps and is divided among them.

    Args:
        warmup_steps: steps at the start of each `fit` call left out (the
            first step of a call also creates the data iterator).
        steps_per_execution: steps per reported batch.

    Attributes:
        step_times: the measured per-step times in seconds.

    Example:

    >>> clock = StepClock(warmup_steps=1)
    >>> model.fit(dataset, steps_per_epoch=6, callbacks=[clock])
    >>> len(clock.step_times)
    5
    """

    def __init__(self, warmup_steps=1, steps_per_execution=1):
        super().__init__()
        check_int_at_least("warmup_steps", warmup_steps, 0)
        if (isinstance(steps_per_execution, bool) or not isinstance(steps_per_execution, int)
                or steps_per_execution < 1):
            raise ValueError(
                f"steps_per_execution must be an integer >= 1, got {steps_per_execution!r}.")
        self.warmup_steps = warmup_steps
        self.steps_per_execution = steps_per_execution
        self.step_times = []
        self._seen = 0
        self._last = None

    def on_train_begin(self, logs=None):
        self._seen = 0
        self._last = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):
        now = time.perf_counter()
        elapsed, self._last = now - self._last, now
        self._seen += self.steps_per_execution
        if self._seen > self.warmup_steps:
            self.step_times.extend([elapsed / self.steps_per_execution] * self.steps_per_execution)
