"""The translation recipe: one short run as a user runs it (BLEU far above copying the
source, the examples, the run record), its refusal of --model-parallel, --print-config."""

import glob
import os
import re

import pytest
import yaml

from helpers.recipe_util import run_recipe
from tfdist.__main__ import main as tfdist_command
from tfdist.recipes import translation

# 128 steps of 64 pairs, greedy decoding of 128 validation sentences.
SHORT = ["--epochs", "1", "--num-examples", "8192", "--validation-sentences", "128",
         "--beam-size", "1", "--verbose", "2"]


@pytest.mark.slow
def test_a_short_run_translates_far_better_than_copying_and_records_bleu(tmp_path):
    model_dir = str(tmp_path / "run")
    result = run_recipe("translation", [*SHORT, "--model-dir", model_dir], timeout=600)
    out = result.stdout
    assert result.returncode == 0, out[-4000:]
    match = re.search(r"epoch 1: BLEU ([0-9.]+), chrF ([0-9.]+) on 128 validation sentences "
                      r"\(greedy; copying the source: BLEU ([0-9.]+), chrF ([0-9.]+)\)", out)
    assert match, out[-4000:]
    bleu, chrf, copy_bleu, copy_chrf = map(float, match.groups())
    # Measured: BLEU 37.3, chrF 54.4; copying the source: BLEU 0.1, chrF 11.5 (111 s on
    # 2 cores shared with another test run).
    assert bleu > 20 and bleu > copy_bleu + 15, out[-4000:]
    assert chrf > copy_chrf + 15, out[-4000:]
    examples = out.split("Example translations (3 of the validation sentences):\n")[1]
    lines = examples.splitlines()[:9]
    assert [line.split()[0] for line in lines] == ["source", "output", "reference"] * 3
    assert re.search(r"^  val_bleu\s+[0-9.]+  \(chance: [0-9.]+\)$", out, re.MULTILINE), out
    (entry,) = glob.glob(os.path.join(model_dir, "runs", "*.yaml"))
    with open(entry) as stream:
        record = yaml.safe_load(stream)
    assert record["results"]["val_bleu"] == pytest.approx(bleu, abs=0.06)
    assert record["results"]["val_chrf"] == pytest.approx(chrf, abs=0.06)
    assert record["outcome"] == "finished"
    with open(os.path.join(model_dir, "training_log.csv")) as stream:
        assert "val_bleu" in stream.readline()


def test_model_parallel_is_refused_with_the_reason(capsys):
    assert translation.main(["--model-parallel", "2"]) == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1
    assert error[0].startswith("python -m tfdist.recipes.translation: error: --model-parallel 2 ")
    assert "cross-attention" in error[0] and "--strategy mirrored" in error[0]
    assert tfdist_command(["translation", "--model-parallel", "2"]) == 2  # `tfdist translation`
    assert "cross-attention" in capsys.readouterr().err


def test_other_datasets_are_refused_by_name(capsys):
    assert translation.main(["--dataset", "tfds:wmt14_translate/de-en"]) == 2
    assert "--dataset tfds:wmt14_translate/de-en" in capsys.readouterr().err


def test_print_config_shows_the_translation_defaults(capsys):
    assert translation.main(["--print-config", "--beam-size", "2"]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    options = printed["options"]
    assert options["model_size"] == "tiny"
    assert options["schedule"] == "inverse_sqrt"
    assert options["label_smoothing"] == 0.1
    assert options["beam_size"] == 2 and options["length_penalty"] == 0.6
    assert options["dataset"] == "embedded"
    assert printed["resolved"]["xla"] is False


def test_label_smoothing_of_one_is_refused_before_tensorflow(capsys):
    assert translation.main(["--label-smoothing", "1"]) == 2
    assert "--label-smoothing 1 leaves nothing" in capsys.readouterr().err


def test_corpus_scores_and_the_copy_baseline():
    from tfdist.data import TranslationTaskSource
    from tfdist.recipes.translation_quality import copy_baseline_scores, corpus_scores

    pairs = TranslationTaskSource(64, split="validation").pairs
    perfect = corpus_scores(list(pairs.target_words), list(pairs.target_words))
    assert perfect == {"bleu": pytest.approx(100.0), "chrf": pytest.approx(100.0)}
    copying = copy_baseline_scores(TranslationTaskSource(64, split="validation"))
    assert copying["bleu"] < 5 and copying["chrf"] < 20
    with pytest.raises(ValueError, match="Got 1 hypotheses for 2 references"):
        corpus_scores([["a"]], [["a"], ["b"]])


def test_batched_decoding_equals_one_batch_and_examples_are_printed():
    import keras

    from tfdist.data import TranslationTaskSource
    from tfdist.models import build_seq2seq, seq2seq_config
    from tfdist.recipes.translation_quality import decode_sentences, example_lines

    source = TranslationTaskSource(5, split="validation", max_source_words=8)
    keras.utils.set_random_seed(0)
    model = build_seq2seq(seq2seq_config("tiny", source.vocab_size, source.vocab_size,
                                         source.source_length, source.target_length + 1))
    length = source.target_length + 1
    for beam_size in (1, 2):
        whole = decode_sentences(model, source.source_ids, length, beam_size, batch_size=5)
        batched = decode_sentences(model, source.source_ids, length, beam_size, batch_size=2)
        assert whole.shape == (5, length)
        assert batched.tolist() == whole.tolist()
    text = example_lines(source.pairs.source_words, [["x"]] * 5, source.pairs.target_words, 2)
    assert text.splitlines()[1] == "  output     x"
    assert text.splitlines()[2] == "  reference  " + " ".join(source.pairs.target_words[0])
    assert len(text.splitlines()) == 6
