"""The Transformer recipe end to end, in fresh processes, as a user runs it."""

import json

import pytest

from mw import launch
from recipe_util import final_metric, run_recipe

SHORT = ["--epochs", "2", "--steps-per-epoch", "40", "--validation-steps", "4", "--verbose", "2"]


@pytest.mark.slow
def test_mirrored_on_two_logical_devices_learns():
    result = run_recipe("transformer", ["--strategy", "mirrored", "--devices", "2", *SHORT])
    assert result.returncode == 0, result.stdout[-4000:]
    out = result.stdout
    assert "mirrored: 2 replica(s) on 1 worker(s)" in out
    assert "global 64, per replica 32" in out
    assert "Throughput:" in out and "tokens/s" in out
    first, last = final_metric(out, "loss")
    assert last < 0.8 * first


@pytest.mark.slow
@pytest.mark.multiworker
def test_two_workers_through_the_launcher_learn():
    result = launch(["-m", "tfdist.recipes.transformer", "--strategy", "multi_worker_mirrored",
                     *SHORT], workers=2, timeout=420)
    assert result.returncode == 0, result.stdout[-4000:]
    assert "multi_worker_mirrored: 2 replica(s) on 2 worker(s)" in result.stdout
    # The chief alone prints the report.
    assert "[worker 0] Throughput:" in result.stdout
    assert "[worker 1] Throughput:" not in result.stdout
    first, last = final_metric(result.stdout, "loss")
    assert last < 0.8 * first


def test_unknown_strategy_exits_2_naming_it_and_the_valid_ones():
    result = run_recipe("transformer", ["--strategy", "bogus"], timeout=120)
    assert result.returncode == 2
    assert "'bogus'" in result.stdout and "mirrored" in result.stdout
    assert "Traceback" not in result.stdout


@pytest.mark.parametrize("tf_config, fragment", [
    ("{not json", "JSON"),
    (json.dumps({"task": {"type": "worker", "index": 0}}), "cluster"),
    (json.dumps({"cluster": {"worker": ["localhost:1", "localhost:2"]},
                 "task": {"type": "worker", "index": 5}}), "index"),
])
def test_malformed_tf_config_exits_2_naming_the_problem(tf_config, fragment):
    result = run_recipe("transformer", ["--strategy", "multi_worker_mirrored"], timeout=120,
                        env={"TF_CONFIG": tf_config})
    assert result.returncode == 2, result.stdout[-2000:]
    assert "TF_CONFIG" in result.stdout and fragment in result.stdout
    assert "Traceback" not in result.stdout


def test_bad_flag_value_exits_2_before_tensorflow_starts():
    result = run_recipe("transformer", ["--global-batch-size", "-4"], timeout=60)
    assert result.returncode == 2
    assert "global_batch_size must be >= 1, got -4" in result.stdout


def test_indivisible_global_batch_is_a_clear_error():
    result = run_recipe("transformer", ["--strategy", "mirrored", "--devices", "2",
                                        "--global-batch-size", "63"], timeout=120)
    assert result.returncode == 2
    assert "63" in result.stdout and "2 replicas" in result.stdout


def test_help_documents_every_flag():
    result = run_recipe("transformer", ["--help"], timeout=60)
    assert result.returncode == 0
    for flag in ("--strategy", "--devices", "--global-batch-size", "--epochs", "--steps-per-epoch",
                 "--precision", "--xla", "--optimizer", "--learning-rate", "--warmup-steps",
                 "--dataset", "--model-dir", "--config", "--grad-accum-steps", "--clip-norm"):
        assert flag in result.stdout
