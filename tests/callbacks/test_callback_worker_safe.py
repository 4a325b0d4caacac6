"""make_worker_safe / WorkerSafeBackupAndRestore: Keras's own callbacks under several workers.

In one process, a fake TF_CONFIG (as in test_callback_chief_logging.py) and a
stand-in for MultiWorkerMirroredStrategy (a real one would start a gRPC
server in the test process) decide the wrapping, and Keras `fit` drives the
backup as the chief and as worker 1. The 2-worker run (tests/helpers/mw.py, fresh
processes) trains with tfdist's Trainer and Keras's callbacks used as in
TensorFlow's multi-worker tutorial, the same paths on both workers:
interrupted after 2 of 4 epochs, then rerun to the end.
"""

import csv
import json
import logging
import os
import types

import keras
import numpy as np
import pytest
import tensorflow as tf

from helpers import mw
from tfdist.callbacks import BackupAndResume, NanGuard, ThroughputMeter
from tfdist.callbacks.chief import is_chief, num_workers
from tfdist.callbacks.chief_logging import ChiefOnly
from tfdist.callbacks.worker_safe import make_worker_safe
from tfdist.callbacks.worker_safe_backup import WorkerSafeBackupAndRestore
from tfdist.distribute import collectives
from tfdist.distribute.strategy_factory import create_strategy
from tfdist.training.callback_list import make_callback_list
from helpers.interrupt import Interrupted, InterruptAtEpochStart
from helpers.tf_config import tf_config
from helpers.workers import keras_callbacks_worker as kcw
from helpers.workers import train_common as common

EPOCHS = 4


class FakeMultiWorker:
    """What tfdist reads from a `MultiWorkerMirroredStrategy`: the cluster
    (TF's own resolver over TF_CONFIG) and whether this task checkpoints."""

    def __init__(self):
        self.cluster_resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
        self.extended = types.SimpleNamespace(should_checkpoint=is_chief())


def as_worker(monkeypatch, index, **kwargs):
    monkeypatch.setenv("TF_CONFIG", tf_config("worker", index, **kwargs))
    return FakeMultiWorker()


class MyCSVLogger(keras.callbacks.CSVLogger):
    pass


class MyBackup(keras.callbacks.BackupAndRestore):
    pass


class Custom(keras.callbacks.Callback):
    pass




class BackupProbe(keras.callbacks.Callback):
    """Placed after the backup: what it restored and where it wrote."""

    def __init__(self, backup):
        super().__init__()
        self.backup, self.writes, self.at_begin = backup, [], None

    def on_train_begin(self, logs=None):
        self.at_begin = {"epoch": self.backup.restored_epoch,
                         "files": files(self.backup.backup_dir)}

    def on_epoch_end(self, epoch, logs=None):
        folder = self.backup.write_dir
        self.writes.append((folder, sorted(os.listdir(folder))))


def files(folder):
    """{relative path: bytes} of every file under `folder`."""
    out = {}
    for root, _, names in os.walk(folder):
        for name in names:
            path = os.path.join(root, name)
            with open(path, "rb") as f:
                out[os.path.relpath(path, folder)] = f.read()
    return out


def model():
    built = common.dense_model(tf.distribute.get_strategy())
    built.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    return built


def fit(built, callbacks, epochs=EPOCHS):
    x, y = common.regression_arrays(n=48)
    return built.fit(x, y, batch_size=16, epochs=epochs, shuffle=False, verbose=0,
                     callbacks=callbacks)


def interrupted_fit(callbacks, at):
    with pytest.raises(Interrupted):
        fit(model(), callbacks + [InterruptAtEpochStart(at)])


@pytest.fixture(scope="module")
def reference():
    built = model()
    fit(built, [])
    return common.weights_of(built)


# --- which callbacks are wrapped ----------------------------------------------------------

@pytest.mark.parametrize("make", [
    lambda: None, tf.distribute.get_strategy, lambda: common.mirrored(2),
    lambda: create_strategy("one_device"),
], ids=["none", "default", "mirrored", "one_device"])
def test_single_worker_strategies_keep_the_callbacks(make, monkeypatch, caplog, tmp_path):
    monkeypatch.setenv("TF_CONFIG", tf_config("worker", 1))  # TF_CONFIG alone is not a strategy
    callbacks = [keras.callbacks.BackupAndRestore(str(tmp_path / "b")),
                 keras.callbacks.CSVLogger(str(tmp_path / "log.csv")),
                 keras.callbacks.ModelCheckpoint(str(tmp_path / "m.keras"))]
    strategy = make()
    assert num_workers(strategy) == 1
    with caplog.at_level(logging.INFO, "tfdist.callbacks.worker_safe"):
        safe = make_worker_safe(callbacks, strategy)
    assert safe == callbacks and safe is not callbacks
    assert all(a is b for a, b in zip(safe, callbacks, strict=True))
    assert not caplog.records
    assert make_worker_safe(None, strategy) == []


@pytest.mark.parametrize("index, chief", [(0, False), (1, False), (0, True)])
def test_under_several_workers_the_writers_run_on_the_chief_only(index, chief, monkeypatch,
                                                                 tmp_path):
    strategy = as_worker(monkeypatch, index, chief=chief)
    assert num_workers(strategy) == (3 if chief else 2)
    writers = [keras.callbacks.ModelCheckpoint(str(tmp_path / "m.keras")),
               keras.callbacks.CSVLogger(str(tmp_path / "log.csv")),
               keras.callbacks.TensorBoard(str(tmp_path / "tb")),
               MyCSVLogger(str(tmp_path / "mine.csv"))]
    kept = [ChiefOnly(keras.callbacks.CSVLogger(str(tmp_path / "wrapped.csv"))),
            BackupAndResume(str(tmp_path / "resume")), NanGuard(),
            ThroughputMeter(16, print_fn=None), keras.callbacks.EarlyStopping(), Custom(),
            WorkerSafeBackupAndRestore(str(tmp_path / "safe"))]
    backup = keras.callbacks.BackupAndRestore(str(tmp_path / "backup"))
    callbacks = writers[:2] + kept[:4] + [backup] + writers[2:] + kept[4:]
    safe = make_worker_safe(callbacks, strategy)
    assert len(safe) == len(callbacks)
    for original, new in zip(callbacks, safe, strict=True):
        if original in writers:
            assert isinstance(new, ChiefOnly) and new.callback is original
            assert (new.non_chief, new.strategy) == ("auto", strategy)
        elif original is backup:
            assert type(new) is WorkerSafeBackupAndRestore and new.strategy is strategy
        else:
            assert new is original, type(original).__name__


@pytest.mark.parametrize("arguments", [
    {}, {"save_freq": 3}, {"double_checkpoint": True}, {"delete_checkpoint": False},
])
def test_the_backup_equivalent_keeps_every_argument(arguments, monkeypatch, tmp_path):
    strategy = as_worker(monkeypatch, 1)
    backup = keras.callbacks.BackupAndRestore(str(tmp_path / "backup"), **arguments)
    [safe] = make_worker_safe([backup], strategy)
    for name in ("backup_dir", "save_freq", "double_checkpoint", "delete_checkpoint"):
        assert getattr(safe, name) == getattr(backup, name), name
    # one equivalent per callback: its batch counters carry over between fits as in Keras
    assert make_worker_safe([backup], strategy)[0] is safe


def test_what_cannot_be_made_safe_is_an_error_naming_it(monkeypatch, tmp_path):
    strategy = as_worker(monkeypatch, 0)
    with pytest.raises(ValueError, match=r"MyBackup subclasses keras.callbacks.BackupAndRestore"
                                         r".*Subclass .*WorkerSafeBackupAndRestore"):
        make_worker_safe([MyBackup(str(tmp_path / "b"))], strategy)
    with pytest.raises(ValueError, match=r"save_freq=False cannot be honoured.*save_freq='epoch'"):
        make_worker_safe([keras.callbacks.BackupAndRestore(str(tmp_path / "b"), save_freq=False)],
                         strategy)
    with pytest.raises(ValueError, match="backup_dir must be a non-empty path, got ''"):
        WorkerSafeBackupAndRestore("")
    with pytest.raises(TypeError, match="got CSVLogger"):
        WorkerSafeBackupAndRestore.from_keras(keras.callbacks.CSVLogger("x.csv"))


def test_what_was_wrapped_is_logged_once(monkeypatch, caplog, tmp_path):
    strategy = as_worker(monkeypatch, 1)
    callbacks = [keras.callbacks.CSVLogger(str(tmp_path / "log.csv")),
                 keras.callbacks.BackupAndRestore(str(tmp_path / "backup")), NanGuard()]
    with caplog.at_level(logging.INFO, "tfdist.callbacks.worker_safe"):
        make_worker_safe(callbacks, strategy)
        make_worker_safe(callbacks, strategy)
    [record] = caplog.records
    message = record.getMessage()
    assert "2 workers" in message
    assert f"CSVLogger(filename={str(tmp_path / 'log.csv')!r}) -> ChiefOnly" in message
    assert (f"BackupAndRestore(backup_dir={str(tmp_path / 'backup')!r}) -> "
            "WorkerSafeBackupAndRestore") in message
    assert "NanGuard" not in message


def test_make_callback_list_makes_the_callbacks_worker_safe(monkeypatch, tmp_path):
    built = model()
    logger = keras.callbacks.CSVLogger(str(tmp_path / "log.csv"))
    strategy = as_worker(monkeypatch, 1)
    callback_list = make_callback_list([logger], built, strategy, verbose=1, epochs=1,
                                       steps=None, add_history=False)
    [wrapped] = callback_list.callbacks  # worker 1: no progress bar either
    assert isinstance(wrapped, ChiefOnly) and wrapped.callback is logger
    assert wrapped.mode == "skip"  # decided when the list set the model
    monkeypatch.delenv("TF_CONFIG")
    plain = make_callback_list([logger], built, tf.distribute.get_strategy(), verbose=0,
                               epochs=1, steps=None, add_history=False)
    assert plain.callbacks == [logger]


# --- WorkerSafeBackupAndRestore in one process (Keras fit) --------------------------------

def safe_backup(monkeypatch, index, backup_dir, **arguments):
    strategy = as_worker(monkeypatch, index)
    [backup] = make_worker_safe([keras.callbacks.BackupAndRestore(backup_dir, **arguments)],
                                strategy)
    return backup


def test_every_worker_restores_and_only_the_chief_writes_and_deletes(monkeypatch, tmp_path,
                                                                     reference):
    backup_dir = str(tmp_path / "backup")
    interrupted_fit([safe_backup(monkeypatch, 0, backup_dir)], at=2)
    written = files(backup_dir)
    assert sorted(written) == ["latest.weights.h5", "training_metadata.json"]
    assert json.loads(written["training_metadata.json"]) == {"epoch": 2, "batch": 0}

    # worker 1 resumes from the chief's backup, saves into its own folder, deletes nothing
    other = safe_backup(monkeypatch, 1, backup_dir)
    probe = BackupProbe(other)
    built = model()
    history = fit(built, [other, probe])
    assert history.epoch == [2, 3] and other.restored_epoch == 2
    assert common.max_rel_diff(common.weights_of(built), reference) < 1e-6
    folder = probe.writes[0][0]
    assert "tfdist-backup-worker_1-" in folder and not folder.startswith(str(tmp_path))
    assert probe.writes == [(folder, ["latest.weights.h5", "training_metadata.json"])] * 2
    assert not os.path.exists(folder) and other.write_dir is None
    assert files(backup_dir) == written  # delete_checkpoint=True is the chief's job

    # the chief resumes too, writes into backup_dir and deletes it at the end
    chief = safe_backup(monkeypatch, 0, backup_dir)
    probe = BackupProbe(chief)
    built = model()
    assert fit(built, [chief, probe]).epoch == [2, 3]
    assert [w[0] for w in probe.writes] == [backup_dir] * 2
    assert common.max_rel_diff(common.weights_of(built), reference) < 1e-6
    assert not os.path.exists(backup_dir)


def test_a_failed_fit_deletes_a_non_chief_s_temporary_folder_and_keeps_the_backup(
        monkeypatch, tmp_path):
    """Keras calls no callback when fit raises; tfdist's Trainer calls on_fit_error."""
    from tfdist.training import Trainer

    backup_dir = str(tmp_path / "backup")
    interrupted_fit([safe_backup(monkeypatch, 0, backup_dir)], at=2)
    written = files(backup_dir)
    other = safe_backup(monkeypatch, 1, backup_dir)
    probe = BackupProbe(other)
    x, y = common.regression_arrays(n=48)
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(16)
    with pytest.raises(Interrupted):
        Trainer(model()).fit(data, epochs=EPOCHS, verbose=0,
                             callbacks=[other, probe, InterruptAtEpochStart(3)])
    folder = probe.writes[0][0]
    assert "tfdist-backup-worker_1-" in folder and other.restored_epoch == 2
    assert not os.path.exists(folder) and other.write_dir is None
    assert files(backup_dir) == written


def test_double_checkpoint_falls_back_as_keras_does_and_only_the_chief_repairs(monkeypatch,
                                                                             tmp_path):
    backup_dir = str(tmp_path / "backup")
    interrupted_fit([safe_backup(monkeypatch, 0, backup_dir, double_checkpoint=True)], at=3)
    weights = os.path.join(backup_dir, "latest.weights.h5")
    with open(weights, "wb") as f:
        f.write(b"not an hdf5 file")  # the latest state is lost, the previous one is kept
    damaged = files(backup_dir)
    assert json.loads(damaged["training_metadata.json.bkp"])["epoch"] == 2

    other = safe_backup(monkeypatch, 1, backup_dir, double_checkpoint=True,
                        delete_checkpoint=False)
    probe = BackupProbe(other)
    assert fit(model(), [other, probe]).epoch == [2, 3]
    assert probe.at_begin == {"epoch": 2, "files": damaged}
    assert files(backup_dir) == damaged  # worker 1 never writes backup_dir

    chief = safe_backup(monkeypatch, 0, backup_dir, double_checkpoint=True,
                        delete_checkpoint=False)
    probe = BackupProbe(chief)
    chief_run = model()
    assert fit(chief_run, [chief, probe]).epoch == [2, 3]
    repaired = probe.at_begin["files"]  # as Keras: the previous state copied over the latest
    assert repaired["latest.weights.h5"] == damaged["latest.weights.h5.bkp"]
    assert repaired["training_metadata.json"] == damaged["training_metadata.json.bkp"]

    # Keras's own callback, on the same damaged folder, resumes at the same epoch and weights
    keras_dir = tmp_path / "keras_backup"
    os.makedirs(keras_dir)
    for name, content in damaged.items():
        (keras_dir / name).write_bytes(content)
    keras_run = model()
    keras_backup = keras.callbacks.BackupAndRestore(str(keras_dir), double_checkpoint=True)
    assert fit(keras_run, [keras_backup]).epoch == [2, 3]
    assert common.max_rel_diff(common.weights_of(chief_run), common.weights_of(keras_run)) < 1e-6


def test_workers_that_restored_different_states_stop_with_an_error(monkeypatch, tmp_path):
    backup_dir = str(tmp_path / "backup")
    backup = safe_backup(monkeypatch, 1, backup_dir)
    temp_dirs = []

    def disagree(strategy, values):  # the chief found a backup of epoch 2, this worker none
        temp_dirs.append(backup.write_dir)
        return np.array([[2, 1], values])

    monkeypatch.setattr(collectives, "gather", disagree)
    probe = BackupProbe(backup)
    with pytest.raises(ValueError, match=r"restored different states from backup_dir="
                                         r".*\(-1, None\), \(2, 'latest'\).*shared file system"):
        fit(model(), [backup, probe])
    assert probe.at_begin is None  # training did not begin
    assert "tfdist-backup-worker_1-" in temp_dirs[0] and not os.path.exists(temp_dirs[0])
    assert backup.write_dir is None and os.listdir(tmp_path) == []


def test_without_workers_it_is_keras_backup_and_restore(monkeypatch, tmp_path):
    # batch-level saves (2 batches; 3 per epoch): the same files, epochs and weights as Keras's
    monkeypatch.delenv("TF_CONFIG", raising=False)
    results = {}
    for name, make in (("keras", keras.callbacks.BackupAndRestore),
                       ("safe", WorkerSafeBackupAndRestore)):
        backup_dir = str(tmp_path / name)
        interrupted_fit([make(backup_dir, save_freq=2)], at=2)
        written = files(backup_dir)
        built = model()
        epochs = fit(built, [make(backup_dir, save_freq=2)]).epoch
        results[name] = (sorted(written), written["training_metadata.json"], epochs,
                         common.weights_of(built), os.path.exists(backup_dir))
    keras_run, safe_run = results["keras"], results["safe"]
    assert safe_run[:3] == keras_run[:3]
    assert json.loads(safe_run[1]) == {"epoch": 1, "batch": 2}
    assert safe_run[2] == [1, 2, 3] and safe_run[4] is keras_run[4] is False
    assert common.max_rel_diff(safe_run[3], keras_run[3]) < 1e-6


# --- 2 workers: tfdist Trainer, Keras's callbacks as in TensorFlow's tutorial -------------

@pytest.fixture(scope="module")
def two_workers(tmp_path_factory):
    out = tmp_path_factory.mktemp("keras_callbacks_mw")
    runs = {}
    for phase in ("first", "resume"):
        temp = out / f"tmp_{phase}"
        temp.mkdir()
        result = mw.launch(["tests/helpers/workers/keras_callbacks_worker.py", "--out", str(out),
                            "--phase", phase],
                           workers=2, timeout=150, startup_timeout=120,
                           env={"TMPDIR": str(temp)})
        assert result.returncode == 0, result.stdout[-4000:]
        runs[phase] = [json.loads((out / f"{phase}_rank{r}.json").read_text()) for r in (0, 1)]
    return out, runs


@pytest.mark.multiworker
def test_mw_run_1_is_interrupted_after_epoch_2_and_run_2_resumes_at_epoch_2(two_workers):
    out, runs = two_workers
    first, resume = runs["first"], runs["resume"]
    assert [r["task_info"] for r in first] == [["worker", 0, True], ["worker", 1, False]]
    assert [r["error"] for r in first] == ["interrupted at the start of epoch 2"] * 2
    assert [r["epochs"] for r in first] == [[0, 1]] * 2
    assert first[0]["backup_files"] == ["latest.weights.h5", "training_metadata.json"]
    assert first[0]["backup_metadata"] == {"epoch": 2, "batch": 0}
    assert [r["epochs"] for r in resume] == [[2, 3]] * 2
    assert [r["history_epochs"] for r in resume] == [[2, 3]] * 2
    for run in resume:
        assert any("resuming from" in m and "at epoch 2" in m for m in run["messages"])


@pytest.mark.multiworker
def test_mw_the_resumed_weights_are_the_uninterrupted_run_s(two_workers):
    out, _ = two_workers
    for rank in (0, 1):
        reference = common.load_weights(out / f"reference_rank{rank}.npz")
        resumed = common.load_weights(out / f"resumed_rank{rank}.npz")
        for got, want in zip(resumed, reference, strict=True):
            assert np.allclose(got, want, rtol=1e-6)
        # not trivially equal: run 1 stopped elsewhere
        interrupted = common.load_weights(out / f"interrupted_rank{rank}.npz")
        assert common.max_rel_diff(interrupted, reference) > 1e-3


@pytest.mark.multiworker
def test_mw_one_set_of_files_at_the_user_paths_written_by_the_chief(two_workers):
    out, runs = two_workers
    shared = out / "shared"
    tensorboard = kcw.HAS_TENSORBOARD
    found = sorted(os.path.relpath(os.path.join(d, f), shared)
                   for d, _, names in os.walk(shared) for f in names)
    checkpoints = [f"ckpt/epoch_{e}.weights.h5" for e in range(1, EPOCHS + 1)]
    events = [f for f in found if f.startswith("tb/")]
    assert [f for f in found if not f.startswith("tb/")] == checkpoints + ["log.csv"]
    assert not (shared / "backup").exists()  # delete_checkpoint=True: the chief deleted it
    # every save_weights call: the chief's into the user's paths, worker 1's into its temp folder
    for phase, epochs in (("first", [1, 2]), ("resume", [3, 4])):
        chief, other = runs[phase]
        assert chief["saves"] == [
            p for e in epochs for p in ([str(shared / "backup" / "latest.weights.h5"), True],
                                        [str(shared / "ckpt" / f"epoch_{e}.weights.h5"), True])]
        temp = out / f"tmp_{phase}"
        assert len(other["saves"]) == 2 and other["tmpdir"] == str(temp)
        for path, existed in other["saves"]:
            assert existed and path.startswith(str(temp / "tfdist-backup-worker_1-"))
        assert os.listdir(temp) == []  # no temporary folder left behind
    # the CSV: one header, each epoch once, the values both workers logged
    with open(shared / "log.csv") as f:
        lines = f.read().splitlines()
    assert sum(line.startswith("epoch,") for line in lines) == 1
    rows = list(csv.DictReader(lines))
    assert [int(r["epoch"]) for r in rows] == list(range(EPOCHS))
    logged = runs["first"][0]["logs"] + runs["resume"][0]["logs"]
    assert runs["first"][0]["logs"] == runs["first"][1]["logs"]
    assert [float(r["loss"]) for r in rows] == pytest.approx([e["loss"] for e in logged])
    # the last checkpoint holds the final weights
    saved = kcw.classifier()
    saved.load_weights(str(shared / checkpoints[-1]))
    assert common.max_rel_diff(common.weights_of(saved),
                               common.load_weights(out / "resumed_rank0.npz")) < 1e-6
    if tensorboard:  # one event file per run, from the chief's process
        chief_pids = {str(runs[phase][0]["pid"]) for phase in ("first", "resume")}
        assert len(events) == 2 and all(e.startswith("tb/train/") for e in events), events
        assert {e.split(".")[-3] for e in events} == chief_pids
    for run in runs["first"] + runs["resume"]:
        [message] = [m for m in run["messages"] if "make_worker_safe" in m]
        for name in ("BackupAndRestore", "ModelCheckpoint", "CSVLogger") + (
                ("TensorBoard",) if tensorboard else ()):
            assert f"{name}(" in message
