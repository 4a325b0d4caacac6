"""The seam to `keras.callbacks.ProgbarLogger`'s private hooks.

Example:

    from tfdist.seam.keras_callbacks import ProgbarLoggerHooks

    class Quiet(ProgbarLoggerHooks):
        def shown_logs(self, logs):
            return {k: v for k, v in (logs or {}).items() if k == "loss"}
"""

import keras


class ProgbarLoggerHooks(keras.callbacks.ProgbarLogger):
    """Keras's progress bar with public hooks: which logs it shows, and what follows an epoch's bar.

    Private: `ProgbarLogger._update_progbar` and `_finalize_progbar` (Keras has
    no public way to choose the shown logs).

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

    def _update_progbar(self, batch, logs=None):  # noqa: D401 - Keras's hook
        super()._update_progbar(batch, self.shown_logs(logs))

    def _finalize_progbar(self, logs):
        super()._finalize_progbar(self.shown_logs(logs))
        self.after_bar(logs)
