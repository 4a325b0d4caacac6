"""tfdist.data sources: embedded tasks, TFRecord and text round trips, tokens, make_source."""

import math

import numpy as np
import pytest
import tensorflow as tf

from tfdist.data import (BOS_ID, EOS_ID, PAD_ID, SEP_ID, ByteVocabulary, EmbeddedTaskSource,
                         TextSource, TFRecordSource, expand_files, make_dataset_fn, make_source,
                         pack_windows, write_text_tfrecords, write_token_tfrecords)
from tfdist.data.embedded import generate_tokens
from tfdist.data.text import LINES_PER_RECORD


def one_epoch(source, batch=4, context=None, **options):
    """All (inputs, targets) rows of one epoch, as two int arrays (in order by default)."""
    options = dict(dict(training=False, deterministic=True), **options)
    fn = make_dataset_fn(source, batch, drop_remainder=False, repeat=False, **options)
    rows = [(x.numpy(), y.numpy()) for x, y in fn(context)]
    return np.concatenate([r[0] for r in rows]), np.concatenate([r[1] for r in rows])


# --- embedded tasks -------------------------------------------------------------------------

@pytest.mark.parametrize("task, f", [
    ("reverse", lambda x: x[::-1]), ("copy", lambda x: x), ("sort", np.sort)])
def test_embedded_targets_are_the_task_of_the_prompt_and_pads_are_where_promised(task, f):
    p, v = 6, 10
    source = EmbeddedTaskSource(task, num_examples=50, payload_length=p, payload_vocab=v, seed=3)
    assert (source.vocab_size, source.sequence_length) == (4 + v, 2 * p + 2)
    inputs, targets = one_epoch(source, batch=8)
    assert inputs.shape == targets.shape == (50, 2 * p + 2)
    for x, y in zip(inputs, targets, strict=True):
        payload = x[1:p + 1]
        assert x[0] == BOS_ID and x[p + 1] == SEP_ID
        assert payload.min() >= 4 and payload.max() < 4 + v
        assert (y[:p + 1] == PAD_ID).all()                    # prompt targets are pad
        np.testing.assert_array_equal(y[p + 1:2 * p + 1], f(payload))
        assert y[-1] == EOS_ID
        np.testing.assert_array_equal(x[p + 2:], y[p + 1:2 * p + 1])  # teacher forcing
    assert len({tuple(x[1:p + 1]) for x in inputs}) > 45          # payloads are random


def test_embedded_generation_is_deterministic_per_seed_and_split():
    a = generate_tokens("reverse", 20, seed=1)
    np.testing.assert_array_equal(a, generate_tokens("reverse", 20, seed=1))
    assert not np.array_equal(a, generate_tokens("reverse", 20, seed=2))
    assert not np.array_equal(a, generate_tokens("reverse", 20, seed=1, split="validation"))


def test_embedded_chance_level_is_documented_numbers():
    chance = EmbeddedTaskSource("reverse", num_examples=8).chance()
    assert chance.loss == pytest.approx(8 / 9 * math.log(16))
    assert chance.accuracy == pytest.approx((8 / 16 + 1) / 9)
    assert "chance: loss 2.465, accuracy 0.167" in str(chance)


def test_embedded_unknown_task_lists_the_valid_ones():
    with pytest.raises(ValueError, match=r"'add'.*copy, reverse, sort"):
        EmbeddedTaskSource("add")
    with pytest.raises(ValueError, match=r"payload_vocab must be an integer >= 2, got 1"):
        EmbeddedTaskSource(payload_vocab=1)


# --- tokens ---------------------------------------------------------------------------------

def test_pack_windows_keeps_every_token_and_pads_the_tail():
    docs = tf.data.Dataset.from_tensor_slices(tf.ragged.constant([[4, 5, 6], [7], [8, 9]]))
    windows = [w.tolist() for w in pack_windows(docs, 4, documents_per_chunk=2).as_numpy_iterator()]
    assert windows == [[4, 5, 6, 7], [8, 9, 0, 0]]


def test_byte_vocabulary_round_trip_and_built_vocabulary():
    vocab = ByteVocabulary()
    text = "héllo"
    ids = vocab.encode(tf.constant(text)).numpy()
    assert vocab.vocab_size == 260 and ids.min() >= 4
    assert vocab.decode(ids).decode("utf-8") == text
    built = ByteVocabulary.from_texts(["abc"])
    assert built.vocab_size == 4 + 1 + 3
    assert built.encode(tf.constant("cab")).numpy().tolist() == [7, 5, 6]
    assert built.encode(tf.constant("z")).numpy().tolist() == [built.unk_id]
    assert built.decode([7, 4]) == b"c?"



def test_a_batch_of_texts_encodes_as_each_text_does():
    """Texts of 0 to 30 bytes, some of 2-byte characters, and bytes outside a
    built vocabulary: the batch gives each text's ids in its own row (int64
    row splits), and a batch of no text gives no row."""
    rng = np.random.default_rng(2)
    words = ["alpha", "é", "tau", "ü ü", ""]
    texts = [" ".join(rng.choice(words, size=int(rng.integers(0, 8)))) for _ in range(40)] + [""]
    for vocab in (ByteVocabulary(), ByteVocabulary.from_texts(["alpha tau"])):
        batch = vocab.encode_batch(tf.constant(texts))
        assert batch.row_splits.dtype == tf.int64
        for text, row in zip(texts, batch.to_list(), strict=True):
            assert row == vocab.encode(tf.constant(text)).numpy().tolist()
        assert vocab.encode_batch(tf.constant([], tf.string)).to_list() == []

# --- TFRecord -------------------------------------------------------------------------------

def test_token_tfrecords_round_trip(tmp_path):
    rng = np.random.default_rng(0)
    sequences = [rng.integers(4, 50, size=rng.integers(2, 9)).tolist() for _ in range(30)]
    paths = write_token_tfrecords(sequences, str(tmp_path / "tok"), num_files=3)
    assert [p.rsplit("/", 1)[1] for p in paths] == [
        f"tok-0000{i}-of-00003.tfrecord" for i in range(3)]
    source = TFRecordSource(str(tmp_path / "tok-*.tfrecord"), sequence_length=5)
    assert source.vocab_size == max(max(s) for s in sequences) + 1  # scanned
    assert source.num_files == 3 and not source.pack
    inputs, targets = one_epoch(source)
    got = sorted(tuple(np.concatenate([x[:1], y]).tolist())
                 for x, y in zip(inputs, targets, strict=True))
    expected = sorted(tuple((s + [0] * 6)[:6]) for s in sequences)
    assert got == expected


def test_writing_tfrecords_leaves_no_partial_or_mixed_set(tmp_path):
    """A writer that failed part-way left its files under their final names (a smaller set
    that reads as whole); a second set of another count sat beside the first, read together
    with it by `tok-*`; a negative id was written."""
    prefix = str(tmp_path / "tok")

    def failing_rows():
        yield [4, 5, 6]
        yield [7, 8]
        raise RuntimeError("the source broke")

    with pytest.raises(RuntimeError, match="the source broke"):
        write_token_tfrecords(failing_rows(), prefix, num_files=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # nothing left, not even partials

    first = write_token_tfrecords([[4, 5, 6]] * 4, prefix, num_files=2)
    again = write_token_tfrecords([[7, 8, 9]] * 6, prefix, num_files=2)  # same set: replaced
    assert again == first
    inputs, _ = one_epoch(TFRecordSource(prefix + "-*.tfrecord", sequence_length=2, vocab_size=10))
    assert len(inputs) == 6 and {int(row[0]) for row in inputs} == {7}
    with pytest.raises(FileExistsError, match=r"already has shards written as another set "
                                              r"\(tok-00000-of-00002\.tfrecord, "
                                              r"tok-00001-of-00002\.tfrecord\); 3 new file"):
        write_token_tfrecords([[4, 5]] * 3, prefix, num_files=3)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "tok-00000-of-00002.tfrecord", "tok-00001-of-00002.tfrecord"]
    with pytest.raises(ValueError, match=r"^sequence 1 holds the token id -2; token ids are "
                                         r"integers >= 0\.$"):
        write_token_tfrecords([[4, 5], [6, -2]], str(tmp_path / "neg"))
    assert not list(tmp_path.glob("neg*"))


def test_packed_token_tfrecords_keep_every_token_in_order(tmp_path):
    """600 documents in one file, parsed 256 records at a time: unshuffled, the
    windows are the documents' tokens back to back, the last window padded;
    an id outside the vocabulary still fails in a block."""
    rng = np.random.default_rng(1)
    sequences = [rng.integers(4, 50, size=rng.integers(1, 9)).tolist() for _ in range(600)]
    write_token_tfrecords(sequences, str(tmp_path / "tok"), num_files=1)
    source = TFRecordSource(str(tmp_path / "tok-*.tfrecord"), sequence_length=7, vocab_size=50,
                            pack=True)
    inputs, targets = one_epoch(source)
    stream = np.concatenate([np.concatenate([x[:1], y])
                             for x, y in zip(inputs, targets, strict=True)]).tolist()
    expected = sum(sequences, [])
    assert stream == expected + [PAD_ID] * (-len(expected) % 8)
    write_token_tfrecords([[1, 4, 99]] * 300, str(tmp_path / "big"))
    big = TFRecordSource(str(tmp_path / "big-*"), sequence_length=2, vocab_size=50, pack=True)
    with pytest.raises(tf.errors.InvalidArgumentError, match="vocab_size=50"):
        one_epoch(big)


def test_token_ids_outside_the_vocabulary_fail_loudly(tmp_path):
    write_token_tfrecords([[1, 4, 99]], str(tmp_path / "big"))
    source = TFRecordSource(str(tmp_path / "big-*"), sequence_length=2, vocab_size=50)
    with pytest.raises(tf.errors.InvalidArgumentError, match="vocab_size=50"):
        one_epoch(source)


@pytest.mark.parametrize("count", [3, 600], ids=["one_block", "three_blocks"])
@pytest.mark.parametrize("fmt", ["text", "raw"])
def test_text_tfrecords_round_trip(tmp_path, fmt, count):
    """Packed records are parsed RECORDS_PER_BLOCK (256) at a time; the token
    stream is each document's, in order, empty ones included."""
    texts = ["first doc", "second, longer document", "3rd"]
    texts = (texts * 200)[:count - 1] + [""] if count > 3 else texts
    if fmt == "text":
        write_text_tfrecords(texts, str(tmp_path / "t"), feature="body")
        source = TFRecordSource(str(tmp_path / "t-*"), sequence_length=8, format="text",
                                feature="body")
    else:
        with tf.io.TFRecordWriter(str(tmp_path / "raw.tfrecord")) as writer:
            for text in texts:
                writer.write(text.encode())
        source = TFRecordSource(str(tmp_path / "raw.tfrecord"), sequence_length=8, format="raw")
    inputs, targets = one_epoch(source)
    assert inputs.shape[1] == 8
    stream = np.concatenate([np.concatenate([x[:1], y])
                             for x, y in zip(inputs, targets, strict=True)])
    expected = []
    for text in texts:
        expected += [BOS_ID] + (np.frombuffer(text.encode(), np.uint8) + 4).tolist() + [EOS_ID]
    expected += [PAD_ID] * (-len(expected) % 9)
    assert stream.tolist() == expected


# --- plain text -----------------------------------------------------------------------------

def test_text_files_round_trip_through_packed_windows(tmp_path):
    contents = {"a.txt": "To be, or not to be:\nthat is the question.\n",
                "b.txt": "Ünïcödé line\n\nafter an empty one\n"}
    for name, text in contents.items():
        (tmp_path / name).write_text(text, encoding="utf-8")
    source = TextSource(str(tmp_path / "*.txt"), sequence_length=16, vocabulary="build")
    distinct = set("".join(contents.values()).encode("utf-8"))
    assert source.vocab_size == 5 + len(distinct)
    inputs, targets = one_epoch(source)
    assert inputs.shape[1] == 16
    for x, y in zip(inputs, targets, strict=True):
        np.testing.assert_array_equal(x[1:], y[:-1])
    stream = np.concatenate([np.concatenate([x[:1], y])
                             for x, y in zip(inputs, targets, strict=True)])
    assert source.vocabulary.decode(stream).decode("utf-8") == contents["a.txt"] + contents["b.txt"]


def window_texts(source, inputs, targets):
    return [source.vocabulary.decode(np.concatenate([x[:1], y])).decode() for x, y in
            zip(inputs, targets, strict=True)]


def test_packed_text_windows_are_contiguous_text_even_when_shuffled(tmp_path):
    files = {name: "".join(f"{name} line {i:03d}\n" for i in range(40)) for name in "abc"}
    for name, text in files.items():
        (tmp_path / f"{name}.txt").write_text(text)
    source = TextSource(str(tmp_path / "*.txt"), sequence_length=40)
    inputs, targets = one_epoch(source, training=True, deterministic=False, seed=None)
    windows = window_texts(source, inputs, targets)
    assert len(windows) == math.ceil(3 * 40 * 11 / 41)
    # Files are read one after the other (in a shuffled order): a window lies in one file
    # or spans the end of one and the start of the next, but never mixes lines.
    pairs = [files[a] + files[b] for a in files for b in files if a != b]
    for window in windows:
        assert any(window.rstrip("\x00") in text for text in pairs), window


def test_record_sharded_text_hands_out_records_of_consecutive_lines(tmp_path):
    lines = [f"{i:03d}\n" for i in range(150)]
    (tmp_path / "one.txt").write_text("".join(lines))
    source = TextSource(str(tmp_path / "one.txt"), sequence_length=15)
    assert LINES_PER_RECORD == 64
    streams = []
    for index in range(2):
        inputs, targets = one_epoch(source, context=tf.distribute.InputContext(2, index, 1))
        streams.append("".join(window_texts(source, inputs, targets)).rstrip("\x00"))
    assert streams[0] == "".join(lines[0:64] + lines[128:150])
    assert streams[1] == "".join(lines[64:128])


# --- files and make_source ------------------------------------------------------------------

def test_expand_files_sorts_and_names_missing_patterns(tmp_path):
    for name in ("b.txt", "a.txt"):
        (tmp_path / name).write_text("x\n")
    assert expand_files(f"{tmp_path}/*.txt") == (f"{tmp_path}/a.txt", f"{tmp_path}/b.txt")
    assert expand_files([f"{tmp_path}/b.txt", f"{tmp_path}/*.txt"]) == (
        f"{tmp_path}/a.txt", f"{tmp_path}/b.txt")
    with pytest.raises(FileNotFoundError, match=r"No files match '.*/nothing-\*\.tfrecord'"):
        expand_files(f"{tmp_path}/*.txt,{tmp_path}/nothing-*.tfrecord")
    (tmp_path / "folder").mkdir()
    with pytest.raises(FileNotFoundError, match=r"No files match '.*/folder/': it is a folder\. "
                                                r"Name its files, e\.g\. .*/folder/\*\.$"):
        expand_files(f"{tmp_path}/folder/")


def test_make_source_maps_dataset_strings_to_sources(tmp_path):
    default = make_source()
    assert isinstance(default, EmbeddedTaskSource) and default.task == "reverse"
    sort = make_source("embedded:sort", num_examples=16, payload_length=4, seed=None)
    assert (sort.task, sort.num_examples, sort.sequence_length) == ("sort", 16, 10)
    (tmp_path / "a.txt").write_text("hello, world\n")  # 13 tokens: one example of 8 + 1
    text = make_source(f"text:{tmp_path}/*.txt", sequence_length=8)
    assert isinstance(text, TextSource) and text.files == (f"{tmp_path}/a.txt",)
    write_token_tfrecords([[1, 5, 3]], str(tmp_path / "tok"))
    records = make_source(f"tfrecord:{tmp_path}/tok-*.tfrecord", vocab_size=8, sequence_length=2)
    assert isinstance(records, TFRecordSource) and records.vocab_size == 8
    assert make_source(records) is records


@pytest.mark.parametrize("spec, error, message", [
    ("imagenet:train", ValueError, r"scheme 'imagenet'.*embedded, tfds, tfrecord, text"),
    ("text:", ValueError, r"needs a file pattern"),
    ("tfds:", ValueError, r"needs a TFDS name"),
    ("tfrecord:/no/such/dir/*.tfrecord", FileNotFoundError, r"'/no/such/dir/\*\.tfrecord'"),
    ("embedded:add", ValueError, r"valid tasks: copy, reverse, sort"),
])
def test_make_source_errors_name_the_bad_value(spec, error, message):
    with pytest.raises(error, match=message):
        make_source(spec)


def test_make_source_rejects_options_the_source_does_not_take():
    with pytest.raises(TypeError, match=r"Bad option for dataset 'embedded'.*vocab_size"):
        make_source("embedded", vocab_size=10)
