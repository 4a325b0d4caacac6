"""The translation recipe: one short run as a user runs it (BLEU far above copying the
source, the examples, the run record), the same run SIGKILLed mid-epoch and rerun (the
uninterrupted run's final weights, to the bit), decoding split over replicas, its
refusal of --model-parallel, --print-config."""

import glob
import io
import os
import re
import signal
import subprocess
import sys

import pytest
import yaml

from helpers.compare import assert_same_final_checkpoint
from helpers.processes import finish, newest_backup, wait_for_backup
from helpers.recipe_util import run_recipe, start_recipe
from tfdist.__main__ import main as tfdist_command
from tfdist.recipes import translate, translation
from tfdist.recipes.config import PACKAGED_CONFIGS, parse_config

# The shipped default run (translation_tiny), shortened: one epoch of 96 steps of 64 pairs
# of sentences of at most 6 source words (the task's easy end), greedy decoding of 64
# validation sentences.
SHORT = ["--config", os.path.join(PACKAGED_CONFIGS, "translation_tiny.yaml"), "--epochs", "1",
         "--num-examples", "6144", "--max-source-words", "6", "--warmup-steps", "20",
         "--validation-sentences", "64", "--beam-size", "1", "--verbose", "2"]
BACKUPS = ["--backup-every", "20"]


@pytest.fixture(scope="module")
def short_run(tmp_path_factory):
    """`(model dir, output)` of the one uninterrupted subprocess run of the recipe (also
    the few-step run of the shipped translation_tiny config, see
    test_shipped_configs.RUN_ELSEWHERE), backing up every 20 steps as the killed run does."""
    model_dir = tmp_path_factory.mktemp("translation") / "run"
    result = run_recipe("translation", [*SHORT, *BACKUPS, "--model-dir", str(model_dir)],
                        timeout=600)
    return model_dir, result


@pytest.mark.slow
def test_a_short_run_translates_far_better_than_copying_and_records_bleu(short_run, capsys,
                                                                          monkeypatch):
    # Then `tfdist translate` on the run, in-process.
    model_dir, result = short_run
    model_dir = str(model_dir)
    out = result.stdout
    assert result.returncode == 0, out[-4000:]
    assert "translation_tiny.yaml" in out, out[-4000:]
    match = re.search(r"epoch 1: BLEU ([0-9.]+), chrF ([0-9.]+) on 64 validation sentences "
                      r"\(greedy; copying the source: BLEU ([0-9.]+), chrF ([0-9.]+)\)", out)
    assert match, out[-4000:]
    bleu, chrf, copy_bleu, copy_chrf = map(float, match.groups())
    # Measured: BLEU 29.4, chrF 47.8; copying the source: BLEU 0.3, chrF 10.4 (75 s on
    # 2 cores shared with two other test runs).
    assert bleu > 15 and bleu > copy_bleu + 10, out[-4000:]
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

    # `tfdist translate` restores the model and vocabulary from the run directory alone
    # and gives the printed examples (greedy, the run's --beam-size 1).
    sources = [line.split(None, 1)[1] for line in lines[0::3]]
    outputs = [line.split(None, 1)[1] if len(line.split()) > 1 else "" for line in lines[1::3]]
    capsys.readouterr()
    assert tfdist_command(["translate", "--model-dir", model_dir, *sources]) == 0
    assert capsys.readouterr().out.splitlines() == outputs
    monkeypatch.setattr("sys.stdin", io.StringIO(sources[0] + "\n\n"))
    assert translate.main(["--model-dir", model_dir]) == 0
    assert capsys.readouterr().out.splitlines() == outputs[:1]
    assert translate.main(["--model-dir", model_dir, "the dog zzyzx"]) == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and "['zzyzx'] are not source words" in error[0], error


@pytest.mark.slow
def test_a_run_killed_mid_epoch_resumes_to_the_uninterrupted_runs_weights(short_run, tmp_path):
    reference_dir, reference = short_run
    assert reference.returncode == 0, reference.stdout[-4000:]
    model_dir = tmp_path / "killed"
    args = [*SHORT, *BACKUPS, "--model-dir", str(model_dir)]
    process = start_recipe("translation", args)
    wait_for_backup(process, model_dir, after=1)  # step 40 of the 96-step epoch
    process.kill()
    code, _ = finish(process, timeout=60)
    assert code == -signal.SIGKILL and newest_backup(model_dir) < 5  # not at the epoch end
    result = run_recipe("translation", args, timeout=600)
    assert result.returncode == 0, result.stdout[-4000:]
    resumed = re.search(r"resuming from \S+ at epoch 0 step (\d+) ", result.stdout)
    assert resumed and 40 <= int(resumed.group(1)) < 96, result.stdout[-4000:]
    assert_same_final_checkpoint(reference_dir, model_dir)


def test_translate_refuses_a_directory_that_is_not_a_translation_run(tmp_path, capsys):
    (tmp_path / "config.yaml").write_text("options: {}\n")
    assert translate.main(["--model-dir", str(tmp_path), "the dog sleeps"]) == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1, error
    assert error[0].startswith(f"tfdist translate: error: {tmp_path} is not a translation run: "
                               "it has no translation.json")


@pytest.mark.parametrize("content, says", [
    ("{half a fi", "cannot be read (Expecting property name enclosed in double quotes"),
    ("[1, 2]", "is not a translation setup of format 1."),
    ('{"format": 1, "recipe": "translation", "model_size": "tiny"}',
     "lacks dropout, tie_embeddings, vocab_size, source_length, target_length, beam_size, "
     "length_penalty, tokenizer, vocabulary: it is damaged"),
], ids=["not-json", "a-list", "keys-missing"])
def test_translate_names_a_damaged_setup_file_in_one_line(tmp_path, capsys, content, says):
    """They were tracebacks (JSONDecodeError, AttributeError, KeyError)."""
    (tmp_path / "translation.json").write_text(content)
    assert translate.main(["--model-dir", str(tmp_path), "the dog sleeps"]) == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1, error
    assert error[0].startswith(f"tfdist translate: error: {tmp_path / 'translation.json'} {says}"), error


def test_translate_names_a_file_given_as_the_run_and_a_bad_length_penalty(tmp_path, capsys):
    notes = tmp_path / "notes.txt"
    notes.write_text("mine")
    assert translate.main(["--model-dir", str(notes), "the dog sleeps"]) == 2
    assert capsys.readouterr().err.strip() == (
        f"tfdist translate: error: {notes} is a file, not a folder: give the --model-dir of a "
        "translation run (`tfdist translation --model-dir DIR` trains one).")
    for value in ("nan", "-1", "inf"):
        with pytest.raises(SystemExit) as stop:
            translate.main(["--model-dir", str(tmp_path), "--length-penalty", value, "x"])
        assert stop.value.code == 2
        assert f"--length-penalty {float(value)}: use a number >= 0" in capsys.readouterr().err


@pytest.mark.parametrize("name, make", [("tokenizer", "file"), ("translation.json", "folder")])
def test_a_model_dir_entry_of_the_translation_run_in_the_way_is_refused(tmp_path, capsys, name,
                                                                       make):
    """Its subword tokenizer folder and its setup file, besides every recipe's entries."""
    from tfdist.data.subword import TOKENIZER_DIR

    assert translation.TOKENIZER_FOLDER == TOKENIZER_DIR
    if make == "file":
        (tmp_path / name).write_text("mine")
    else:
        (tmp_path / name).mkdir()
    assert translation.main(["--model-dir", str(tmp_path), "--epochs", "1"]) == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1, error
    assert f"{tmp_path / name} is a {make}, but the run " in error[0], error


def test_translate_names_a_missing_directory_before_tensorflow_starts(tmp_path):
    missing = tmp_path / "no_such_run"
    script = ("import sys\nfrom tfdist.recipes import translate\n"
              f"code = translate.main(['--model-dir', {str(missing)!r}])\n"
              "print('exit', code, 'tensorflow imported:', 'tensorflow' in sys.modules)\n")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            timeout=60, stdin=subprocess.DEVNULL)
    assert result.stdout.strip() == "exit 2 tensorflow imported: False", result.stderr[-2000:]
    assert result.stderr.strip() == (f"tfdist translate: error: {missing} does not exist: give "
                                     "the --model-dir of a translation run (`tfdist translation "
                                     "--model-dir DIR` trains one).")


def test_the_shipped_base_config_builds_the_papers_model_and_takes_a_training_step():
    """translation_base as shipped, in-process (a subprocess run of its 44 M-parameter
    model spends over a minute tracing and writing checkpoints on 2 CPU cores): its
    model, loss and optimizer from the recipe's own builders, one eager training step
    (the second of the schedule) with its dropout on 2 short sentence pairs."""
    import keras
    import numpy as np

    from tfdist.recipes.recipe_optimizer import build_recipe_optimizer

    config = parse_config(["--config", os.path.join(PACKAGED_CONFIGS, "translation_base.yaml"),
                           "--num-examples", "2", "--validation-sentences", "2",
                           "--global-batch-size", "2", "--max-source-words", "4"],
                          translation.RECIPE.all_options(), prog="translation")
    translation.check_config(config)
    assert (config.model_size, config.dropout, config.warmup_steps) == ("base", 0.1, 4000)
    data = translation.build_data(config)
    keras.utils.set_random_seed(0)
    built = translation.build_model(config, data)
    assert built.description.startswith("encoder-decoder 'base': 6+6 layers, d=512, 8 heads, ")
    assert "tied embeddings, label smoothing 0.1" in built.description
    optimizer = build_recipe_optimizer(config, 100_000, built)
    assert isinstance(optimizer, keras.optimizers.Adam)  # the paper's betas and epsilon
    assert (optimizer.beta_1, optimizer.beta_2, optimizer.epsilon) == (0.9, 0.98, 1e-9)
    built.model.compile(optimizer=optimizer, loss=built.loss, metrics=built.metrics,
                        run_eagerly=True)
    (source, target_in), target_out = next(iter(data.train.read_all().batch(2)))
    before = [v.numpy() for v in built.model.trainable_variables]
    optimizer.iterations.assign(1)  # the inverse-sqrt warmup's rate is 0 at step 0
    logs = built.model.train_on_batch((source, target_in), target_out, return_dict=True)
    assert np.isfinite(logs["loss"]) and logs["loss"] > 1.0
    changed = [not np.array_equal(b, a.numpy())
               for b, a in zip(before, built.model.trainable_variables, strict=True)]
    assert sum(changed) > 0.9 * len(changed), changed


def test_model_parallel_is_refused_with_the_reason(capsys):
    assert translation.main(["--model-parallel", "2"]) == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1
    assert error[0].startswith("python -m tfdist.recipes.translation: error: --model-parallel 2 ")
    assert "cross-attention" in error[0] and "--strategy mirrored" in error[0]
    assert tfdist_command(["translation", "--model-parallel", "2"]) == 2  # `tfdist translation`
    assert "cross-attention" in capsys.readouterr().err


def test_other_datasets_are_refused_by_name(capsys):
    assert translation.main(["--dataset", "tfrecord:/data/*.tfrecord"]) == 2
    assert "--dataset: Dataset 'tfrecord:/data/*.tfrecord'" in capsys.readouterr().err


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


def test_fewer_validation_sentences_than_a_global_batch_are_refused(capsys):
    # The validation batches drop their remainder: no batch would run, val_loss would read 0.
    assert translation.main(["--validation-sentences", "40"]) == 2
    (error,) = capsys.readouterr().err.strip().splitlines()
    assert "--validation-sentences 40 is fewer than one global batch (--global-batch-size 64)" \
        in error and "Use --validation-sentences 64 or more" in error


@pytest.mark.parametrize("flags, message", [
    (["--optimizer", "sgd", "--adam-beta2", "0.98"],
     "--adam-beta2 0.98: optimizer 'sgd' has no beta_2; use --optimizer adam or adamw or lamb "
     "or lion, or drop the flag."),
    (["--optimizer", "lion", "--adam-epsilon", "1e-9"],
     "--adam-epsilon 1e-09: optimizer 'lion' has no epsilon; use --optimizer adam or adamw or "
     "lamb, or drop the flag."),
    (["--adam-beta1", "1"], "--adam-beta1 1: a moment decay must be below 1 (e.g. 0.98)."),
])
def test_adam_moment_flags_an_optimizer_lacks_are_refused_before_tensorflow(flags, message,
                                                                            capsys):
    assert translation.main(flags) == 2
    (error,) = capsys.readouterr().err.strip().splitlines()
    assert error.endswith(message), error


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
    # Beam search (greedy decoding is batched the same way: the end-to-end run decodes
    # greedily).
    whole = decode_sentences(model, source.source_ids, length, beam_size=2, batch_size=5)
    batched = decode_sentences(model, source.source_ids, length, beam_size=2, batch_size=2)
    assert whole.shape == (5, length)
    assert batched.tolist() == whole.tolist()
    text = example_lines(source.pairs.source_words, [["x"]] * 5, source.pairs.target_words, 2)
    assert text.splitlines()[1] == "  output     x"
    assert text.splitlines()[2] == "  reference  " + " ".join(source.pairs.target_words[0])
    assert len(text.splitlines()) == 6


@pytest.mark.parametrize("beam_size", [1, 2], ids=["greedy", "beam"])
def test_decoding_split_over_two_replicas_equals_one_device(beam_size):
    from helpers.workers import seq2seq_common as s2s
    from helpers.workers import train_common
    from tfdist.data import TranslationTaskSource
    from tfdist.recipes.translation_quality import (corpus_scores, decode_sentences,
                                                    translation_callback_class)

    source = TranslationTaskSource(11, split="validation", max_source_words=8)
    strategy = train_common.mirrored(2)
    model = s2s.seq2seq_model(strategy, source)
    length = source.target_length + 1
    one_device = decode_sentences(model, source.source_ids, length, beam_size=beam_size)
    assert len({tuple(row) for row in one_device.tolist()}) > 1  # not one output for all
    # 3 sentences per replica: 6 a call, the second call padded with a filler.
    split = decode_sentences(model, source.source_ids, length, beam_size=beam_size,
                             batch_size=3, strategy=strategy)
    assert split.tolist() == one_device.tolist()

    # The recipe's callback decodes on both replicas and scores what one device decodes.
    lines, logs = [], {}
    quality = translation_callback_class()(model, source, beam_size=beam_size,
                                           print_fn=lines.append)
    quality.on_epoch_end(0, logs)
    assert quality.decoder.replicas == 2 and lines[0].endswith("on 2 replicas"), lines
    hypotheses = [source.vocabulary.decode(row) for row in one_device]
    expected = corpus_scores(hypotheses, list(source.pairs.target_words))
    assert (logs["val_bleu"], logs["val_chrf"]) == (expected["bleu"], expected["chrf"])


def test_bleu_sentences_sets_how_many_validation_sentences_are_decoded():
    options = translation.RECIPE.all_options()
    count = translation.bleu_sentence_count
    assert count(parse_config([], options, "translation")) == 256
    assert count(parse_config(["--bleu-sentences", "32"], options, "translation")) == 32
    assert count(parse_config(["--bleu-sentences", "999", "--validation-sentences", "8"],
                              options, "translation")) == 8
    off = parse_config(["--bleu-sentences", "0", "--validation-sentences", "8",
                        "--num-examples", "8"], options, "translation")
    assert translation.quality_callbacks(off, None, None, None) == []
    assert translation.build_data(off).chance == {}
