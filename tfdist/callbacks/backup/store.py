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
at any point therefore leaves the index naming complete backups. The index
is the one `tf.train.CheckpointManager` writes (relative paths, with
timestamps), so `tf.train.latest_checkpoint` and a manager opened on the
folder read it.

Nothing is deleted on a guess. `clean_uncommitted` removes only what the
write protocol proves to be an interrupted write: `ckpt-N_temp` folders,
`*.tempstate*` files, the index's `checkpoint.tmp<hex>` temporaries, and the
files of a backup numbered above every entry of a valid index (written after
it, never committed) when they are complete or come with their `_temp`
folder. A damaged (truncated, not text, not parseable), missing or
inconsistent index (naming a backup whose files are gone) is rebuilt from the
backups present that can be read; the others are kept on disk and named. When
backup files or an index are there but no backup can be read, the folder is
refused (`BackupIndexError`) rather than training starting over.

A write that fails (a full disk: ENOSPC, `tf.errors.ResourceExhaustedError`)
removes its own partial files, leaves the index and the earlier backups as
they were, and raises `BackupWriteError` naming the folder, the free space and
the space the next backup needs.

Under `MultiWorkerMirroredStrategy` every worker must take part in each save
(reading the `ON_READ` variables a checkpoint holds, such as metric totals,
is an all-reduce across workers; measured on TF 2.21: a chief-only save fails
with aborted collectives). As in TensorFlow's multi-worker tutorial, the
other workers save into a temporary folder of their own
(`tfdist-backup-<worker>-<pid>-*` in the temporary directory), deleted right
after; folders of such workers that were killed (their pid is gone) are
removed when the next writer of that worker starts.
"""

import dataclasses
import errno
import logging
import os
import re
import shutil
import tempfile
import time
import uuid

import numpy as np
import tensorflow as tf
from google.protobuf import text_format
from tensorflow.python.training import checkpoint_state_pb2

logger = logging.getLogger(__name__)

CHECKPOINT_NAME = "ckpt"
INDEX_NAME = "checkpoint"
POSITION_KEYS = ("epoch", "step", "global_step", "iterator_batches", "iterator_index",
                 "iterations")
# The files of a backup (its index and data shards), the saver's temporary
# folder, the merge's temporary states, and the index's own temporary file.
_BACKUP_FILE = re.compile(CHECKPOINT_NAME + r"-(\d+)(?:\.index|\.data-(\d{5})-of-(\d{5}))")
_TEMP_FOLDER = re.compile(CHECKPOINT_NAME + r"-(\d+)_temp")
_TEMPSTATE = re.compile(CHECKPOINT_NAME
                        + r"-(\d+)(?:\.index|\.data-\d{5}-of-\d{5})\.tempstate\d+")
_INDEX_TEMPORARY = re.compile(INDEX_NAME + r"\.tmp[0-9a-f]{32}")
_SUMMARY_LIMIT = 200


class BackupIndexError(ValueError):
    """The backup folder holds backups (or an index) but none can be read:
    training refuses to start over on top of them.

    Example:

    >>> try:
    ...     latest_backup("backup")
    ... except BackupIndexError as error:
    ...     print(error)  # one line: the index, why, and the way out
    """


class BackupWriteError(OSError):
    """A backup could not be written (e.g. the disk is full). Its partial files
    are removed; the index and the earlier backups are as they were. `errno`
    is `errno.ENOSPC` for a full disk.

    Example:

    >>> try:
    ...     writer.write(number=9)
    ... except BackupWriteError as error:
    ...     print(error)  # the folder, the free space, the space needed
    """

    def __str__(self):
        return self.args[0] if self.args else "backup write failed"


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

    def describe(self):
        """The backup named for an operator: its name, global step and folder.

        Example:

        >>> latest_backup("/runs/a/backup").describe()
        'ckpt-7 (global step 120) in /runs/a/backup'
        """
        folder = os.path.dirname(self.path) or "."
        return f"{os.path.basename(self.path)} (global step {self.global_step}) in {folder}"


def describe_backup(info):
    """Names a backup for an operator, e.g. the one a rerun resumes from.

    Args:
        info: a `BackupInfo` (e.g. from `latest_backup`).

    Returns:
        A str such as `"ckpt-7 (global step 120) in /runs/a/backup"`.

    Example:

    >>> print(f"rerun to resume from {describe_backup(latest_backup('backup'))}")
    rerun to resume from ckpt-7 (global step 120) in backup
    """
    return info.describe()


def read_backup(path):
    """Reads the training position stored in one backup, without a model.

    Args:
        path: a checkpoint prefix (`".../ckpt-7"`).

    Returns:
        A `BackupInfo`.

    Raises:
        ValueError: `path` is not a backup written by `BackupAndResume`
            (no position in it), or it cannot be read (missing or corrupt;
            the reason, e.g. TensorFlow's checksum error, is in the message).

    Example:

    >>> read_backup("backup/ckpt-7").step
    3
    """
    values, reason = _read_position(path)
    if reason is not None:
        error = ValueError(f"Cannot read the backup {path!r}: {reason}")
        error.reason = reason  # the why alone, for messages that name the backup already
        raise error
    return BackupInfo(path=path, number=checkpoint_number(path), **values)


def _read_position(path):
    """The position values of backup `path` and None, or None and why they
    cannot be read (one line)."""
    try:
        reader = tf.train.load_checkpoint(path)
        keys = [f"position/{key}/.ATTRIBUTES/VARIABLE_VALUE" for key in POSITION_KEYS]
        missing = [key for key in keys if not reader.has_tensor(key)]
        if missing:
            return None, (f"it holds no training position ({missing[0]} is missing); it must be "
                          "a checkpoint written by tfdist's BackupAndResume")
        values = {name: int(reader.get_tensor(key)) for name, key in zip(POSITION_KEYS, keys,
                                                                           strict=True)}
        short = _data_shortfall(path, reader)
    except (tf.errors.OpError, IndexError, KeyError) as error:
        # A short (truncated) data file raises IndexError from TF's reader,
        # or "Read less bytes than requested".
        if isinstance(error, IndexError) or "Read less bytes than requested" in str(error):
            return None, "its data files end before the tensors its index lists (truncated)"
        return None, summarize_error(error)
    return (None, short) if short else (values, None)


def _data_shortfall(path, reader):
    """Why the data files are shorter than the tensors they hold (a truncated
    backup: TF reads the tensors before the cut without a word), or None.
    Reads the object graph (checksummed) to know its size."""
    graph = reader.get_tensor("_CHECKPOINTABLE_OBJECT_GRAPH")
    shapes, dtypes = reader.get_variable_to_shape_map(), reader.get_variable_to_dtype_map()
    needed = len(graph) + sum(int(np.prod(shape)) * dtypes[key].size
                              for key, shape in shapes.items() if dtypes[key] != tf.string)
    held = sum(tf.io.gfile.stat(f).length for f in tf.io.gfile.glob(path + ".data-?????-of-?????"))
    if held < needed:
        return (f"its data files hold {held} bytes, fewer than the {needed} of its tensors "
                "(truncated)")
    return None


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


def summarize_error(error, limit=_SUMMARY_LIMIT):
    """One line of an error for an operator: TensorFlow's op decorations
    (`{{function_node ...}}`, `[Op:...]`) dropped, cut at a word boundary.

    Example:

    >>> summarize_error(tf.errors.DataLossError(None, None, "{{function_node f}} TensorBundle "
    ...                 "at b/ckpt-2 shard 0: Checksum does not match [Op:RestoreV2]"))
    'TensorBundle at b/ckpt-2 shard 0: Checksum does not match'
    """
    text = str(getattr(error, "message", None) or error)
    text = re.sub(r"\{\{function_node [^}]*\}\}", " ", text)
    text = re.sub(r"\s*\[Op:[^\]]*\]", "", text)
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    line = lines[0] if lines else type(error).__name__
    if len(line) <= limit:
        return line
    cut = line[:limit].rsplit(" ", 1)[0] if " " in line[:limit] else line[:limit]
    return cut.rstrip(" ,;:") + " ..."


# ------------------------------------------------------------ the folder
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
    entries, problem = _parse_index(index) if exists else (None, f"the index {index} is missing")
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
    return _read_position(os.path.join(backup_dir, f"{CHECKPOINT_NAME}-{number}"))[1]


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


def _parse_index(index):
    """The index's entries as (name, timestamp) pairs, oldest first, and None;
    or None and why it cannot be used."""
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
    state = checkpoint_state_pb2.CheckpointState()
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


# ------------------------------------------------------------ the writer
class BackupWriter:
    """Writes backups of one `tf.train.Checkpoint`: the chief into the backup
    folder (atomically, keeping the last `max_to_keep` and any it is asked to
    keep), every other worker into a temporary folder deleted right after.

    `write` must be called on every worker of a multi-worker job at the same
    point (see the module docstring). A non-chief writer removes, when
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
            _write_index(self.backup_dir, kept)
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
        entries, _ = _parse_index(os.path.join(self.backup_dir, INDEX_NAME))
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
            _remove_quietly(path)
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
            _write_index(self.backup_dir, [(n, t) for n, t in committed if n not in gone])
            self._delete_files(removed)
        return [os.path.join(self.backup_dir, n) for n in removed]

    def _delete_files(self, names):
        """Deletes the files of the backups `names` (no longer in the index)."""
        for name in names:
            prefix = os.path.join(self.backup_dir, name)
            for path in tf.io.gfile.glob(prefix + ".index") + tf.io.gfile.glob(
                    prefix + ".data-?????-of-?????"):
                _remove_quietly(path)

    def clean_uncommitted(self, survey=None):
        """Chief only: puts the folder in order before training writes to it.
        Rewrites a damaged, missing or inconsistent index from the readable
        backups (one warning line), and deletes only the debris of interrupted
        writes (see the module docstring); unreadable backups are kept and
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
            _write_index(self.backup_dir, survey.committed)
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
                _remove_quietly(path)
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


def _remove_quietly(path):
    try:
        tf.io.gfile.remove(path)
    except tf.errors.NotFoundError:
        pass


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


def _write_index(backup_dir, entries):
    """Atomically replaces the `checkpoint` index (write a temporary file,
    rename it over the old one, as TensorFlow does); removes it when
    `entries` is empty. A failed write leaves the old index and no
    temporary file."""
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
            _remove_quietly(temporary)
        raise
