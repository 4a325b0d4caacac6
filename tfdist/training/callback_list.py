"""Standard Keras callbacks around tfdist's loop, chief-aware.

A `keras.callbacks.CallbackList` with the model set (so `ModelCheckpoint`,
`EarlyStopping`, `ReduceLROnPlateau`, `TensorBoard`... find `self.model`), a
`History`, and a progress bar (`tfdist.callbacks.progress.ProgressLogger`:
model metrics in the bar, speed figures with units after it) that only the
chief shows when several workers train together. Under a multi-worker
strategy Keras's file-writing callbacks are made to write once per job
(`tfdist.callbacks.worker_safe.make_worker_safe`). When `fit` raises,
`end_failed_fit` (or `telling_callbacks_if_fit_fails` around a fit's body)
lets the callbacks release what they hold for a `fit`.
"""

import contextlib
import warnings

import keras

from tfdist.callbacks.progress import ProgressLogger
from tfdist.callbacks.worker_safe import make_worker_safe
from tfdist.distribute.collectives import is_chief


def make_callback_list(callbacks, model, strategy, *, verbose, epochs, steps, add_history):
    """Returns a `keras.callbacks.CallbackList` for one fit/evaluate/predict run.

    Under a strategy with several workers (`MultiWorkerMirroredStrategy`),
    the callbacks pass through `make_worker_safe` first: `ModelCheckpoint`,
    `CSVLogger` and `TensorBoard` run in `ChiefOnly` (only the chief writes
    their files), and a `keras.callbacks.BackupAndRestore` becomes a
    `WorkerSafeBackupAndRestore` (every worker restores from `backup_dir`,
    only the chief writes there); other callbacks are unchanged. With one
    worker the list is used as given.

    Args:
        callbacks: a list of `keras.callbacks.Callback` (or one callback), a
            `CallbackList` (returned unchanged: it is not made worker-safe),
            or None.
        model: the `keras.Model` the callbacks see as `self.model`.
        strategy: the trainer's strategy (decides who shows the progress bar,
            and whether callbacks are made worker-safe).
        verbose: `"auto"`, 0, 1 or 2, as in Keras; 0 adds no progress bar,
            and neither do non-chief workers.
        epochs: number of epochs (a callback parameter).
        steps: steps per epoch, or None when unknown.
        add_history: add a `keras.callbacks.History` (for `fit`).

    Raises:
        ValueError: `verbose` is not one of the allowed values, or a
            `BackupAndRestore` cannot be made worker-safe (see
            `make_worker_safe`).

    Example:

    >>> cbks = make_callback_list([keras.callbacks.EarlyStopping()], model, strategy,
    ...                           verbose=0, epochs=3, steps=None, add_history=True)
    """
    if isinstance(callbacks, keras.callbacks.CallbackList):
        return callbacks
    if isinstance(callbacks, keras.callbacks.Callback):
        callbacks = [callbacks]  # one callback, as Keras's fit takes it
    callbacks = _checked_callbacks(callbacks)
    if verbose not in ("auto", 0, 1, 2):
        raise ValueError(f"verbose must be one of 'auto', 0, 1, 2; got {verbose!r}.")
    if not is_chief(strategy):
        verbose = 0
    callbacks = make_worker_safe(callbacks, strategy)
    if verbose != 0 and not any(isinstance(c, keras.callbacks.ProgbarLogger) for c in callbacks):
        callbacks.append(ProgressLogger())
    return keras.callbacks.CallbackList(
        callbacks, add_history=add_history, add_progbar=verbose != 0,
        model=model, verbose=verbose, epochs=epochs, steps=steps)


def _checked_callbacks(callbacks):
    """`callbacks` as a new list, each a `keras.callbacks.Callback`, else a ValueError
    naming the odd one."""
    if callbacks is None:
        return []
    if isinstance(callbacks, (str, bytes, dict)) or not hasattr(callbacks, "__iter__"):
        raise ValueError(f"callbacks must be a list of keras.callbacks.Callback (or one), got "
                         f"{type(callbacks).__name__}: {callbacks!r}.")
    callbacks = list(callbacks)
    for index, callback in enumerate(callbacks):
        if not isinstance(callback, keras.callbacks.Callback):
            hint = (" (a class: pass an instance, e.g. with ())"
                    if isinstance(callback, type) and issubclass(callback, keras.callbacks.Callback)
                    else "")
            raise ValueError(f"callbacks[{index}] is not a keras.callbacks.Callback{hint}: got "
                             f"{type(callback).__name__}: {callback!r}.")
    return callbacks


def end_failed_fit(callback_list, error):
    """Tells the callbacks of a `fit` that raised `error`, before it propagates.

    Keras calls no callback when `fit` raises, so what a callback holds for
    the length of a `fit` (released in `on_train_end`) would stay held. Each
    callback with an `on_fit_error(error)` method gets that call here
    (tfdist's callbacks that hold something for a `fit` have one; e.g.
    `PreemptionGuard` gives back the SIGINT/SIGTERM handlers it installed,
    or Ctrl-C would stay a noted stop request in that process, and
    `ProfilerWindow` saves and stops an open profile). A hook that fails is
    reported as a warning; the error of `fit` is the one raised.

    Example:

    >>> try:
    ...     run_epochs()
    ... except BaseException as error:
    ...     end_failed_fit(callback_list, error)
    ...     raise
    """
    for callback in callback_list.callbacks:
        hook = getattr(callback, "on_fit_error", None)
        if not callable(hook):
            continue
        try:
            hook(error)
        except Exception as hook_error:  # noqa: BLE001 - the fit's own error goes on
            warnings.warn(f"{type(callback).__name__}.on_fit_error failed after fit raised "
                          f"{type(error).__name__}: {hook_error!r}", RuntimeWarning, stacklevel=2)


@contextlib.contextmanager
def telling_callbacks_if_fit_fails(callback_list):
    """Runs the body of a `fit`; if it raises, `end_failed_fit` tells the
    callbacks of `callback_list` before the error goes on.

    Example:

    >>> with telling_callbacks_if_fit_fails(callback_list):
    ...     run_epochs()
    """
    try:
        yield
    except BaseException as error:
        end_failed_fit(callback_list, error)
        raise
