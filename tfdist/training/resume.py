"""The resume protocol: where a running `Trainer.fit` is, and how a callback starts it mid-epoch.

`FitPosition` is what the `Trainer` publishes on the model during `fit`
(`getattr(model, FIT_POSITION_ATTRIBUTE)`); `ResumePoint` is a position to
start from. `tfdist.callbacks.backup.BackupAndResume` drives it.
"""

import collections

import numpy as np

FIT_POSITION_ATTRIBUTE = "_tfdist_fit_position"
"""Name of the model attribute holding the `FitPosition` of a running `Trainer.fit`."""


class ResumePoint(collections.namedtuple(
        "ResumePoint", ["epoch", "step", "iterator_batches", "iterator_index"])):
    """A position in training that `fit` can start from (see `FitPosition`).

    Args:
        epoch: the epoch index.
        step: training batches of that epoch already done.
        iterator_batches: batches already drawn from that epoch's data
            iterator (more than `step` when the iterator continues across
            epochs, with `steps_per_epoch`).
        iterator_index: which data iterator (0-based count of
            `iter(dataset)` calls since training started) that epoch uses.
            Creating the earlier ones again reproduces per-iteration state
            such as the order of `dataset.shuffle(seed=...)`, which
            reshuffles at every new iterator.

    Example:

    >>> ResumePoint(epoch=1, step=3, iterator_batches=3, iterator_index=1)
    """


class FitPosition:
    """Where a running `Trainer.fit` is in its data, and the way to start it mid-epoch.

    This is the resume protocol between the `Trainer` and callbacks, which
    only see the model: while `fit` runs, the trainer publishes this object
    as `getattr(model, FIT_POSITION_ATTRIBUTE)` (set back to None when `fit`
    returns or raises; plain `keras.Model.fit` has none). A callback can

    * read the exact position at any batch or epoch end (`resume_point()`):
      epoch, step, the batches drawn from the current data iterator (more
      than the step when `steps_per_epoch` is set and the iterator continues
      across epochs) and which iterator that is;
    * ask, in `on_train_begin` only, that training start at such a
      position (`resume_at`): `fit` then starts at that epoch, re-creates
      and discards the data iterators of the earlier epochs (so a seeded
      `shuffle` that reshuffles every iteration is at the same order),
      draws and discards the batches already consumed from the epoch's
      iterator, and runs the rest of the epoch, with batch indices
      continuing from the step. For a deterministic input pipeline this
      reproduces the data position exactly (`tf.distribute`'s distributed
      iterators cannot be checkpointed in TF 2.21, so the position is
      replayed);
    * tell whether the optimizer is between two updates
      (`at_update_boundary()`): with `grad_accum_steps=K` the per-replica
      gradient buffers of a partial accumulation are not restorable, so a
      backup should only be taken when this is True (`resume_at` drops a
      partial accumulation).

    `tfdist.callbacks.backup.BackupAndResume` drives it; a callback that
    resumes training with `keras.Model.fit` can only set the model's initial
    epoch (`tfdist.seam.set_model_initial_epoch`) and restart the epoch.

    Args:
        steps_per_epoch: the `fit` argument (None: one pass over the data
            per epoch, with a new iterator every epoch).
        grad_accum_steps: micro-batches per optimizer update.
        update_boundary: a function returning True when no gradient
            accumulation is in progress, or None when there is no
            accumulation.
        replays_consumed_batches: whether `fit` reaches a requested data
            position by drawing and discarding the consumed batches
            (`Trainer`: True for a dataset that can only be replayed; the
            parameter-server loop, whose workers start their datasets anew,
            False).
        starts_input_at_position: whether `fit` builds its input at the
            requested position instead (`Trainer` with a `tfdist.data`
            pipeline function that can be positioned).

    Attributes:
        epoch: the current epoch index.
        step: training batches finished in the current epoch.
        iterator_batches: batches drawn from the current data iterator
            since it was created (the data position).
        iterator_index: the current iterator's index (0 for the first
            `iter(dataset)` of training; -1 before there is one).
        epoch_finished: True from the end of the epoch's last batch until
            the next epoch begins (validation and `on_epoch_end` run then).
        iterator_continues: whether the next epoch continues the current
            iterator (`steps_per_epoch` set and the data not exhausted).
        requested: the `ResumePoint` asked for with `resume_at`, or None.
        replays_consumed_batches: as the argument.

    Example:

    >>> class Where(keras.callbacks.Callback):
    ...     def on_train_batch_end(self, batch, logs=None):
    ...         position = getattr(self.model, FIT_POSITION_ATTRIBUTE, None)
    ...         if position is not None:
    ...             print(position.resume_point())
    ResumePoint(epoch=0, step=3, iterator_batches=3, iterator_index=0)
    """

    def __init__(self, steps_per_epoch, grad_accum_steps=1, update_boundary=None,
                 replays_consumed_batches=True, starts_input_at_position=False):
        self.steps_per_epoch = steps_per_epoch
        self.grad_accum_steps = grad_accum_steps
        self.epoch = 0
        self.step = 0
        self.iterator_batches = 0
        self.iterator_index = -1
        self.epoch_finished = False
        self.iterator_continues = False
        self.requested = None
        self.replays_consumed_batches = replays_consumed_batches
        self.starts_input_at_position = starts_input_at_position
        self._update_boundary = update_boundary
        self._started = False

    def resume_point(self):
        """Returns the `ResumePoint` to start `fit` at (with `resume_at`) to
        continue exactly from here.

        During an epoch this is the current epoch, step and data position;
        once the epoch's batches are done it is the start of the next epoch.

        Example:

        >>> position.resume_point()
        ResumePoint(epoch=1, step=0, iterator_batches=4, iterator_index=0)
        """
        if self.epoch_finished:
            if self.iterator_continues:
                return ResumePoint(self.epoch + 1, 0, self.iterator_batches,
                                   self.iterator_index)
            return ResumePoint(self.epoch + 1, 0, 0, self.iterator_index + 1)
        return ResumePoint(self.epoch, self.step, self.iterator_batches,
                           max(self.iterator_index, 0))

    def at_update_boundary(self):
        """True when no gradient accumulation is in progress (always True
        without `grad_accum_steps`).

        Example:

        >>> position.at_update_boundary()
        True
        """
        return True if self._update_boundary is None else bool(self._update_boundary())

    def start(self):
        """Marks training as started (from now on `resume_at` is refused) and
        returns the `ResumePoint` a callback asked for, or None.

        The training loop calls it after `on_train_begin`.

        Example:

        >>> requested = position.start()
        """
        self._started = True
        return self.requested

    def resume_at(self, epoch, step, iterator_batches, iterator_index=0):
        """Asks `fit` to start at `epoch`, after `step` batches of it, with
        `iterator_batches` batches already drawn from its data iterator, the
        `iterator_index`-th of training.

        Call it from a callback's `on_train_begin`; it overrides `fit`'s
        `initial_epoch` and the model's (`tfdist.seam.model_initial_epoch`).

        Args:
            epoch: the epoch index to start in (an int >= 0).
            step: training batches of that epoch already done (an int >= 0,
                at most `steps_per_epoch` when that is set).
            iterator_batches: batches to draw and discard from the new data
                iterator (an int >= `step`; equal to `step` when
                `steps_per_epoch` is None, since every epoch then starts a
                new pass).
            iterator_index: iterators to create and discard before the one
                that is used (an int >= 0; the epoch index when every epoch
                makes a new pass).

        Raises:
            ValueError: a value is not an int in its range.
            RuntimeError: training has already started.

        Example:

        >>> position.resume_at(epoch=2, step=3, iterator_batches=3, iterator_index=2)
        """
        if self._started:
            raise RuntimeError(
                "FitPosition.resume_at must be called before the first epoch begins "
                "(from a callback's on_train_begin); training has already started.")
        for name, value in (("epoch", epoch), ("step", step),
                            ("iterator_batches", iterator_batches),
                            ("iterator_index", iterator_index)):
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
                raise ValueError(f"resume_at: {name} must be an integer >= 0, got {value!r}.")
        if self.steps_per_epoch is not None and step > self.steps_per_epoch:
            raise ValueError(
                f"resume_at: step={step} is beyond steps_per_epoch={self.steps_per_epoch}.")
        if iterator_batches < step:
            raise ValueError(
                f"resume_at: iterator_batches={iterator_batches} is less than step={step}; "
                "at least the epoch's own batches were drawn from the iterator.")
        if self.steps_per_epoch is None and iterator_batches != step:
            raise ValueError(
                f"resume_at: iterator_batches={iterator_batches} differs from step={step}, "
                "but without steps_per_epoch every epoch is a new pass over the data "
                "(iterator_batches == step).")
        self.requested = ResumePoint(int(epoch), int(step), int(iterator_batches),
                                     int(iterator_index))

    def data_position_note(self):
        """How `fit` will reach the requested data position, as words a resume
        message can add (see `replay_note`); empty when nothing is replayed
        (no request, no batch consumed, or a loop that does not replay).

        Example:

        >>> position.resume_at(epoch=0, step=402, iterator_batches=402)
        >>> position.data_position_note()
        '; replaying the 402 batches already consumed ... (a dataset that can only be replayed)'
        """
        if self.requested is None:
            return ""
        if self.starts_input_at_position and self.requested.iterator_index == 0:
            return position_note(self.requested.iterator_batches)
        if not self.replays_consumed_batches:
            return ""
        return replay_note(self.requested.iterator_batches)


def replay_note(batches):
    """The words a resume message adds when `fit` reaches the data position by
    replaying: drawing the `batches` batches already consumed through the whole
    input pipeline and discarding them (empty for 0 batches). The one place
    this wording lives; a faster way of reaching the position says its own.

    Example:

    >>> replay_note(402)
    '; replaying the 402 batches already consumed from the input pipeline to reach the ...'
    >>> replay_note(0)
    ''
    """
    if not batches:
        return ""
    noun = "batch" if batches == 1 else "batches"
    return (f"; replaying the {batches} {noun} already consumed from the input pipeline to "
            "reach the data position (a dataset that can only be replayed)")


def position_note(batches):
    """The words a resume message adds when the input pipeline is built at the
    data position (`tfdist.data`'s `DatasetFn.positioned`) instead of being
    replayed (empty for 0 batches).

    Example:

    >>> position_note(402)
    '; the input pipeline starts at batch 403 without replaying the 402 before it'
    """
    if not batches:
        return ""
    noun = "batch" if batches == 1 else "batches"
    return (f"; the input pipeline starts at batch {batches + 1} without replaying the "
            f"{batches} {noun} before it")
