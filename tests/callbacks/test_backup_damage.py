"""Backups are never deleted on a guess: damaged, missing and inconsistent
indexes, unreadable backups, a disk that fills during a write, and the
temporary folders of killed workers.

Every case runs on real files: real TF checkpoints written by a real
(interrupted) training run, damaged on disk, then a new run resumes from the
folder. Each case either resumes exactly from the newest readable backup (the
restored weights equal that backup's, bit for bit) or refuses with one line;
no readable backup file is ever removed.
"""

import errno
import hashlib
import logging
import os
import shutil
import subprocess
import sys
import tempfile

import keras
import numpy as np
import pytest
import tensorflow as tf

from helpers.interrupt import Interrupted, InterruptAfterSteps
from test_callback_backup import make_trainer, train
from tfdist.callbacks.backup import (BackupAndResume, BackupIndexError, BackupWriteError,
                                     BackupWriter, ResumeWarning, describe_backup,
                                     latest_backup, list_backups, read_backup)
from tfdist.callbacks.backup.errors import summarize_error
from tfdist.callbacks.backup.index import survey_backups
from tfdist.callbacks.backup.writer import remove_stale_temporary_folders
from helpers.workers import train_common as common

DATA = "data-00000-of-00001"
# The first kernel (Keras 3 models save their weights under the optimizer).
KERNEL = "optimizer/_trainable_variables/0/.ATTRIBUTES/VARIABLE_VALUE"
RANDOM_INDEX = bytes([0xDC]) + np.random.default_rng(22).bytes(199)  # not UTF-8 from byte 0


class StopAfterRestore(keras.callbacks.Callback):
    """Placed after BackupAndResume: records the weights it restored, then stops."""

    def __init__(self):
        super().__init__()
        self.weights = None

    def on_train_begin(self, logs=None):
        self.weights = common.weights_of(self.model)
        raise Interrupted("stopped right after the restore")


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """A folder with three backups (global steps 2, 4 and 6) of a real run."""
    folder = tmp_path_factory.mktemp("written") / "backup"
    with pytest.raises(Interrupted):
        train(tf.distribute.get_strategy(),
              [BackupAndResume(folder, save_freq=2, max_to_keep=3, verbose=0), InterruptAfterSteps(7)])
    assert [read_backup(p).global_step for p in list_backups(folder)] == [2, 4, 6]
    return folder


@pytest.fixture
def backup_dir(written, tmp_path):
    folder = tmp_path / "backup"
    shutil.copytree(written, folder)
    return folder


def files_of(folder):
    """{name: sha256} of every file in the folder."""
    return {name: hashlib.sha256((folder / name).read_bytes()).hexdigest()
            for name in sorted(os.listdir(folder)) if (folder / name).is_file()}


def backup_files(folder):
    return {n: h for n, h in files_of(folder).items() if n.startswith("ckpt-")}


def weights_in(path):
    """The model weights stored in a backup, read into a fresh model."""
    model, _ = make_trainer(tf.distribute.get_strategy())
    tf.train.Checkpoint(model=model).read(path).expect_partial().assert_existing_objects_matched()
    return common.weights_of(model)


def resume(backup_dir):
    """A new run on the folder, stopped right after its restore."""
    backup = BackupAndResume(backup_dir, save_freq=2, max_to_keep=3, verbose=0)
    stop = StopAfterRestore()
    with pytest.raises(Interrupted):
        train(tf.distribute.get_strategy(), [backup, stop])
    return backup, stop.weights


def assert_resumed_exactly_from(backup_dir, name, global_step):
    expected = weights_in(str(backup_dir / name))
    backup, restored = resume(backup_dir)
    assert backup.restored.path == str(backup_dir / name)
    assert backup.restored.global_step == global_step
    for actual, wanted in zip(restored, expected, strict=True):
        np.testing.assert_array_equal(actual, wanted)
    return backup


def flip_kernel_byte(prefix):
    """Flips one byte inside the first kernel's bytes in the data file (so
    only restoring the model fails its checksum; the position still reads)."""
    kernel = tf.train.load_checkpoint(prefix).get_tensor(KERNEL).tobytes()
    data_file = prefix + "." + DATA
    with open(data_file, "rb") as stream:
        data = bytearray(stream.read())
    start = bytes(data).find(kernel)
    assert start >= 0 and bytes(data).find(kernel, start + 1) < 0
    data[start + len(kernel) // 2] ^= 0xFF
    with open(data_file, "wb") as stream:
        stream.write(bytes(data))


def truncate(path, fraction=0.5):
    with open(path, "r+b") as stream:
        stream.truncate(int(os.path.getsize(path) * fraction))


# ------------------------------------------------- the index damaged or missing
DAMAGES = {
    "truncated_to_half": lambda index: truncate(index),
    "random_bytes": lambda index: open(index, "wb").write(RANDOM_INDEX),
    "deleted": os.remove,
}


@pytest.mark.parametrize("damage", list(DAMAGES))
def test_a_damaged_index_is_rebuilt_and_training_resumes_from_the_newest_backup(
        backup_dir, damage, caplog):
    before = backup_files(backup_dir)
    DAMAGES[damage](str(backup_dir / "checkpoint"))
    assert [os.path.basename(p) for p in list_backups(backup_dir)] == ["ckpt-1", "ckpt-2",
                                                                        "ckpt-3"]
    with caplog.at_level(logging.WARNING):
        assert_resumed_exactly_from(backup_dir, "ckpt-3", 6)
    assert backup_files(backup_dir) == before  # nothing removed, nothing changed
    rebuilt = [r.getMessage() for r in caplog.records if "rebuilt" in r.getMessage()]
    assert len(rebuilt) == 1 and str(backup_dir / "checkpoint") in rebuilt[0]
    assert "ckpt-1, ckpt-2, ckpt-3" in rebuilt[0] and "\n" not in rebuilt[0]
    # The rewritten index is TensorFlow's format again.
    state = tf.train.get_checkpoint_state(str(backup_dir))
    assert [os.path.basename(p) for p in state.all_model_checkpoint_paths] == [
        "ckpt-1", "ckpt-2", "ckpt-3"]
    assert survey_backups(backup_dir).rebuilt is None


def test_an_index_naming_a_missing_backup_resumes_from_the_newest_present(backup_dir, caplog):
    for name in os.listdir(backup_dir):
        if name.startswith("ckpt-3."):
            os.remove(backup_dir / name)
    before = backup_files(backup_dir)
    with caplog.at_level(logging.WARNING):
        assert_resumed_exactly_from(backup_dir, "ckpt-2", 4)
    assert backup_files(backup_dir) == before
    assert any("names ckpt-3 but its files are not all" in r.getMessage()
               for r in caplog.records)
    assert [os.path.basename(p) for p in list_backups(backup_dir)] == ["ckpt-1", "ckpt-2"]


def test_an_unreadable_backup_is_kept_and_never_overwritten_when_the_index_is_rebuilt(
        backup_dir, caplog):
    truncate(str(backup_dir / f"ckpt-3.{DATA}"))  # its position cannot be read
    (backup_dir / "checkpoint").write_bytes(RANDOM_INDEX)
    unreadable = {n: h for n, h in backup_files(backup_dir).items() if n.startswith("ckpt-3.")}
    with caplog.at_level(logging.WARNING):
        assert_resumed_exactly_from(backup_dir, "ckpt-2", 4)
    warning = [r.getMessage() for r in caplog.records if "rebuilt" in r.getMessage()]
    assert len(warning) == 1 and "kept on disk but not used (unreadable): ckpt-3 (" in warning[0]
    assert "is not text (byte 0xdc at offset 0)" in warning[0]
    # A whole run: its backups are numbered above the kept one, which stays as it was.
    train(tf.distribute.get_strategy(), [BackupAndResume(backup_dir, save_freq=2, verbose=0)])
    assert {n: h for n, h in backup_files(backup_dir).items()
            if n.startswith("ckpt-3.")} == unreadable
    numbers = [read_backup(p).number for p in list_backups(backup_dir)]
    assert min(numbers) > 3 and read_backup(list_backups(backup_dir)[-1]).global_step == 27


@pytest.mark.parametrize("index", ["random_bytes", "deleted"])
def test_a_folder_with_no_readable_backup_is_refused_with_one_line(backup_dir, index):
    for number in (1, 2, 3):
        truncate(str(backup_dir / f"ckpt-{number}.{DATA}"))
    DAMAGES[index](str(backup_dir / "checkpoint"))
    before = files_of(backup_dir)
    for look in (lambda: latest_backup(backup_dir), lambda: resume(backup_dir)):
        with pytest.raises(BackupIndexError) as refused:
            look()
        message = str(refused.value)
        assert "\n" not in message
        assert str(backup_dir / "checkpoint") in message
        assert "no backup in" in message and "ckpt-1:" in message and "ckpt-3:" in message
        assert "move the folder away" in message and "nothing was deleted" in message
        assert files_of(backup_dir) == before


def test_a_valid_index_whose_backups_are_all_truncated_is_refused_with_the_reasons(backup_dir):
    for number in (1, 2, 3):
        truncate(str(backup_dir / f"ckpt-{number}.{DATA}"))
    before = files_of(backup_dir)
    with pytest.raises(BackupIndexError, match="None of the backups in .* can be read") as seen:
        latest_backup(backup_dir)
    assert str(seen.value).count("(truncated)") == 3 and "\n" not in str(seen.value)
    with pytest.warns(ResumeWarning), pytest.raises(ValueError) as refused:
        resume(backup_dir)
    message = str(refused.value)
    assert "none of the backups in" in message and message.count("(truncated)") == 3
    assert "\n" not in message and "move the folder away" in message
    assert files_of(backup_dir) == before


# ------------------------------------------------- unreadable backups, with the reason
def test_a_corrupt_newest_backup_says_why_and_the_previous_one_resumes(backup_dir):
    flip_kernel_byte(str(backup_dir / "ckpt-3"))
    before = backup_files(backup_dir)
    with pytest.warns(ResumeWarning) as warned:
        backup = assert_resumed_exactly_from(backup_dir, "ckpt-2", 4)
    why = [str(w.message) for w in warned if "could not be restored" in str(w.message)]
    assert len(why) == 1 and "ckpt-3" in why[0] and "Checksum does not match" in why[0]
    assert "{{function_node" not in why[0] and "[Op:" not in why[0]
    assert backup_files(backup_dir) == before  # the corrupt one is kept too
    assert describe_backup(backup.restored) == f"ckpt-2 (global step 4) in {backup_dir}"


def test_no_restorable_backup_is_refused_naming_each_reason(backup_dir):
    for number in (1, 2, 3):
        flip_kernel_byte(str(backup_dir / f"ckpt-{number}"))
    before = files_of(backup_dir)
    with pytest.warns(ResumeWarning), pytest.raises(ValueError) as refused:
        resume(backup_dir)
    message = str(refused.value)
    assert "\n" not in message and "none of the backups in" in message
    assert message.count("Checksum does not match") == 3
    assert "move the folder away" in message
    assert files_of(backup_dir) == before


def test_summarize_error_cuts_at_a_word_boundary():
    error = tf.errors.DataLossError(
        None, None, "{{function_node __wrapped__RestoreV2}} TensorBundle at b/ckpt-2 shard 0: "
        + "Checksum does not match " * 20 + "[Op:RestoreV2]\nsecond line")
    summary = summarize_error(error, limit=80)
    assert summary.startswith("TensorBundle at b/ckpt-2 shard 0: Checksum does not match")
    assert summary.endswith(" ...") and len(summary) <= 84
    whole = "TensorBundle at b/ckpt-2 shard 0: " + "Checksum does not match " * 20
    assert whole.startswith(summary[:-4] + " ")  # cut after a whole word


# ------------------------------------------------- interrupted writes are still cleaned
def test_an_interrupted_write_above_a_valid_index_is_cleaned(backup_dir):
    committed = backup_files(backup_dir)
    for suffix in ("index", DATA):  # a complete ckpt-4 never committed (killed before the index)
        shutil.copy(backup_dir / f"ckpt-3.{suffix}", backup_dir / f"ckpt-4.{suffix}")
    (backup_dir / "ckpt-5_temp").mkdir()  # killed while the saver wrote ckpt-5
    (backup_dir / "ckpt-5_temp" / f"part-00000-of-00001.{DATA}").write_bytes(b"partial")
    (backup_dir / "ckpt-5.index").write_bytes(b"partial")
    (backup_dir / f"ckpt-6.{DATA}.tempstate123").write_bytes(b"partial")
    (backup_dir / "checkpoint.tmp0123456789abcdef0123456789abcdef").write_text("partial")
    survey = survey_backups(backup_dir)
    assert survey.rebuilt is None and survey.next_number == 4
    assert_resumed_exactly_from(backup_dir, "ckpt-3", 6)
    assert files_of(backup_dir) == dict(committed, checkpoint=files_of(backup_dir)["checkpoint"])
    assert not (backup_dir / "ckpt-5_temp").exists()


def test_an_unreadable_file_above_a_valid_index_without_its_temp_folder_is_kept(backup_dir):
    (backup_dir / "ckpt-7.index").write_bytes(b"not a checkpoint index")
    survey = survey_backups(backup_dir)
    assert list(survey.unreadable) == ["ckpt-7"] and survey.debris == []
    assert survey.next_number == 8  # the next backup never overwrites it
    resume(backup_dir)
    assert (backup_dir / "ckpt-7.index").read_bytes() == b"not a checkpoint index"


# ------------------------------------------------- a disk that fills during a write
def mount_small_tmpfs(folder, size):
    """Mounts a tmpfs of `size` on `folder`; False when mounting is not permitted."""
    if sys.platform != "linux" or not shutil.which("mount"):
        return False
    folder.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=30)
    return done.returncode == 0


@pytest.fixture
def full_disk(tmp_path):
    """A folder on a real 320 KB tmpfs (where the machine allows mounting one),
    else None (the test then injects ENOSPC at the write)."""
    folder = tmp_path / "small"
    mounted = mount_small_tmpfs(folder, "320k")
    yield folder if mounted else None
    if mounted:
        subprocess.run(["umount", str(folder)], timeout=30, check=True)


class FullAfterTempFiles:
    """`tf.train.Checkpoint.write` that fails as TF does on a full disk: its
    `_temp` folder with a partial file is left, then ResourceExhaustedError."""

    def __init__(self, checkpoint, fail_at):
        self.checkpoint, self.fail_at = checkpoint, fail_at

    def write(self, prefix):
        if prefix.endswith(f"-{self.fail_at}"):
            os.makedirs(prefix + "_temp")
            with open(os.path.join(prefix + "_temp", f"part.{DATA}.tempstate1"), "wb") as f:
                f.write(b"partial")
            raise tf.errors.ResourceExhaustedError(
                None, None, f"{prefix}_temp/part: No space left on device [Op:SaveV2]")
        return self.checkpoint.write(prefix)


def test_a_disk_full_during_a_write_removes_the_partial_backup_and_keeps_the_last(
        tmp_path, full_disk):
    variable = tf.Variable(np.zeros(20000, np.float32))  # 80 KB a backup
    checkpoint = tf.train.Checkpoint(v=variable)
    if full_disk is not None:
        print("real full tmpfs")
        folder, writable = full_disk / "backup", checkpoint
    else:
        print("mount not permitted: ENOSPC injected after the _temp files")
        folder, writable = tmp_path / "backup", FullAfterTempFiles(checkpoint, fail_at=4)
    writer = BackupWriter(writable, folder, max_to_keep=5, is_chief=True)
    with pytest.raises(BackupWriteError) as failed:
        for number in range(1, 10):
            variable.assign(np.full(20000, number, np.float32))
            before = files_of(folder) if folder.exists() else {}
            writer.write(number)
    last = number - 1
    assert last >= 1
    message = str(failed.value)
    assert failed.value.errno == errno.ENOSPC and "\n" not in message
    assert f"could not write backup ckpt-{number} into {folder}" in message
    assert "No space left on device" in message and " free there" in message
    assert "the next backup needs about" in message and f"(the size of ckpt-{last})" in message
    assert "{{function_node" not in message
    # Its partial files are gone; the index and every earlier backup are as they were.
    assert files_of(folder) == before
    assert not (folder / f"ckpt-{number}_temp").exists()
    assert [os.path.basename(p) for p in list_backups(folder)] == [
        f"ckpt-{n}" for n in range(1, number)]
    restored = tf.Variable(np.zeros(20000, np.float32))
    tf.train.Checkpoint(v=restored).read(str(folder / f"ckpt-{last}")).assert_consumed()
    np.testing.assert_array_equal(restored.numpy(), np.full(20000, last, np.float32))


def test_a_worker_whose_temporary_directory_is_full_says_so_and_leaves_nothing(
        full_disk, monkeypatch):
    if full_disk is None:
        pytest.skip("mounting a small tmpfs is not permitted here")
    monkeypatch.setattr(tempfile, "tempdir", str(full_disk))
    variable = tf.Variable(np.zeros(200000, np.float32))  # 800 KB: more than the 320 KB there
    writer = BackupWriter(tf.train.Checkpoint(v=variable), full_disk / "unused", 2,
                          is_chief=False, worker_name="worker1")
    with pytest.raises(BackupWriteError) as failed:
        writer.write(1)
    message = str(failed.value)
    assert "\n" not in message and "temporary copy of backup 1" in message
    assert str(full_disk) in message and "free there" in message and "TMPDIR" in message
    assert os.listdir(full_disk) == []  # its partial copy is gone


# ------------------------------------------------- temporary folders of killed workers
def test_temporary_folders_of_dead_workers_are_removed_and_live_ones_kept(tmp_path,
                                                                          monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait(timeout=60)
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        names = [f"tfdist-backup-worker1-{dead.pid}-abc", f"tfdist-backup-worker1-{alive.pid}-d",
                 f"tfdist-backup-worker1-{os.getpid()}-e", f"tfdist-backup-worker10-{dead.pid}-f",
                 "tfdist-backup-worker1-g7h8"]  # another worker's; an old name without a pid
        for name in names:
            (tmp_path / name).mkdir()
            (tmp_path / name / "ckpt-1_temp").mkdir()
        writer = BackupWriter(tf.train.Checkpoint(v=tf.Variable([1.0])), tmp_path / "backup", 2,
                              is_chief=False, worker_name="worker1")
        assert sorted(os.listdir(tmp_path)) == sorted(names[1:])
        assert writer.write(1) is None
        assert sorted(os.listdir(tmp_path)) == sorted(names[1:])  # its own copy is gone too
        assert remove_stale_temporary_folders("worker10") == [str(tmp_path / names[3])]
    finally:
        alive.kill()
        alive.wait(timeout=60)
