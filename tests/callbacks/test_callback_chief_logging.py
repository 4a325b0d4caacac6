"""ChiefOnly / make_logging_callbacks / is_chief, in one process and across 2 workers.

The 2-worker run (one launch through tests/helpers/mw.py, shared by the tests marked
multiworker) also checks the other tfdist callbacks where multi-worker
behaviour matters: ProfilerWindow profiles on the chief only, NanGuard stops
every worker at the same step, DeviceMemoryMonitor logs on every worker.
"""

import csv
import importlib.util
import itertools
import json
import os

import keras
import numpy as np
import pytest
import tensorflow as tf

from helpers import mw
from helpers.interrupt import Interrupted, InterruptAtEpochStart
from helpers.tf_config import tf_config
from tfdist.callbacks.chief import is_chief, model_strategy, task_info
from tfdist.callbacks.chief_logging import ChiefOnly, make_logging_callbacks
from tfdist.distribute.strategy_factory import create_strategy
from helpers.workers.train_common import OnReadCounter

HAS_TENSORBOARD = importlib.util.find_spec("tensorboard") is not None
_key_base = itertools.count(500)  # far from the ranges other test files use


def mirrored():
    """A 2-replica MirroredStrategy over the 2 logical CPUs, with its own collective keys."""
    tf.distribute.MirroredStrategy._collective_key_base = 10_000 * next(_key_base)
    try:
        return create_strategy("mirrored", devices=["/cpu:0", "/cpu:1"])
    finally:
        tf.distribute.MirroredStrategy._collective_key_base = 0


def arrays():
    rs = np.random.RandomState(3)
    x = rs.standard_normal((64, 4)).astype("float32")
    return x, np.tanh(x @ rs.standard_normal((4, 2))).astype("float32")


def build_model(strategy=None, on_read=False):
    scope = strategy.scope() if strategy is not None else tf.distribute.get_strategy().scope()
    with scope:
        layers = [keras.Input((4,))] + ([OnReadCounter()] if on_read else []) + [
            keras.layers.Dense(8, activation="tanh"), keras.layers.Dense(2)]
        model = keras.Sequential(layers)
        model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse", metrics=["mae"])
    rs = np.random.RandomState(0)
    model.set_weights([(0.5 * rs.standard_normal(w.shape)).astype("float32")
                       for w in model.get_weights()])
    return model


def fit(model, callbacks, epochs=2):
    x, y = arrays()
    return model.fit(x, y, batch_size=16, epochs=epochs, shuffle=False, verbose=0,
                     callbacks=callbacks)


def read_csv(path):
    with open(path) as f:
        return list(csv.DictReader(f))


# --- is_chief / task_info ---------------------------------------------------------------

@pytest.mark.parametrize("config, expected", [
    (None, (None, 0, True)),
    (tf_config("worker", 0), ("worker", 0, True)),
    (tf_config("worker", 1), ("worker", 1, False)),
    (tf_config("worker", 0, chief=True), ("worker", 0, False)),
    (tf_config("chief", 0, chief=True), ("chief", 0, True)),
    (tf_config("evaluator", 0), ("evaluator", 0, True)),
    (tf_config("ps", 0, workers=1, ps=["localhost:1002"]), ("ps", 0, False)),
])
def test_task_info_follows_tf_config(monkeypatch, config, expected):
    if config is None:
        monkeypatch.delenv("TF_CONFIG", raising=False)
    else:
        monkeypatch.setenv("TF_CONFIG", config)
    assert task_info() == expected
    assert is_chief() is expected[2]


def test_a_malformed_tf_config_is_an_error_that_shows_it(monkeypatch):
    monkeypatch.setenv("TF_CONFIG", "{not json")
    with pytest.raises(ValueError, match=r"TF_CONFIG is not valid JSON.*'not json'"):
        is_chief()


def test_a_single_worker_strategy_is_the_chief_and_the_model_knows_its_strategy(monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    strategy = mirrored()
    assert is_chief(strategy)
    model = build_model(strategy)
    assert model_strategy(model) is strategy
    with strategy.scope():
        assert is_chief()


# --- ChiefOnly in one process -----------------------------------------------------------

def test_on_the_chief_the_wrapped_logger_writes_what_the_plain_one_writes(tmp_path, monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    fit(build_model(), [keras.callbacks.CSVLogger(str(tmp_path / "plain.csv"))])
    wrapped = ChiefOnly(keras.callbacks.CSVLogger(str(tmp_path / "new" / "sub" / "log.csv")))
    fit(build_model(), [wrapped])
    assert wrapped.mode == "chief" and wrapped.runs_here
    assert read_csv(tmp_path / "new" / "sub" / "log.csv") == read_csv(tmp_path / "plain.csv")


def test_a_non_chief_worker_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("TF_CONFIG", tf_config("worker", 1))
    wrapped = [ChiefOnly(keras.callbacks.CSVLogger(str(tmp_path / "logs" / "log.csv"))),
               ChiefOnly(keras.callbacks.ModelCheckpoint(str(tmp_path / "ckpt" / "m.keras")))]
    history = fit(build_model(), wrapped)
    assert len(history.history["loss"]) == 2
    assert [w.mode for w in wrapped] == ["skip", "skip"]
    assert os.listdir(tmp_path) == []


def test_fallback_dir_gives_each_non_chief_its_own_copy(tmp_path, monkeypatch):
    monkeypatch.setenv("TF_CONFIG", tf_config("worker", 1))
    logger = keras.callbacks.CSVLogger(str(tmp_path / "logs" / "log.csv"))
    wrapped = ChiefOnly(logger, fallback_dir=str(tmp_path / "workers"))
    history = fit(build_model(), [wrapped])
    rows = read_csv(tmp_path / "workers" / "worker_1" / "log.csv")
    assert [float(r["loss"]) for r in rows] == pytest.approx(history.history["loss"])
    assert not (tmp_path / "logs").exists()
    assert logger.filename == str(tmp_path / "logs" / "log.csv")  # restored after training


class TempDirProbe(keras.callbacks.Callback):
    """Records, at each epoch end, the folder the wrapped callback writes to and its files."""

    def __init__(self, wrapped):
        super().__init__()
        self.wrapped, self.seen = wrapped, []

    def on_epoch_end(self, epoch, logs=None):
        folder = os.path.dirname(self.wrapped.output_path)
        self.seen.append((folder, sorted(os.listdir(folder)) if os.path.isdir(folder) else None))


def test_redirect_saves_into_a_temporary_folder_that_is_deleted(tmp_path, monkeypatch):
    monkeypatch.setenv("TF_CONFIG", tf_config("worker", 1))
    checkpoint = keras.callbacks.ModelCheckpoint(str(tmp_path / "ckpt" / "e{epoch}.weights.h5"),
                                                 save_weights_only=True)
    wrapped = ChiefOnly(checkpoint, non_chief="redirect")
    probe = TempDirProbe(wrapped)
    fit(build_model(), [wrapped, probe])
    folder = probe.seen[0][0]
    assert not folder.startswith(str(tmp_path)) and "worker_1" in folder
    assert probe.seen == [(folder, ["e1.weights.h5"]), (folder, ["e1.weights.h5", "e2.weights.h5"])]
    assert not os.path.exists(folder)  # deleted at the end of training
    assert not (tmp_path / "ckpt").exists()
    assert checkpoint.filepath == str(tmp_path / "ckpt" / "e{epoch}.weights.h5")


def test_a_failed_fit_gives_the_path_back_and_deletes_the_temporary_folder(tmp_path,
                                                                           monkeypatch):
    """Keras calls no callback when fit raises; tfdist's Trainer calls on_fit_error,
    which ends the redirect as the end of training does."""
    from tfdist.training import Trainer

    monkeypatch.setenv("TF_CONFIG", tf_config("worker", 1))
    path = str(tmp_path / "ckpt" / "e{epoch}.weights.h5")
    checkpoint = keras.callbacks.ModelCheckpoint(path, save_weights_only=True)
    wrapped = ChiefOnly(checkpoint, non_chief="redirect")
    probe = TempDirProbe(wrapped)
    x, y = arrays()
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(16)
    with pytest.raises(Interrupted):
        Trainer(build_model()).fit(data, epochs=3, verbose=0,
                                   callbacks=[wrapped, probe, InterruptAtEpochStart(2)])
    folder = probe.seen[0][0]
    assert "worker_1" in folder and probe.seen[1] == (folder, ["e1.weights.h5", "e2.weights.h5"])
    assert not os.path.exists(folder)
    assert checkpoint.filepath == path and wrapped.mode is None


def test_auto_runs_checkpoints_everywhere_only_when_the_model_has_on_read_variables(
        tmp_path, monkeypatch):
    monkeypatch.setenv("TF_CONFIG", tf_config("worker", 1))
    modes = {}
    for on_read in (False, True):
        checkpoint = ChiefOnly(keras.callbacks.ModelCheckpoint(
            str(tmp_path / f"ckpt{on_read}" / "m.weights.h5"), save_weights_only=True))
        logger = ChiefOnly(keras.callbacks.CSVLogger(str(tmp_path / f"log{on_read}.csv")))
        model = build_model(on_read=on_read)
        checkpoint.set_model(model)
        logger.set_model(model)
        modes[on_read] = (checkpoint.mode, logger.mode)
    assert modes == {False: ("skip", "skip"), True: ("redirect", "skip")}


def test_only_the_hooks_the_callback_has_are_forwarded():
    # CSVLogger has no batch hooks: Keras may dispatch batch ends asynchronously.
    assert getattr(ChiefOnly(keras.callbacks.CSVLogger("x.csv")).on_train_batch_end,
                   "_is_default", False)
    assert not getattr(ChiefOnly(keras.callbacks.ModelCheckpoint("x.keras")).on_train_batch_end,
                       "_is_default", False)


@pytest.mark.parametrize("make, error, match", [
    (lambda: ChiefOnly(keras.callbacks.BackupAndRestore("b")), ValueError, "BackupAndRestore"),
    (lambda: ChiefOnly(keras.callbacks.CSVLogger("x.csv"), non_chief="never"), ValueError,
     r"non_chief must be one of \('auto', 'skip', 'redirect'\), got 'never'"),
    (lambda: ChiefOnly(keras.callbacks.EarlyStopping(), non_chief="redirect"), ValueError,
     "path_attribute"),
    (lambda: ChiefOnly(keras.callbacks.EarlyStopping(), fallback_dir="w"), ValueError,
     "fallback_dir needs to know where EarlyStopping writes"),
    (lambda: ChiefOnly(keras.callbacks.CSVLogger("x.csv"), path_attribute="nope"), ValueError,
     "'nope'"),
    (lambda: ChiefOnly("log.csv"), TypeError, "got str"),
    (lambda: make_logging_callbacks(""), ValueError, "log_dir"),
    (lambda: make_logging_callbacks("logs", tensorboard="yes"), ValueError, "'yes'"),
])
def test_bad_arguments_are_named(make, error, match):
    with pytest.raises(error, match=match):
        make()


# --- make_logging_callbacks -------------------------------------------------------------

def test_make_logging_callbacks_writes_csv_and_checkpoints_on_the_chief(tmp_path, monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    callbacks = make_logging_callbacks(str(tmp_path / "run"), checkpoint=True)
    assert all(isinstance(c, ChiefOnly) for c in callbacks)
    assert len(callbacks) == (3 if HAS_TENSORBOARD else 2)
    history = fit(build_model(), callbacks)
    rows = read_csv(tmp_path / "run" / "training_log.csv")
    assert [float(r["loss"]) for r in rows] == pytest.approx(history.history["loss"])
    assert sorted(os.listdir(tmp_path / "run" / "checkpoints")) == [
        "epoch_001.weights.h5", "epoch_002.weights.h5"]


@pytest.mark.skipif(HAS_TENSORBOARD, reason="checks the error without the tensorboard package")
def test_tensorboard_true_without_the_package_says_how_to_get_it():
    with pytest.raises(ImportError, match="pip install tensorboard"):
        make_logging_callbacks("logs", tensorboard=True)


def test_values_logged_under_two_replicas_are_the_single_device_values(tmp_path, monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    single = make_logging_callbacks(str(tmp_path / "one"), tensorboard=False)
    fit(build_model(), single, epochs=3)
    strategy = mirrored()
    assert strategy.num_replicas_in_sync == 2
    replicated = make_logging_callbacks(str(tmp_path / "two"), tensorboard=False)
    fit(build_model(strategy), replicated, epochs=3)
    one = read_csv(tmp_path / "one" / "training_log.csv")
    two = read_csv(tmp_path / "two" / "training_log.csv")
    assert len(one) == len(two) == 3
    for key in ("loss", "mae"):
        np.testing.assert_allclose([float(r[key]) for r in two], [float(r[key]) for r in one],
                                   rtol=1e-5)


# --- 2 workers (MultiWorkerMirroredStrategy, tfdist Trainer) ----------------------------

@pytest.fixture(scope="module")
def two_workers(tmp_path_factory):
    out = tmp_path_factory.mktemp("callbacks_mw")
    result = mw.launch(["tests/helpers/workers/callbacks_worker.py", "--out", str(out)],
                       workers=2, timeout=200, startup_timeout=150)
    assert result.returncode == 0, result.stdout[-4000:]
    reports = [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]
    return out, reports, result.stdout


def files_under(path):
    return sorted(os.path.relpath(os.path.join(d, f), path)
                  for d, _, names in os.walk(path) for f in names)


@pytest.mark.multiworker
def test_mw_the_chief_is_worker_0(two_workers):
    _, reports, _ = two_workers
    assert [r["task_info"] for r in reports] == [["worker", 0, True], ["worker", 1, False]]
    assert [r["is_chief_from_tf_config"] for r in reports] == [True, False]


@pytest.mark.multiworker
def test_mw_only_the_chief_writes_logs_checkpoints_profile_and_events(two_workers):
    out, reports, _ = two_workers
    assert not (out / "rank1").exists(), files_under(out / "rank1")
    chief = files_under(out / "rank0")
    assert "logs/training_log.csv" in chief
    assert {"logs/checkpoints/epoch_001.weights.h5", "logs/checkpoints/epoch_002.weights.h5",
            "on_read/model.weights.h5"} <= set(chief)
    assert any(f.startswith("profile/plugins/profile/") and f.endswith(".xplane.pb")
               for f in chief)
    events = [f for f in chief if "events.out.tfevents" in f]
    assert events, chief
    assert [r["logging"]["modes"][:2] for r in reports] == [["chief", "chief"], ["skip", "skip"]]


@pytest.mark.multiworker
def test_mw_logged_values_are_global_and_the_csv_holds_them(two_workers):
    out, reports, _ = two_workers
    epochs = [[{k: e[k] for k in ("loss", "mae")} for e in r["logging"]["epochs"]]
              for r in reports]
    assert epochs[0] == epochs[1] and len(epochs[0]) == 2
    rows = read_csv(out / "rank0" / "logs" / "training_log.csv")
    assert [float(r["loss"]) for r in rows] == pytest.approx([e["loss"] for e in epochs[0]])
    # DeviceMemoryMonitor ran on both workers, before the CSV logger: its figures are logged.
    assert all("host_rss_mb" in e for r in reports for e in r["logging"]["epochs"])
    assert "host_rss_mb" in rows[0] and not any(k.startswith("gpu") for k in rows[0])
    # ThroughputMeter and LearningRateLogger ran on both workers too; the rate
    # depends only on the optimizer step, so the workers agree on it exactly.
    rates = [[e["learning_rate"] for e in r["logging"]["epochs"]] for r in reports]
    assert rates[0] == rates[1] and rates[0][0] > rates[0][1] > 0
    assert all(e["examples_per_sec"] > 0 for r in reports for e in r["logging"]["epochs"])
    assert float(rows[-1]["learning_rate"]) == pytest.approx(rates[0][-1])
    assert "examples_per_sec" in rows[0]


@pytest.mark.multiworker
def test_mw_a_model_with_on_read_variables_saves_on_both_workers_without_deadlock(two_workers):
    # Saving it on the chief alone fails the job (the ON_READ read is an
    # all-reduce the other worker never joins); ChiefOnly runs the save on
    # worker 1 too, into a temporary folder deleted at the end.
    out, reports, _ = two_workers
    chief, other = reports[0]["on_read"], reports[1]["on_read"]
    assert chief["seen_paths"] == [[str(out / "rank0" / "on_read" / "model.weights.h5"), True]] * 2
    temp_paths = [p for p, existed in other["seen_paths"] if existed]
    assert len(temp_paths) == 2 and "worker_1" in temp_paths[0]
    assert other["exists_after"] == [False, False]
    assert other["filepath_after"] == str(out / "rank1" / "on_read" / "model.weights.h5")
    assert chief["loss"] == other["loss"]


@pytest.mark.multiworker
def test_mw_nan_guard_stops_every_worker_at_the_same_step(two_workers):
    _, reports, _ = two_workers
    assert [r["nan"] for r in reports] == [{"name": "loss", "epoch": 1, "batch": 1, "step": 5}] * 2
