"""The example app examples/keras_fit_callbacks.py: tfdist's callbacks in a
plain Keras `model.fit`, run as a user would run it (a subprocess), twice: the
second run resumes from the first one's backup. Its generated data are checked
in-process: training and validation must be one task (one labelling rule)."""

import csv
import importlib.util
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from tfdist.callbacks.backup import latest_backup, list_backups

from helpers.paths import REPO_ROOT  # noqa: E402
APP = os.path.join(REPO_ROOT, "examples", "keras_fit_callbacks.py")
STEPS = 2048 // 64  # the app's default examples // batch size


def run_app(*args, timeout=150):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1")
    env.pop("TF_CONFIG", None)
    return subprocess.run([sys.executable, APP, *args], cwd=REPO_ROOT, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=timeout)


def read_csv(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def app():
    """The example app imported as a module (its `main` is not run)."""
    spec = importlib.util.spec_from_file_location("keras_fit_callbacks_app", APP)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("app")
    common = ["--out", str(out), "--strategy", "mirrored", "--devices", "2"]
    first = run_app(*common, "--epochs", "2")
    assert first.returncode == 0, first.stdout[-5000:]
    first_rows = read_csv(out / "logs" / "training_log.csv")
    first_summary = json.loads((out / "summary.json").read_text())
    first_backup = latest_backup(out / "backup")
    second = run_app(*common, "--epochs", "3")
    assert second.returncode == 0, second.stdout[-5000:]
    return {"out": out, "first": first, "first_rows": first_rows,
            "first_summary": first_summary, "first_backup": first_backup, "second": second}


def test_first_run_logs_learning_rate_throughput_and_memory_to_the_csv(runs):
    rows = runs["first_rows"]
    assert [row["epoch"] for row in rows] == ["0", "1"]
    for row in rows:
        for column in ("loss", "accuracy", "val_loss", "learning_rate", "examples_per_sec",
                       "step_time_ms", "host_rss_mb"):
            assert float(row[column]) >= 0, (column, row)
        assert float(row["examples_per_sec"]) > 0
    # Warmup then cosine decay to 0 at the last step of epoch 2.
    assert 0 < float(rows[0]["learning_rate"]) < 0.05
    assert float(rows[1]["learning_rate"]) == pytest.approx(0.0, abs=1e-6)
    assert float(rows[1]["loss"]) < float(rows[0]["loss"])
    summary = runs["first_summary"]
    assert (summary["strategy"], summary["num_replicas"], summary["epochs_run"]) == (
        "mirrored", 2, 2)
    assert summary["throughput"]["examples_per_sec"] > 0
    assert summary["resumed_from"] is None
    assert "Throughput:" in runs["first"].stdout


def test_first_run_wrote_step_and_epoch_backups_keeping_two(runs):
    info = runs["first_backup"]
    assert (info.epoch, info.step, info.global_step, info.iterations) == (2, 0, 2 * STEPS,
                                                                         2 * STEPS)
    # Backups every 10 steps and at each epoch end: 10, 20, 30, 32, 40, 50, 60, 64 -> 8.
    assert info.number == 8
    assert runs["first_summary"]["last_backup"] == info.path


def test_second_run_resumes_at_the_epoch_the_first_one_reached(runs):
    second = runs["second"]
    assert "resuming from" in second.stdout and "at epoch 2 step 0" in second.stdout
    summary = json.loads((runs["out"] / "summary.json").read_text())
    assert summary["resumed_from"] == {"epoch": 2, "step": 0, "global_step": 2 * STEPS}
    assert summary["epochs_run"] == 1
    rows = read_csv(runs["out"] / "logs" / "training_log.csv")
    assert [row["epoch"] for row in rows] == ["0", "1", "2"]  # appended to the first run's
    assert rows[:2] == runs["first_rows"]
    backups = list_backups(runs["out"] / "backup")
    assert len(backups) == 2
    assert latest_backup(runs["out"] / "backup").global_step == 3 * STEPS


def test_training_and_validation_data_are_labelled_by_one_rule(app):
    x, y = app.generated_data(2048, seed=app.TRAINING_SEED)
    x_val, y_val = app.generated_data(512, seed=app.VALIDATION_SEED)
    assert app.TRAINING_SEED != app.VALIDATION_SEED
    assert x.shape == (2048, app.FEATURES) and x_val.shape == (512, app.FEATURES)
    assert not np.allclose(x[:512], x_val)  # held-out features...
    weights = app.labelling_matrix()
    assert weights.shape == (app.FEATURES, app.CLASSES)
    np.testing.assert_array_equal(weights, app.labelling_matrix())  # fixed
    # ... labelled by the same map as the training features.
    np.testing.assert_array_equal(y, np.argmax(x @ weights, axis=1))
    np.testing.assert_array_equal(y_val, np.argmax(x_val @ weights, axis=1))
    assert set(np.unique(y_val)) == set(range(app.CLASSES))
    # Without looking at the map: a linear rule fitted to the training set alone
    # (least squares on one-hot labels) labels the validation set well. With a
    # labelling map per seed it scored ~0.29, chance for 4 unbalanced classes.
    fitted, *_ = np.linalg.lstsq(x, np.eye(app.CLASSES)[y], rcond=None)
    assert np.mean(np.argmax(x_val @ fitted, axis=1) == y_val) >= 0.85  # 0.94 measured


def test_validation_accuracy_rises_far_above_chance(runs):
    # Four classes: chance is 0.25 (the largest class is ~0.3 of the examples).
    # Measured on 2 CPUs: val_accuracy ~0.85-0.90 after epoch 1, ~0.93-0.94 after 3.
    rows = read_csv(runs["out"] / "logs" / "training_log.csv")
    val_accuracy = [float(row["val_accuracy"]) for row in rows]
    assert len(val_accuracy) == 3
    assert val_accuracy[-1] >= 0.8, val_accuracy
    assert val_accuracy[-1] > val_accuracy[0], val_accuracy
    summary = json.loads((runs["out"] / "summary.json").read_text())
    assert summary["final_logs"]["val_accuracy"] == pytest.approx(val_accuracy[-1])
