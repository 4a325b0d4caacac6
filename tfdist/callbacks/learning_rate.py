"""Callbacks that set and log the optimizer's learning rate.

`LearningRateScheduleCallback` drives an optimizer that holds a float rate
from a schedule, per optimizer step or per epoch. `LearningRateLogger` only
reports the rate, whatever the optimizer holds. Both write `learning_rate`
into the batch and epoch logs, so `History`, `CSVLogger` and `TensorBoard`
placed after them in the callback list see it.

Both depend only on the optimizer's step count (or the epoch index), so every
replica and every worker computes the same rate; neither writes to disk.
"""

import math

import keras
import numpy as np
from keras import ops

from tfdist.runtime.argtypes import check_bool
from tfdist.seam import held_learning_rate

_UNITS = ("step", "epoch")
LOG_KEY = "learning_rate"


def _optimizer_of(callback):
    model = callback.model
    optimizer = getattr(model, "optimizer", None) if model is not None else None
    if optimizer is None:
        raise ValueError(
            f"{type(callback).__name__} needs a compiled model with an optimizer; "
            f"got model={model!r} with optimizer=None. Call model.compile(...) first."
        )
    if not hasattr(optimizer, "learning_rate"):
        raise ValueError(
            f"{type(callback).__name__}: optimizer {optimizer!r} has no "
            "`learning_rate` attribute; a Keras 3 optimizer is required."
        )
    return optimizer


def _to_numpy(value):
    if isinstance(value, keras.Variable):
        # Read into a tensor first: NumPy 2 warns when it converts a variable
        # directly (Keras's convert_to_numpy calls np.array on it).
        value = ops.copy(value)
    return ops.convert_to_numpy(value)


def _read_learning_rate(optimizer):
    """The optimizer's current learning rate as a Python float."""
    return float(_to_numpy(optimizer.learning_rate))


def _read_step(optimizer):
    """The optimizer's update count, `optimizer.iterations`, as an int.

    Keras divides its internal counter by `gradient_accumulation_steps`, so
    this counts optimizer updates, not micro-batches.
    """
    return int(_to_numpy(optimizer.iterations))


class LearningRateScheduleCallback(keras.callbacks.Callback):
    """Sets the optimizer's learning rate from a schedule, per step or epoch.

    For apps that keep a float learning rate in the optimizer and want a
    warmup or decay applied from outside (the alternative is to pass the
    schedule to the optimizer itself). With `unit="step"` (default) the rate
    is set before every batch to `schedule(optimizer.iterations)`; with
    `unit="epoch"` it is set at the start of every epoch to
    `schedule(epoch)`. Whatever else sets the rate (e.g. `ReduceLROnPlateau`)
    is overridden at the next step or epoch.

    The step is the optimizer's update count, `optimizer.iterations`, not a
    batch counter of this callback. Therefore:

    - under gradient accumulation the schedule advances once per optimizer
      update, not per micro-batch: a Keras optimizer built with
      `gradient_accumulation_steps=K` reports `iterations` as micro-batches
      // K, and a training loop that accumulates before calling the
      optimizer (tfdist's trainer) counts updates there too;
    - resumed training (the optimizer's variables restored from a checkpoint)
      continues the schedule where it stopped;
    - all workers set the same rate.

    With `steps_per_execution > 1` Keras calls batch hooks once per group of
    steps, so the rate changes once per group.

    Keras refuses to set the rate of an optimizer built with a
    `LearningRateSchedule` (`keras.callbacks.LearningRateScheduler` and
    `ReduceLROnPlateau` then fail with a `TypeError` from the optimizer). This
    callback checks at the start of training and raises a `TypeError` that
    says what to do: build the optimizer with a float rate, or keep the
    schedule in the optimizer and use `LearningRateLogger` instead.

    The rate is also written into the logs as `learning_rate`: in batch logs
    the rate that batch's update used, in epoch logs the optimizer's rate at
    the end of the epoch (the value `TensorBoard` reports).

    Args:
        schedule: a `keras.optimizers.schedules.LearningRateSchedule` (e.g.
            from `tfdist.schedules.make_schedule`) or a function of one
            integer (the optimizer step, or the 0-based epoch) that returns a
            number >= 0.
        unit: `"step"` (default) or `"epoch"`: what the schedule counts.
        verbose: 0 (quiet) or 1 (print the rate at the start of each epoch).

    Example:

    >>> schedule = tfdist.schedules.make_schedule(
    ...     "cosine", 0.1, warmup_steps=100, total_steps=1000)
    >>> model.compile(optimizer=keras.optimizers.SGD(learning_rate=0.1), loss="mse")
    >>> model.fit(x, y, epochs=10, callbacks=[LearningRateScheduleCallback(schedule)])
    >>> model.history.history["learning_rate"]  # one value per epoch
    """

    def __init__(self, schedule, unit="step", verbose=0):
        super().__init__()
        if not (
            isinstance(schedule, keras.optimizers.schedules.LearningRateSchedule)
            or callable(schedule)
        ):
            raise ValueError(
                "LearningRateScheduleCallback: `schedule` must be a keras."
                "optimizers.schedules.LearningRateSchedule or a function of one "
                f"integer. Received: schedule={schedule!r}."
            )
        if unit not in _UNITS:
            raise ValueError(
                "LearningRateScheduleCallback: `unit` must be one of "
                f"{', '.join(repr(u) for u in _UNITS)}. Received: unit={unit!r}."
            )
        if verbose not in (0, 1):
            raise ValueError(
                "LearningRateScheduleCallback: `verbose` must be 0 or 1. "
                f"Received: verbose={verbose!r}."
            )
        self.schedule = schedule
        self.unit = unit
        self.verbose = verbose
        self._last_step = None
        self._batch_rate = None
        self._epoch = 0
        self._announced_epoch = None

    def _check_settable(self, optimizer):
        inner = optimizer
        while hasattr(inner, "inner_optimizer"):  # LossScaleOptimizer
            inner = inner.inner_optimizer
        held = held_learning_rate(inner)
        if held is None or isinstance(held, keras.Variable):
            return
        if isinstance(held, keras.optimizers.schedules.LearningRateSchedule):
            what = f"the schedule {type(held).__name__} (a LearningRateSchedule)"
        else:
            what = f"the callable {held!r}"
        raise TypeError(
            f"LearningRateScheduleCallback cannot set the learning rate of "
            f"optimizer {inner.name!r}: it was built with {what}, and Keras 3 "
            "does not let callbacks override such a rate (keras.callbacks."
            "LearningRateScheduler and ReduceLROnPlateau fail the same way). "
            "Either build the optimizer with a float learning_rate (e.g. "
            "keras.optimizers.SGD(learning_rate=0.0)) and keep this callback, "
            "or keep the schedule in the optimizer, drop this callback and add "
            "tfdist.callbacks.learning_rate.LearningRateLogger to log the rate."
        )

    def _evaluate(self, index):
        value = self.schedule(index)
        try:
            rate = float(np.asarray(_to_numpy(value), dtype=np.float64))
        except (TypeError, ValueError) as error:
            raise ValueError(
                f"LearningRateScheduleCallback: the schedule returned {value!r} at "
                f"{self.unit} {index}; expected a single number >= 0."
            ) from error
        if not math.isfinite(rate) or rate < 0.0:
            raise ValueError(
                f"LearningRateScheduleCallback: the schedule returned {rate!r} at "
                f"{self.unit} {index}; expected a finite number >= 0."
            )
        return rate

    def _set(self, optimizer, index):
        rate = self._evaluate(index)
        optimizer.learning_rate = rate
        self._batch_rate = rate
        if self.verbose and self._announced_epoch != self._epoch:
            self._announced_epoch = self._epoch
            print(
                f"\nEpoch {self._epoch + 1}: LearningRateScheduleCallback set the "
                f"learning rate to {rate:.6g} ({self.unit} {index})."
            )
        return rate

    def on_train_begin(self, logs=None):
        self._check_settable(_optimizer_of(self))
        self._last_step = None
        self._batch_rate = None

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch
        if self.unit == "epoch":
            self._set(_optimizer_of(self), epoch)

    def on_train_batch_begin(self, batch, logs=None):
        optimizer = _optimizer_of(self)
        if self.unit == "step":
            step = _read_step(optimizer)
            # Micro-batches of one accumulated update share a step: set once.
            if step != self._last_step:
                self._last_step = step
                self._set(optimizer, step)
        elif self._batch_rate is None:
            self._batch_rate = _read_learning_rate(optimizer)

    def on_train_batch_end(self, batch, logs=None):
        if logs is not None and self._batch_rate is not None:
            logs[LOG_KEY] = self._batch_rate

    def on_epoch_end(self, epoch, logs=None):
        if logs is not None:
            logs[LOG_KEY] = _read_learning_rate(_optimizer_of(self))


class LearningRateLogger(keras.callbacks.Callback):
    """Puts the optimizer's current learning rate into the logs.

    Works whether the optimizer holds a float, a `LearningRateSchedule` or is
    wrapped in a `LossScaleOptimizer`: it reads `optimizer.learning_rate`,
    which Keras evaluates for schedules at the optimizer's step.

    - Batch logs get `learning_rate` = the rate the batch's update used (read
      just before the batch runs), for `TensorBoard(update_freq="batch")` or
      any per-batch callback.
    - Epoch logs get `learning_rate` = the optimizer's rate at the end of the
      epoch (what `TensorBoard` reports), for `History` and `CSVLogger`.

    Put it before the callbacks that should see the value. It reads one
    scalar per batch and writes nothing to disk, so every worker may run it.

    Note: with a schedule inside a Keras optimizer built with
    `gradient_accumulation_steps`, Keras evaluates the schedule at the
    micro-batch count; the logged value is the one Keras uses (see
    `tfdist.schedules.OptimizerStepSchedule` to count updates instead).

    Args:
        log_batches: also write the rate into batch logs (default True); False
            skips the per-batch read and logs only at epoch end.

    Example:

    >>> schedule = tfdist.schedules.make_schedule("constant", 0.1, warmup_steps=10)
    >>> model.compile(optimizer=keras.optimizers.SGD(schedule), loss="mse")
    >>> history = model.fit(x, y, epochs=3, callbacks=[LearningRateLogger()])
    >>> history.history["learning_rate"]
    """

    def __init__(self, log_batches=True):
        super().__init__()
        self.log_batches = check_bool("log_batches", log_batches)
        self._batch_rate = None

    def on_train_batch_begin(self, batch, logs=None):
        if self.log_batches:
            self._batch_rate = _read_learning_rate(_optimizer_of(self))

    def on_train_batch_end(self, batch, logs=None):
        if self.log_batches and logs is not None and self._batch_rate is not None:
            logs[LOG_KEY] = self._batch_rate

    def on_epoch_end(self, epoch, logs=None):
        if logs is not None:
            logs[LOG_KEY] = _read_learning_rate(_optimizer_of(self))
