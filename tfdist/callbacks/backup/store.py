"""One backup: its name (`ckpt-N`) and the training position it holds
(`BackupInfo`, `read_backup`, `describe_backup`). The layout of a backup
folder and the write protocol, which `index.py` (the index and the survey of
a folder), `writer.py` (writing and cleaning) and `errors.py` follow, are
described here, once.

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
import os
import re

import numpy as np
import tensorflow as tf

from tfdist.callbacks.backup.errors import summarize_error

CHECKPOINT_NAME = "ckpt"
INDEX_NAME = "checkpoint"
POSITION_KEYS = ("epoch", "step", "global_step", "iterator_batches", "iterator_index",
                 "iterations")


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
    values, reason = read_position(path)
    if reason is not None:
        error = ValueError(f"Cannot read the backup {path!r}: {reason}")
        error.reason = reason  # the why alone, for messages that name the backup already
        raise error
    return BackupInfo(path=path, number=checkpoint_number(path), **values)


def read_position(path):
    """The position values of backup `path` and None, or None and why they
    cannot be read (one line).

    Example:

        values, problem = read_position("/runs/a/backup/ckpt-3")
        # ({"epoch": 1, "step": 40, ...}, None)
    """
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
