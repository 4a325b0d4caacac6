"""Stop training with a clear error when the loss diverges: far above its recent level."""

import math
import statistics
import warnings

import keras
import numpy as np

from tfdist.callbacks.loss_health import HEALTH_ATTRIBUTE, LossHealth, LossStopError
from tfdist.runtime.argtypes import check_int_at_least

DEFAULT_WARMUP = 20  # training steps before the rule judges anything
DEFAULT_CAUSES = (
    "Common causes: a learning rate too high (lower it, add gradient clipping or a longer "
    "warmup), float16 overflow without loss scaling, bad input values. Fix the cause and "
    "resume from the last good backup.")


class DivergenceError(LossStopError):
    """Training diverged: the loss rose far above its recent level (or is NaN/Inf).

    Attributes:
        name: the monitored log entry, e.g. `"loss"`.
        value: the loss that fired the rule: the mean loss of the batches
            since the previous check (with `check_freq=1`, the batch's own).
        level: the recent level it was compared with (median of the last
            healthy values), or None when `value` is not finite.
        factor: the guard's `factor`.
        rule: `"ratio"` (above `factor` x `level` for `patience` checks in
            a row) or `"non-finite"`.
        epoch: the 0-based epoch index (`Epoch epoch + 1` in the progress bar).
        batch: the batch index within the epoch.
        step: training batches run since the start of training, including
            this one (across resumed runs, as `BackupAndResume`'s global step).
        iterations: `model.optimizer.iterations` when it fired, or None.

    Example:

        try:
            trainer.fit(data, epochs=3, callbacks=[DivergenceGuard()])
        except DivergenceError as error:
            print(error.name, error.value, error.level, error.rule)
    """

    FIELDS = ("name", "value", "level", "factor", "rule", "epoch", "batch", "step",
              "iterations")


class DivergenceGuard(keras.callbacks.Callback):
    """Stops training with `DivergenceError` when the loss jumps far above its recent level.

    A loss that explodes but stays finite (a learning rate far too high
    drives it to 1e12 and beyond) is never caught by `NanGuard`; this
    callback catches it. The rule, applied every `check_freq` training
    batches:

    * **The value checked** is the mean loss of the batches since the
      previous check (with `check_freq=1`: each batch's own loss). Keras
      and tfdist's `Trainer` log the running mean of the epoch's loss,
      which resets every epoch; the guard recovers the recent batches' mean
      from two logged running means (`(n * mean_n - m * mean_m) / (n - m)`
      for the epoch's batches `n` and `m`; batches weigh equally, exact for
      equal batch sizes up to float32 rounding), so the level carries across
      epoch boundaries and a late jump in a long epoch is not averaged away.
      (The epoch's loss total is float32: when it reaches ~10^6 times one
      batch's loss, e.g. 10^5 batches in the epoch and a loss fallen 10x
      since its start, single-batch values are off by ~10%, more beyond; a
      larger `check_freq` divides that error.)
    * **The recent level** is the median of the last `window` values that
      passed the rule.
    * **It fires** when the value is NaN or Inf (at once, like `NanGuard`),
      or when it is above `factor` x the level at `patience` checks in a
      row (a single outlier batch does not stop training; values above the
      threshold never enter the level). Nothing is judged before `warmup`
      training steps have run and `window` values are recorded, so a loss
      that is high at the start, or a spike while the learning rate warms
      up, stops nothing (pass at least your learning-rate warmup, in
      batches, as `warmup`); the first level judged against is the median
      of the last `window` values of the warmup. The ratio needs a positive
      loss; while the level is 0 or negative nothing is judged (with a
      warning).

    Like `NanGuard` it raises instead of only stopping, so that no
    `on_train_end` runs and no later callback writes a backup of the
    diverged weights. Put it before `BackupAndResume` (right after
    `NanGuard`; placed after it, a resumed run would start its record over).
    It publishes its record (a `LossHealth`: the recent values, which steps
    were judged healthy) on the model, and `BackupAndResume` uses it:

    * the record is saved in every backup and restored with it, so a
      resumed run is judged as if it had not been interrupted (no new
      warmup after a restart);
    * a backup becomes *good* once a later check passed the rule (the loss
      of the weights it holds was seen healthy; the backup a run resumed
      from counts as good); the newest good backup is never deleted by the
      rotation (up to `max_to_keep` + 1 backups are on disk);
    * when a guard fires (this one or `NanGuard`), the backups this run took
      after the last good one are deleted as suspect, so that rerunning
      (with a lower learning rate) resumes from the last good one; the
      error message says which backup that is.

    The steps the error names (and `warmup`) count training batches since
    the start of training, across resumed runs; with `grad_accum_steps=K`
    a batch is a micro-batch (a learning-rate warmup of W optimizer steps
    is W x K batches).

    Multi-worker: the logged loss is global (reduced over all replicas and
    workers), and every worker restores the same record from the same
    backup, so every worker computes the same values and raises at the same
    step (after waiting, in `BackupAndResume`, for the chief to delete the
    suspect backups). Run it on every worker, not only on the chief.

    Args:
        factor: fire when the loss is above this many times its recent
            level (a number > 1); 0 or None turns the guard off (it then
            does nothing).
        window: how many recent values the level is the median of (an
            int >= 1).
        warmup: training steps (batches) before anything is judged (an int
            >= 0).
        patience: consecutive checks above the threshold that fire (an int
            >= 1).
        monitor: the log entry to watch (`"loss"`).
        check_freq: check every this many training batches (an int >= 1).
            Reading a log value waits for the device to finish the step.
        hint: advice appended to the error message (e.g. which flag lowers
            the learning rate); None for a general list of causes.

    Example:

    >>> callbacks = [NanGuard(), DivergenceGuard(factor=10, warmup=500),
    ...              BackupAndResume("backup", save_freq=200)]
    >>> try:
    ...     trainer.fit(dataset, epochs=10, callbacks=callbacks)
    ... except DivergenceError as error:
    ...     print(error.step, error.value, error.level)   # "backup" holds the last good backup
    """

    def __init__(self, factor=10.0, window=20, warmup=DEFAULT_WARMUP, patience=3, monitor="loss",
                 check_freq=1, hint=None):
        super().__init__()
        if factor is not None and not (
                isinstance(factor, (int, float, np.integer, np.floating))
                and not isinstance(factor, bool) and math.isfinite(factor)
                and (factor == 0 or factor > 1)):
            raise ValueError(
                f"factor must be a number > 1 (the guard fires when the loss is above factor x "
                f"its recent level), or 0 or None to turn the guard off; got {factor!r}.")
        for name, value, minimum in (("window", window, 1), ("warmup", warmup, 0),
                                     ("patience", patience, 1), ("check_freq", check_freq, 1)):
            check_int_at_least(name, value, minimum)
        if not isinstance(monitor, str) or not monitor:
            raise ValueError(f"monitor must be a log name such as 'loss', got {monitor!r}.")
        if hint is not None and not isinstance(hint, str):
            raise ValueError(f"hint must be a string or None, got {hint!r}.")
        self.factor = float(factor) if factor else None
        self.window = int(window)
        self.warmup = int(warmup)
        self.patience = int(patience)
        self.monitor = monitor
        self.check_freq = int(check_freq)
        self.hint = hint
        self.health = LossHealth(self.window)
        self._epoch = 0
        self._warned = set()
        if self.factor is not None:
            # Only then: a batch hook turns off Keras's asynchronous batch-end dispatch.
            self.on_train_batch_end = self._on_train_batch_end

    @property
    def enabled(self):
        """False when `factor` is 0 or None (the guard does nothing).

        Example:

        >>> DivergenceGuard(factor=0).enabled
        False
        """
        return self.factor is not None

    def set_model(self, model):
        super().set_model(model)
        if self.enabled and model is not None:
            setattr(model, HEALTH_ATTRIBUTE, self.health)

    def on_train_begin(self, logs=None):
        # BackupAndResume (placed after this callback) restores the record
        # from its backup in its own on_train_begin, after this reset.
        self.health.reset()
        self.health.clear_listeners()
        self._warned = set()

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch
        health = self.health
        if epoch != health.epoch:  # else: resumed inside this epoch, its counts restored
            health.epoch, health.epoch_batches = epoch, 0
            health.checked_batches, health.checked_mean = 0, 0.0

    def on_train_end(self, logs=None):
        model = self.model
        if model is not None and getattr(model, HEALTH_ATTRIBUTE, None) is self.health:
            setattr(model, HEALTH_ATTRIBUTE, None)

    def on_fit_error(self, error):
        """Takes the guard's record off the model when `fit` raised `error` (the
        guard's own `DivergenceError` included), as the end of a `fit` does: a
        later `fit` of the same model without a guard then gives its backups no
        record of a guard that no longer runs. tfdist's `Trainer` calls it (Keras
        calls no callback when `fit` raises); after Keras's own `fit` raised,
        call it yourself.

        Example:

        >>> try:
        ...     model.fit(data, epochs=3, callbacks=[guard])
        ... except Exception as error:
        ...     guard.on_fit_error(error)
        ...     raise
        """
        del error  # whatever it was, this fit's record is done
        self.on_train_end()

    def _on_train_batch_end(self, batch, logs=None):
        health = self.health
        batches = batch + 1  # batches of this epoch in the logged running mean
        if batches <= health.epoch_batches:  # the epoch started over (keras fit redoes it)
            health.epoch_batches, health.checked_batches, health.checked_mean = 0, 0, 0.0
        previous = health.steps
        health.steps += batches - health.epoch_batches
        health.epoch_batches = batches
        # With steps_per_execution > 1 a call covers several steps: check when
        # a multiple of check_freq lies within them.
        if health.steps // self.check_freq > previous // self.check_freq:
            self._check(logs, batch)

    def get_config(self):
        return {"factor": self.factor or 0, "window": self.window, "warmup": self.warmup,
                "patience": self.patience, "monitor": self.monitor,
                "check_freq": self.check_freq, "hint": self.hint}

    # ------------------------------------------------------------ the rule
    def _check(self, logs, batch):
        health = self.health
        if not logs or self.monitor not in logs:
            self._warn_once("missing", f"DivergenceGuard: {self.monitor!r} is not in the batch "
                            f"logs (which have {sorted(logs or {})}); nothing is checked.")
            return
        mean = np.asarray(logs[self.monitor], dtype=np.float64)
        if mean.size != 1:
            raise ValueError(
                f"DivergenceGuard watches one number; the log entry {self.monitor!r} has shape "
                f"{mean.shape}. Pass monitor= the name of a scalar loss.")
        mean = float(mean.reshape(()))
        batches, before = health.epoch_batches, health.checked_batches
        spanned = batches - before if 0 < before < batches else batches
        if 0 < before < batches:
            value = (batches * mean - before * health.checked_mean) / (batches - before)
        else:
            value = mean
        health.checked_batches, health.checked_mean = batches, mean
        if not math.isfinite(value):
            self._fail("non-finite", value, None, batch, spanned)
        armed = health.steps >= self.warmup and len(health.values) >= self.window
        if not armed:
            self._record(value)
            return
        level = statistics.median(health.values)
        if level <= 0:
            self._warn_once("level", f"DivergenceGuard: the recent level of {self.monitor!r} is "
                            f"{level:g}; the ratio rule needs a positive loss, so nothing is "
                            "judged while it is 0 or negative.")
            self._pass(value)
            return
        if value > self.factor * level:
            health.streak += 1
            health.flagged_at = health.steps
            if health.streak >= self.patience:
                self._fail("ratio", value, level, batch, spanned)
            return
        self._pass(value)

    def _pass(self, value):
        self.health.streak = 0
        self.health.healthy_through = self.health.steps
        self._record(value)

    def _record(self, value):
        values = self.health.values
        values.append(value)
        del values[:-self.window]

    def _warn_once(self, key, message):
        if key not in self._warned:
            self._warned.add(key)
            warnings.warn(message, stacklevel=3)

    def _fail(self, rule, value, level, batch, spanned):
        model = self.model
        if model is not None:
            model.stop_training = True
        iterations = None
        optimizer = getattr(model, "optimizer", None)
        if optimizer is not None and hasattr(optimizer, "iterations"):
            try:
                iterations = int(keras.ops.convert_to_numpy(optimizer.iterations))
            except Exception:  # an unbuilt or exotic optimizer: leave it out
                iterations = None
        health = self.health
        what = (f"{self.monitor} is {value:.4g}"
                + (f" (the mean of the {spanned} batches since the previous check)"
                   if spanned > 1 else ""))
        if rule == "ratio":
            why = (f"above {self.factor:g} x its recent level {level:.4g} (the median of the "
                   f"last {len(health.values)} healthy values) at {health.streak} check(s) in a "
                   "row")
        else:
            why = "not finite"
        message = (
            f"DivergenceGuard: training diverged at global step {health.steps} (batch {batch} "
            f"of epoch index {self._epoch}, Epoch {self._epoch + 1} in the progress bar"
            + (f", optimizer iteration {iterations}" if iterations is not None else "")
            + f"): {what}, {why}. Training stopped without running on_train_end.")
        notes = health.notify_stop()
        if notes:
            message += " " + notes
        message += " " + (self.hint or DEFAULT_CAUSES)
        raise DivergenceError(message, name=self.monitor, value=value, level=level,
                              factor=self.factor, rule=rule, epoch=self._epoch, batch=batch,
                              step=health.steps, iterations=iterations)
