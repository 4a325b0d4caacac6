"""The seam to `keras.callbacks.ProgbarLogger`'s private hooks (and the
step-time estimate of its `keras.utils.Progbar`, so that a resumed epoch's
rate and ETA count only the steps run since the resume).

Example:

    from tfdist.seam.keras_callbacks import ProgbarLoggerHooks

    class Quiet(ProgbarLoggerHooks):
        def shown_logs(self, logs):
            return {k: v for k, v in (logs or {}).items() if k == "loss"}
"""

import time

import keras


class _ProgbarFromStep(keras.utils.Progbar):
    """A `keras.utils.Progbar` whose time per step (and so its ETA) counts only
    the steps from `first_step` on: an epoch resumed at step 402 shows the
    rate of the steps run since the resume, not the elapsed time divided by 403.

    Private: overrides `Progbar._estimate_step_duration(current, now)`.
    With `first_step == 0` (an epoch run from its start) it is Keras's estimate.
    """

    first_step = 0
    steps_began = None  # when the first step after the resume began
    after_first_step = None  # when the first step after the resume ended

    def start_at(self, first_step):
        """Marks the epoch as starting at batch `first_step` now (its first batch begins)."""
        self.first_step = first_step
        self.steps_began = time.time()
        self.after_first_step = None

    def _estimate_step_duration(self, current, now):  # noqa: D401 - Keras's hook
        if not self.first_step:
            return super()._estimate_step_duration(current, now)
        steps_run = current - self.first_step
        if steps_run <= 0:
            return 0
        if steps_run > 1 and self.after_first_step is not None:
            # As Keras does, the first step (here: the first after the resume) is left out.
            return (now - self.after_first_step) / (steps_run - 1)
        if steps_run == 1:
            self.after_first_step = now
        return (now - self.steps_began) / steps_run


class ProgbarLoggerHooks(keras.callbacks.ProgbarLogger):
    """Keras's progress bar with public hooks: which logs it shows, and what follows an epoch's bar.

    Private: `ProgbarLogger._update_progbar` and `_finalize_progbar` (Keras has
    no public way to choose the shown logs); `_maybe_init_progbar` and
    `Progbar._estimate_step_duration`: in an epoch whose first batch is not
    batch 0 (`tfdist.training.Trainer` resumed mid-epoch), the time per step
    and the ETA count only the steps run since that batch (Keras divides the
    elapsed time by the batch index); the elapsed time shown stays the wall
    time since the epoch began.

    Example:

    >>> class LossOnly(ProgbarLoggerHooks):
    ...     def shown_logs(self, logs):
    ...         return {"loss": logs["loss"]}
    """

    def shown_logs(self, logs):
        """The logs the bar shows (default: all of them).

        Example:

        >>> ProgbarLoggerHooks().shown_logs({"loss": 1.0})
        {'loss': 1.0}
        """
        return logs

    def after_bar(self, logs):
        """Called after the bar of an epoch (or of evaluate/predict) is finished, with all its logs.

        Example:

        >>> ProgbarLoggerHooks().after_bar({"loss": 1.0})
        """

    def on_train_batch_begin(self, batch, logs=None):
        """At an epoch's first batch, tells the bar which batch the epoch starts at.

        Example:

        >>> logger = ProgbarLoggerHooks()
        >>> logger.set_params({"verbose": 1, "epochs": 1, "steps": 500})
        >>> logger.on_epoch_begin(0)
        >>> logger.on_train_batch_begin(402)  # resumed: the rate counts from batch 402
        """
        super().on_train_batch_begin(batch, logs)
        if self.seen == 0:  # no batch has ended in this epoch yet
            self._maybe_init_progbar()
            if isinstance(self.progbar, _ProgbarFromStep):
                self.progbar.start_at(batch)

    def _maybe_init_progbar(self):  # noqa: D401 - Keras's hook
        if self.progbar is None:  # as Keras's, with the resume-aware step time
            self.progbar = _ProgbarFromStep(target=self.target, verbose=self.verbose,
                                            unit_name="step", stateless_metrics=set())

    def _update_progbar(self, batch, logs=None):  # noqa: D401 - Keras's hook
        super()._update_progbar(batch, self.shown_logs(logs))

    def _finalize_progbar(self, logs):
        super()._finalize_progbar(self.shown_logs(logs))
        self.after_bar(logs)
