"""Turning file patterns into a stable, sorted list of files."""

import tensorflow as tf


def expand_files(patterns):
    """Expands glob patterns (or plain paths) into a sorted tuple of files.

    The order is sorted and therefore the same in every worker, which file
    sharding and record sharding rely on.

    Args:
        patterns: a path or glob (`"/data/*.tfrecord"`), several of them
            separated by commas, or a list of paths/globs. Any filesystem
            `tf.io.gfile` supports (local, `gs://`, ...).

    Returns:
        A tuple of unique file paths, sorted.

    Raises:
        FileNotFoundError: a pattern matches no file (the pattern is named).
        ValueError: no pattern was given.

    Example:

    >>> expand_files("/data/train-*.tfrecord")
    ('/data/train-00000.tfrecord', '/data/train-00001.tfrecord')
    """
    if isinstance(patterns, (str, bytes)):
        patterns = [p for p in str(patterns).split(",") if p.strip()]
    patterns = [str(p).strip() for p in (patterns or [])]
    if not patterns:
        raise ValueError("No file pattern given: pass a path, a glob such as "
                         "'/data/*.tfrecord', or a list of them.")
    found = set()
    for pattern in patterns:
        matches = [m for m in tf.io.gfile.glob(pattern) if not tf.io.gfile.isdir(m)]
        if not matches:
            raise FileNotFoundError(f"No files match {pattern!r}.")
        found.update(matches)
    return tuple(sorted(found))
