"""Make standard Keras callbacks write once per multi-worker job, automatically."""

import logging
import weakref

import keras

from tfdist.callbacks.chief import num_workers
from tfdist.callbacks.chief_logging import ChiefOnly
from tfdist.callbacks.worker_safe_backup import WorkerSafeBackupAndRestore

logger = logging.getLogger(__name__)

# Keras callbacks that write files and need no other worker: the chief alone runs them.
CHIEF_WRITERS = (keras.callbacks.ModelCheckpoint, keras.callbacks.CSVLogger,
                 keras.callbacks.TensorBoard)
_PATH_ATTRIBUTES = ("filepath", "filename", "log_dir", "backup_dir")

# One worker-safe backup per user BackupAndRestore, so that its batch counters
# carry over between fit calls as they do in Keras's callback.
_BACKUPS = weakref.WeakKeyDictionary()
_LOGGED = set()


def make_worker_safe(callbacks, strategy=None):
    """The callbacks to run instead of `callbacks` under `strategy`.

    Keras 3's file-writing callbacks have no multi-worker logic: under
    `MultiWorkerMirroredStrategy` every worker writes the same files (and
    `BackupAndRestore` with one `backup_dir`, as in TensorFlow's tutorial,
    crashes the job). When `strategy` spans more than one worker (see
    `tfdist.callbacks.chief.num_workers`), this returns a new list, in the
    same order, where:

    * `ModelCheckpoint`, `CSVLogger`, `TensorBoard` (and subclasses) are
      wrapped in `ChiefOnly(callback, strategy=strategy)`: they write on the
      chief only (the other workers run a checkpoint into a temporary folder
      when saving needs every worker; see `ChiefOnly`'s "auto" mode);
    * a `keras.callbacks.BackupAndRestore` is replaced by its
      `WorkerSafeBackupAndRestore` equivalent (same arguments): every worker
      restores from `backup_dir`, only the chief writes there;
    * everything else is kept as it is: callbacks already in `ChiefOnly`,
      tfdist's own callbacks (multi-worker aware, e.g. `BackupAndResume`),
      `WorkerSafeBackupAndRestore` and its subclasses, and any other callback.

    What was wrapped is logged once (INFO, this module's logger). With one
    worker (`MirroredStrategy`, `OneDeviceStrategy`, the default strategy)
    the list holds the same callbacks, unchanged. The callbacks given are
    never modified.

    Args:
        callbacks: an iterable of `keras.callbacks.Callback`, or None.
        strategy: the `tf.distribute.Strategy` training runs under, or None
            for the current one.

    Returns:
        A new list of callbacks.

    Raises:
        ValueError: a subclass of `keras.callbacks.BackupAndRestore` (its
            overrides cannot be kept in a worker-safe copy), or a
            `BackupAndRestore` argument that cannot be honoured
            (`save_freq=False`).

    Example:

    >>> strategy = tf.distribute.MultiWorkerMirroredStrategy()  # 2 workers in TF_CONFIG
    >>> safe = make_worker_safe([keras.callbacks.CSVLogger("log.csv"),
    ...                          keras.callbacks.EarlyStopping()], strategy)
    >>> [type(c).__name__ for c in safe]
    ['ChiefOnly', 'EarlyStopping']
    """
    callbacks = list(callbacks or [])
    workers = num_workers(strategy)
    if workers <= 1:
        return callbacks
    safe, changed = [], []
    for callback in callbacks:
        replacement = _worker_safe(callback, strategy, workers)
        if replacement is not callback:
            changed.append(f"{_describe(callback)} -> {type(replacement).__name__}")
        safe.append(replacement)
    if changed:
        message = (f"make_worker_safe: {workers} workers, so only the chief writes the files of: "
                   + "; ".join(changed))
        if message not in _LOGGED:
            _LOGGED.add(message)
            logger.info(message)
    return safe


def _worker_safe(callback, strategy, workers):
    if isinstance(callback, (ChiefOnly, WorkerSafeBackupAndRestore)) or _is_tfdist(callback):
        return callback
    if isinstance(callback, keras.callbacks.BackupAndRestore):
        if type(callback) is not keras.callbacks.BackupAndRestore:
            raise ValueError(
                f"{type(callback).__name__} subclasses keras.callbacks.BackupAndRestore, which "
                f"writes {callback.backup_dir!r} from all {workers} workers and crashes the job; "
                "tfdist cannot make a copy that keeps its overrides. Subclass "
                "tfdist.callbacks.worker_safe_backup.WorkerSafeBackupAndRestore instead (only "
                "the chief writes), or use keras.callbacks.BackupAndRestore itself or "
                "tfdist.callbacks.BackupAndResume.")
        backup = _BACKUPS.get(callback)
        if backup is None or backup.strategy is not strategy:
            backup = WorkerSafeBackupAndRestore.from_keras(callback, strategy=strategy)
            _BACKUPS[callback] = backup
        return backup
    if isinstance(callback, CHIEF_WRITERS):
        return ChiefOnly(callback, strategy=strategy)
    return callback


def _is_tfdist(callback):
    return type(callback).__module__.split(".")[0] == "tfdist"


def _describe(callback):
    for name in _PATH_ATTRIBUTES:
        if hasattr(callback, name):
            return f"{type(callback).__name__}({name}={getattr(callback, name)!r})"
    return type(callback).__name__
