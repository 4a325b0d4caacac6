"""tfdist.data TFDS source: offline only (tfds.testing.mock_data and a dataset prepared here)."""

import collections

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds

from tfdist.data import (BOS_ID, EOS_ID, FILE, RECORD, DatasetNotPreparedError, TFDSSource,
                         make_dataset_fn, make_source)

NUM_DOCS = 23
NUM_TEST_DOCS = 5


class TfdistTestDocs(tfds.core.GeneratorBasedBuilder):
    """A tiny real TFDS text dataset, generated locally: 'doc 000' ... 'doc 022'."""

    VERSION = tfds.core.Version("1.0.0")

    def _info(self):
        return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict(
            {"number": tf.int64, "body": tfds.features.Text(), "title": tfds.features.Text()}))

    def _split_generators(self, dl_manager):
        return {"train": self._generate_examples(range(NUM_DOCS)),
                "test": self._generate_examples(range(100, 100 + NUM_TEST_DOCS))}

    def _generate_examples(self, numbers):
        for i in numbers:
            yield i, {"number": i, "title": f"title {i}", "body": f"doc {i:03d}"}


@pytest.fixture(scope="module")
def prepared_dir(tmp_path_factory):
    """The dataset prepared (no download) in 4 shard files."""
    data_dir = str(tmp_path_factory.mktemp("tfds"))
    builder = TfdistTestDocs(data_dir=data_dir)
    builder.download_and_prepare(download_config=tfds.download.DownloadConfig(num_shards=4))
    assert builder.info.splits["train"].num_shards == 4
    return data_dir


def documents(source, context=None):
    """Decoded texts of one epoch (pack=False: one example per document)."""
    fn = make_dataset_fn(source, 1, training=True, seed=2, repeat=False, drop_remainder=False)
    texts = []
    for inputs, targets in fn(context):
        tokens = np.concatenate([inputs.numpy()[0, :1], targets.numpy()[0]])
        assert tokens[0] == BOS_ID
        texts.append(source.vocabulary.decode(tokens).decode())
    return fn, texts


def test_mock_data_loads_through_the_source():
    with tfds.testing.mock_data(num_examples=12):
        # Under mock_data, download_and_prepare is a no-op: this is the offline path.
        source = make_source("tfds:imdb_reviews", download=True, sequence_length=32)
        assert source.feature == "text" and source.vocab_size == 260
        fn = make_dataset_fn(source, 4, training=False, deterministic=True, drop_remainder=False)
        tokens = np.concatenate([np.concatenate([x[:, :1], y], axis=1).reshape(-1)
                                 for x, y in (b for b in fn(None))])
    assert np.sum(tokens == BOS_ID) == 12 and np.sum(tokens == EOS_ID) == 12
    text = source.vocabulary.decode(tokens).decode()
    assert text and set(text) <= set(" abcdefghij")  # mock_data's generated review texts


def test_unprepared_dataset_is_an_error_that_says_how_to_prepare_it(tmp_path):
    with pytest.raises(DatasetNotPreparedError) as caught:
        TFDSSource("imdb_reviews", data_dir=str(tmp_path))
    message = str(caught.value)
    assert f"tfds build imdb_reviews --data_dir {tmp_path}" in message
    assert "download=True" in message
    assert not list(tmp_path.iterdir())  # nothing was downloaded or written


def test_unknown_dataset_and_feature_are_named(prepared_dir):
    with pytest.raises(ValueError, match="Unknown TFDS dataset 'no_such_dataset_xyz'"):
        TFDSSource("no_such_dataset_xyz")
    with pytest.raises(ValueError, match=r"'number'.*text features: body, title"):
        TFDSSource("tfdist_test_docs", feature="number", data_dir=prepared_dir)


@pytest.mark.parametrize("pipelines, mode", [(1, FILE), (2, FILE), (4, FILE), (5, RECORD)])
def test_prepared_dataset_is_partitioned_across_pipelines(prepared_dir, pipelines, mode):
    source = TFDSSource("tfdist_test_docs", feature="body", data_dir=prepared_dir,
                        sequence_length=12, pack=False)
    assert source.num_files == 4 and source.num_examples == NUM_DOCS
    seen = collections.Counter()
    for index in range(pipelines):
        fn, texts = documents(source, tf.distribute.InputContext(pipelines, index, 1))
        assert fn.plans[index].mode == mode and texts
        seen.update(texts)
    assert sorted(seen) == [f"doc {i:03d}" for i in range(NUM_DOCS)]
    assert set(seen.values()) == {1}


def test_evaluation_split_is_validation_else_test(prepared_dir):
    source = make_source("tfds:tfdist_test_docs", split="evaluation", data_dir=prepared_dir,
                         sequence_length=16, pack=False)
    assert source.split == "test"
    _, texts = documents(source)
    assert sorted(texts) == [f"doc {i:03d}" for i in range(100, 100 + NUM_TEST_DOCS)]
    with tfds.testing.mock_data(num_examples=4):  # no split list: taken at its word
        assert make_source("tfds:imdb_reviews", split="evaluation", download=True).split == "test"


def test_a_split_the_dataset_lacks_is_named_with_the_ones_it_has(prepared_dir):
    with pytest.raises(ValueError, match=r"has no split 'validation'; its splits are train, test"):
        make_source("tfds:tfdist_test_docs", split="validation", data_dir=prepared_dir)
    with pytest.raises(ValueError, match=r"has no split 'dev'"):
        make_source("tfds:tfdist_test_docs", split="train[:50%]+dev", data_dir=prepared_dir)
    source = make_source("tfds:tfdist_test_docs", split="train[:50%]+test", data_dir=prepared_dir)
    assert source.split == "train[:50%]+test"


def test_transformer_validation_on_tfds_reads_the_held_out_split(prepared_dir):
    import argparse

    from tensorflow_datasets.core.utils import file_utils

    from tfdist.recipes.transformer import validation_source

    tfds.core.add_data_dir(prepared_dir)  # the recipe passes no data_dir: TFDS searches here
    try:
        train = make_source("tfds:tfdist_test_docs", sequence_length=16)
        config = argparse.Namespace(dataset="tfds:tfdist_test_docs", seed=0, global_batch_size=8)
        validation = validation_source("tfds:tfdist_test_docs", train, config)
    finally:
        file_utils.clear_registered_data_dirs()
    assert (train.split, validation.split) == ("train", "test")
    assert validation.vocabulary is train.vocabulary and validation.sequence_length == 16
