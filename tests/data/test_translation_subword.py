"""Real translation data: the SentencePiece tokenizer saved with a run, line-aligned text
files and TFDS translation datasets (tfds.testing.mock_data: nothing downloads)."""

import json
import os

import numpy as np
import pytest
import tensorflow_datasets as tfds

from tfdist.data.specs import parse_pair_spec
from tfdist.data.subword import (META_FILE, MODEL_FILE, SubwordTokenizer,
                                 load_or_train_tokenizer)
from tfdist.data.translation_pairs import SubwordPairsSource, read_text_pairs, read_tfds_pairs
from tfdist.data.translation_task import generate_sentence_pairs
from tfdist.recipes import translation
from tfdist.recipes.config import ConfigError, parse_config


def sentences(count=300):
    pairs = generate_sentence_pairs(count, seed=3, max_source_words=8)
    return ([" ".join(words) for words in pairs.source_words],
            [" ".join(words) for words in pairs.target_words])


def test_the_tokenizer_is_trained_once_then_reused_never_retrained(tmp_path):
    sources, targets = sentences()
    lines = []
    directory = str(tmp_path / "tokenizer")
    tokenizer = load_or_train_tokenizer(directory, sources + targets, 200, "bpe", say=lines.append)
    assert lines[-1].startswith("Training a bpe subword tokenizer")
    model_path = os.path.join(directory, MODEL_FILE)
    first_bytes = open(model_path, "rb").read()
    ids = tokenizer.encode(sources[0])
    assert ids.dtype == np.int32 and len(ids) > 0 and min(ids) > 3  # 0..3 are tfdist's reserved
    assert tokenizer.decode([1, *ids, 3, 0, 0]) == sources[0]
    with open(os.path.join(directory, META_FILE)) as stream:
        meta = json.load(stream)
    assert meta["model_type"] == "bpe" and meta["vocab_size"] == tokenizer.vocab_size <= 200

    again = load_or_train_tokenizer(directory, sources + targets, 200, "bpe", say=lines.append)
    assert lines[-1].startswith(f"Reusing the subword tokenizer {model_path}")
    assert open(model_path, "rb").read() == first_bytes
    assert again.encode(sources[0]).tolist() == ids.tolist()
    # Other text or settings than the saved tokenizer's: an error naming the file.
    with pytest.raises(ValueError, match=f"{directory}/{META_FILE} was trained with other "
                                         "training_sentences, training_text_sha256"):
        load_or_train_tokenizer(directory, sources[:10] + targets, 200, "bpe")
    with pytest.raises(ValueError, match="requested_vocab_size"):
        load_or_train_tokenizer(directory, sources + targets, 300, "bpe")


def test_a_worker_that_is_not_the_chief_waits_for_the_chiefs_file_then_fails_naming_it(tmp_path):
    sources, targets = sentences(100)
    directory = str(tmp_path / "tokenizer")
    now = [0.0]

    def sleep(seconds):  # the chief "finishes" after 3 s of waiting
        now[0] += seconds
        if now[0] >= 3 and not os.path.exists(os.path.join(directory, META_FILE)):
            load_or_train_tokenizer(directory, sources + targets, 120, say=lambda line: None)

    lines = []
    tokenizer = load_or_train_tokenizer(directory, sources + targets, 120, is_chief=False,
                                        wait_seconds=10, say=lines.append,
                                        clock=lambda: now[0], sleep=sleep)
    assert isinstance(tokenizer, SubwordTokenizer) and lines[0].startswith("Reusing")
    assert 3 <= now[0] < 10
    now[0] = 0.0
    empty = str(tmp_path / "nobody")
    with pytest.raises(TimeoutError, match=f"Waited 2 s for the chief to write the subword "
                                           f"tokenizer {empty}/{META_FILE}"):
        load_or_train_tokenizer(empty, sources, 120, is_chief=False, wait_seconds=2,
                                clock=lambda: now[0],
                                sleep=lambda s: now.__setitem__(0, now[0] + s))
    assert not os.path.exists(empty)  # a waiting worker writes nothing


def test_line_aligned_files_differing_in_line_count_are_refused_naming_both(tmp_path):
    (tmp_path / "a.de").write_text("eins\nzwei\ndrei\n")
    (tmp_path / "a.en").write_text("one\ntwo\n")
    with pytest.raises(ValueError) as caught:
        read_text_pairs(str(tmp_path / "a.de"), str(tmp_path / "a.en"))
    assert str(caught.value).startswith(f"{tmp_path}/a.de has 3 lines but {tmp_path}/a.en has 2;")
    assert parse_pair_spec("text: x.de , x.en") == ("text", ("x.de", "x.en"))
    with pytest.raises(ValueError, match="give two line-aligned files"):
        parse_pair_spec("text:x.de")
    with pytest.raises(FileNotFoundError) as caught:
        read_text_pairs(str(tmp_path / "a.de"), str(tmp_path / "b.en"))
    assert str(caught.value) == (f"the target file {tmp_path}/b.en does not exist "
                                 "(text:SOURCE_FILE,TARGET_FILE names two line-aligned local files).")


def test_text_files_through_the_recipe_data_and_a_resume_reuses_the_tokenizer(tmp_path, capsys):
    sources, targets = sentences(300)
    (tmp_path / "train.src").write_text("\n".join(sources) + "\n")
    (tmp_path / "train.tgt").write_text("\n".join(targets) + "\n")
    model_dir = str(tmp_path / "run")
    argv = ["--dataset", f"text:{tmp_path}/train.src,{tmp_path}/train.tgt", "--model-dir",
            model_dir, "--subword-vocab-size", "200", "--max-tokens", "20",
            "--validation-sentences", "40", "--global-batch-size", "8"]
    config = parse_config(argv, translation.RECIPE.all_options(), prog="t")
    translation.check_config(config)
    data = translation.build_data(config)
    assert "Training a unigram subword tokenizer" in capsys.readouterr().out
    # The last 40 pairs are held out; the tokenizer saw only the 260 training pairs.
    assert data.validation.pairs.source_words == tuple(sources[-40:])
    assert data.train.num_examples + data.train.dropped == 260
    assert data.info["tokenizer"] == os.path.join("tokenizer", MODEL_FILE)
    (source_ids, target_in), target_out = next(iter(data.train.read_all()))
    assert target_in.numpy()[0] == 1 and 3 in target_out.numpy()
    assert data.train.vocabulary.decode(source_ids.numpy()) == data.train.pairs.source_words[0]
    model_file = os.path.join(model_dir, "tokenizer", MODEL_FILE)
    stamp = os.stat(model_file).st_mtime_ns
    again = translation.build_data(config)  # what a resumed run does first
    assert capsys.readouterr().out.startswith(f"Reusing the subword tokenizer {model_file}")
    assert os.stat(model_file).st_mtime_ns == stamp
    np.testing.assert_array_equal(again.train.source_ids, data.train.source_ids)
    bad = parse_config(["--dataset", "text:only_one_file"], translation.RECIPE.all_options(),
                       prog="t")
    with pytest.raises(ConfigError, match="--dataset: Dataset 'text:only_one_file'"):
        translation.check_config(bad)


@pytest.mark.parametrize("name", ["wmt14_translate/de-en", "wmt_t2t_translate/de-en"])
def test_tfds_translation_datasets_read_their_language_pair(name, tmp_path):
    with tfds.testing.mock_data(num_examples=12):
        sources, targets, keys = read_tfds_pairs(name, "train", download=True)
        valid_sources, _, _ = read_tfds_pairs(name, "validation", download=True, limit=5)
    assert keys == ("de", "en") and len(sources) == len(targets) == 12
    assert len(valid_sources) == 5 and all(isinstance(text, str) for text in sources)
    tokenizer = load_or_train_tokenizer(str(tmp_path), sources + targets, 60,
                                        say=lambda line: None)
    source = SubwordPairsSource(sources, targets, tokenizer, 64, 64, name=name)
    assert source.num_examples + source.dropped == 12
    assert source.vocabulary.decode(source.source_ids[0]) == " ".join(sources[0].split())


def test_a_multi_worker_run_of_real_data_needs_a_model_dir_every_worker_sees(monkeypatch):
    monkeypatch.setenv("TF_CONFIG", json.dumps({
        "cluster": {"worker": ["localhost:1", "localhost:2"]},
        "task": {"type": "worker", "index": 1}}))
    config = parse_config(["--dataset", "text:a.de,a.en"], translation.RECIPE.all_options(),
                          prog="t")
    with pytest.raises(ConfigError, match="in a multi-worker run needs --model-dir"):
        translation.tokenizer_directory(config, print)
