"""Keras callbacks that record what a `fit()` showed them, for tests to read after.

    from helpers.recorders import BatchRecorder, EpochRecorder

    batches, epochs = BatchRecorder(), EpochRecorder()
    model.fit(x, y, epochs=2, callbacks=[batches, epochs])
    batches.batches   # [(0, 0), (0, 1), ..., (1, 0), ...]: (epoch, batch) of each batch end
    epochs.logs       # [{"loss": 0.9}, {"loss": 0.7}]
"""

import keras


class BatchRecorder(keras.callbacks.Callback):
    """Records every training batch end: `batches` holds its (epoch, batch), and
    `batch_logs` a copy of its logs.

    Example: `recorder.values("learning_rate")` is the logged learning rate of each batch.
    """

    def __init__(self):
        super().__init__()
        self.batches, self.batch_logs, self.epoch = [], [], None

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        self.batches.append((self.epoch, batch))
        self.batch_logs.append(dict(logs or {}))

    def values(self, key):
        """The logged `key` of every batch end, in order.

        Example: `recorder.values("loss")`
        """
        return [logs[key] for logs in self.batch_logs]


class EpochRecorder(keras.callbacks.Callback):
    """Records every epoch end: `epochs` holds its index, and `logs` its logs as floats.

    Example: after `fit(..., epochs=2, callbacks=[r])`, `r.epochs == [0, 1]`.
    """

    def __init__(self):
        super().__init__()
        self.epochs, self.logs = [], []

    def on_epoch_end(self, epoch, logs=None):
        self.epochs.append(epoch)
        self.logs.append({key: float(value) for key, value in (logs or {}).items()})
