"""Standard Keras callbacks around tfdist's loop, chief-aware.

A `keras.callbacks.CallbackList` with the model set (so `ModelCheckpoint`,
`EarlyStopping`, `ReduceLROnPlateau`, `TensorBoard`... find `self.model`), a
`History`, and a progress bar (`tfdist.callbacks.progress.ProgressLogger`:
model metrics in the bar, speed figures with units after it) that only the
chief shows when several workers train together.
"""

import keras

from tfdist.callbacks.progress import ProgressLogger
from tfdist.strategy import is_chief


def make_callback_list(callbacks, model, strategy, *, verbose, epochs, steps, add_history):
    """Returns a `keras.callbacks.CallbackList` for one fit/evaluate/predict run.

    Args:
        callbacks: a list of `keras.callbacks.Callback`, a `CallbackList`
            (returned unchanged), or None.
        model: the `keras.Model` the callbacks see as `self.model`.
        strategy: the trainer's strategy (decides who shows the progress bar).
        verbose: `"auto"`, 0, 1 or 2, as in Keras; 0 adds no progress bar,
            and neither do non-chief workers.
        epochs: number of epochs (a callback parameter).
        steps: steps per epoch, or None when unknown.
        add_history: add a `keras.callbacks.History` (for `fit`).

    Raises:
        ValueError: `verbose` is not one of the allowed values.

    Example:

    >>> cbks = make_callback_list([keras.callbacks.EarlyStopping()], model, strategy,
    ...                           verbose=0, epochs=3, steps=None, add_history=True)
    """
    if isinstance(callbacks, keras.callbacks.CallbackList):
        return callbacks
    if verbose not in ("auto", 0, 1, 2):
        raise ValueError(f"verbose must be one of 'auto', 0, 1, 2; got {verbose!r}.")
    if not is_chief(strategy):
        verbose = 0
    callbacks = list(callbacks or [])
    if verbose != 0 and not any(isinstance(c, keras.callbacks.ProgbarLogger) for c in callbacks):
        callbacks.append(ProgressLogger())
    return keras.callbacks.CallbackList(
        callbacks, add_history=add_history, add_progbar=verbose != 0,
        model=model, verbose=verbose, epochs=epochs, steps=steps)
