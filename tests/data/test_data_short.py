"""Data that holds no example, or fewer than an epoch reads: said at once, in one line.

Real files: empty or too short text and TFRecord files; one recipe run shows
the error as a user sees it (exit 2, one line, no traceback).
"""

import os
import subprocess
import sys

import pytest
import tensorflow as tf

from helpers.recipe_util import REPO_ROOT
from tfdist.data import (NoExamplesError, count_examples, describe_epoch_passes, make_dataset_fn,
                         make_source, write_token_tfrecords)


def write(path, text=""):
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize("scheme, options", [("text", {}),
                                             ("tfrecord", {"vocab_size": 8}),
                                             ("imagenet_tfrecord", {"num_classes": 2})])
def test_an_empty_file_is_an_error_naming_it_when_the_source_is_made(tmp_path, scheme, options):
    path = write(tmp_path / "empty.data")
    if scheme != "imagenet_tfrecord":
        options["sequence_length"] = 8
    with pytest.raises(NoExamplesError) as caught:
        make_source(f"{scheme}:{path}", **options)
    assert isinstance(caught.value, ValueError)
    assert str(caught.value) == (
        f"No examples in {path}: the file is empty (0 bytes). Check the file(s) (an interrupted "
        "copy or download?) or point the dataset at the data.")


def test_every_file_empty_names_them_one_with_data_is_enough(tmp_path):
    paths = [write(tmp_path / f"part-{i}.txt") for i in range(3)]
    with pytest.raises(NoExamplesError, match=r"No examples in .*part-0.txt, .*part-1.txt, "
                                              r".*part-2.txt: all 3 files are empty \(0 bytes\)"):
        make_source(f"text:{tmp_path}/part-*.txt", sequence_length=8)
    write(tmp_path / "part-1.txt", "enough text for one window of eight\n")
    source = make_source(f"text:{tmp_path}/part-*.txt", sequence_length=8)
    assert source.files == tuple(paths)


def test_text_shorter_than_one_packed_example_is_an_error_saying_what_it_needs(tmp_path):
    path = write(tmp_path / "short.txt", "hello\n")  # 6 tokens
    with pytest.raises(NoExamplesError) as caught:
        make_source(f"text:{path}", sequence_length=8)
    assert str(caught.value).startswith(
        f"No examples in {path}: 6 byte(s) in all, fewer than the 9 tokens (a token per byte) of "
        "one example of sequence_length 8 + 1; use more text or a smaller sequence_length")
    source = make_source(f"text:{path}", sequence_length=5)  # exactly one window of 6
    fn = make_dataset_fn(source, 1, training=False, repeat=False)
    assert sum(1 for _ in fn(None)) == 1
    assert make_source(f"text:{path}", sequence_length=8, pack=False).pack is False


def test_an_input_pipeline_given_only_empty_files_says_so(tmp_path):
    write(tmp_path / "a.txt", "some text that fills a window or two of eight tokens\n")
    write(tmp_path / "b.txt")
    source = make_source(f"text:{tmp_path}/*.txt", sequence_length=8)
    fn = make_dataset_fn(source, 2, training=False, repeat=False)
    context = tf.distribute.InputContext(num_input_pipelines=2, input_pipeline_id=0,
                                         num_replicas_in_sync=2)
    assert sum(1 for _ in fn(context)) > 0
    context = tf.distribute.InputContext(num_input_pipelines=2, input_pipeline_id=1,
                                         num_replicas_in_sync=2)
    with pytest.raises(NoExamplesError, match=r"b.txt \(the files of input pipeline 1 of 2, "
                                              r"sharded by file\): the file is empty"):
        fn(context)


def test_an_epoch_longer_than_the_data_is_said_with_the_number_of_passes(tmp_path):
    write_token_tfrecords([[1, 5, 6, 3] * 10] * 55, str(tmp_path / "tok"), num_files=2)
    source = make_source(f"tfrecord:{tmp_path}/tok-*", sequence_length=8, vocab_size=8)
    assert count_examples(source) == 55
    assert describe_epoch_passes(source, 32, 300) == (
        "--steps-per-epoch 300 x global batch 32 = 9600 examples per epoch, 174.5 passes over "
        "the 55 training examples: each epoch repeats the data")
    assert describe_epoch_passes(source, 5, 11) is None  # exactly one pass
    assert describe_epoch_passes(source, 8, 7) == (
        "--steps-per-epoch 7 x global batch 8 = 56 examples per epoch, 1.02 passes over the 55 "
        "training examples: each epoch repeats the data")
    # Packed text: the windows are counted (90 bytes, a token each: 10 windows of 8 + 1).
    (tmp_path / "ten.txt").write_text("abcdefgh\n" * 10)
    text = make_source(f"text:{tmp_path / 'ten.txt'}", sequence_length=8)
    assert count_examples(text) == 10
    assert describe_epoch_passes(text, 4, 5) == (
        "--steps-per-epoch 5 x global batch 4 = 20 examples per epoch, 2 passes over the 10 "
        "training examples: each epoch repeats the data")
    # A source that knows its size is not read; counting stops at the limit.
    assert count_examples(make_source("embedded", num_examples=100), limit=99) is None
    assert count_examples(source, limit=54) is None


def test_counting_leaves_the_skipped_records_log_alone(tmp_path):
    [path] = write_token_tfrecords([[1, 5, 6, 3] * 10] * 20, str(tmp_path / "tok"))
    data = open(path, "rb").read()
    open(path, "wb").write(data[:-30])  # record 19 cut short
    source = make_source(f"tfrecord:{path}", sequence_length=8, vocab_size=8,
                         skip_corrupt_records=True)
    assert count_examples(source) == 19
    assert source.skipped.files == []
    fn = make_dataset_fn(source, 1, training=False, repeat=False)
    assert sum(1 for _ in fn(None)) == 19
    assert [damage.record_index for damage in source.skipped.files] == [19]


def test_a_recipe_given_an_empty_file_exits_2_with_one_line(tmp_path):
    path = write(tmp_path / "empty.txt")
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1")
    env.pop("TF_CONFIG", None)
    result = subprocess.run(
        [sys.executable, "-m", "tfdist.recipes.transformer", "--dataset", f"text:{path}",
         "--sequence-length", "16", "--steps-per-epoch", "2", "--epochs", "1",
         "--warmup-steps", "0"],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=180)
    assert result.returncode == 2, result.stderr[-3000:]
    # TensorFlow's own native log lines (e.g. "E0000 ... cuInit") are not the recipe's.
    lines = [line for line in result.stderr.splitlines()
             if line.strip() and not line.startswith(("E0000", "W0000", "I0000"))]
    assert lines[-1] == (
        f"python -m tfdist.recipes.transformer: error: NoExamplesError: No examples in {path}: "
        "the file is empty (0 bytes). Check the file(s) (an interrupted copy or download?) or "
        "point the dataset at the data."), result.stderr
    assert [line for line in lines if "error" in line.lower()] == lines[-1:], result.stderr
    assert "Traceback" not in result.stdout + result.stderr
