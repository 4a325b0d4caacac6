"""A backup folder's committed backups: the `checkpoint` index (parsed, and
written atomically) and the survey of the folder that judges every file by the
write protocol (`survey_backups`, `list_backups`, `latest_backup`).

The backup folder's layout and write protocol are described once, in
`tfdist.callbacks.backup.store`.
"""

import dataclasses
import logging
import os
import re
import uuid

import tensorflow as tf
from google.protobuf import text_format

from tfdist.callbacks.backup.errors import BackupIndexError, summarize_error
from tfdist.callbacks.backup.store import (CHECKPOINT_NAME, INDEX_NAME, read_position,
                                           checkpoint_number, read_backup)
from tfdist.seam import checkpoint_state

logger = logging.getLogger(__name__)

# The files of a backup (its index and data shards), the saver's temporary
# folder, the merge's temporary states, and the index's own temporary file.
_BACKUP_FILE = re.compile(CHECKPOINT_NAME + r"-(\d+)(?:\.index|\.data-(\d{5})-of-(\d{5}))")
_TEMP_FOLDER = re.compile(CHECKPOINT_NAME + r"-(\d+)_temp")
_TEMPSTATE = re.compile(CHECKPOINT_NAME
                        + r"-(\d+)(?:\.index|\.data-\d{5}-of-\d{5})\.tempstate\d+")
_INDEX_TEMPORARY = re.compile(INDEX_NAME + r"\.tmp[0-9a-f]{32}")


def list_backups(backup_dir):
    """The committed backups in `backup_dir`, oldest first (empty if none).

    The backups named by the folder's `checkpoint` index; when the index is
    damaged, missing or names a backup whose files are gone, the readable
    backups present (the index is not rewritten here: the writer does it).

    Args:
        backup_dir: the backup folder (a str or path-like).

    Returns:
        A list of checkpoint prefixes (str).

    Raises:
        BackupIndexError: backups (or an index) are there but none can be read.

    Example:

    >>> list_backups("backup")
    ['backup/ckpt-7', 'backup/ckpt-8']
    """
    return survey_backups(backup_dir).paths


def latest_backup(backup_dir):
    """The newest committed backup in `backup_dir` that can be read, or None.

    Args:
        backup_dir: the backup folder (a str or path-like).

    Returns:
        A `BackupInfo`, or None when the folder holds no backup.

    Raises:
        BackupIndexError: backups (or an index) are there but none can be read.

    Example:

    >>> latest_backup("backup").path
    'backup/ckpt-8'
    """
    paths, reasons = list_backups(backup_dir), []
    for path in reversed(paths):
        try:
            return read_backup(path)
        except ValueError as error:
            logger.warning("Skipping unreadable backup: %s", error)
            reasons.append(f"{os.path.basename(path)}: {getattr(error, 'reason', error)}")
    if paths:
        raise BackupIndexError(
            f"None of the backups in {os.fspath(backup_dir)} can be read ({'; '.join(reasons)}); "
            "nothing was deleted. Restore the files, or move the folder away (or use another "
            "backup folder) to start over.")
    return None


@dataclasses.dataclass(frozen=True)
class BackupSurvey:
    """What a backup folder holds, judged by the write protocol.

    Attributes:
        backup_dir: the folder.
        committed: the committed backups as (name, timestamp) pairs, oldest
            first: the index's entries, or the readable backups present when
            the index was unusable.
        rebuilt: why the index cannot be used as it is (then `committed` is
            rebuilt from the files), or None.
        unreadable: backups kept on disk but not committed, name -> reason
            (their files are never deleted).
        debris: names of files and folders of interrupted writes.
        next_number: the number of the next backup (above every backup kept).

    Example:

    >>> survey = survey_backups("backup")
    >>> survey.paths, survey.rebuilt
    (['backup/ckpt-1', 'backup/ckpt-2'], None)
    """

    backup_dir: str
    committed: list
    rebuilt: str = None
    unreadable: dict = dataclasses.field(default_factory=dict)
    debris: list = dataclasses.field(default_factory=list)
    next_number: int = 1

    @property
    def paths(self):
        """The committed backups' checkpoint prefixes, oldest first.

        Example:

        >>> survey_backups("backup").paths
        ['backup/ckpt-1', 'backup/ckpt-2']
        """
        return [os.path.join(self.backup_dir, name) for name, _ in self.committed]


def survey_backups(backup_dir, refuse=True):
    """Reads a backup folder without changing it: its committed backups (from
    the index, or rebuilt from the readable backups when the index is damaged,
    missing or inconsistent), the backups kept but unreadable, and the debris
    of interrupted writes.

    Args:
        backup_dir: the backup folder (a str or path-like).
        refuse: raise `BackupIndexError` when backups or an index are there
            but none can be read (False: return an empty `committed`).

    Returns:
        A `BackupSurvey`.

    Example:

    >>> survey_backups("backup").rebuilt
    'the index backup/checkpoint is not text (byte 0xdc at offset 3)'
    """
    backup_dir = os.fspath(backup_dir)
    if not tf.io.gfile.isdir(backup_dir):
        return BackupSurvey(backup_dir, [])
    files, debris, temporary = _files_by_number(backup_dir)
    index = os.path.join(backup_dir, INDEX_NAME)
    exists = tf.io.gfile.exists(index)
    if not exists and not files:  # nothing written yet, or only a first write's debris
        return BackupSurvey(backup_dir, [], debris=debris)
    entries, problem = parse_index(index) if exists else (None, f"the index {index} is missing")
    if entries is not None:
        missing = [name for name, _ in entries if not _complete(files.get(checkpoint_number(name)))]
        if missing:
            problem = (f"the index {index} names {', '.join(missing)} but its files are not all "
                       f"in {backup_dir}")
    if problem is None:
        return _survey_with_index(backup_dir, entries, files, debris, temporary)
    survey = _survey_rebuilt(backup_dir, problem, files, debris, temporary)
    if refuse and not survey.committed and (exists or survey.unreadable):
        reasons = "; ".join(f"{name}: {reason}" for name, reason in survey.unreadable.items())
        raise BackupIndexError(
            f"{_capitalized(problem)}, and no backup in {backup_dir} can be read"
            + (f" ({reasons})" if reasons else "")
            + "; nothing was deleted. Restore the files, or move the folder away (or use "
            "another backup folder) to start over.")
    return survey


def _capitalized(text):
    return text[:1].upper() + text[1:]


def _files_by_number(backup_dir):
    """Groups the folder's backup files by N; lists the debris of writes
    (temporary folders and states, index temporaries) and the Ns that have it."""
    files, debris, temporary = {}, [], set()
    for name in sorted(n.rstrip("/") for n in tf.io.gfile.listdir(backup_dir)):
        match = _BACKUP_FILE.fullmatch(name)
        if match is not None:
            files.setdefault(int(match.group(1)), []).append(name)
            continue
        match = _TEMP_FOLDER.fullmatch(name) or _TEMPSTATE.fullmatch(name)
        if match is not None:
            temporary.add(int(match.group(1)))
        if match is not None or _INDEX_TEMPORARY.fullmatch(name):
            debris.append(name)
    return files, debris, temporary


def _complete(names):
    """Whether a backup's files are all there: its index and every data shard."""
    if not names:
        return False
    shards = [_BACKUP_FILE.fullmatch(n).groups()[1:] for n in names]
    data = {(int(i), int(k)) for i, k in shards if i is not None}
    counts = {k for _, k in data}
    has_index = any(i is None for i, _ in shards)
    return has_index and len(counts) == 1 and data == {(i, k) for k in counts for i in range(k)}


def _readable(backup_dir, number):
    """None when backup `number` can be read, else the reason."""
    return read_position(os.path.join(backup_dir, f"{CHECKPOINT_NAME}-{number}"))[1]


def _survey_with_index(backup_dir, entries, files, debris, temporary):
    """A valid index: backups numbered above all its entries were written
    after it and never committed; they are debris when the protocol explains
    them (their `_temp` folder, or complete and readable), else kept."""
    newest = max(checkpoint_number(name) for name, _ in entries)
    named = {checkpoint_number(name) for name, _ in entries}
    unreadable, debris = {}, list(debris)
    for number, names in sorted(files.items()):
        if number <= newest:
            continue  # named, or left by an interrupted rotation: kept
        reason = None if number in temporary else _readable(backup_dir, number)
        if reason is None:
            debris += names
        else:
            unreadable[f"{CHECKPOINT_NAME}-{number}"] = reason
    kept = named | {n for n in files if n <= newest} | {int(k.split("-")[1]) for k in unreadable}
    return BackupSurvey(backup_dir, entries, None, unreadable, sorted(debris),
                        max(kept) + 1)


def _survey_rebuilt(backup_dir, problem, files, debris, temporary):
    """An unusable index: the readable backups present, ordered by N."""
    committed, unreadable, debris = [], {}, list(debris)
    for number, names in sorted(files.items()):
        name = f"{CHECKPOINT_NAME}-{number}"
        reason = (_readable(backup_dir, number) if _complete(names)
                  else "its index or data files are missing")
        if reason is None:
            stamp = tf.io.gfile.stat(os.path.join(backup_dir, name + ".index")).mtime_nsec / 1e9
            committed.append((name, stamp))
        elif number in temporary:
            debris += names  # a write interrupted before it was complete
        else:
            unreadable[name] = reason
    kept = [checkpoint_number(n) for n, _ in committed] + [
        checkpoint_number(n) for n in unreadable]
    return BackupSurvey(backup_dir, committed, problem, unreadable, sorted(debris),
                        max(kept + [0]) + 1)


def parse_index(index):
    """The index's entries as (name, timestamp) pairs, oldest first, and None;
    or None and why it cannot be used.

    Example:

        entries, problem = parse_index("/runs/a/backup/checkpoint")
        # ([("ckpt-1", 1764000000.0), ("ckpt-2", 1764000060.0)], None)
    """
    try:
        with tf.io.gfile.GFile(index, "rb") as stream:
            raw = stream.read()
    except tf.errors.OpError as error:
        return None, f"the index {index} cannot be read ({summarize_error(error)})"
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        return None, (f"the index {index} is not text (byte 0x{raw[error.start]:02x} at offset "
                      f"{error.start})")
    state = checkpoint_state()
    try:
        text_format.Parse(text, state)
    except text_format.ParseError as error:
        return None, f"the index {index} is damaged ({summarize_error(error)})"
    paths = list(state.all_model_checkpoint_paths)
    stamps = list(state.all_model_checkpoint_timestamps)
    names = [os.path.basename(p) for p in paths]
    if not text.endswith("\n") or not paths or state.model_checkpoint_path != paths[-1] or len(
            stamps) != len(paths) or not state.last_preserved_timestamp:
        return None, f"the index {index} is incomplete (truncated: {len(raw)} bytes)"
    if not all(re.fullmatch(CHECKPOINT_NAME + r"-\d+", n) for n in names):
        return None, f"the index {index} names files that are not tfdist backups ({names})"
    return list(zip(names, stamps, strict=True)), None


def write_index(backup_dir, entries):
    """Atomically replaces the `checkpoint` index (write a temporary file,
    rename it over the old one, as TensorFlow does); removes it when
    `entries` is empty. A failed write leaves the old index and no
    temporary file.

    Example:

        write_index("/runs/a/backup", [("ckpt-1", 1764000000.0), ("ckpt-2", 1764000060.0)])
    """
    index = os.path.join(backup_dir, INDEX_NAME)
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
    try:
        with tf.io.gfile.GFile(temporary, "w") as stream:
            stream.write("\n".join(lines) + "\n")
        tf.io.gfile.rename(temporary, index, overwrite=True)
    except (OSError, tf.errors.OpError):
        if tf.io.gfile.exists(temporary):
            remove_quietly(temporary)
        raise


def remove_quietly(path):
    """Removes the file `path`; a file that is already gone is no error.

    Example:

        remove_quietly("/runs/a/backup/checkpoint.tmp1f2e")
    """
    try:
        tf.io.gfile.remove(path)
    except tf.errors.NotFoundError:
        pass
