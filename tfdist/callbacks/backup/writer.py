"""Writing backups: `BackupWriter` (write and rotate, discard, put a folder
in order before training writes to it, remove a failed write's partial files)
and the removal of the temporary folders of killed non-chief writers.

The backup folder's layout and write protocol are described once, in
`tfdist.callbacks.backup.store`.
"""

import errno
import logging
import os
import re
import shutil
import tempfile
import time

import tensorflow as tf

from tfdist.callbacks.backup.errors import BackupWriteError, summarize_error
from tfdist.callbacks.backup.index import (parse_index, remove_quietly, write_index,
                                           survey_backups)
from tfdist.callbacks.backup.store import CHECKPOINT_NAME, INDEX_NAME
from tfdist.seam import save_on_read_variables_with_one_reduction

logger = logging.getLogger(__name__)


class BackupWriter:
    """Writes backups of one `tf.train.Checkpoint`: the chief into the backup
    folder (atomically, keeping the last `max_to_keep` and any it is asked to
    keep), every other worker into a temporary folder deleted right after.

    `write` must be called on every worker of a multi-worker job at the same
    point (see `tfdist.callbacks.backup.store`). A non-chief writer removes, when
    created, the temporary folders of its worker name left by killed
    processes.

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
        # Each save reads an ON_READ variable (a metric total: an all-reduce
        # across workers) once, not three times.
        save_on_read_variables_with_one_reduction()
        if not is_chief:
            remove_stale_temporary_folders(worker_name)

    def write(self, number, keep=()):
        """Writes backup `number` (must be greater than every committed one).

        Args:
            number: the new backup's number.
            keep: numbers of committed backups never deleted by the rotation
                (e.g. the last good one), besides the last `max_to_keep`.

        Returns:
            The committed prefix on the chief; None on other workers (whose
            temporary copy is already deleted).

        Raises:
            BackupWriteError: the write failed (e.g. a full disk); its partial
                files are removed, the index and earlier backups unchanged.

        Example:

        >>> writer.write(number=8, keep=[5])
        'backup/ckpt-8'
        """
        if not self.is_chief:
            self._write_temporary_copy(number)
            return None
        tf.io.gfile.makedirs(self.backup_dir)
        # The existing index is read at every write: the last K survive restarts.
        committed = survey_backups(self.backup_dir, refuse=False).committed
        name = f"{CHECKPOINT_NAME}-{number}"
        try:
            path = self.checkpoint.write(os.path.join(self.backup_dir, name))  # the data first
            committed = [(n, t) for n, t in committed if n != name] + [(name, time.time())]
            protected = {f"{CHECKPOINT_NAME}-{k}" for k in keep}
            last = {n for n, _ in committed[-self.max_to_keep:]}
            kept = [(n, t) for n, t in committed if n in last or n in protected]
            write_index(self.backup_dir, kept)
        except (OSError, tf.errors.OpError) as error:
            raise self._failed_write(number, committed, error) from error
        kept_names = {n for n, _ in kept}
        self._delete_files([n for n, _ in committed if n not in kept_names])
        return path

    def _write_temporary_copy(self, number):
        """A non-chief worker's share of a save, into a folder deleted right after."""
        folder = None
        try:
            folder = tempfile.mkdtemp(prefix=f"tfdist-backup-{self.worker_name}-{os.getpid()}-")
            tf.train.CheckpointManager(self.checkpoint, folder, max_to_keep=1).save(
                checkpoint_number=number)
        except (OSError, tf.errors.OpError) as error:
            where = folder or tempfile.gettempdir()
            raise BackupWriteError(
                f"BackupAndResume: this worker could not write its temporary copy of backup "
                f"{number} into {where} ({summarize_error(error)}; {_free_space(where)} free "
                "there). Free space in the temporary directory (or set TMPDIR) and rerun to "
                "resume from the last backup.") from error
        finally:
            if folder is not None:
                shutil.rmtree(folder, ignore_errors=True)

    def _failed_write(self, number, committed, error):
        """Removes the partial files of backup `number` (never committed) and
        returns the `BackupWriteError` to raise."""
        name = f"{CHECKPOINT_NAME}-{number}"
        entries, _ = parse_index(os.path.join(self.backup_dir, INDEX_NAME))
        if entries is None or name not in {n for n, _ in entries}:
            self._remove_partial(number)
        previous = [n for n, _ in committed if n != name]
        if previous:
            need = _format_bytes(_backup_size(os.path.join(self.backup_dir, previous[-1])))
            needs = f"the next backup needs about {need} (the size of {previous[-1]})"
            kept = f"the last backup {previous[-1]} and the index are kept"
        else:
            needs = "the next backup needs more than that"
            kept = "no earlier backup was there"
        full = _is_full_disk(error)
        reason = "No space left on device" if full else summarize_error(error)
        message = (f"BackupAndResume: could not write backup {name} into {self.backup_dir} "
                   f"({reason}); {_free_space(self.backup_dir)} free there, "
                   f"{needs}. Its partial files were removed and {kept}. Free space there (or "
                   "use another backup folder) and rerun.")
        failure = BackupWriteError(message)
        failure.errno = errno.ENOSPC if full else getattr(error, "errno", None)
        return failure

    def _remove_partial(self, number):
        """Removes `ckpt-N_temp`, `ckpt-N.*` and their temporary states."""
        prefix = os.path.join(self.backup_dir, f"{CHECKPOINT_NAME}-{number}")
        for path in sorted(tf.io.gfile.glob(prefix + ".*")):
            remove_quietly(path)
        if tf.io.gfile.isdir(prefix + "_temp"):
            try:
                tf.io.gfile.rmtree(prefix + "_temp")
            except tf.errors.OpError as error:
                logger.warning("Could not remove %s_temp: %s", prefix, summarize_error(error))

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
        committed = survey_backups(self.backup_dir, refuse=False).committed
        removed = [n for n, _ in committed if n in gone]
        if removed:
            write_index(self.backup_dir, [(n, t) for n, t in committed if n not in gone])
            self._delete_files(removed)
        return [os.path.join(self.backup_dir, n) for n in removed]

    def _delete_files(self, names):
        """Deletes the files of the backups `names` (no longer in the index)."""
        for name in names:
            prefix = os.path.join(self.backup_dir, name)
            for path in tf.io.gfile.glob(prefix + ".index") + tf.io.gfile.glob(
                    prefix + ".data-?????-of-?????"):
                remove_quietly(path)

    def clean_uncommitted(self, survey=None):
        """Chief only: puts the folder in order before training writes to it.
        Rewrites a damaged, missing or inconsistent index from the readable
        backups (one warning line), and deletes only the debris of interrupted
        writes (see `tfdist.callbacks.backup.store`); unreadable backups are kept and
        named. Returns the names deleted.

        Args:
            survey: a `BackupSurvey` of the folder taken just before, or None
                to take one.

        Raises:
            BackupIndexError: backups are there but none can be read.

        Example:

        >>> writer.clean_uncommitted()
        ['ckpt-9_temp']
        """
        if not self.is_chief or not tf.io.gfile.isdir(self.backup_dir):
            return []
        survey = survey or survey_backups(self.backup_dir)
        if survey.rebuilt is not None:
            write_index(self.backup_dir, survey.committed)
            logger.warning(
                "BackupAndResume: %s; rebuilt it from the readable backups present: %s%s.",
                survey.rebuilt, ", ".join(n for n, _ in survey.committed) or "none",
                _unreadable_note(survey.unreadable))
        elif survey.unreadable:
            logger.warning("BackupAndResume: in %s%s.", self.backup_dir,
                           _unreadable_note(survey.unreadable))
        for name in survey.debris:
            path = os.path.join(self.backup_dir, name)
            if tf.io.gfile.isdir(path):
                tf.io.gfile.rmtree(path)
            else:
                remove_quietly(path)
        if survey.debris:
            logger.warning("BackupAndResume: removed the files of an interrupted backup write "
                           "in %s: %s", self.backup_dir, survey.debris)
        return list(survey.debris)


def _unreadable_note(unreadable):
    if not unreadable:
        return ""
    return "; kept on disk but not used (unreadable): " + "; ".join(
        f"{name} ({reason})" for name, reason in unreadable.items())


def remove_stale_temporary_folders(worker_name, directory=None):
    """Removes the temporary folders (`tfdist-backup-<worker_name>-<pid>-*`)
    of non-chief writers whose process is gone; never a live process's.

    Args:
        worker_name: the worker's name (e.g. "worker1").
        directory: where to look (default: the temporary directory).

    Returns:
        The folders removed.

    Example:

    >>> remove_stale_temporary_folders("worker1")
    ['/tmp/tfdist-backup-worker1-4242-k2j3h4']
    """
    directory = directory or tempfile.gettempdir()
    pattern = re.compile(rf"tfdist-backup-{re.escape(worker_name)}-(\d+)-.+")
    removed = []
    try:
        names = sorted(os.listdir(directory))
    except OSError:
        return removed
    for name in names:
        match = pattern.fullmatch(name)
        path = os.path.join(directory, name)
        if match is None or not os.path.isdir(path) or _process_alive(int(match.group(1))):
            continue
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    if removed:
        logger.info("BackupAndResume: removed the temporary folders of killed workers: %s",
                    removed)
    return removed


def _process_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, OSError):
        return True  # another user's process (or not ours to judge)
    return True


def _backup_size(prefix):
    total = 0
    for path in tf.io.gfile.glob(prefix + ".*"):
        try:
            total += tf.io.gfile.stat(path).length
        except tf.errors.OpError:
            pass
    return total


def _free_space(folder):
    try:
        return _format_bytes(shutil.disk_usage(folder).free)
    except (OSError, ValueError):
        return "unknown space"


def _format_bytes(count):
    for unit in ("bytes", "KB", "MB", "GB"):
        if count < 1024 or unit == "GB":
            return f"{count} {unit}" if unit == "bytes" else f"{count:.1f} {unit}"
        count /= 1024
    return f"{count:.1f} TB"


def _is_full_disk(error):
    return (isinstance(error, tf.errors.ResourceExhaustedError)
            or getattr(error, "errno", None) == errno.ENOSPC
            or "No space left on device" in str(error))
