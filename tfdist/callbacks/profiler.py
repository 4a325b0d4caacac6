"""Capture a TensorBoard profile of a chosen range of training steps."""

import logging
import os
import warnings

import keras
import tensorflow as tf

from tfdist.callbacks.chief import is_chief, model_strategy
from tfdist.runtime.argtypes import check_int_at_least

logger = logging.getLogger(__name__)


class ProfilerWindow(keras.callbacks.Callback):
    """Profiles training steps `start_step` to `stop_step - 1` for TensorBoard.

    Starts `tf.profiler.experimental.start(log_dir)` just before global step
    `start_step` and stops it (`tf.profiler.experimental.stop()`, which
    writes `log_dir/plugins/profile/<run>/<host>.xplane.pb`) right after
    step `stop_step - 1`. Steps count training batches from 0 across epochs
    of one `fit` call; each profiled step is marked with
    `tf.profiler.experimental.Trace("train", step_num=step)` so TensorBoard's
    profile plugin shows per-step times. Leave the first steps out of the
    window: they trace and compile the step function.

    If training ends inside the window (fewer steps than `stop_step`, early
    stopping), the profile is stopped and saved at the end of training. If
    the window is never reached nothing is written (with a warning when the
    run's length is known in advance). A profiler that cannot start (for
    example because another one, such as `TensorBoard(profile_batch=...)`,
    is running) is logged as an error and training goes on, as in Keras.

    With `steps_per_execution > 1` the callback sees groups of steps; the
    window then grows to whole groups (starting before the group that
    contains `start_step`, stopping after the one that contains
    `stop_step - 1`).

    Multi-worker: only the chief (see `tfdist.callbacks.chief.is_chief`)
    profiles; the other workers count steps and do nothing else. (Workers
    on one machine would write their profiles under the same host name, and
    the chief's profile already shows the time spent waiting in the job's
    all-reduces.)

    After the run, `profiled_steps` holds the `(first, last)` steps that were
    captured, or None.

    Args:
        log_dir: directory for the profile, usually the TensorBoard log dir
            of the run (a str or path-like).
        start_step: first global step to profile, an int >= 0.
        stop_step: the step after the last one to profile, an int >
            `start_step` (`range(start_step, stop_step)` is profiled).

    Example:

    >>> profiler = ProfilerWindow("logs/run1", start_step=10, stop_step=15)
    >>> model.fit(dataset, epochs=2, callbacks=[profiler])
    >>> profiler.profiled_steps
    (10, 14)
    """

    def __init__(self, log_dir, start_step, stop_step):
        super().__init__()
        if not isinstance(log_dir, (str, os.PathLike)) or not os.fspath(log_dir):
            raise ValueError(f"log_dir must be a non-empty path, got {log_dir!r}.")
        for name, value in (("start_step", start_step), ("stop_step", stop_step)):
            check_int_at_least(name, value, 0)
        if stop_step <= start_step:
            raise ValueError(
                f"stop_step must be greater than start_step (steps range(start_step, "
                f"stop_step) are profiled); got start_step={start_step}, "
                f"stop_step={stop_step}.")
        self.log_dir = os.fspath(log_dir)
        self.start_step = start_step
        self.stop_step = stop_step
        self.profiled_steps = None
        self._reset()

    def _reset(self):
        self._chief = True
        self._active = False
        self._done = False
        self._trace = None
        self._steps_done = 0      # training batches finished in this fit
        self._epoch_offset = 0    # steps done before the current epoch
        self._group_begin = 0     # global step of the current batch group's first step
        self._group_size = 1      # batches in the last group (steps_per_execution)
        self._first = self._last = None

    def on_train_begin(self, logs=None):
        self._reset()
        self.profiled_steps = None
        self._chief = is_chief(model_strategy(self.model))
        spe = getattr(self.model, "steps_per_execution", 1)
        self._group_size = spe if isinstance(spe, int) and spe > 0 else 1
        params = self.params or {}
        steps, epochs = params.get("steps"), params.get("epochs")
        if steps and epochs and steps * epochs <= self.start_step:
            warnings.warn(
                f"ProfilerWindow: the run has {steps * epochs} steps ({epochs} epochs x {steps}), "
                f"so the window starting at step {self.start_step} is never reached and nothing "
                "is profiled.", stacklevel=2)

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch_offset = self._steps_done

    def on_train_batch_begin(self, batch, logs=None):
        step = self._epoch_offset + batch
        self._group_begin = step
        if self._done or not self._chief:
            return
        if (not self._active and step < self.stop_step
                and step + self._group_size > self.start_step):
            self._start()
        if self._active:
            self._trace = tf.profiler.experimental.Trace("train", step_num=step, _r=1)
            self._trace.__enter__()
            if self._first is None:
                self._first = step

    def on_train_batch_end(self, batch, logs=None):
        step = self._epoch_offset + batch
        self._group_size = max(1, step - self._group_begin + 1)
        self._steps_done = step + 1
        if self._trace is not None:
            self._trace.__exit__(None, None, None)
            self._trace = None
            self._last = step
        if self._active and self._steps_done >= self.stop_step:
            self._stop()

    def on_train_end(self, logs=None):
        if self._trace is not None:
            self._trace.__exit__(None, None, None)
            self._trace = None
        if self._active:
            self._stop()

    def on_fit_error(self, error):
        """Stops a window that a raising `fit` left open, saving the steps profiled
        before the error (often the ones worth reading) and freeing the profiler
        for the next `fit`. tfdist's `Trainer` calls it (Keras calls no callback
        when `fit` raises); after Keras's own `fit` raised, call it yourself.

        Example:

        >>> try:
        ...     model.fit(data, epochs=3, callbacks=[window])
        ... except Exception as error:
        ...     window.on_fit_error(error)
        ...     raise
        """
        del error  # whatever it was, the window ends here
        self.on_train_end()

    def get_config(self):
        return {"log_dir": self.log_dir, "start_step": self.start_step,
                "stop_step": self.stop_step}

    def _start(self):
        try:
            tf.profiler.experimental.start(self.log_dir)
        except Exception as error:  # profiling must never stop training
            logger.error("ProfilerWindow: could not start the profiler in %s: %s",
                         self.log_dir, error)
            self._done = True
            return
        self._active = True

    def _stop(self):
        self._active = False
        self._done = True
        try:
            tf.profiler.experimental.stop()
        except Exception as error:
            logger.error("ProfilerWindow: could not stop the profiler: %s", error)
            return
        if self._first is not None:
            self.profiled_steps = (self._first, self._last if self._last is not None
                                   else self._first)
        logger.info("ProfilerWindow: profiled steps %s into %s", self.profiled_steps,
                    os.path.join(self.log_dir, "plugins", "profile"))
