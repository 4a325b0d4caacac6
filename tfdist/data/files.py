"""Turning file patterns into a stable, sorted list of files."""

import tensorflow as tf


def first_few(names, shown=5):
    """The first `shown` of `names` joined by commas, and how many more there are.

    Example:

    >>> first_few(["a.txt", "b.txt", "c.txt"], shown=2)
    'a.txt, b.txt and 1 more'
    """
    names = list(names)
    more = len(names) - shown
    return ", ".join(names[:shown]) + (f" and {more} more" if more > 0 else "")


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
            if tf.io.gfile.isdir(pattern):
                raise FileNotFoundError(
                    f"No files match {pattern!r}: it is a folder. Name its files, e.g. "
                    f"{pattern.rstrip('/')}/*.")
            raise FileNotFoundError(f"No files match {pattern!r}.")
        found.update(matches)
    return tuple(sorted(found))


class NoExamplesError(ValueError):
    """The input files hold no example; the message names them and the way out."""


def check_holds_examples(files, min_bytes=1, *, too_short=None, where=None):
    """Raises `NoExamplesError` when `files` cannot hold a single example.

    The files are stat-ed one by one until they hold `min_bytes` bytes in
    all (usually the first one does), so this costs a stat or two. Files
    that cannot be stat-ed count as holding enough.

    Args:
        files: the paths, in reading order.
        min_bytes: bytes the files must hold in all for one example (an
            upper bound of the example's size in bytes, so that fewer bytes
            certainly mean no example).
        too_short: for files that hold some bytes but fewer than
            `min_bytes`: what one example needs and the way out, e.g.
            "the 129 tokens of one example (--sequence-length 128 + 1);
            use more text or a shorter --sequence-length".
        where: what the files are, when not the whole source, e.g.
            "the files of input pipeline 1 of 2".

    Raises:
        NoExamplesError: every file is empty (they are named), or together
            they hold fewer than `min_bytes` bytes.

    Example:

    >>> check_holds_examples(["/data/empty.txt"])
    Traceback (most recent call last):
    ...
    NoExamplesError: No examples in /data/empty.txt: the file is empty (0 bytes). ...
    """
    files = list(files)
    total = 0
    for path in files:
        try:
            total += int(tf.io.gfile.stat(path).length)
        except (tf.errors.OpError, OSError):
            return
        if total >= min_bytes:
            return
    if not files:
        return
    named = first_few(files)
    place = f" ({where})" if where else ""
    if total == 0:
        what = ("the file is empty (0 bytes)" if len(files) == 1
                else f"all {len(files)} files are empty (0 bytes)")
        raise NoExamplesError(
            f"No examples in {named}{place}: {what}. Check the file(s) (an interrupted copy or "
            "download?) or point the dataset at the data.")
    raise NoExamplesError(
        f"No examples in {named}{place}: {total} byte(s) in all, fewer than "
        f"{too_short or f'the {min_bytes} bytes of one example'}.")
