"""`WorkerSafeBackupAndRestore`: Keras's `BackupAndRestore` for several workers."""

import json
import logging
import numbers
import os
import shutil
import tempfile
import weakref

import keras
import tensorflow as tf

from tfdist.callbacks.chief import model_strategy, num_workers, task_info
from tfdist.distribute.collectives import agree
from tfdist.runtime.argtypes import check_bool
from tfdist.seam import backup_and_restore_position, set_model_initial_epoch

logger = logging.getLogger(__name__)

_WEIGHTS = "latest.weights.h5"
_METADATA = "training_metadata.json"
_PREVIOUS = ".bkp"  # Keras's suffix for double_checkpoint's previous state
_SOURCES = {None: 0, "latest": 1, "previous": 2}


class WorkerSafeBackupAndRestore(keras.callbacks.BackupAndRestore):
    """`keras.callbacks.BackupAndRestore` that only the chief writes.

    Keras 3's `BackupAndRestore` has no multi-worker logic: with the same
    `backup_dir` on every worker (as in TensorFlow's multi-worker tutorial)
    all workers create and write the same folder and HDF5 file, and the job
    crashes (`FileExistsError`, then `BlockingIOError: unable to lock
    file`). This subclass keeps Keras's files, arguments and behaviour
    (backup at every epoch end or every `save_freq` batches, restart at the
    epoch of the backup, `double_checkpoint`'s fallback to the previous
    state, `delete_checkpoint`), and under a multi-worker strategy:

    * **every worker restores** from `backup_dir` when training begins
      (each needs the same weights and epoch), without writing there; the
      workers then check, with an all-gather, that they restored the same
      state, and raise a `ValueError` otherwise (`backup_dir` must be on
      storage all workers see: a shared file system or a bucket);
    * **only the chief writes** into `backup_dir`. The other workers still
      save at the same points (saving may read `ON_READ` variables, an
      all-reduce every worker must join) into a temporary folder of their
      own, deleted when training ends (or when the process exits, if
      training is interrupted by an error);
    * only the chief deletes `backup_dir` (`delete_checkpoint`) and repairs
      it after falling back to the previous state (`double_checkpoint`).

    With one worker it behaves as Keras's callback. tfdist's `Trainer` uses
    it automatically in place of a `keras.callbacks.BackupAndRestore` under
    multi-worker strategies (`tfdist.callbacks.worker_safe.make_worker_safe`).
    For step-exact resumes and atomic backups see
    `tfdist.callbacks.BackupAndResume`.

    Args:
        backup_dir: the backup folder, as for Keras (a str or path-like);
            the same on every worker.
        save_freq: `"epoch"` or a number of batches, as for Keras. `False`
            (Keras 3 documents it for preemption checkpointing, which it does
            not have, and then saves after every batch) is refused.
        double_checkpoint: also keep the previous state, as for Keras.
        delete_checkpoint: delete `backup_dir` when training ends (chief).
        strategy: the `tf.distribute.Strategy` that decides who is chief
            and how many workers there are, or None for the model's.

    Attributes:
        restored_epoch: the epoch training resumed at in the last
            `on_train_begin` (None: no backup, or one without metadata).
        write_dir: where this process writes its backups during training:
            `backup_dir` on the chief, a temporary folder elsewhere; None
            outside training.

    Example:

    >>> backup = WorkerSafeBackupAndRestore("/shared/run1/backup")
    >>> trainer.fit(dataset, epochs=4, steps_per_epoch=100, callbacks=[backup])
    >>> # interrupted in epoch 3 and restarted: resumes at epoch 2 on every worker
    >>> backup.restored_epoch
    2
    """

    def __init__(self, backup_dir, save_freq="epoch", double_checkpoint=False,
                 delete_checkpoint=True, strategy=None):
        if not isinstance(backup_dir, (str, os.PathLike)) or not os.fspath(backup_dir):
            raise ValueError(f"backup_dir must be a non-empty path, got {backup_dir!r}.")
        if isinstance(save_freq, bool):
            raise ValueError(
                f"save_freq={save_freq!r} cannot be honoured: Keras 3 documents save_freq=False "
                "for preemption checkpointing, which it does not have (its BackupAndRestore "
                "then backs up after every batch). Pass save_freq='epoch' or a number of "
                "batches.")
        if save_freq != "epoch" and (not isinstance(save_freq, numbers.Integral) or save_freq < 1):
            raise ValueError(f"save_freq must be an integer >= 1 (training batches) or 'epoch', "
                             f"got {save_freq!r}.")
        if strategy is not None and not hasattr(strategy, "extended"):
            raise ValueError(
                f"strategy must be a tf.distribute.Strategy or None, got {strategy!r}.")
        for name, value in (("double_checkpoint", double_checkpoint),
                            ("delete_checkpoint", delete_checkpoint)):
            check_bool(name, value)  # Keras takes any value by its truth
        super().__init__(os.fspath(backup_dir), save_freq=save_freq,
                         double_checkpoint=double_checkpoint, delete_checkpoint=delete_checkpoint)
        self.strategy = strategy
        self.restored_epoch = None
        self.write_dir = None
        self._chief = True
        self._workers = 1
        self._distribution = None
        self._temp_dir = None
        self._cleanup = None

    @classmethod
    def from_keras(cls, callback, strategy=None):
        """The worker-safe equivalent of a `keras.callbacks.BackupAndRestore`
        (same `backup_dir`, `save_freq`, `double_checkpoint`, `delete_checkpoint`).

        Args:
            callback: a `keras.callbacks.BackupAndRestore`.
            strategy: as for the constructor.

        Raises:
            TypeError: `callback` is not a `keras.callbacks.BackupAndRestore`.
            ValueError: an argument cannot be honoured (see the constructor).

        Example:

        >>> safe = WorkerSafeBackupAndRestore.from_keras(
        ...     keras.callbacks.BackupAndRestore("/shared/backup", save_freq=50))
        >>> safe.backup_dir, safe.save_freq
        ('/shared/backup', 50)
        """
        if not isinstance(callback, keras.callbacks.BackupAndRestore):
            raise TypeError(
                "from_keras converts a keras.callbacks.BackupAndRestore, got "
                f"{type(callback).__name__}: {callback!r}.")
        return cls(callback.backup_dir, save_freq=callback.save_freq,
                   double_checkpoint=callback.double_checkpoint,
                   delete_checkpoint=callback.delete_checkpoint, strategy=strategy)

    # ------------------------------------------------------------ restoring
    def on_train_begin(self, logs=None):
        model = self.model
        if model is None or not model.built:
            raise ValueError(
                "To use the BackupAndRestore callback, your model must be built before "
                f"training begins; got {model!r}. tfdist's Trainer builds it from the data; with "
                "keras fit, call the model on a batch first.")
        self._finish()  # a previous fit of this process that ended with an error
        self.restored_epoch = None
        self._distribution = model_strategy(model) or tf.distribute.get_strategy()
        decider = self.strategy if self.strategy is not None else self._distribution
        task_type, task_id, self._chief = task_info(decider)
        self._workers = num_workers(decider)
        if self._chief:
            self.write_dir = self.backup_dir
        else:
            worker = f"{task_type or 'worker'}_{task_id}"
            self._temp_dir = tempfile.mkdtemp(prefix=f"tfdist-backup-{worker}-")
            self._cleanup = weakref.finalize(self, shutil.rmtree, self._temp_dir,
                                             ignore_errors=True)
            self.write_dir = self._temp_dir
        optimizer = getattr(model, "optimizer", None)
        if optimizer is not None and not optimizer.built:
            with self._distribution.scope():  # its variables must be restored too
                optimizer.build(model.trainable_variables)
        try:
            epoch, source = self._restore()
            self._agree(epoch, source)
        except Exception:
            self._finish()  # training does not start: no on_train_end
            raise
        if self._chief and source == "previous":
            self._repair()
        self.restored_epoch = epoch
        if epoch is not None:
            set_model_initial_epoch(model, epoch)  # tfdist's Trainer and keras fit start there
            logger.info("WorkerSafeBackupAndRestore: resuming from %s at epoch %d (%s state)",
                        self.backup_dir, epoch, source)

    def _restore(self):
        """Loads the backup in `backup_dir` without writing there.

        Returns `(epoch or None, source)`, source None (no weights file),
        "latest" or "previous" (double_checkpoint's copy, when the latest
        cannot be read)."""
        weights, metadata = _paths(self.backup_dir)
        try:
            return self._load(weights, metadata)
        except OSError as error:
            if not tf.io.gfile.exists(weights + _PREVIOUS):
                raise
            logger.warning("WorkerSafeBackupAndRestore: cannot read %s (%s); restoring the "
                           "previous state", weights, error)
            previous = metadata + _PREVIOUS
            with tempfile.TemporaryDirectory(prefix="tfdist-backup-previous-") as folder:
                # load_weights wants a name ending in .weights.h5; Keras copies the
                # previous file over the latest first, which only the chief may do.
                copy = os.path.join(folder, _WEIGHTS)
                tf.io.gfile.copy(weights + _PREVIOUS, copy, overwrite=True)
                epoch, _ = self._load(copy, previous if tf.io.gfile.exists(previous) else None)
            return epoch, "previous"

    def _load(self, weights, metadata):
        source = None
        if tf.io.gfile.exists(weights):
            self.model.load_weights(weights)
            source = "latest"
        epoch = None
        if metadata is not None and tf.io.gfile.exists(metadata):
            with tf.io.gfile.GFile(metadata, "r") as f:
                epoch = int(json.loads(f.read())["epoch"])
        return epoch, source

    def _repair(self):
        """What Keras does after falling back: the previous state becomes the latest."""
        weights, metadata = _paths(self.backup_dir)
        tf.io.gfile.copy(weights + _PREVIOUS, weights, overwrite=True)
        if tf.io.gfile.exists(metadata + _PREVIOUS):
            tf.io.gfile.copy(metadata + _PREVIOUS, metadata, overwrite=True)
        elif tf.io.gfile.exists(metadata):
            tf.io.gfile.remove(metadata)

    def _agree(self, epoch, source):
        """Several workers: raises unless every worker restored the same state.
        The all-gather is also a barrier: after it, no worker reads `backup_dir`."""
        if self._workers <= 1:
            return
        names = {code: name for name, code in _SOURCES.items()}
        restored = [-1 if epoch is None else epoch, _SOURCES[source]]
        agree(self._distribution, restored, lambda table: (
            "WorkerSafeBackupAndRestore: the workers restored different states from "
            f"backup_dir={self.backup_dir!r}: (epoch, file) per replica "
            f"{sorted({(int(e), names.get(int(s))) for e, s in table})} (epoch -1: "
            "no backup found). Every worker must see the chief's backup_dir: put it on a "
            "shared file system or a bucket, not on each machine's local disk."))

    # -------------------------------------------------------------- saving
    def _save_model(self):
        """Keras's save, into `write_dir` (the chief's `backup_dir`, or this
        worker's temporary folder)."""
        folder = self.write_dir or self.backup_dir
        weights, metadata = _paths(folder)
        if not tf.io.gfile.exists(folder):
            tf.io.gfile.makedirs(folder)
        if self.double_checkpoint and self._chief:  # nobody restores a non-chief's copy
            for path in (weights, metadata):
                if tf.io.gfile.exists(path):
                    tf.io.gfile.copy(path, path + _PREVIOUS, overwrite=True)
        self.model.save_weights(filepath=weights, overwrite=True)
        with tf.io.gfile.GFile(metadata, "w") as f:
            epoch, batch = backup_and_restore_position(self)
            f.write(json.dumps({"epoch": epoch, "batch": batch}))

    def on_train_end(self, logs=None):
        try:
            if self._chief and self.delete_checkpoint and tf.io.gfile.exists(self.backup_dir):
                tf.io.gfile.rmtree(self.backup_dir)
        finally:
            self._finish()

    def on_fit_error(self, error):
        """Deletes this worker's temporary folder (a non-chief's copies) when
        `fit` raised `error`; the backup in `backup_dir` stays, for the rerun.
        tfdist's `Trainer` calls it (Keras calls no callback when `fit`
        raises); after Keras's own `fit` raised, call it yourself.

        Example:

        >>> try:
        ...     model.fit(x, y, callbacks=[backup])
        ... except Exception as error:
        ...     backup.on_fit_error(error)
        ...     raise
        """
        del error
        self._finish()

    def _finish(self):
        if self._cleanup is not None:
            self._cleanup()  # deletes this worker's temporary folder
        self._cleanup = self._temp_dir = self.write_dir = None


def _paths(folder):
    return os.path.join(folder, _WEIGHTS), os.path.join(folder, _METADATA)
