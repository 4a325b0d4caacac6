"""The Keras programs of tests/helpers/keras_programs.py, on 2 worker processes
(MultiWorkerMirroredStrategy through tfdist.launch), train exactly like
one-device Keras `fit`; evaluate and predict work after training.
"""

import json
import os

import numpy as np
import pytest
import tensorflow as tf

from helpers import keras_programs as programs
from helpers.mw import launch
from helpers.workers import train_common as common
from helpers.paths import WORKERS_DIR  # noqa: E402

pytestmark = pytest.mark.multiworker

WORKER = os.path.join(WORKERS_DIR, "keras_program_worker.py")


# TensorFlow's C++ start-up lines (the worker imports TensorFlow before tfdist).
STARTUP_LINES = ("All log messages before absl::InitializeLog()", "oneDNN custom operations",
                 "Could not find cuda drivers", "cpu_feature_guard", "failed call to cuInit",
                 "XLA service", "I0000", "E0000", "W0000")


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("keras_programs_mw")
    # TF_CPP_MIN_LOG_LEVEL unset, as in a user's shell: the launcher's default applies.
    # Fresh workers (no fork): their start-up output is checked below.
    result = launch([WORKER, "--out", str(out)], workers=2, timeout=400, startup_timeout=180,
                    env={"TF_CPP_MIN_LOG_LEVEL": None}, fork=False)
    assert result.returncode == 0, result.stdout[-5000:]
    assert "worker 0 done" in result.stdout and "worker 1 done" in result.stdout
    (out / "launcher_output.txt").write_text(result.stdout)
    return out


def test_launcher_workers_show_none_of_tensorflows_startup_lines(run):
    output = (run / "launcher_output.txt").read_text()
    shown = [line for line in output.splitlines()
             if any(fragment in line for fragment in STARTUP_LINES)]
    assert shown == [], "\n".join(shown[:10])


@pytest.mark.parametrize("name", sorted(programs.PROGRAMS))
def test_two_workers_train_like_one_device_keras_fit(run, name):
    expected_model, arguments = programs.PROGRAMS[name]()
    expected = expected_model.fit(verbose=0, **arguments).history
    expected_weights = [np.array(w) for w in expected_model.get_weights()]
    for r in (0, 1):
        with open(run / f"rank{r}_{name}.json") as f:
            seen = json.load(f)
        weights = common.load_weights(run / f"rank{r}_{name}.npz")
        programs.assert_same_training((weights, seen["history"]), (expected_weights, expected))
        evaluation = expected_model.evaluate(arguments["x"], arguments["y"],
                                             batch_size=arguments["batch_size"],
                                             return_dict=True, verbose=0)
        for key, value in evaluation.items():
            assert seen["evaluation"][key] == pytest.approx(value, rel=1e-5, abs=1e-6), key
        in_order = expected_model.evaluate(arguments["x"], arguments["y"],
                                           batch_size=arguments["batch_size"], verbose=0)
        assert seen["evaluation_list"] == pytest.approx(in_order, rel=1e-5, abs=1e-6)
        predictions = expected_model.predict(arguments["x"], batch_size=arguments["batch_size"],
                                             verbose=0)
        first = np.asarray(tf.nest.flatten(predictions)[0])
        assert seen["predictions_rows"] == programs.ROWS
        assert seen["predictions_sum"] == pytest.approx(float(np.sum(first)), rel=1e-5, abs=1e-5)


def test_shuffled_arrays_use_every_row_once_per_epoch_across_the_workers(run):
    model, arguments = programs.shuffled_rows()
    y = arguments["y"][:, 0]
    for r in (0, 1):
        with open(run / f"rank{r}_shuffled.json") as f:
            history = json.load(f)
        assert history["targets_sum"] == pytest.approx([float(np.sum(y))] * 2, rel=1e-6)
        assert history["targets_squares"] == pytest.approx([float(np.sum(y ** 2))] * 2,
                                                           rel=1e-6)


def test_run_eagerly_and_python_generators_are_refused_with_the_way_out(run):
    for r in (0, 1):
        with open(run / f"rank{r}_refusals.json") as f:
            messages = json.load(f)
        assert "run_eagerly=True" in messages["run_eagerly"]
        assert "Compile with run_eagerly=False" in messages["run_eagerly"]
        assert "generator, which every worker would read in full" in messages["generator"]


def test_two_workers_fine_tune_on_one_trainer_like_two_phase_keras_fit(run):
    expected = programs.keras_fine_tune()
    for r in (0, 1):
        with open(run / f"rank{r}_fine_tuning.json") as f:
            histories = json.load(f)
        weights = common.load_weights(run / f"rank{r}_fine_tuning.npz")
        programs.assert_same_fine_tuning((weights, histories), expected)


def test_two_workers_predict_a_ragged_tensor_like_keras(run):
    model, arguments = programs.ragged_scorer()
    expected = model.predict(verbose=0, **arguments)
    for r in (0, 1):
        with open(run / f"rank{r}_ragged.json") as f:
            seen = json.load(f)
        assert seen["type"] == "RaggedTensor"
        assert seen["row_lengths"] == expected.row_lengths().numpy().tolist()
        np.testing.assert_allclose(seen["values"], expected.flat_values.numpy(), rtol=1e-6,
                                   atol=1e-7)
