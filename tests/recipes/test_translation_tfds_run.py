"""The translation recipe on a TFDS translation dataset (tfds.testing.mock_data, in-process:
mock_data patches this process; 35 s on 2 cores), then `tfdist translate` on the run: the tokenizer and the
model come from the run directory alone."""

import os
import re

import pytest
import tensorflow_datasets as tfds

from tfdist.recipes import translate, translation

OUTPUT_PREFIX = "  output     "


@pytest.mark.slow
def test_a_tfds_run_saves_its_tokenizer_and_translate_gives_its_printed_examples(tmp_path,
                                                                                   capsys):
    model_dir = str(tmp_path / "run")
    argv = ["--dataset", "tfds:wmt14_translate/de-en", "--download", "true", "--model-dir",
            model_dir, "--subword-vocab-size", "64", "--max-tokens", "24",
            "--validation-sentences", "16", "--bleu-sentences", "4", "--global-batch-size", "16",
            "--epochs", "1", "--warmup-steps", "1", "--beam-size", "1", "--verbose", "2"]
    with tfds.testing.mock_data(num_examples=32):
        assert translation.main(argv) == 0
    out = capsys.readouterr().out
    tokenizer_file = os.path.join(model_dir, "tokenizer", "subword.model")
    assert f"Training a unigram subword tokenizer (64 pieces at most) on 64 training " \
           f"sentences into {tokenizer_file}" in out, out[-3000:]
    assert re.search(r"dataset\s+SubwordPairsSource\(wmt14_translate/de-en\[train\]", out), out
    assert re.search(r"epoch 1: BLEU [0-9.]+, chrF [0-9.]+ on 4 validation sentences", out), out
    examples = out.split("Example translations (3 of the validation sentences):\n")[1]
    lines = examples.splitlines()[:9]
    sources = [line.split(None, 1)[1] for line in lines[0::3]]
    outputs = [line[len(OUTPUT_PREFIX):] for line in lines[1::3]]
    assert all(line.startswith(OUTPUT_PREFIX.rstrip()) for line in lines[1::3]), lines

    # Restored from the run directory alone: the saved tokenizer encodes the sources and
    # detokenises the greedy outputs, which are the ones the run printed.
    assert translate.main(["--model-dir", model_dir, *sources]) == 0
    assert capsys.readouterr().out.splitlines() == outputs
    assert translate.main(["--model-dir", model_dir, "a " * 30]) == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and "its --max-tokens" in error[0], error
    os.remove(tokenizer_file)
    assert translate.main(["--model-dir", model_dir, sources[0]]) == 2
    assert f"names the subword tokenizer {tokenizer_file}, which is missing" in \
        capsys.readouterr().err
