"""`tfdist bench` end to end: quick runs write the table, JSON and PNG, and the
figures in them are consistent with each other."""

import json
import os
import subprocess
import sys

import pytest

from mw import REPO_ROOT

pytestmark = pytest.mark.slow


def _run(args, timeout=300):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1")
    env.pop("TF_CONFIG", None)
    env["PYTHONPATH"] = os.pathsep.join(p for p in [REPO_ROOT, env.get("PYTHONPATH", "")] if p)
    return subprocess.run([sys.executable, "-m", "tfdist.bench"] + args, cwd=REPO_ROOT, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=timeout)


def test_quick_report_writes_table_json_and_plot(tmp_path):
    out = tmp_path / "bench"
    # One single-process point and one two-worker point through the launcher.
    result = _run(["--quick", "--models", "transformer", "--max-replicas", "1",
                   "--max-workers", "2", "--compare", "engine", "--out", str(out)])
    assert result.returncode == 0, result.stdout[-3000:]

    data = json.loads((out / "results.json").read_text())
    rows = data["scaling"]["transformer"]["rows"]
    assert [(r["replicas"], r["workers"]) for r in rows] == [(1, 1), (2, 2)]
    assert all("error" not in r for r in rows), rows
    base, two = rows
    assert two["strategy"] == "multi_worker_mirrored" and two["global_batch_size"] == 16
    assert two["speedup"] == pytest.approx(two["examples_per_sec"] / base["examples_per_sec"])
    assert two["efficiency"] == pytest.approx(two["speedup"] / 2)
    peak = data["peaks"]["float32"]
    assert two["mfu"] == pytest.approx(two["model_flops_per_sec"] / peak)
    assert two["tokens_per_sec"] == pytest.approx(two["examples_per_sec"] * 32)
    assert 0.0 <= two["input_wait_share"] <= 1.0
    assert two["step_time_p50_ms"] <= two["step_time_p90_ms"] <= two["step_time_p99_ms"]

    settings = data["settings"]["transformer"]
    (engine,) = settings["comparisons"]
    ours = settings["contenders"][engine["numerator"]]
    theirs = settings["contenders"][engine["denominator"]]
    assert (ours["engine"], theirs["engine"]) == ("tfdist", "keras")
    assert engine["ratio"] == pytest.approx(ours["round_examples_per_sec"][0]
                                            / theirs["round_examples_per_sec"][0])
    check = settings["input_pipeline"]
    assert check["headroom"] == pytest.approx(check["pipeline_examples_per_sec"]
                                              / check["training_examples_per_sec"])

    table = (out / "report.md").read_text()
    assert "| Replicas | Workers | Precision | XLA |" in table
    assert "CPU figures" in table
    assert "tfdist / keras fit" in table
    png = (out / "scaling.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000


def test_quick_engine_comparison_prints_ratios_and_writes_json(tmp_path):
    path = tmp_path / "engine.json"
    result = _run(["engine", "--quick", "--same-xla", "off", "--json-out", str(path)])
    assert result.returncode == 0, result.stdout[-3000:]
    assert "same settings (float32, XLA off, strategy default): tfdist / keras fit:" in result.stdout
    assert "defaults vs defaults: tfdist / keras fit:" in result.stdout
    report = json.loads(path.read_text())
    labels = [c["label"] for c in report["comparisons"]]
    assert labels[-1] == "defaults vs defaults: tfdist / keras fit"
    defaults = report["comparisons"][-1]
    # Keras's defaults resolve to the same run as the float32, XLA off pair on a
    # CPU-only machine (compile's jit_compile="auto" is off there): measured once.
    assert defaults["denominator"] == "keras fp32 xla-off"
    ours = report["contenders"][defaults["numerator"]]
    assert ours["strategy"] == "one_device" and ours["xla"] is True
    for name, figures in report["contenders"].items():
        assert figures["mfu"] == pytest.approx(
            figures["model_flops_per_sec"] / report["peaks"][figures["precision"]])


@pytest.mark.parametrize("args, message", [
    (["--models", "rnn"], "'rnn' not allowed"),
    (["--sizes", "transformer=huge"], "Unknown transformer size 'huge'"),
    (["--scaling", "strong", "--batch", "15", "--max-replicas", "2"],
     "global batch 15 does not split evenly over 2 replicas"),
])
def test_bad_arguments_fail_fast_with_the_bad_value(args, message):
    result = _run(args + ["--out", "/nonexistent/never-written"], timeout=120)
    assert result.returncode == 2
    assert message in result.stdout
