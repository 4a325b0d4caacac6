"""Corrupt TFRecord files: naming them when a read fails, skipping them when asked.

TensorFlow reports a damaged TFRecord file as `DataLossError: corrupted
record at 900` (or `truncated record at ...`): a byte offset, but not which
file, and only once training reaches it. Here:

* `find_corrupt_tfrecords(files)` reads files one at a time, within a time
  budget, and returns where each damaged one stops being readable (record
  index and byte offset).
* `explain_data_loss(error, sources)` turns such a `DataLossError` into a
  `CorruptDataError` (a `ValueError`) that names the file(s) and the way out.
* `find_cut_tfrecords(files)` walks the record framing of uncompressed
  files (one 8-byte length read per record) for a file that ends inside a
  record: TensorFlow reads a file cut inside a record's 12-byte header as
  if it ended cleanly before that record, without a word.
  `check_tfrecord_tails(files)` (TFRecord sources call it when created)
  raises a `CorruptDataError` for such a file.
* `read_tfrecords(path, skipped=log)` reads one file; with a
  `SkippedRecords` log, a damaged file ends at its last readable record and
  the log notes what was skipped. TFRecord framing cannot be trusted after a
  damaged record (its length may be the damaged part), so the rest of that
  file is skipped, as `tf.data`'s `ignore_errors` does. Whether a file was
  read to its end is told by comparing the bytes read with its size, so
  skipping needs uncompressed files.

Example:

    try:
        model.fit(dataset, ...)
    except tf.errors.DataLossError as error:
        raise explain_data_loss(error, [train_source]) from error
"""

import collections
import dataclasses
import logging
import os
import re
import struct
import threading
import time

import numpy as np
import tensorflow as tf

logger = logging.getLogger("tfdist.data")

FRAMING_BYTES = 16
"""Bytes a TFRecord adds around each record: length (8), its CRC (4), data CRC (4)."""

DEFAULT_SCAN_SECONDS = 60.0
"""How long `explain_data_loss` looks for the damaged file(s) by default."""

SKIP_HINT = ("pass skip_corrupt_records=True (the recipes' --skip-corrupt-records) to skip the "
             "rest of a damaged file and count what was skipped")

FRAMING_CHECK_SECONDS = 20.0
"""How long `check_tfrecord_tails` walks record framing at most (then it warns)."""

HEADER_BYTES = 12
"""Bytes before a record's data: its length (8) and the length's CRC (4)."""

_SCAN_CHUNK = 1024
_WALK_BUFFER = 4096
_OFFSET = re.compile(r"(corrupted|truncated) record at (\d+)")


class CorruptDataError(ValueError):
    """Input data cannot be read; the message names the file(s) and the way out.

    Example:

        try:
            check_tfrecord_tails(files)
        except CorruptDataError as error:
            print(error)  # names the damaged file(s) and --skip-corrupt-records
    """


@dataclasses.dataclass(frozen=True)
class DamagedFile:
    """Where a TFRecord file stops being readable.

    Args:
        path: the file.
        record_index: records before the damaged one (0-based index of the
            first record that cannot be read).
        byte_offset: where that record starts in the file (None for a
            compressed file). TensorFlow's "corrupted record at N" names
            the record's start when its length is damaged, else the start
            of its data, 12 bytes further.
        size: the file's size in bytes, or None when unknown.
        reason: what TensorFlow said, or None.

    Example:

    >>> DamagedFile("/data/a.tfrecord", 12, 888, 1850, None).describe()
    '/data/a.tfrecord: record 12 (starts at byte 888 of 1850)'
    """

    path: str
    record_index: int
    byte_offset: int = None
    size: int = None
    reason: str = None

    def describe(self):
        """One phrase naming the file and the place."""
        where = f"record {self.record_index}"
        if self.byte_offset is not None:
            where += f" (starts at byte {self.byte_offset}" + (
                f" of {self.size})" if self.size is not None else ")")
        return f"{self.path}: {where}"


@dataclasses.dataclass(frozen=True)
class ScanResult:
    """What `find_corrupt_tfrecords` found.

    Attributes:
        damaged: `DamagedFile`s, in file order.
        scanned: files read to their end or to their damage.
        total: files to scan.
        complete: every file was scanned within the time budget.

    Example:

    >>> result = find_corrupt_tfrecords(files, time_budget=5)
    >>> result.complete, result.scanned, len(result.damaged)
    (True, 4, 1)
    """

    damaged: tuple
    scanned: int
    total: int
    complete: bool


def find_corrupt_tfrecords(files, compression_type="", time_budget=DEFAULT_SCAN_SECONDS,
                           byte_offset=None):
    """Reads TFRecord files one by one and returns the damaged ones.

    Args:
        files: paths (any filesystem `tf.io.gfile` reads).
        compression_type: `""`, `"GZIP"` or `"ZLIB"`.
        time_budget: seconds to spend at most; files not reached are
            counted as not scanned.
        byte_offset: the offset TensorFlow named ("corrupted record at N"),
            or None. For uncompressed files, only files longer than it can
            hold that record, so only those are read.

    Returns:
        A `ScanResult`.

    Example:

    >>> result = find_corrupt_tfrecords(["/data/a.tfrecord", "/data/b.tfrecord"])
    >>> [damage.describe() for damage in result.damaged]
    ['/data/b.tfrecord: record 12 (starts at byte 888 of 1850)']
    """
    compression_type = compression_type or ""
    files = list(dict.fromkeys(files))
    sizes = {path: _size(path) for path in files}
    if byte_offset is not None and not compression_type:
        files = [path for path in files if sizes[path] is None or sizes[path] > byte_offset]
    deadline = time.monotonic() + time_budget
    damaged, scanned = [], 0
    for path in files:
        try:
            found = _scan_file(path, compression_type, deadline)
        except TimeoutError:
            break
        scanned += 1
        if found is not None:
            record_index, offset, reason = found
            damaged.append(DamagedFile(path, record_index, offset, sizes[path], reason))
    return ScanResult(damaged=tuple(damaged), scanned=scanned, total=len(files),
                      complete=scanned == len(files))


def find_cut_tfrecords(files, time_budget=FRAMING_CHECK_SECONDS):
    """Walks the record framing of uncompressed TFRecord files; returns those cut short.

    Only each record's 8-byte length is read (the data is skipped), so the
    cost is one small read per record. A file whose last record runs past
    its end (a copy cut short, or a damaged length) is damaged at that
    record. TensorFlow reads a file cut inside a record's 12-byte header as
    if it ended cleanly before it; a file cut later fails only when reading
    reaches it.

    Args:
        files: paths of uncompressed TFRecord files.
        time_budget: seconds to spend at most; files not reached are
            counted as not scanned.

    Returns:
        A `ScanResult`; each `DamagedFile` names the record the file ends
        inside, where it starts, and why.

    Example:

    >>> result = find_cut_tfrecords(["/data/a.tfrecord", "/data/b.tfrecord"])
    >>> [damage.describe() for damage in result.damaged]
    ['/data/b.tfrecord: record 199 (starts at byte 14726 of 14733)']
    """
    files = list(dict.fromkeys(files))
    deadline = time.monotonic() + time_budget
    damaged, scanned = [], 0
    for path in files:
        try:
            found = _cut_record(path, deadline)
        except TimeoutError:
            break
        scanned += 1
        if found is not None:
            damaged.append(found)
    return ScanResult(damaged=tuple(damaged), scanned=scanned, total=len(files),
                      complete=scanned == len(files))


def check_tfrecord_tails(files, compression_type="", time_budget=FRAMING_CHECK_SECONDS):
    """Raises a `CorruptDataError` when a TFRecord file ends inside a record.

    Uncompressed files only (a compressed file's framing cannot be walked
    without decompressing it; they are left to TensorFlow's reader). When
    the time budget runs out, a warning on the `tfdist.data` logger says how
    many files were not checked.

    Args:
        files: the TFRecord files.
        compression_type: `""`, `"GZIP"` or `"ZLIB"`.
        time_budget: seconds to spend at most.

    Raises:
        CorruptDataError: a file is cut short; the message names the file,
            the record, its byte offset and the way out.

    Example:

    >>> check_tfrecord_tails(["/data/cut.tfrecord"])
    Traceback (most recent call last):
    ...
    CorruptDataError: Corrupt TFRecord data: /data/cut.tfrecord: record 199 (starts at byte ...
    """
    if compression_type:
        return
    result = find_cut_tfrecords(files, time_budget)
    if result.damaged:
        shown = "; ".join(f"{damage.describe()}: {damage.reason}" for damage in result.damaged[:5])
        more = f"; and {len(result.damaged) - 5} more" if len(result.damaged) > 5 else ""
        raise CorruptDataError(
            f"Corrupt TFRecord data: {shown}{more}. Re-create or remove the damaged file(s), "
            f"or {SKIP_HINT}.")
    if not result.complete:
        logger.warning(
            "Checked the record framing of %d of %d TFRecord file(s) in %g s; a file among the "
            "other %d that is cut inside a record header would end early without an error.",
            result.scanned, result.total, time_budget, result.total - result.scanned)


def explain_data_loss(error, sources, time_budget=DEFAULT_SCAN_SECONDS):
    """Turns a `tf.errors.DataLossError` into a `CorruptDataError` naming the file.

    The sources' TFRecord files are scanned (`find_corrupt_tfrecords`) for the
    damaged one(s), within `time_budget` seconds.

    Args:
        error: the `tf.errors.DataLossError` (or its message).
        sources: the `Source`s the failing run read (None entries are
            ignored); those with `files` and a `compression_type` are
            TFRecord sources and get scanned.
        time_budget: seconds to spend scanning at most.

    Returns:
        A `CorruptDataError` (to raise); its message names the damaged
        file(s) with record index and byte offset, or says how far the
        search got, and the way out.

    Example:

    >>> try:
    ...     trainer.fit(dataset, epochs=1, steps_per_epoch=100)
    ... except tf.errors.DataLossError as error:
    ...     raise explain_data_loss(error, [source]) from error
    """
    said = _tensorflow_said(error)
    match = _OFFSET.search(said)
    byte_offset = int(match.group(2)) if match else None
    groups = collections.defaultdict(list)
    described = []
    for source in sources:
        if source is None:
            continue
        if getattr(source, "files", None) and hasattr(source, "compression_type"):
            groups[source.compression_type or ""].extend(source.files)
        else:
            described.append(_describe(source))
    if not groups:
        return CorruptDataError(
            f"The input data cannot be read: TensorFlow said {said!r} while reading "
            f"{'; '.join(described) or 'the data'}. Check or re-create those files.")
    damaged, scanned, total, complete = [], 0, 0, True
    started = time.monotonic()
    for compression_type, files in groups.items():
        left = max(time_budget - (time.monotonic() - started), 0.0)
        result = find_corrupt_tfrecords(files, compression_type, left, byte_offset)
        damaged += result.damaged
        scanned, total = scanned + result.scanned, total + result.total
        complete = complete and result.complete
    way_out = f"Re-create or remove the damaged file(s), or {SKIP_HINT}."
    if damaged:
        shown = "; ".join(damage.describe() for damage in damaged[:5])
        more = f" and {len(damaged) - 5} more" if len(damaged) > 5 else ""
        searched = "" if complete else (
            f" ({total - scanned} of {total} file(s) not checked within {time_budget:g} s)")
        return CorruptDataError(
            f"Corrupt TFRecord data: {shown}{more} cannot be read{searched}. TensorFlow said "
            f"{said!r}. {way_out}")
    if not complete:
        return CorruptDataError(
            f"Corrupt TFRecord data: TensorFlow said {said!r}, in one of {total} file(s); "
            f"{scanned} of them were read in {time_budget:g} s without finding the damage. "
            f"Find it with tfdist.data.find_corrupt_tfrecords(files), or {SKIP_HINT}.")
    return CorruptDataError(
        f"The input data could not be read: TensorFlow said {said!r}, but all {total} TFRecord "
        "file(s) read cleanly afterwards: the failure may be in the filesystem (network or "
        "disk) rather than in the files. Rerun; if it repeats, check the storage, or "
        f"{SKIP_HINT}.")


class SkippedRecords:
    """What `read_tfrecords` skipped: per damaged file, where reading stopped.

    Thread-safe (tf.data reads files in parallel). The first time a file is
    cut short a warning names it, on the `tfdist.data` logger.

    Example:

    >>> skipped = SkippedRecords()
    >>> sum(1 for _ in read_tfrecords("/data/a.tfrecord", skipped=skipped))
    12
    >>> skipped.files[0].describe()
    '/data/a.tfrecord: record 12 (starts at byte 888 of 1850)'
    """

    def __init__(self):
        self._lock = threading.Lock()
        self._files = {}
        self._reads = collections.Counter()

    @property
    def files(self):
        """The damaged files seen so far, as `DamagedFile`s in path order."""
        with self._lock:
            return [self._files[path] for path in sorted(self._files)]

    def note(self, path, records, bytes_read):
        """Called when a file's records end: notes it when it ended early.

        Args:
            path: the file (str or bytes).
            records: records read from it.
            bytes_read: their bytes on disk, framing included.

        Returns:
            Whether the file was cut short.
        """
        path = path.decode() if isinstance(path, bytes) else str(path)
        size = _size(path)
        if size is not None and bytes_read >= size:
            return False
        damage = DamagedFile(path, int(records), int(bytes_read), size,
                             "corrupt, truncated or unreadable")
        with self._lock:
            first = path not in self._files
            self._files[path] = damage
            self._reads[path] += 1
        if first:
            logger.warning("Skipping the rest of %s from record %d (starts at byte %d%s): it "
                           "cannot be read (corrupt or truncated TFRecord data).", path,
                           damage.record_index, damage.byte_offset,
                           f" of {size}" if size is not None else "")
        return True

    def summary(self):
        """One line: "none", or the damaged files and the bytes not read.

        Example:

        >>> SkippedRecords().summary()
        'none'
        """
        files = self.files
        if not files:
            return "none"
        lost = sum(d.size - d.byte_offset for d in files if d.size is not None)
        with self._lock:
            reads = dict(self._reads)
        parts = []
        for damage in files[:5]:
            times = reads.get(damage.path, 1)
            parts.append(f"{damage.describe()} and the rest of the file"
                         + (f", on each of {times} reads" if times > 1 else ""))
        more = f"; and {len(files) - 5} more" if len(files) > 5 else ""
        return (f"{len(files)} damaged file{'s' if len(files) > 1 else ''}, {lost} bytes not read: "
                + "; ".join(parts) + more)


def skipped_records_log(skip_corrupt_records, compression_type=""):
    """A `SkippedRecords` log when skipping is asked for, else None.

    Args:
        skip_corrupt_records: True to skip damaged files' unreadable rest.
        compression_type: the files' compression (skipping needs none).

    Raises:
        ValueError: skipping asked for compressed files.

    Example:

    >>> skipped_records_log(False) is None
    True
    """
    if not skip_corrupt_records:
        return None
    if compression_type:
        raise ValueError(
            f"skip_corrupt_records=True needs uncompressed TFRecord files, got "
            f"compression_type={compression_type!r}: a file counts as read to its end when the "
            "bytes read equal its size. Decompress the files, or drop skip_corrupt_records.")
    return SkippedRecords()


def read_tfrecords(path, compression_type="", skipped=None):
    """The records of one TFRecord file, optionally skipping its damaged rest.

    Args:
        path: the file (a str or a scalar `tf.string` tensor).
        compression_type: `""`, `"GZIP"` or `"ZLIB"`.
        skipped: None to fail on damage (`tf.errors.DataLossError`), or a
            `SkippedRecords` log (uncompressed files only): the records
            before the damage are read, the rest of the file is skipped and
            noted in the log.

    Returns:
        A `tf.data.Dataset` of serialized records.

    Example:

    >>> skipped = SkippedRecords()
    >>> dataset = tf.data.Dataset.from_tensor_slices(files).interleave(
    ...     lambda path: read_tfrecords(path, skipped=skipped))
    """
    records = tf.data.TFRecordDataset(path, compression_type=compression_type)
    if skipped is None:
        return records
    if compression_type:
        skipped_records_log(True, compression_type)  # raises, naming the compression
    path = tf.convert_to_tensor(path, tf.string)
    end = tf.data.Dataset.from_tensors((tf.constant(b""), tf.constant(True)))
    marked = records.ignore_errors().map(lambda record: (record, tf.constant(False)))
    marked = marked.concatenate(end)

    def count(state, element):
        read, bytes_read = state
        record, last = element
        size = tf.cast(tf.strings.length(record), tf.int64) + FRAMING_BYTES
        read = read + tf.cast(tf.logical_not(last), tf.int64)
        bytes_read = bytes_read + tf.where(last, tf.constant(0, tf.int64), size)
        return (read, bytes_read), (record, last, read, bytes_read)

    def note(path_, read, bytes_read):
        skipped.note(path_, read, bytes_read)
        return np.False_

    def keep(record, last, read, bytes_read):
        return tf.cond(
            last,
            lambda: tf.reshape(tf.numpy_function(note, [path, read, bytes_read], tf.bool,
                                                 stateful=True), []),
            lambda: tf.constant(True))

    initial = (tf.constant(0, tf.int64), tf.constant(0, tf.int64))
    return marked.scan(initial, count).filter(keep).map(lambda record, *_: record)


def _scan_file(path, compression_type, deadline):
    """(record_index, byte_offset, reason) of the first unreadable record, or None.

    Raises TimeoutError when the deadline passes first.
    """
    def lengths(skip=0):
        dataset = tf.data.TFRecordDataset(path, compression_type=compression_type)
        return dataset.skip(skip).map(lambda record: tf.cast(tf.strings.length(record), tf.int64))

    records, offset = 0, 0
    chunks = iter(lengths().batch(_SCAN_CHUNK))
    while True:
        if time.monotonic() > deadline:
            raise TimeoutError(path)
        try:
            chunk = next(chunks).numpy()
        except StopIteration:
            return None if compression_type else _cut_header(path, records, offset)
        except tf.errors.OpError:
            break
        records += len(chunk)
        offset += int(chunk.sum()) + FRAMING_BYTES * len(chunk)
    # The damage is in the next chunk: find its record one at a time.
    for length in iter(_guarded(lengths(records))):
        if isinstance(length, tf.errors.OpError):
            return records, (None if compression_type else offset), _tensorflow_said(length)
        records += 1
        offset += int(length) + FRAMING_BYTES
    return None


def _cut_header(path, records, offset):
    """(record_index, byte_offset, reason) when a file TensorFlow read to `offset`
    is longer: cut inside the next record's header, which TensorFlow does not
    report. None when the file ends at `offset`."""
    size = _size(path)
    if size is None or offset >= size:
        return None
    return records, offset, _cut_reason(size - offset, None)


def _cut_reason(left, length):
    if length is None:
        return (f"the file ends {left} byte(s) into the record's {HEADER_BYTES}-byte header "
                "(cut short)")
    return (f"the file ends {left} byte(s) into this {length + FRAMING_BYTES}-byte record "
            "(cut short, or its length is damaged)")


def _cut_record(path, deadline):
    """The `DamagedFile` of the record `path` ends inside, or None."""
    size = _size(path)
    if size is None:
        return None
    records, position = 0, 0
    with _open_binary(path) as stream:
        while position < size:
            if records % _SCAN_CHUNK == 0 and time.monotonic() > deadline:
                raise TimeoutError(path)
            stream.seek(position)
            header = stream.read(8)
            if len(header) < 8 or size - position < HEADER_BYTES:
                return DamagedFile(path, records, position, size,
                                   _cut_reason(size - position, None))
            (length,) = struct.unpack("<Q", header)
            end = position + length + FRAMING_BYTES
            if end > size:
                return DamagedFile(path, records, position, size,
                                   _cut_reason(size - position, length))
            records, position = records + 1, end
    return None


def _open_binary(path):
    """A local file through a small buffer (reads of the length skip the data), else gfile."""
    if "://" not in str(path) and os.path.exists(path):
        return open(path, "rb", buffering=_WALK_BUFFER)
    return tf.io.gfile.GFile(path, "rb")


def _guarded(dataset):
    """Yields the elements of `dataset`, then the error that ended it, if any."""
    iterator = iter(dataset)
    while True:
        try:
            yield next(iterator)
        except StopIteration:
            return
        except tf.errors.OpError as error:
            yield error
            return


def _describe(source):
    try:
        return source.describe()
    except Exception:  # pylint: disable=broad-except  (a half-built source)
        return type(source).__name__


def _size(path):
    try:
        return int(tf.io.gfile.stat(path).length)
    except (tf.errors.OpError, OSError):
        return None


def _tensorflow_said(error):
    """TensorFlow's own sentence, without the graph, node and op decorations around it."""
    message = str(getattr(error, "message", error))
    for line in message.splitlines():
        line = re.sub(r"\{\{[^}]*\}\}", "", line)
        line = re.sub(r"\[Op:[^\]]*\].*$", "", line).strip()
        if line and not line.startswith(_DECORATIONS):
            return line
    return type(error).__name__


_DECORATIONS = ("[[", "Graph execution error", "Detected at node", "<stack traces unavailable>")
