"""The errors an operator must act on (`BackupIndexError`: a folder whose
backups cannot be read; `BackupWriteError`: a failed write) and
`summarize_error`, the one line of an error their messages quote.

The backup folder's layout and write protocol are described once, in
`tfdist.callbacks.backup.store`.
"""

import re

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
