"""Preemption: on SIGTERM or SIGINT every worker backs up at one agreed step and stops."""

import itertools
import threading
import time

import keras
import tensorflow as tf

from tfdist.callbacks.chief import model_strategy, task_info
from tfdist.runtime.argtypes import check_number
from tfdist.runtime.stop_signals import HandlerStopSignals, Preempted
from tfdist.distribute.introspection import describe_strategy
from tfdist.seam import coordination_key_value_store

ACK_TIMEOUT = 120.0
_POLL_MS = 1000
_KEY_PREFIX = "tfdist/stop"
# Written in place of a stop step when a worker's `fit` ends, so that every
# worker's watcher stops waiting at once instead of at the end of its poll.
_FIT_ENDED = "fit ended"
# Numbers this process's multi-worker fits in the order they start (the same
# order on every worker): each fit's keys are its own, whichever guard runs it.
_multi_worker_fits = itertools.count(1)


class PreemptionGuard(keras.callbacks.Callback):
    """Turns SIGTERM/SIGINT into a backup at one step all workers agree on, then stops.

    At every training batch end the callback takes a pending stop signal
    (see `tfdist.runtime.stop_signals`). With one worker it then backs up (through
    `backup`, a `BackupAndResume` placed before it) and raises `Preempted`.
    With several workers only the worker that got the signal knows; it
    names a step to stop at through TensorFlow's coordination service (the
    key-value store `MultiWorkerMirroredStrategy` runs, with the protocol of
    TensorFlow's `PreemptionCheckpointHandler`): it claims the stop, sets
    the stop step to its next step and waits until every worker has read
    it (each worker's watcher thread reads it and acknowledges). Workers
    advance in lockstep (every step all-reduces), so none can have passed
    that step; at it every worker takes part in the backup and raises
    `Preempted`. Rerunning the same command resumes at exactly that step.

    Why not `tf.distribute.experimental.PreemptionCheckpointHandler`
    itself: it asks a cloud metadata server whether it runs on GCP (a
    network request at construction), does nothing on GCP CPU machines, and
    saves and restores its own checkpoint; tfdist's backups (data position,
    counters, atomic rotation) are `BackupAndResume`'s.

    With gradient accumulation the step counted is the optimizer update: a
    backup is taken at an update boundary only.

    A signal that arrives at or after the last training step does not stop
    the run: training has finished, so `fit` ends normally (epoch end,
    validation, logs) and `signal_after_last_step` names the signal (the
    recipes then exit 0 saying so). Every worker knows the run's length, so
    all agree on this.

    When `fit` ends, the first worker there marks the stop step as "fit
    ended" in the store, which every watcher is waiting on: the watchers
    stop at once, not at the end of their current poll of the store, which
    would keep `fit` up to a second after its last step. Each multi-worker
    `fit` of the process has keys of its own (numbered in the order the fits
    start, which every worker shares), so a guard made for a later `fit`
    never reads an earlier one's stop step or mark.

    Args:
        backup: the `BackupAndResume` that writes the backup, or None to
            stop without saving (a restart then starts over).
        signals: where stop signals come from: an object with `pending()`
            and `training_started()` (`tfdist.runtime.stop_signals`), or None to
            install `HandlerStopSignals` for the run (and remove them after).
        strategy: the strategy, or None for the model's.
        ack_timeout: seconds the worker that got the signal waits for every
            worker to acknowledge the stop step (an error naming the
            missing workers after that).

    Attributes:
        signal_after_last_step: the signal (`"SIGTERM"`) taken at the last
            training step of `fit`, which therefore ended normally; None.
        watch_ended_by: with several workers, what ended the last `fit`'s
            watcher: `"stop step"` (it read one), `"fit ended"` (the mark
            above), `"cluster gone"` (the store failed) or `"stopped"` (it
            was told to stop between two polls); None before that, or with
            one worker.

    Example:

    >>> backup = BackupAndResume("run/backup", save_freq=100)
    >>> trainer.fit(data, epochs=3, callbacks=[NanGuard(), backup, PreemptionGuard(backup)])
    """

    def __init__(self, backup=None, signals=None, strategy=None, ack_timeout=ACK_TIMEOUT):
        super().__init__()
        if backup is not None and not all(
                callable(getattr(backup, name, None)) for name in ("backup_now", "at_update_boundary")):
            raise TypeError(f"backup must be the BackupAndResume that writes the run's backups, or "
                            f"None to stop without one; got {backup!r}.")
        if signals is not None and not all(
                callable(getattr(signals, name, None)) for name in ("pending", "training_started")):
            raise TypeError("signals must be a source of stop signals with pending() and "
                            "training_started() (tfdist.runtime.stop_signals), or None to catch "
                            f"SIGTERM and SIGINT for the run; got {signals!r}.")
        self.backup = backup
        self.signals = signals
        self.strategy = strategy
        self.ack_timeout = check_number("ack_timeout", ack_timeout, above=0, unit="seconds")
        self._own_signals = None
        self._watcher = None
        self._stop_watching = threading.Event()
        self._reset()

    def _reset(self):
        self._count = 0
        self._stop_at = None
        self._stop_signal = None
        self._claimed = False
        self._epoch = 0
        self._epoch_step = 0
        self._started = False
        self._multi_worker = False
        self._task = ("worker", 0)
        self._num_workers = 1
        self._keys = None
        self.signal_after_last_step = None
        self.watch_ended_by = None

    def on_train_begin(self, logs=None):
        self._reset()
        if self.signals is None:
            self._own_signals = HandlerStopSignals.install()
        strategy = self.strategy or model_strategy(self.model) or tf.distribute.get_strategy()
        info = describe_strategy(strategy)
        task_type, task_id, _ = task_info(strategy)
        self._task = (task_type or "worker", task_id or 0)
        self._num_workers = info.num_workers
        self._multi_worker = info.num_workers > 1
        if self._multi_worker:
            run = f"{_KEY_PREFIX}/{next(_multi_worker_fits)}"
            self._keys = {"claim": f"{run}/claim", "step": f"{run}/step", "ack": f"{run}/ack"}
            # An event of this fit's own: a watcher a failed fit left polling
            # (see on_fit_error) stays stopped and leaves this fit's state alone.
            self._stop_watching = threading.Event()
            self._watcher = threading.Thread(target=self._watch_stop_step, daemon=True,
                                             name="tfdist-stop-step-watcher")
            self._watcher.start()

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch
        self._epoch_step = 0

    def on_train_batch_end(self, batch, logs=None):
        self._epoch_step = batch + 1
        signals = self._signal_source()
        if not self._started:
            self._started = True
            signals.training_started()
        if self.backup is not None and not self.backup.at_update_boundary():
            return
        self._count += 1
        name = signals.pending()
        last = self._at_last_step(batch)
        if not self._multi_worker:
            if name is not None:
                self._stop(name, logs, last)
            return
        if self._stop_at is not None and self._count >= self._stop_at:
            self._stop(self._stop_signal, logs, last)
        elif last and (name or self._stop_at is not None):
            self.signal_after_last_step = name or self._stop_signal  # the stop step never comes
        elif name is not None and not self._claimed and self._stop_at is None:
            self._claim(name)

    def _at_last_step(self, batch):
        """Whether `batch` is the last training step of this `fit` (False when unknown)."""
        params = self.params or {}
        epochs, steps = params.get("epochs"), params.get("steps")
        return bool(epochs and steps) and self._epoch == epochs - 1 and batch + 1 >= steps

    def on_train_end(self, logs=None):
        self._finish()

    def on_fit_error(self, error):
        """Ends the guard's part in a `fit` that raised `error`, as the end of a
        `fit` does: gives back the signal handlers it installed (else Ctrl-C
        would stay a noted stop request in this process) and stops its
        watcher. tfdist's `Trainer` calls it (Keras calls no callback when
        `fit` raises); after Keras's own `fit` raised, call it yourself.
        Unlike the end of a `fit`, it neither waits for the watcher nor
        writes to the coordination service, which a lost worker may have
        taken down with the `fit`.

        Example:

        >>> try:
        ...     model.fit(data, epochs=3, callbacks=[guard])
        ... except Exception as error:
        ...     guard.on_fit_error(error)
        ...     raise
        """
        del error  # whatever it was, the guard's fit is over
        # No "fit ended" mark and no wait: the store may have gone with the failed
        # fit (a lost worker), and the watcher, a daemon, ends at its next poll.
        self._stop_watching.set()
        self._watcher = None
        self._close_signals()

    # ------------------------------------------------------------ protocol
    def _claim(self, name):
        """The worker that got the signal names the stop step (its next one)."""
        self._claimed = True
        ctx = coordination_key_value_store()
        try:
            ctx.set_config_key_value(self._keys["claim"], self._task_name())
        except tf.errors.AlreadyExistsError:
            return  # another worker claimed first; its stop step will arrive
        try:
            ctx.set_config_key_value(self._keys["step"], f"{self._count + 1}:{name}")
        except tf.errors.AlreadyExistsError:
            # Another worker's fit has ended (its mark is there): so has training.
            self.signal_after_last_step = name
            return
        deadline = time.monotonic() + self.ack_timeout
        missing = list(range(self._num_workers))
        while missing and time.monotonic() < deadline:
            index = missing[0]
            try:
                ctx.get_config_key_value(f"{self._keys['ack']}/{index}", timeout_in_ms=_POLL_MS)
                missing.pop(0)
            except tf.errors.DeadlineExceededError:
                continue
        if missing:
            raise RuntimeError(
                f"PreemptionGuard: {name} arrived, but worker(s) {missing} did not acknowledge "
                f"the stop step within {self.ack_timeout:g} s; stopping without a common "
                "backup. The last regular backup is kept.")

    def _watch_stop_step(self):
        """Watcher thread: reads the stop step when it is set, and acknowledges it.

        It reads and writes the state of its own fit only: once a later fit
        has started (after a fit that raised, whose watcher was left to end at
        its next poll), it changes nothing."""
        ctx = coordination_key_value_store()
        stop, keys, task = self._stop_watching, self._keys, self._task[1]

        def own_fit():
            return stop is self._stop_watching

        while not stop.is_set():
            try:
                value = ctx.get_config_key_value(keys["step"], timeout_in_ms=_POLL_MS)
            except tf.errors.DeadlineExceededError:
                continue
            except (tf.errors.OpError, RuntimeError):
                if own_fit():
                    self.watch_ended_by = "cluster gone"
                return  # the main thread sees why
            if not own_fit():
                return
            if value == _FIT_ENDED:
                self.watch_ended_by = _FIT_ENDED
                return
            self.watch_ended_by = "stop step"
            step, name = value.split(":", 1)
            self._stop_signal = name
            self._stop_at = int(step)
            try:
                ctx.set_config_key_value(f"{keys['ack']}/{task}", "1")
            except (tf.errors.OpError, RuntimeError):
                pass
            return
        if own_fit():
            self.watch_ended_by = "stopped"

    def _stop(self, name, logs, last=False):
        if last:  # training has finished: end normally instead of stopping
            self.signal_after_last_step = name
            return
        written = None
        if self.backup is not None:
            written = self.backup.backup_now(logs)
        self._finish()
        where = f"in epoch {self._epoch + 1} after step {self._epoch_step}"
        raise Preempted(f"{name} {where}", signal_name=name, epoch=self._epoch,
                        step=self._epoch_step, backup=written)

    def _finish(self):
        if self._watcher is not None:
            self._end_every_watch()
            self._stop_watching.set()
            self._watcher.join(timeout=2 * _POLL_MS / 1000)
            self._watcher = None
        self._close_signals()

    def _close_signals(self):
        """Gives back the signal handlers the guard installed for the fit, if any."""
        if self._own_signals is not None:
            self._own_signals.close()
            self._own_signals = None

    def _end_every_watch(self):
        """Marks the stop step as `_FIT_ENDED` (before `_stop_watching` is set,
        so that this worker's watcher, too, ends by reading it), unless a stop
        step is there already: then every watcher has read it or will."""
        try:
            coordination_key_value_store().set_config_key_value(self._keys["step"], _FIT_ENDED)
        except (tf.errors.OpError, RuntimeError):
            pass  # AlreadyExists (a stop step, or another worker's mark), or the cluster is going away

    def _signal_source(self):
        return self.signals if self.signals is not None else self._own_signals

    def _task_name(self):
        return f"{self._task[0]} {self._task[1]}"
