"""Stop training with a clear error on a NaN/Inf loss, keeping the last good backup."""

import warnings

import keras
import numpy as np

from tfdist.callbacks.loss_health import LossStopError, notify_stop


class NonFiniteLossError(LossStopError):
    """Training hit a NaN or Inf loss (or monitored metric).

    Attributes:
        name: the log entry that was not finite, e.g. `"loss"`.
        value: its value (a float, or an array for array-valued metrics).
        epoch: the 0-based epoch index (`Epoch epoch + 1` in the progress bar).
        batch: the batch index within the epoch, or None when it was seen in
            the epoch-end logs.
        step: training batches run in this `fit` call up to and including
            this one (the 0-based global step of the batch).
        iterations: `model.optimizer.iterations` when it was seen (counts
            optimizer steps across resumed runs), or None.

    Example:

        try:
            trainer.fit(data, epochs=3, callbacks=[NanGuard()])
        except NonFiniteLossError as error:
            print(f"{error.name} was {error.value} at step {error.step}")
    """

    FIELDS = ("name", "value", "epoch", "batch", "step", "iterations")


class NanGuard(keras.callbacks.Callback):
    """Stops training with `NonFiniteLossError` when the loss is NaN or Inf.

    Every `check_freq` training batches (and at every epoch end) the
    monitored log values are checked. On the first non-finite one the
    callback sets `model.stop_training = True` and raises
    `NonFiniteLossError` (a `RuntimeError`) naming the value, the epoch,
    the batch and the global step.

    Raising, instead of only stopping, is what keeps your last good backup:
    `fit` ends through the exception, so no callback's `on_train_end` runs.
    `keras.callbacks.BackupAndRestore(delete_checkpoint=True)` (the default)
    deletes its backup folder in `on_train_end`; after
    `keras.callbacks.TerminateOnNaN()` (which stops gracefully) the backup
    of the last good epoch is therefore gone, after `NanGuard` it is still
    there, and the next `fit` with the same `BackupAndRestore` resumes from
    it. Put `NanGuard` *before* `BackupAndRestore` and `ModelCheckpoint` in
    the callback list: callbacks run in order, so a backup or checkpoint
    scheduled on the failing batch or epoch is then never written with the
    NaN weights. With a `DivergenceGuard` in the callbacks too, tfdist's
    `BackupAndResume` also deletes the backups not yet confirmed healthy
    when `NanGuard` fires (see `DivergenceGuard`), and the error says which
    backup is left. (Keras 3.15's `TerminateOnNaN(raise_error=True)` also
    raises, with a plain `RuntimeError` that gives the batch only.)

    Reading a log value waits for the device to finish the step, so a
    larger `check_freq` lets the host run ahead. Keras and tfdist's
    `Trainer` log the running mean of the epoch's loss, which stays NaN once
    a NaN entered it, so a sparse check still catches it (at the next
    checked batch, or at the latest at the epoch end).

    Multi-worker: the logged loss and metrics are global, so every worker
    sees the same values at the same steps and raises at the same step (run
    this callback on every worker, not only on the chief: a worker that
    went on alone would wait forever in the next all-reduce).

    Args:
        monitor: the log entry to check (`"loss"`), a list of them (e.g.
            `["loss", "val_loss"]`; names absent from a batch's logs are
            checked where they appear), or `"all"` for every numeric entry.
        check_freq: check every this many training batches (an int >= 1),
            or `"epoch"` to check the epoch-end logs only.

    Example:

    >>> callbacks = [NanGuard(check_freq=10),
    ...              keras.callbacks.BackupAndRestore("backup")]
    >>> try:
    ...     model.fit(dataset, epochs=10, callbacks=callbacks)
    ... except NonFiniteLossError as error:
    ...     print(error.name, error.epoch, error.step)   # "backup" still holds the last good epoch
    """

    def __init__(self, monitor="loss", check_freq=1):
        super().__init__()
        if isinstance(monitor, str) and monitor:
            names = None if monitor == "all" else [monitor]
        elif isinstance(monitor, (list, tuple)) and monitor and all(
                isinstance(m, str) and m for m in monitor):
            names = list(monitor)
        else:
            raise ValueError(
                "monitor must be a log name such as 'loss', a non-empty list of names, "
                f"or 'all'; got {monitor!r}.")
        if check_freq != "epoch" and not (
                isinstance(check_freq, int) and not isinstance(check_freq, bool)
                and check_freq >= 1):
            raise ValueError(f"check_freq must be an integer >= 1 or 'epoch', got {check_freq!r}.")
        self.monitor = monitor
        self.check_freq = check_freq
        self._names = names
        self._epoch = 0
        self._steps_done = 0
        self._epoch_offset = 0
        self._warned_missing = False
        if check_freq != "epoch":
            # Only then: a batch hook turns off Keras's asynchronous batch-end dispatch.
            self.on_train_batch_end = self._on_train_batch_end

    def on_train_begin(self, logs=None):
        self._steps_done = 0
        self._epoch_offset = 0
        self._warned_missing = False

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch
        self._epoch_offset = self._steps_done

    def _on_train_batch_end(self, batch, logs=None):
        previous, self._steps_done = self._steps_done, self._epoch_offset + batch + 1
        # With steps_per_execution > 1 a call covers several steps: check when
        # a multiple of check_freq lies within them.
        if self._steps_done // self.check_freq > previous // self.check_freq:
            self._check(logs, batch=batch, step=self._steps_done - 1)

    def on_epoch_end(self, epoch, logs=None):
        if self._names is not None and not self._warned_missing and logs is not None:
            missing = [n for n in self._names if n not in logs]
            if missing:
                self._warned_missing = True
                warnings.warn(
                    f"NanGuard: monitored log entries {missing} are not in the epoch logs "
                    f"(which have {sorted(logs)}); they are never checked.", stacklevel=2)
        self._check(logs, batch=None, step=max(self._steps_done - 1, 0))

    def get_config(self):
        return {"monitor": self.monitor, "check_freq": self.check_freq}

    def _check(self, logs, batch, step):
        if not logs:
            return
        names = self._names if self._names is not None else list(logs)
        for name in names:
            if name not in logs:
                continue
            try:
                value = np.asarray(logs[name], dtype=np.float64)
            except (TypeError, ValueError):
                continue  # not a number (e.g. a string someone logged)
            if np.all(np.isfinite(value)):
                continue
            self._fail(name, value, batch, step)

    def _fail(self, name, value, batch, step):
        if self.model is not None:
            self.model.stop_training = True
        value = float(value) if value.ndim == 0 else value
        iterations = None
        optimizer = getattr(self.model, "optimizer", None)
        if optimizer is not None and hasattr(optimizer, "iterations"):
            try:
                iterations = int(keras.ops.convert_to_numpy(optimizer.iterations))
            except Exception:  # an unbuilt or exotic optimizer: leave it out
                iterations = None
        where = (f"batch {batch} of epoch index {self._epoch}" if batch is not None
                 else f"the end of epoch index {self._epoch}")
        message = (
            f"NanGuard: {name} is {value} at {where} (Epoch {self._epoch + 1} in the progress "
            f"bar), global step {step}"
            + (f", optimizer iteration {iterations}" if iterations is not None else "")
            + ". Training stopped without running on_train_end, so backups and checkpoints "
            "of earlier steps are kept (e.g. BackupAndRestore resumes from its last backup). "
            "Common causes: a learning rate too high, float16 overflow without loss scaling, "
            "bad input values (check the data), a log/divide of 0 in the loss.")
        notes = notify_stop(self.model)  # with a DivergenceGuard: BackupAndResume drops suspects
        if notes:
            message += " " + notes
        raise NonFiniteLossError(message, name=name, value=value, epoch=self._epoch,
                                 batch=batch, step=step, iterations=iterations)
