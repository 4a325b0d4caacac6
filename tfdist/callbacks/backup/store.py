"""The backups on disk: atomic, chief-only writes of `tf.train.Checkpoint`s, keep the last K.

Layout of a backup folder (written by the chief only)::

    backup_dir/
        checkpoint                         the index: committed backups, oldest first
        ckpt-7.index, ckpt-7.data-00000-of-00001
        ckpt-8.index, ckpt-8.data-00000-of-00001

Each backup is one `tf.train.Checkpoint` written atomically, the way
`tf.train.CheckpointManager` does it: TensorFlow's saver writes the data into
`ckpt-N_temp/` and merges it into `ckpt-N.*`; only then is the `checkpoint`
index rewritten (a temporary file renamed over the old one), and only after
that are the backups beyond the last K deleted (except those the caller asks
to keep, e.g. the last backup a `DivergenceGuard` confirmed healthy). A crash
at any point therefore leaves the index naming complete backups; the debris of
an interrupted write (files of a backup the index does not name) is removed by
`clean_uncommitted` before the next write. The index is the one
`tf.train.CheckpointManager` writes (relative paths, with timestamps), so
`tf.train.latest_checkpoint` and a manager opened on the folder read it.

Under `MultiWorkerMirroredStrategy` every worker must take part in each save
(reading the `ON_READ` variables a checkpoint holds, such as metric totals,
is an all-reduce across workers; measured on TF 2.21: a chief-only save fails
with aborted collectives). As in TensorFlow's multi-worker tutorial, the
other workers save into a temporary folder of their own, deleted right after.
"""

import dataclasses
import logging
import os
import re
import shutil
import tempfile
import time
import uuid

import tensorflow as tf

logger = logging.getLogger(__name__)

CHECKPOINT_NAME = "ckpt"
POSITION_KEYS = ("epoch", "step", "global_step", "iterator_batches", "iterator_index",
                 "iterations")
# Files of a backup write (the saver's temporary folder, the merged files and
# their temporary states), and the index's own temporary file.
_DEBRIS = re.compile(CHECKPOINT_NAME
                     + r"-(\d+)(?:\.index|\.data-\d{5}-of-\d{5}|_temp)(?:\.tempstate\d+)?")
_INDEX_TEMPORARY = re.compile(r"checkpoint\.tmp[0-9a-f]{32}")


@dataclasses.dataclass(frozen=True)
class BackupInfo:
    """One committed backup and the training position it was taken at.

    Args:
        path: the checkpoint prefix, e.g. `".../backup/ckpt-7"`.
        number: the backup's number (N in `ckpt-N`), increasing.
        epoch: the epoch index training resumes in.
        step: training batches of that epoch already done (0: the epoch has
            not started).
        global_step: training batches run since the start of the job
            (across restarts; batches of an epoch redone by plain
            `keras.Model.fit` count once).
        iterator_batches: batches drawn from the data iterator of that epoch
            (differs from `step` when the iterator continues across epochs),
            or -1 when unknown (written by plain `keras.Model.fit`).
        iterator_index: which data iterator of training (0-based count of
            `iter(dataset)` calls) that epoch uses, or -1 when unknown.
        iterations: `optimizer.iterations` (optimizer updates) at the backup.

    Example:

    >>> info = latest_backup("backup")
    >>> info.epoch, info.step, info.global_step
    (1, 3, 11)
    """

    path: str
    number: int
    epoch: int
    step: int
    global_step: int
    iterator_batches: int
    iterator_index: int
    iterations: int

    @property
    def mid_epoch(self):
        """True when the backup was taken inside an epoch (`step > 0`).

        Example:

        >>> latest_backup("backup").mid_epoch
        False
        """
        return self.step > 0


def read_backup(path):
    """Reads the training position stored in one backup, without a model.

    Args:
        path: a checkpoint prefix (`".../ckpt-7"`).

    Returns:
        A `BackupInfo`.

    Raises:
        ValueError: `path` is not a backup written by `BackupAndResume`
            (no position in it), or it cannot be read (missing or corrupt).

    Example:

    >>> read_backup("backup/ckpt-7").step
    3
    """
    try:
        reader = tf.train.load_checkpoint(path)
        values = {key: int(reader.get_tensor(f"position/{key}/.ATTRIBUTES/VARIABLE_VALUE"))
                  for key in POSITION_KEYS}
    except (tf.errors.OpError, ValueError, IndexError, KeyError) as error:
        # A short (truncated) data file raises IndexError from TF's reader.
        raise ValueError(
            f"Cannot read the backup {path!r}: {_first_line(error)}. It must be a checkpoint "
            "written by tfdist's BackupAndResume (with a position/ entry).") from error
    return BackupInfo(path=path, number=checkpoint_number(path), **values)


def list_backups(backup_dir):
    """The committed backups in `backup_dir`, oldest first (empty if none).

    Only backups named by the folder's `checkpoint` index are listed: the
    files of an interrupted write are not backups.

    Args:
        backup_dir: the backup folder (a str or path-like).

    Returns:
        A list of checkpoint prefixes (str).

    Example:

    >>> list_backups("backup")
    ['backup/ckpt-7', 'backup/ckpt-8']
    """
    backup_dir = os.fspath(backup_dir)
    paths, _ = _indexed(backup_dir)
    return [p if os.path.isabs(p) or "://" in p else os.path.join(backup_dir, p) for p in paths]


def latest_backup(backup_dir):
    """The newest committed backup in `backup_dir` that can be read, or None.

    Args:
        backup_dir: the backup folder (a str or path-like).

    Returns:
        A `BackupInfo`, or None when the folder holds no readable backup.

    Example:

    >>> latest_backup("backup").path
    'backup/ckpt-8'
    """
    for path in reversed(list_backups(backup_dir)):
        try:
            return read_backup(path)
        except ValueError as error:
            logger.warning("Skipping unreadable backup: %s", error)
    return None


def checkpoint_number(path):
    """The N of a `.../ckpt-N` prefix.

    Args:
        path: a checkpoint prefix.

    Raises:
        ValueError: the name is not `ckpt-<number>`.

    Example:

    >>> checkpoint_number("backup/ckpt-12")
    12
    """
    match = re.fullmatch(CHECKPOINT_NAME + r"-(\d+)", os.path.basename(os.fspath(path)))
    if not match:
        raise ValueError(f"{path!r} is not a backup prefix named {CHECKPOINT_NAME}-<number>.")
    return int(match.group(1))


class BackupWriter:
    """Writes backups of one `tf.train.Checkpoint`: the chief into the backup
    folder (atomically, keeping the last `max_to_keep` and any it is asked to
    keep), every other worker into a temporary folder deleted right after.

    `write` must be called on every worker of a multi-worker job at the same
    point (see the module docstring).

    Args:
        checkpoint: the `tf.train.Checkpoint` to write.
        backup_dir: the backup folder.
        max_to_keep: how many backups to keep (an int >= 1).
        is_chief: whether this process writes the real backups.
        worker_name: a name for this worker's temporary folder.

    Example:

    >>> writer = BackupWriter(tf.train.Checkpoint(model=model), "backup", 2, is_chief=True)
    >>> writer.write(number=1)
    'backup/ckpt-1'
    """

    def __init__(self, checkpoint, backup_dir, max_to_keep, is_chief, worker_name="worker"):
        self.checkpoint = checkpoint
        self.backup_dir = os.fspath(backup_dir)
        self.max_to_keep = max_to_keep
        self.is_chief = is_chief
        self.worker_name = worker_name

    def write(self, number, keep=()):
        """Writes backup `number` (must be greater than every committed one).

        Args:
            number: the new backup's number.
            keep: numbers of committed backups never deleted by the rotation
                (e.g. the last good one), besides the last `max_to_keep`.

        Returns:
            The committed prefix on the chief; None on other workers (whose
            temporary copy is already deleted).

        Example:

        >>> writer.write(number=8, keep=[5])
        'backup/ckpt-8'
        """
        if not self.is_chief:
            folder = tempfile.mkdtemp(prefix=f"tfdist-backup-{self.worker_name}-")
            try:
                tf.train.CheckpointManager(self.checkpoint, folder, max_to_keep=1).save(
                    checkpoint_number=number)
            finally:
                shutil.rmtree(folder, ignore_errors=True)
            return None
        tf.io.gfile.makedirs(self.backup_dir)
        # The existing index is read at every write: the last K survive restarts.
        committed = _read_index(self.backup_dir)
        path = self.checkpoint.write(
            os.path.join(self.backup_dir, f"{CHECKPOINT_NAME}-{number}"))  # the data first
        name = os.path.basename(path)
        committed = [(n, t) for n, t in committed if n != name] + [(name, time.time())]
        protected = {f"{CHECKPOINT_NAME}-{k}" for k in keep}
        last = {n for n, _ in committed[-self.max_to_keep:]}
        kept = [(n, t) for n, t in committed if n in last or n in protected]
        kept_names = {n for n, _ in kept}
        self._commit(kept, [n for n, _ in committed if n not in kept_names])
        return path

    def discard(self, numbers):
        """Chief only: removes the committed backups `numbers` (the index
        first, then their files). Returns the prefixes removed.

        Example:

        >>> writer.discard([13, 14])
        ['backup/ckpt-13', 'backup/ckpt-14']
        """
        if not self.is_chief or not numbers:
            return []
        gone = {f"{CHECKPOINT_NAME}-{k}" for k in numbers}
        committed = _read_index(self.backup_dir)
        removed = [n for n, _ in committed if n in gone]
        if removed:
            self._commit([(n, t) for n, t in committed if n not in gone], removed)
        return [os.path.join(self.backup_dir, n) for n in removed]

    def _commit(self, kept, deleted):
        """Rewrites the index to name `kept` ((name, timestamp) pairs, oldest
        first), then deletes the files of the backups named in `deleted`."""
        _write_index(self.backup_dir, kept)
        for name in deleted:
            prefix = os.path.join(self.backup_dir, name)
            for path in tf.io.gfile.glob(prefix + ".index") + tf.io.gfile.glob(
                    prefix + ".data-?????-of-?????"):
                try:
                    tf.io.gfile.remove(path)
                except tf.errors.NotFoundError:
                    pass

    def clean_uncommitted(self):
        """Chief only: deletes files of backups the index does not name (left
        by a write that was interrupted). Returns the names deleted.

        Example:

        >>> writer.clean_uncommitted()
        ['ckpt-9_temp']
        """
        if not self.is_chief or not tf.io.gfile.isdir(self.backup_dir):
            return []
        committed = {checkpoint_number(p) for p in list_backups(self.backup_dir)}
        removed = []
        for name in sorted(tf.io.gfile.listdir(self.backup_dir)):
            name = name.rstrip("/")
            match = _DEBRIS.fullmatch(name)
            if match is None and _INDEX_TEMPORARY.fullmatch(name) is None:
                continue
            if match is not None and int(match.group(1)) in committed:
                continue
            path = os.path.join(self.backup_dir, name)
            if tf.io.gfile.isdir(path):
                tf.io.gfile.rmtree(path)
            else:
                tf.io.gfile.remove(path)
            removed.append(name)
        if removed:
            logger.warning("BackupAndResume: removed the files of an interrupted backup write "
                           "in %s: %s", self.backup_dir, removed)
        return removed


def _indexed(backup_dir):
    """The backups the `checkpoint` index names, oldest first, and the index
    itself (`([], None)` when there is none)."""
    if not tf.io.gfile.isdir(backup_dir):
        return [], None
    state = tf.train.get_checkpoint_state(backup_dir)
    if state is None:
        return [], None
    return list(state.all_model_checkpoint_paths) or [state.model_checkpoint_path], state


def _read_index(backup_dir):
    """The committed backups as (name, timestamp) pairs, oldest first."""
    paths, state = _indexed(backup_dir)
    if state is None:
        return []
    stamps = list(state.all_model_checkpoint_timestamps)
    if len(stamps) != len(paths):
        stamps = [state.last_preserved_timestamp or time.time()] * len(paths)
    return [(os.path.basename(p), t) for p, t in zip(paths, stamps)]


def _write_index(backup_dir, entries):
    """Atomically replaces the `checkpoint` index (write a temporary file,
    rename it over the old one, as TensorFlow does); removes it when
    `entries` is empty."""
    index = os.path.join(backup_dir, "checkpoint")
    if not entries:
        if tf.io.gfile.exists(index):
            tf.io.gfile.remove(index)
        return
    stamps = [t for _, t in entries]
    lines = [f'model_checkpoint_path: "{entries[-1][0]}"']
    lines += [f'all_model_checkpoint_paths: "{name}"' for name, _ in entries]
    lines += [f"all_model_checkpoint_timestamps: {t!r}" for t in stamps]
    # Older than every backup, so that a CheckpointManager opened on the folder manages them all.
    lines.append(f"last_preserved_timestamp: {min(stamps) - 1.0!r}")
    temporary = f"{index}.tmp{uuid.uuid4().hex}"
    with tf.io.gfile.GFile(temporary, "w") as stream:
        stream.write("\n".join(lines) + "\n")
    tf.io.gfile.rename(temporary, index, overwrite=True)


def _first_line(error):
    text = str(getattr(error, "message", None) or error).strip()
    return text.splitlines()[0] if text else type(error).__name__
