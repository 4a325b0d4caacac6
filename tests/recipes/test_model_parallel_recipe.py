"""`--model-parallel` in the recipes, and `tfdist bench model-parallel`, as a user runs them."""

import json
import os
import subprocess
import sys

import pytest

from helpers.recipe_util import REPO_ROOT, run_recipe
from tfdist.bench.pipeline_bench import COLUMNS, gpipe_bubble, stage_activity
from tfdist.recipes import transformer
from tfdist.recipes.config import ConfigError, parse_config
from tfdist.recipes.preflight import check_before_tensorflow

SHORT = ["--epochs", "1", "--steps-per-epoch", "3", "--validation-steps", "1",
         "--warmup-steps", "0", "--global-batch-size", "16", "--verbose", "2"]


def test_transformer_recipe_splits_the_model_prints_the_plan_and_trains():
    result = run_recipe("transformer", ["--model-parallel", "2", *SHORT], timeout=240)
    assert result.returncode == 0, result.stdout[-4000:]
    out = result.stdout
    expected = ["one_device: 1 replica(s) on 1 worker(s)",
                "pipeline      2 stages, 4 micro-batches per step (GPipe)",
                "2 stages of 'decoder_lm' (repeated blocks; boundaries: block_1)",
                "stage 0  /job:localhost/replica:0/task:0/device:CPU:0  embedding .. block_0",
                "stage 1  /job:localhost/replica:0/task:0/device:CPU:1  block_1 .. logits",
                "Throughput:", "val_loss"]
    missing = [text for text in expected if text not in out]
    assert not missing, f"missing {missing} in:\n{out[-4000:]}"


@pytest.mark.parametrize("flags,words", [
    (["--model-parallel", "2", "--strategy", "mirrored"],
     ["--strategy mirrored runs one replica per device", "--strategy auto"]),
    (["--model-parallel", "2", "--devices", "2"], ["--devices 2", "tfdist.launch --workers"]),
    (["--model-parallel", "2", "--xla", "on"], ["--xla on", "--xla off or auto"]),
    (["--model-parallel", "2", "--grad-accum-steps", "2"], ["--grad-accum-steps 2"]),
    (["--model-parallel", "2", "--strategy", "parameter_server"], ["parameter_server"]),
    (["--micro-batches", "4"], ["--micro-batches 4", "--model-parallel K"]),
])
def test_flags_the_pipeline_cannot_honour_are_refused_before_tensorflow(flags, words):
    config = parse_config(flags, transformer.RECIPE.all_options(), prog="transformer")
    with pytest.raises(ConfigError) as raised:
        check_before_tensorflow(transformer.RECIPE, config)
    for word in words:
        assert word in str(raised.value), str(raised.value)


def test_refusal_is_one_line_and_exit_2():
    result = run_recipe("transformer", ["--model-parallel", "2", "--strategy", "mirrored"],
                        timeout=120)
    assert result.returncode == 2
    assert "one replica per device" in result.stdout and "Traceback" not in result.stdout


def test_stage_activity_measures_busy_time_overlap_and_bubble():
    lines = {"tf_Compute/1": [("while/stage_0/forward_0/MatMul", 0, 4),
                              ("while/stage_0/forward_1/MatMul", 4, 4)],
             "tf_Compute/2": [("gradient_tape/stage_1/forward_0/MatMul", 4, 4),
                              ("unrelated/MatMul", 0, 20)]}
    activity = stage_activity(lines, 2)
    assert activity["busy"] == [8, 4] and activity["span"] == 8
    assert activity["overlap"] == 4
    assert activity["bubble"] == pytest.approx(1 - 12 / 16)
    assert gpipe_bubble(2, 4) == pytest.approx(0.2) and gpipe_bubble(1, 1) == 0


def test_bench_subcommand_runs_quick_and_prints_the_columns(tmp_path):
    out = tmp_path / "mp.json"
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=REPO_ROOT)
    result = subprocess.run(
        [sys.executable, "-m", "tfdist", "bench", "model-parallel", "--quick",
         "--json-out", str(out)], cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-4000:]
    header = next(line for line in result.stdout.splitlines() if line.startswith("setting"))
    for column in COLUMNS:
        assert column in header, column
    for label in ("one device", "2 stages, no pipelining", "2 stages, pipelined"):
        assert label in result.stdout
    report = json.loads(out.read_text())
    rows = {row["setting"]: row for row in report["rows"]}
    assert [row["K"] for row in report["rows"]] == [1, 2, 2]
    pipelined = rows["2 stages, pipelined"]
    assert pipelined["bubble GPipe"] == pytest.approx(0.2)
    assert 0 <= pipelined["bubble measured"] < 1 and pipelined["overlap"] > 0
    assert all(row["examples/s"] > 0 for row in report["rows"])
