"""`LossHealth`: what a `DivergenceGuard` knows about the loss, shared with backups.

A `tfdist.callbacks.DivergenceGuard` keeps its record of the loss (the recent
values, the steps judged healthy) in a `LossHealth` and publishes it on the
model it trains (as `model._tfdist_loss_health`, duck-typed so that the
callbacks need not know each other). Two other callbacks use it when present:

* `BackupAndResume` saves it in every backup and restores it with the
  backup (so a guard resumed by tfdist's Trainer judges exactly like an
  uninterrupted one), asks
  it which backups the guard has seen to be healthy (`confirmed`), keeps the
  newest of those out of its rotation, and registers a listener;
* a guard that stops training (`DivergenceGuard`, `NanGuard`) calls
  `notify_stop(model)` before raising: the listeners (the backup callback
  drops the backups not confirmed healthy) return notes for the error.

Example:

>>> health = loss_health(model)   # None without a DivergenceGuard in the fit
>>> health.steps, health.confirmed(step=120)
(130, True)
"""

import tensorflow as tf

from tfdist.runtime.argtypes import check_int_at_least

HEALTH_ATTRIBUTE = "_tfdist_loss_health"
# Integer fields saved in a backup, in this order.
_COUNTERS = ("steps", "epoch", "epoch_batches", "checked_batches", "streak",
             "healthy_through", "flagged_at", "num_values")


class LossHealth:
    """The loss record of a `DivergenceGuard`: recent values and verdicts.

    All counts are training batches ("steps"), counted from the start of
    training across resumed runs (the record is restored from backups).

    Attributes:
        window: how many recent values are kept.
        steps: training batches seen.
        epoch: the epoch index of the last batch seen (-1: none).
        epoch_batches: batches of that epoch seen (its last batch index + 1).
        checked_batches: `epoch_batches` at the epoch's last check (0: none).
        checked_mean: the logged running mean of the loss at that check.
        values: recent healthy values, oldest first (at most `window`).
        streak: consecutive checks above the threshold so far.
        healthy_through: `steps` at the last check that passed the rule
            (0: none).
        flagged_at: `steps` at the last check above the threshold (0: none).

    Args:
        window: the number of recent values kept (an int >= 1).

    Example:

    >>> health = LossHealth(window=20)
    >>> health.confirmed(step=0)
    False
    """

    def __init__(self, window):
        self.window = check_int_at_least("window", window, 1)
        self._listeners = []
        self._variables = None
        self.reset()

    def reset(self):
        """Forgets everything (a new training run).

        Example:

        >>> health.reset(); health.steps
        0
        """
        self.steps = 0
        self.epoch = -1
        self.epoch_batches = 0
        self.checked_batches = 0
        self.checked_mean = 0.0
        self.values = []
        self.streak = 0
        self.healthy_through = 0
        self.flagged_at = 0

    def start_at(self, steps, epoch, epoch_batches):
        """Starts an empty record at a training position (resuming from a
        backup that holds no record): `steps` batches run, `epoch_batches`
        of them in epoch `epoch`.

        Example:

        >>> health.start_at(steps=12, epoch=1, epoch_batches=4)
        """
        self.reset()
        self.steps, self.epoch, self.epoch_batches = steps, epoch, epoch_batches

    def confirmed(self, step):
        """True when the weights after `step` batches were seen to be healthy:
        a check after `step` passed the rule, and no check failed it between
        `step` and that check.

        Args:
            step: a `steps` value (e.g. `steps` when a backup was taken).

        Example:

        >>> health.healthy_through, health.flagged_at
        (40, 0)
        >>> health.confirmed(39), health.confirmed(40)
        (True, False)
        """
        return self.healthy_through > max(step, self.flagged_at)

    # ------------------------------------------------------------ listeners
    def add_listener(self, listener):
        """Registers `listener()` (returns a note for the error, or None), called
        when a guard stops training. Registering the same one twice is a no-op.

        Example:

        >>> health.add_listener(lambda: "backups kept")
        """
        if listener not in self._listeners:
            self._listeners.append(listener)

    def clear_listeners(self):
        """Forgets the listeners (a new training run registers its own).

        Example:

        >>> health.clear_listeners()
        """
        self._listeners.clear()

    def notify_stop(self):
        """Calls the listeners; returns their notes joined into one string ("" if none).

        A listener that raises is reported in the notes instead.

        Example:

        >>> health.notify_stop()
        'BackupAndResume: kept backup/ckpt-12 ...'
        """
        notes = []
        for listener in list(self._listeners):
            try:
                note = listener()
            except Exception as error:  # the guard's own error must still be raised
                note = f"(a backup callback failed while reacting: {type(error).__name__}: {error})"
            if note:
                notes.append(note)
        return " ".join(notes)

    # ------------------------------------------------------------ in backups
    def trackable(self):
        """The `tf.Module` holding this record for a `tf.train.Checkpoint`
        (created at the first call; call it outside any strategy scope).

        Example:

        >>> tf.train.Checkpoint(loss_health=health.trackable()).write("ckpt")
        """
        if self._variables is None:
            self._variables = _HealthVariables(self.window)
        return self._variables

    def store(self):
        """Copies the record into `trackable()`'s variables (before a backup).

        Example:

        >>> health.store()
        """
        variables = self.trackable()
        counters = [getattr(self, name) for name in _COUNTERS[:-1]] + [len(self.values)]
        variables.counters.assign(counters)
        floats = [self.checked_mean] + list(self.values) + [0.0] * (self.window - len(self.values))
        variables.floats.assign(floats)

    def restore(self, path):
        """Reads the record from the backup `path`.

        Returns:
            True when restored; False when the backup holds no record of
            this shape (written without a guard, or with another `window`),
            in which case the record is left as it is.

        Example:

        >>> health.restore("backup/ckpt-12")
        True
        """
        variables = _HealthVariables(self.window)  # read apart: a failed read changes nothing
        try:
            status = tf.train.Checkpoint(loss_health=variables).read(path)
            status.expect_partial()
            status.assert_existing_objects_matched()
        except (AssertionError, ValueError, tf.errors.OpError):
            return False
        counters = [int(v) for v in variables.counters.numpy()]
        floats = [float(v) for v in variables.floats.numpy()]
        values = dict(zip(_COUNTERS, counters))
        count = values.pop("num_values")
        for name, value in values.items():
            setattr(self, name, value)
        self.checked_mean = floats[0]
        self.values = floats[1:1 + count]
        return True


class _HealthVariables(tf.Module):
    """The record as variables, saved in backups as `loss_health/...`."""

    def __init__(self, window):
        super().__init__(name="loss_health")
        with tf.init_scope():
            self.counters = tf.Variable([0] * len(_COUNTERS), dtype=tf.int64, trainable=False,
                                        name="counters")
            self.floats = tf.Variable([0.0] * (window + 1), dtype=tf.float64, trainable=False,
                                      name="floats")


def loss_health(model):
    """The `LossHealth` a `DivergenceGuard` published on `model`, or None.

    Example:

    >>> loss_health(model) is None   # no DivergenceGuard in the callbacks
    True
    """
    return getattr(model, HEALTH_ATTRIBUTE, None) if model is not None else None


def notify_stop(model):
    """Tells the listeners of `model`'s `LossHealth` that a guard stops
    training; returns their notes ("" without a `DivergenceGuard`).

    Example:

    >>> message += " " + notify_stop(self.model)
    """
    health = loss_health(model)
    return health.notify_stop() if health is not None else ""


class LossStopError(RuntimeError):
    """Base of the errors that stop training over the loss: a message and named fields.

    A subclass lists its fields in `FIELDS`; each is an attribute (None when
    not given), and the error pickles with them (it crosses process
    boundaries in multi-worker runs and test harnesses).

    Example:

    >>> class MyStop(LossStopError):
    ...     FIELDS = ("name", "value")
    >>> MyStop("loss too high", name="loss", value=9.5).value
    9.5
    """

    FIELDS = ()

    def __init__(self, message, *values, **fields):
        # Positional values fill FIELDS in order, as the errors' old signatures did.
        if len(values) > len(self.FIELDS):
            raise TypeError(f"{type(self).__name__} takes at most {len(self.FIELDS)} field "
                            f"values after the message, got {len(values)}")
        twice = sorted(set(self.FIELDS[:len(values)]) & set(fields))
        if twice:
            raise TypeError(f"{type(self).__name__} got field {twice[0]!r} twice")
        fields = {**dict(zip(self.FIELDS, values)), **fields}
        unknown = sorted(set(fields) - set(self.FIELDS))
        if unknown:
            raise TypeError(f"{type(self).__name__} has no field {unknown[0]!r}; "
                            f"its fields: {', '.join(self.FIELDS)}")
        super().__init__(message)
        for field in self.FIELDS:
            setattr(self, field, fields.get(field))

    def __reduce__(self):
        return (_rebuild_loss_stop, (type(self), self.args[0],
                                     {field: getattr(self, field) for field in self.FIELDS}))


def _rebuild_loss_stop(error_type, message, fields):
    return error_type(message, **fields)

