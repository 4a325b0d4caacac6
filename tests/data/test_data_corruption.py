"""Damaged TFRecord files: named when a read fails, skipped and counted when asked.

Real files: written with tf.io.TFRecordWriter, then damaged by flipping bytes of
one record's payload, or cut short (inside a record's header, its data or its
data's CRC).
"""

import numpy as np
import pytest
import tensorflow as tf

from helpers.damage_util import damage_payload, record_offsets
from tfdist.data import (CorruptDataError, ImageNetTFRecordSource, SkippedRecords, TFRecordSource,
                         check_tfrecord_tails, explain_data_loss, find_corrupt_tfrecords,
                         find_cut_tfrecords, make_dataset_fn, make_source, read_tfrecords,
                         write_image_tfrecords, write_token_tfrecords)

RECORDS_PER_FILE = 25


def token_files(tmp_path, num_files=2):
    """Token TFRecords: RECORDS_PER_FILE records per file, each [1, 5, 6, 3] * 10."""
    return write_token_tfrecords([[1, 5, 6, 3] * 10] * (RECORDS_PER_FILE * num_files),
                                 str(tmp_path / "tok"), num_files=num_files)


def count(dataset):
    return sum(1 for _ in dataset)


def test_a_damaged_record_is_a_data_loss_without_the_file_name(tmp_path):
    # What TensorFlow says by itself: an offset, no file. The rest of tfdist builds on this.
    paths = token_files(tmp_path)
    offset = damage_payload(paths[1], 12)
    with pytest.raises(tf.errors.DataLossError) as caught:
        count(tf.data.TFRecordDataset(paths))
    # The offset of the damaged record's data: after its 12-byte header.
    assert f"corrupted record at {offset + 12}" in caught.value.message
    assert "tok-00001" not in caught.value.message


def test_find_corrupt_tfrecords_names_the_file_the_record_and_the_byte(tmp_path):
    paths = token_files(tmp_path, num_files=3)
    offset = damage_payload(paths[1], 12)
    result = find_corrupt_tfrecords(paths)
    assert result.complete and result.scanned == result.total == 3
    [damage] = result.damaged
    assert (damage.path, damage.record_index, damage.byte_offset) == (paths[1], 12, offset)
    assert damage.size == len(open(paths[1], "rb").read())
    assert "corrupted record at" in damage.reason
    assert damage.describe() == (
        f"{paths[1]}: record 12 (starts at byte {offset} of {damage.size})")


def test_a_truncated_file_is_found_at_its_last_whole_record(tmp_path):
    [path] = token_files(tmp_path, num_files=1)
    start, _ = record_offsets(path)[-1]
    data = open(path, "rb").read()
    open(path, "wb").write(data[:-7])
    [damage] = find_corrupt_tfrecords([path]).damaged
    assert (damage.record_index, damage.byte_offset) == (RECORDS_PER_FILE - 1, start)


def test_the_offset_tensorflow_named_narrows_the_files_read(tmp_path):
    paths = token_files(tmp_path, num_files=2)
    short = str(tmp_path / "short.tfrecord")
    with tf.io.TFRecordWriter(short) as writer:
        writer.write(b"x")
    offset = damage_payload(paths[0], 20)
    result = find_corrupt_tfrecords([short] + paths, byte_offset=offset)
    assert result.total == 2  # short.tfrecord (17 bytes) cannot hold a record at that offset
    assert [d.path for d in result.damaged] == [paths[0]]


def test_explain_data_loss_names_the_file_and_the_way_out(tmp_path):
    paths = token_files(tmp_path, num_files=4)
    offset = damage_payload(paths[2], 7)
    source = TFRecordSource(str(tmp_path / "tok-*.tfrecord"), sequence_length=8, vocab_size=8)
    fn = make_dataset_fn(source, 4, training=False, repeat=False)
    with pytest.raises(tf.errors.DataLossError) as caught:
        count(fn(None))
    error = explain_data_loss(caught.value, [source, None])
    assert isinstance(error, CorruptDataError) and isinstance(error, ValueError)
    message = str(error)
    assert f"{paths[2]}: record 7 (starts at byte {offset} of" in message
    assert f"corrupted record at {offset + 12}" in message and "{{" not in message
    assert "--skip-corrupt-records" in message and "Re-create or remove" in message
    for clean in (paths[0], paths[1], paths[3]):
        assert clean not in message


def test_explain_data_loss_says_how_far_it_searched_when_out_of_time(tmp_path):
    paths = token_files(tmp_path, num_files=2)
    damage_payload(paths[1], 3)
    source = TFRecordSource(paths, sequence_length=8, vocab_size=8)
    message = str(explain_data_loss("corrupted record at 300", [source], time_budget=0))
    assert "one of 2 file(s)" in message and "0 of them were read in 0 s" in message
    assert "find_corrupt_tfrecords" in message and "--skip-corrupt-records" in message


def test_explain_data_loss_when_every_file_reads_cleanly(tmp_path):
    source = TFRecordSource(token_files(tmp_path), sequence_length=8, vocab_size=8)
    message = str(explain_data_loss("corrupted record at 75", [source]))
    assert "all 2 TFRecord file(s) read cleanly afterwards" in message


def test_the_vocabulary_scan_names_a_damaged_file(tmp_path):
    paths = token_files(tmp_path)
    damage_payload(paths[0], 4)
    with pytest.raises(CorruptDataError, match=rf"{paths[0]}: record 4 \(starts at byte"):
        TFRecordSource(str(tmp_path / "tok-*"), sequence_length=8)


@pytest.mark.parametrize("num_files, num_input_pipelines, mode", [(4, 2, "file"), (2, 3, "record")])
def test_skipping_reads_up_to_the_damage_and_counts_the_rest(tmp_path, num_files,
                                                             num_input_pipelines, mode):
    paths = token_files(tmp_path, num_files=num_files)
    offset = damage_payload(paths[1], 12)
    size = len(open(paths[1], "rb").read())
    source = make_source(f"tfrecord:{tmp_path}/tok-*", sequence_length=39, vocab_size=8,
                         skip_corrupt_records=True)
    fn = make_dataset_fn(source, 1, training=False, repeat=False, drop_remainder=False)
    examples = 0
    for index in range(num_input_pipelines):
        context = tf.distribute.InputContext(num_input_pipelines=num_input_pipelines,
                                             input_pipeline_id=index, num_replicas_in_sync=1)
        examples += count(fn(context))
    assert {plan.mode for plan in fn.plans.values()} == {mode}
    # Every whole file, and the 12 records before the damaged one.
    assert examples == (num_files - 1) * RECORDS_PER_FILE + 12
    [damage] = source.skipped.files
    assert (damage.path, damage.record_index, damage.byte_offset, damage.size) == (
        paths[1], 12, offset, size)
    assert source.skipped.summary().startswith(
        f"1 damaged file, {size - offset} bytes not read: {paths[1]}: record 12 "
        f"(starts at byte {offset} of {size}) and the rest of the file")


def test_skipping_counts_every_pass_over_a_damaged_file(tmp_path, caplog):
    [path] = token_files(tmp_path, num_files=1)
    damage_payload(path, 5)
    skipped = SkippedRecords()
    dataset = read_tfrecords(path, skipped=skipped).repeat(3)
    with caplog.at_level("WARNING", logger="tfdist.data"):
        assert count(dataset) == 3 * 5
    assert skipped.summary().endswith("and the rest of the file, on each of 3 reads")
    warnings = [r.getMessage() for r in caplog.records if "Skipping the rest" in r.getMessage()]
    assert len(warnings) == 1 and path in warnings[0] and "record 5" in warnings[0]


def test_skipping_leaves_clean_files_whole_and_reports_none(tmp_path):
    skipped = SkippedRecords()
    paths = token_files(tmp_path)
    dataset = tf.data.Dataset.from_tensor_slices(paths).flat_map(
        lambda path: read_tfrecords(path, skipped=skipped))
    records = [r.numpy() for r in dataset]
    assert records == [r.numpy() for r in tf.data.TFRecordDataset(paths)]
    assert skipped.files == [] and skipped.summary() == "none"


def test_skipping_compressed_files_is_refused_naming_the_compression(tmp_path):
    path = str(tmp_path / "z.tfrecord")
    with tf.io.TFRecordWriter(path, options="GZIP") as writer:
        writer.write(b"x")
    with pytest.raises(ValueError, match="uncompressed.*'GZIP'"):
        TFRecordSource(path, sequence_length=4, vocab_size=8, compression_type="GZIP",
                       skip_corrupt_records=True)


def test_imagenet_tfrecords_skip_a_damaged_file(tmp_path):
    images = np.random.default_rng(0).integers(0, 255, size=(12, 16, 16, 3), dtype=np.uint8)
    paths = write_image_tfrecords(images, [i % 3 for i in range(12)], str(tmp_path / "train"),
                                  num_files=2)
    damage_payload(paths[0], 2)
    source = ImageNetTFRecordSource(str(tmp_path / "train-*"), num_classes=3, image_size=16,
                                    skip_corrupt_records=True)
    fn = make_dataset_fn(source, 1, training=False, repeat=False, drop_remainder=False)
    assert count(fn(None)) == 6 + 2
    assert [(d.path, d.record_index) for d in source.skipped.files] == [(paths[0], 2)]


# ---- files cut short ------------------------------------------------------------

# Where in record 200 a file is cut, from the record's data length: 7 bytes
# into the 12-byte header (length and its CRC), 30 bytes (inside the data), or
# 2 bytes before the end of the data's 4-byte CRC.
CUTS = {"header": lambda length: 7, "data": lambda length: 30,
        "footer_crc": lambda length: 12 + length + 2}


def cut_into_last_record(tmp_path, where):
    """201 token records; the file cut inside record 200 (`where`: a key of CUTS).

    Returns (path, start of record 200, bytes of it left, the cut file's size)."""
    [path] = write_token_tfrecords([[1, 5, 6, 3] * 10] * 201, str(tmp_path / "cut"))
    start, length = record_offsets(path)[200]
    into = CUTS[where](length)
    assert 0 < into < length + 16
    data = open(path, "rb").read()
    open(path, "wb").write(data[:start + into])
    return path, start, into, start + into


@pytest.mark.parametrize("where", sorted(CUTS))
def test_a_file_cut_inside_its_last_record_is_an_error_naming_file_record_and_byte(tmp_path,
                                                                                   where):
    path, start, into, size = cut_into_last_record(tmp_path, where)
    with pytest.raises(CorruptDataError) as caught:
        TFRecordSource(path, sequence_length=8, vocab_size=8)
    message = str(caught.value)
    assert message.startswith(
        f"Corrupt TFRecord data: {path}: record 200 (starts at byte {start} of {size}): the file "
        f"ends {into} byte(s) into ")
    assert "--skip-corrupt-records" in message and "Re-create or remove" in message
    [damage] = find_cut_tfrecords([path]).damaged
    assert (damage.record_index, damage.byte_offset, damage.size) == (200, start, size)
    # explain_data_loss's search finds it too (TensorFlow names no file).
    [found] = find_corrupt_tfrecords([path]).damaged
    assert (found.record_index, found.byte_offset) == (200, start)


def test_tensorflow_reads_a_file_cut_inside_a_record_header_without_a_word(tmp_path):
    # Why the framing is walked when a source is made: TensorFlow stops silently.
    path, _, _, _ = cut_into_last_record(tmp_path, "header")
    assert count(tf.data.TFRecordDataset(path)) == 200


@pytest.mark.parametrize("where", sorted(CUTS))
def test_a_cut_file_is_skipped_and_counted_with_skip_corrupt_records(tmp_path, where):
    path, start, into, size = cut_into_last_record(tmp_path, where)
    source = TFRecordSource(path, sequence_length=39, vocab_size=8, skip_corrupt_records=True)
    fn = make_dataset_fn(source, 1, training=False, repeat=False, drop_remainder=False)
    assert count(fn(None)) == 200
    [damage] = source.skipped.files
    assert (damage.path, damage.record_index, damage.byte_offset, damage.size) == (
        path, 200, start, size)
    assert source.skipped.summary().startswith(f"1 damaged file, {into} bytes not read: ")


def test_whole_files_pass_the_framing_walk_and_compressed_files_are_not_walked(tmp_path):
    paths = token_files(tmp_path, num_files=3)
    result = find_cut_tfrecords(paths)
    assert result.complete and result.scanned == 3 and result.damaged == ()
    gzip_path = str(tmp_path / "z.tfrecord")
    with tf.io.TFRecordWriter(gzip_path, options="GZIP") as writer:
        writer.write(b"x" * 100)
    source = TFRecordSource(gzip_path, sequence_length=4, vocab_size=8, compression_type="GZIP")
    assert source.compression_type == "GZIP"


def test_the_framing_walk_says_what_it_did_not_check_in_its_time(tmp_path, caplog):
    paths = token_files(tmp_path, num_files=2)
    with caplog.at_level("WARNING", logger="tfdist.data"):
        check_tfrecord_tails(paths, time_budget=0)
    [warning] = [r.getMessage() for r in caplog.records if "record framing" in r.getMessage()]
    assert "0 of 2 TFRecord file(s)" in warning and "other 2" in warning


def test_an_imagenet_tfrecord_cut_short_is_an_error(tmp_path):
    images = np.zeros((4, 8, 8, 3), dtype=np.uint8)
    [path] = write_image_tfrecords(images, [0, 1, 2, 0], str(tmp_path / "train"))
    start, _ = record_offsets(path)[3]
    data = open(path, "rb").read()
    open(path, "wb").write(data[:start + 5])
    with pytest.raises(CorruptDataError, match=rf"{path}: record 3 \(starts at byte {start}"):
        ImageNetTFRecordSource(path, num_classes=3, image_size=8)
