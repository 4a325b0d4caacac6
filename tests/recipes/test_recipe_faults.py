"""The recipe runner's faults as an operator meets them: one run owns a model dir
(a lock naming the holder), a stray TF_CONFIG does not silence a single-machine
run, a refused resume keeps the record of the run that wrote the backups, every
environment fault is one line with a documented exit code, a lost ps task is
retryable (141), a stop signal after the last step ends the run normally, and
the exit codes are unique."""

import errno
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time

import pytest
import yaml

from helpers.recipe_util import REPO_ROOT, run_recipe
from tfdist.recipes.config import ConfigError
from tfdist.runtime import exit_codes
from tfdist.recipes.record import history_entries
from tfdist.recipes.recipe_runner import _known_fault
from tfdist.recipes.run_report import error_summary, outputs_block
from tfdist.runtime.run_lock import LOCK_FILE, ModelDirInUseError, acquire

PROG = "python -m tfdist.recipes.transformer"
# One epoch of 6 steps on one device, pinned settings: the cheapest real run.
TINY = ["--strategy", "one_device", "--epochs", "1", "--steps-per-epoch", "6",
        "--validation-steps", "1", "--warmup-steps", "0", "--precision", "float32",
        "--xla", "off", "--verbose", "2"]
STRAY_TF_CONFIG = json.dumps({"cluster": {"worker": ["127.0.0.1:1", "127.0.0.1:2"]},
                              "task": {"type": "worker", "index": 1}})


def no_traceback(out):
    assert "Traceback" not in out, out[-3000:]


# --- the exit-code table ------------------------------------------------------------------

def test_the_exit_codes_are_unique_and_preemption_is_143():
    # docs/fault-tolerance.md shows exit_codes.render_table(): tests/docs/test_generated_tables.py
    codes = [row.code for row in exit_codes.TABLE]
    assert len(codes) == len(set(codes))
    from tfdist.runtime.stop_signals import PREEMPTED_EXIT_CODE

    assert PREEMPTED_EXIT_CODE == exit_codes.PREEMPTED == 143


def test_each_fault_gets_its_documented_code_and_one_line(tmp_path):
    import tensorflow as tf

    from tfdist.distribute.tf_config import StrategyStartupError
    from tfdist.training.ps_loop import ParameterServerLostError

    where = {"model_dir": str(tmp_path / "m"), "backup_dir": str(tmp_path / "m" / "backup")}
    lost_text = ("Parameter-server training stopped: a ps task (ps 0) was lost (UnavailableError: "
                 + "failed to connect to all addresses " * 12 + ").")
    cases = [
        (ParameterServerLostError(lost_text), exit_codes.CLUSTER_LOST,
         r"a parameter-server task was lost \(ParameterServerLostError: Parameter-server .*…\); "
         r"run the same command again \(a cluster manager retries exit 141\); no backup in "),
        (StrategyStartupError("worker 1 at 127.0.0.1:2 did not come"), exit_codes.CLUSTER_LOST,
         r"the cluster did not form \(StrategyStartupError: worker 1 at 127\.0\.0\.1:2 did not "
         r"come\)"),
        (tf.errors.UnavailableError(None, None, "Connection reset by peer"),
         exit_codes.CLUSTER_LOST, r"a peer was lost \(UnavailableError: Connection reset by peer\)"),
        (OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "m" / "config.yaml")),
         exit_codes.BAD_INPUT, r"error: cannot write .*config\.yaml: No space left on device\. "
                               r"The disk is full"),
        (tf.errors.ResourceExhaustedError(None, None, "m/backup/ckpt-3_temp/part-0; No space left "
                                                      "on device [Op:SaveV2]"),
         exit_codes.BAD_INPUT, r"error: cannot write: m/backup/ckpt-3_temp/part-0; No space left "
                               r"on device \[Op:SaveV2\]\. The disk is full"),
        (PermissionError(errno.EROFS, "Read-only file system", "/ro/m/.tfdist.lock"),
         exit_codes.BAD_INPUT, r"cannot write /ro/m/\.tfdist\.lock: Read-only file system\. The "
                               r"folder is read-only"),
        (FileExistsError(errno.EEXIST, "File exists", "notes.txt"), exit_codes.BAD_INPUT,
         r"cannot write notes\.txt: File exists\. A file is in the way"),
        (ModelDirInUseError("the model dir m is in use by another run"), exit_codes.BAD_INPUT,
         r"error: ModelDirInUseError: the model dir m is in use"),
        (ValueError("--epochs must be positive"), exit_codes.BAD_INPUT,
         r"error: ValueError: --epochs must be positive"),
        (ConfigError("--validation-steps 5: this run has no validation data"), exit_codes.BAD_INPUT,
         r"error: --validation-steps 5: this run has no validation data$"),
    ]
    for error, code, pattern in cases:
        got, line = _known_fault(PROG, error, dict(where))
        assert got == code, (error, line)
        assert line.startswith(f"{PROG}: ") and "\n" not in line, line
        assert re.search(pattern, line), line
    with pytest.raises(KeyError):
        _known_fault(PROG, KeyError("a bug"), dict(where))  # not a known fault: a traceback


@pytest.mark.parametrize("value, raised", [("1", True), ("yes", True), ("0", False),
                                           ("off", False), ("", False), (None, False)])
def test_tfdist_traceback_raises_a_known_fault_only_when_it_says_so(monkeypatch, tmp_path, value,
                                                                     raised):
    """TFDIST_TRACEBACK=0 used to raise as well: any value did."""
    if value is None:
        monkeypatch.delenv("TFDIST_TRACEBACK", raising=False)
    else:
        monkeypatch.setenv("TFDIST_TRACEBACK", value)
    error = ValueError("--epochs must be positive")
    where = {"model_dir": str(tmp_path / "m"), "backup_dir": None}
    if raised:
        with pytest.raises(ValueError, match="--epochs must be positive"):
            _known_fault(PROG, error, where)
    else:
        assert _known_fault(PROG, error, where)[0] == exit_codes.BAD_INPUT


def test_rerun_lines_name_the_backup_a_rerun_resumes_from(tmp_path):
    import keras
    import numpy as np
    import tensorflow as tf

    from tfdist.callbacks import BackupAndResume
    from tfdist.runtime.stop_signals import Preempted
    from tfdist.recipes.run_report import preempted_line

    backup_dir = str(tmp_path / "m" / "backup")
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    x = np.ones((16, 4), "float32")
    model.fit(x, x[:, :1], batch_size=8, epochs=1, verbose=0,
              callbacks=[BackupAndResume(backup_dir, verbose=0)])
    where = {"model_dir": str(tmp_path / "m"), "backup_dir": backup_dir}
    _, lost = _known_fault(PROG, tf.errors.UnavailableError(None, None, "Socket closed"), where)
    assert lost.endswith(f"to resume from the last backup in {backup_dir} (ckpt-1, global step "
                         "2)."), lost
    _, full = _known_fault(PROG, OSError(errno.ENOSPC, "No space left on device"), where)
    assert full.endswith(f"A rerun then resumes from ckpt-1 (global step 2) in {backup_dir}."), full
    stop = Preempted("SIGTERM in epoch 1 after step 1", signal_name="SIGTERM")
    assert preempted_line(stop, where) == (
        "Stopped by SIGTERM in epoch 1 after step 1: no backup could be written (the loss was "
        f"not finite); rerunning resumes from the last backup, ckpt-1 (global step 2) in "
        f"{backup_dir}.")


def test_a_tensor_that_does_not_fit_is_one_line_naming_it_and_the_flags_that_shrink_a_step(
        tmp_path, monkeypatch):
    import tensorflow as tf

    monkeypatch.delenv("TF_CPU_BFC_MEM_LIMIT_IN_MB", raising=False)
    where = {"model_dir": str(tmp_path / "m"), "backup_dir": None,
             "batch": (256, 2, "float32")}
    eager = tf.errors.ResourceExhaustedError(None, None, (
        "{{function_node __wrapped__MatMul_device_/job:localhost/replica:0/task:0/device:GPU:0}} "
        "OOM when allocating tensor with shape[256,128,8000] and type float on "
        "/job:localhost/replica:0/task:0/device:GPU:0 by allocator GPU_0_bfc [Op:MatMul]"))
    code, line = _known_fault(PROG, eager, dict(where))
    assert code == exit_codes.BAD_INPUT and "\n" not in line
    full = str(tmp_path / "m" / "errors")
    assert re.fullmatch(
        rf"{re.escape(PROG)}: error: out of memory on GPU:0: a float tensor of shape "
        r"\[256, 128, 8000\] did not fit \(allocator GPU_0_bfc\)\. Lower --global-batch-size "
        r"\(now 256\), or keep it with --grad-accum-steps 4 \(micro-batches half as large\), or "
        r"train in mixed precision \(--precision mixed_bfloat16; now float32\)\. Full error: "
        rf"{re.escape(full)}/\S+\.txt", line), line
    assert "OOM when allocating" in open(line.rsplit(" ", 1)[1]).read()
    # A compiled step names only the size; a mixed-precision run is not told to use one.
    graph = tf.errors.ResourceExhaustedError(None, None, (
        "Graph execution error:\n\nDetected at node while/cond_1/StatefulPartitionedCall "
        "defined at (most recent call last):\n...\nOut of memory while trying to allocate "
        "31.03MiB.\n\t [[{{node while/cond_1/StatefulPartitionedCall}}]]"))
    _, line = _known_fault(PROG, graph, dict(where, batch=(64, 1, "mixed_bfloat16")))
    assert line.startswith(f"{PROG}: error: out of memory while allocating 31.03MiB in a step. "
                           "Lower --global-batch-size (now 64), or keep it with "
                           "--grad-accum-steps 2 (micro-batches half as large). Full error: "), line
    # A full disk is also a ResourceExhaustedError (SaveV2): still the disk's line.
    disk = tf.errors.ResourceExhaustedError(None, None, "ckpt-3_temp/part-0; No space left on "
                                                        "device [Op:SaveV2]")
    assert "The disk is full" in _known_fault(PROG, disk, dict(where))[1]


def test_a_pool_limit_tensorflow_cannot_use_is_refused_before_tensorflow(tmp_path):
    """With TensorFlow's CPU memory pool on, `lots` crashed the run at its first tensor (a
    segmentation fault). A real out-of-memory run is not started here: TensorFlow's pool
    retries each failed allocation for seconds before it raises (30 s for the tiny
    Transformer in an 8 MiB pool); the line it gets is checked above, from TensorFlow's
    own error and text."""
    result = subprocess.run(
        [sys.executable, "-m", "tfdist.recipes.transformer", *TINY, "--model-dir",
         str(tmp_path / "refused")], cwd=REPO_ROOT, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, timeout=120,
        env=dict(os.environ, TF_CPU_BFC_MEM_LIMIT_IN_MB="lots", TF_CPU_ALLOCATOR_USE_BFC="true",
                 PYTHONPATH=str(REPO_ROOT)))
    assert result.returncode == exit_codes.BAD_INPUT, result.stdout[-3000:]
    (line,) = result.stdout.splitlines()  # nothing before it: TensorFlow did not start
    assert line.startswith(f"{PROG}: error: $TF_CPU_BFC_MEM_LIMIT_IN_MB='lots' is not a whole "
                           "number of MiB > 0 "), line
    assert not (tmp_path / "refused").exists()


def test_a_long_tensorflow_error_is_cut_at_a_word_and_kept_whole_in_a_file(tmp_path):
    assert error_summary("Graph execution error:\n\nshort one\nsecond") == "short one"
    text = "Socket closed by the peer while the collective waited " * 10
    summary = error_summary(text)
    assert summary.endswith("…") and len(summary) <= 201 and text.startswith(summary[:-1])
    assert text[len(summary) - 1] == " "  # cut before a space, not inside a word
    import tensorflow as tf

    where = {"model_dir": str(tmp_path / "m"), "backup_dir": None}
    _, line = _known_fault(PROG, tf.errors.AbortedError(None, None, text), where)
    full = re.search(r"Full error: (\S+)$", line).group(1)
    assert full.startswith(str(tmp_path / "m" / "errors")) and text in open(full).read()


def test_single_machine_strategies_are_the_chief_whatever_tf_config_says(monkeypatch):
    from tfdist.distribute.strategy_factory import create_strategy
    from tfdist.distribute.introspection import describe_strategy, task_info

    monkeypatch.setenv("TF_CONFIG", STRAY_TF_CONFIG)
    assert task_info() == ("worker", 1, False)  # no strategy: TF_CONFIG's rule
    strategy = create_strategy("one_device")
    assert task_info(strategy) == (None, 0, True) and describe_strategy(strategy).is_chief
    with strategy.scope():
        assert task_info() == (None, 0, True)  # what callbacks see inside the run


def test_the_outputs_block_lists_only_what_is_there(tmp_path):
    (tmp_path / "config.yaml").write_text("options: {}\n")
    (tmp_path / "training_log.csv").write_text("epoch\n")
    block, missing = outputs_block(str(tmp_path), str(tmp_path / "backup"), None)
    assert missing == ["tensorboard/", "checkpoints/", "a backup"]
    assert "config.yaml" in block and "training_log.csv" in block
    assert "tensorboard" not in block and "checkpoints" not in block and "backups" not in block


# --- the lock -----------------------------------------------------------------------------

HOLDER = ("import sys, time; from tfdist.runtime.run_lock import acquire; "
          "acquire(sys.argv[1], command='holder --model-dir ' + sys.argv[1]); "
          "print('locked', flush=True); time.sleep(120)")


def test_a_second_run_on_a_model_dir_exits_2_at_once_naming_the_holder(tmp_path):
    model_dir = tmp_path / "m"
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(model_dir)], cwd=REPO_ROOT,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        started = time.monotonic()
        result = run_recipe("transformer", [*TINY, "--model-dir", str(model_dir)], timeout=60)
        elapsed = time.monotonic() - started
        out = result.stdout
        assert result.returncode == exit_codes.BAD_INPUT, out[-3000:]
        no_traceback(out)
        lines = [line for line in out.splitlines() if "ModelDirInUseError" in line]
        assert len(lines) == 1, out
        assert (f"the model dir {model_dir} is in use by another run (pid {holder.pid} on "
                f"{os.uname().nodename}, started ") in lines[0]
        assert f"holder --model-dir {model_dir}; lock {model_dir / LOCK_FILE})" in lines[0]
        assert "use another --model-dir" in lines[0]
        assert "tfdist run" not in out and elapsed < 20  # refused before TensorFlow started
        assert os.listdir(model_dir) == [LOCK_FILE]  # nothing else was written
    finally:
        holder.kill()  # SIGKILL: the kernel releases the lock, which is never stale
        holder.wait(timeout=30)
    lock = acquire(str(model_dir), command="next run")
    try:
        assert json.loads((model_dir / LOCK_FILE).read_text())["command"] == "next run"
        with pytest.raises(ModelDirInUseError):  # a second open file of this process is refused too
            acquire(str(model_dir), command="again")
    finally:
        lock.release()


# --- environment faults before TensorFlow ---------------------------------------------------

def test_a_model_dir_that_is_a_file_or_under_one_exits_2_with_one_line(tmp_path):
    notes = tmp_path / "notes.txt"
    notes.write_text("mine\n")
    for model_dir, fragment in ((notes, f"--model-dir {notes} is a file, not a folder"),
                                (notes / "run", f"--model-dir {notes / 'run'}: {notes} is a "
                                                "file, not a folder")):
        result = run_recipe("transformer", [*TINY, "--model-dir", str(model_dir)], timeout=60)
        assert result.returncode == exit_codes.BAD_INPUT, result.stdout[-3000:]
        no_traceback(result.stdout)
        assert f"{PROG}: error: {fragment}" in result.stdout, result.stdout
    assert notes.read_text() == "mine\n"


def test_a_file_where_the_run_keeps_its_backups_exits_2_naming_it_and_keeps_the_file(tmp_path):
    """It was a TensorFlow traceback (FailedPreconditionError) at the first backup."""
    (tmp_path / "backup").write_text("mine\n")
    result = run_recipe("transformer", [*TINY, "--model-dir", str(tmp_path)], timeout=60)
    assert result.returncode == exit_codes.BAD_INPUT, result.stdout[-3000:]
    no_traceback(result.stdout)
    assert (f"{PROG}: error: --model-dir {tmp_path}: {tmp_path / 'backup'} is a file, but the run "
            "keeps a folder of that name there (backup/); move the file away or name another "
            "--model-dir.") in result.stdout, result.stdout[-3000:]
    assert (tmp_path / "backup").read_text() == "mine\n"


@pytest.mark.parametrize("name, make", [
    ("backup", "file"), ("checkpoints", "file"), ("tensorboard", "file"), ("runs", "file"),
    ("errors", "file"), ("config.yaml", "folder"), ("training_log.csv", "folder")])
def test_each_entry_of_the_model_dir_in_the_way_is_refused_before_tensorflow(tmp_path, name, make):
    import argparse

    from tfdist.recipes.config import ConfigError
    from tfdist.recipes.preflight import check_output_folders

    if make == "file":
        (tmp_path / name).write_text("x")
    else:
        (tmp_path / name).mkdir()
    config = argparse.Namespace(model_dir=str(tmp_path), backup_dir=None)
    with pytest.raises(ConfigError, match=rf"{re.escape(str(tmp_path / name))} is a {make}, but "):
        check_output_folders(config)
    if name == "backup":  # backups kept elsewhere: the file is not in the way
        check_output_folders(argparse.Namespace(model_dir=str(tmp_path),
                                                backup_dir=str(tmp_path / "elsewhere")))


def test_a_model_dir_that_cannot_be_created_exits_2_with_one_line_naming_the_flag():
    """/proc takes no new folder, whoever asks (the kernel's ENOENT)."""
    result = run_recipe("transformer", [*TINY, "--model-dir", "/proc/tfdist-run"], timeout=60)
    assert result.returncode == exit_codes.BAD_INPUT, result.stdout[-3000:]
    no_traceback(result.stdout)
    assert (f"{PROG}: error: --model-dir /proc/tfdist-run: the folder cannot be created there "
            "(No such file or directory): name a folder on a disk this user can write to."
            ) in result.stdout, result.stdout[-3000:]


def in_private_mounts(script, *command, timeout=300):
    """Runs `sh -c script sh command...` as root of a new user and mount namespace
    (no real root needed), where it can mount tmpfs; stdout and stderr merged."""
    if shutil.which("unshare") is None or subprocess.run(
            ["unshare", "-rm", "true"], capture_output=True).returncode != 0:
        pytest.skip("no user namespaces here to mount a small or read-only file system")
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1")
    env.pop("TF_CONFIG", None)
    return subprocess.run(["unshare", "-rm", "sh", "-c", script, "sh", *command], cwd=REPO_ROOT,
                          env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          timeout=timeout)


@pytest.mark.slow
def test_a_read_only_or_full_disk_is_one_line_and_exit_2(tmp_path):
    """A read-only tmpfs (refused before TensorFlow) and a 3 MB one that fills at the
    first backup (the tiny Transformer's backup with AdamW needs ~5 MB)."""
    read_only, small = tmp_path / "ro", tmp_path / "small"
    read_only.mkdir()
    small.mkdir()
    recipe = [sys.executable, "-m", "tfdist.recipes.transformer", *TINY]
    result = in_private_mounts(f'mount -t tmpfs -o ro,size=1m tmpfs "{read_only}" && exec "$@"',
                               *recipe, "--model-dir", str(read_only / "run"))
    assert result.returncode == exit_codes.BAD_INPUT, result.stdout[-3000:]
    no_traceback(result.stdout)
    assert (f"{PROG}: error: cannot write {read_only / 'run'}: Read-only file system. The "
            "folder is read-only") in result.stdout, result.stdout

    # The file system exists only in the namespace: its files are listed before it goes.
    result = in_private_mounts(
        f'mount -t tmpfs -o size=3m tmpfs "{small}" || exit 99; "$@"; code=$?; '
        f'echo "--- files"; cd "{small}/run" && find . -type f | sort; exit $code',
        *recipe, "--backup-every", "3", "--model-dir", str(small / "run"))
    out, files = result.stdout.split("--- files\n")
    assert result.returncode == exit_codes.BAD_INPUT, out[-3000:]
    no_traceback(out)
    errors = [line for line in out.splitlines() if line.startswith(f"{PROG}: error:")]
    assert len(errors) == 1 and "No space left on device" in errors[0], out[-3000:]
    assert "_temp" not in files and "ckpt-1." not in files, files  # no partial backup left
    assert "./config.yaml" in files.split() and "./.tfdist.lock" in files.split(), files
    [entry] = [name for name in files.split() if name.startswith("./runs/")]
    assert re.fullmatch(r"\./runs/001-\d{8}-\d{6}\.yaml", entry), files


# --- a stray TF_CONFIG, the record and a refused resume --------------------------------------

@pytest.mark.slow
def test_a_stray_tf_config_is_ignored_and_a_refused_resume_keeps_the_record(tmp_path):
    model_dir = tmp_path / "m"
    first = run_recipe("transformer", [*TINY, "--model-dir", str(model_dir)],
                       env={"TF_CONFIG": STRAY_TF_CONFIG})
    out = first.stdout
    assert first.returncode == 0, out[-3000:]
    warnings = [line for line in out.splitlines() if "TF_CONFIG" in line]
    assert warnings == [
        "TF_CONFIG names this process worker 1 of a 2-task cluster, but --strategy one_device "
        "trains on this machine alone: TF_CONFIG is ignored and this run trains and writes its "
        "outputs by itself. Unset TF_CONFIG, or use --strategy multi_worker_mirrored to join the "
        "cluster."], out[-3000:]
    # It wrote what it says it wrote (before the fix: config.yaml only, as a non-chief).
    for name in ("config.yaml", "training_log.csv", "tensorboard", "checkpoints/epoch_001.weights.h5",
                 "backup/ckpt-1.index"):
        assert (model_dir / name).exists(), (name, out[-3000:])
    assert f"backups            {model_dir / 'backup'} (rerun the same command to resume from " \
           "ckpt-1, global step 6)" in out
    record = (model_dir / "config.yaml").read_bytes()
    [entry] = history_entries(str(model_dir))
    assert entry["backups"] == ["ckpt-1"] and (entry["outcome"], entry["exit_code"]) == (
        "finished", 0)
    assert entry["run"]["pid"] > 0 and "--model-dir" in entry["run"]["command"]
    assert yaml.safe_load(record) == {key: entry[key] for key in ("options", "resolved")}

    # Another model on the same backups: refused (exit 2). The record of the run that
    # wrote the backups stays byte for byte; the refused run has its own history entry.
    refused = run_recipe("transformer", [*TINY, "--model-dir", str(model_dir), "--model-size",
                                         "small", "--learning-rate", "1e6"])
    out = refused.stdout
    assert refused.returncode == exit_codes.BAD_INPUT, out[-3000:]
    no_traceback(out)
    assert "does not match this model" in out, out[-3000:]
    assert "model_size: tiny -> small" in out and "learning_rate: 0.003 -> 1000000.0" in out
    assert (model_dir / "config.yaml").read_bytes() == record
    first_entry, second = history_entries(str(model_dir))
    assert first_entry == entry
    assert second["options"]["model_size"] == "small" and second["exit_code"] == 2
    assert "does not match this model" in second["outcome"] and "backups" not in second
    assert sorted(os.listdir(model_dir / "backup")) == ["checkpoint", "ckpt-1.data-00000-of-00001",
                                                        "ckpt-1.index"]


# --- a stop signal after the last training step -----------------------------------------------

def test_a_stop_signal_at_the_last_step_ends_the_run_normally():
    import keras
    import numpy as np

    from tfdist.callbacks.preemption import PreemptionGuard
    from tfdist.runtime.stop_signals import BlockedStopSignals, Preempted

    main = threading.main_thread().ident

    class SignalAt(keras.callbacks.Callback):
        """Sends SIGTERM to this thread (where it is blocked) at one step end."""

        def __init__(self, epoch, batch):
            super().__init__()
            self.at, self.epoch = (epoch, batch), None

        def on_epoch_begin(self, epoch, logs=None):
            self.epoch = epoch

        def on_train_batch_end(self, batch, logs=None):
            if (self.epoch, batch) == self.at:
                signal.pthread_kill(main, signal.SIGTERM)

    x = np.random.default_rng(0).normal(size=(32, 4)).astype("float32")
    y = x.sum(axis=1, keepdims=True)
    for at, stops in (((1, 3), False), ((1, 2), True)):  # 2 epochs x 4 steps
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
        model.compile(optimizer="sgd", loss="mse")
        signals = BlockedStopSignals.install("test", watchdog=False)
        try:
            guard = PreemptionGuard(None, signals=signals)
            epochs_seen = []
            ends = keras.callbacks.LambdaCallback(on_epoch_end=lambda e, l: epochs_seen.append(e))
            if stops:
                with pytest.raises(Preempted, match="SIGTERM in epoch 2 after step 3"):
                    model.fit(x, y, batch_size=8, epochs=2, verbose=0,
                              callbacks=[SignalAt(*at), guard, ends])
                assert epochs_seen == [0] and guard.signal_after_last_step is None
            else:
                model.fit(x, y, batch_size=8, epochs=2, verbose=0,
                          callbacks=[SignalAt(*at), guard, ends])
                assert epochs_seen == [0, 1] and guard.signal_after_last_step == "SIGTERM"
        finally:
            assert signals.pending() == "SIGTERM"  # taken, so unblocking delivers nothing
            signals.close()


def test_validation_steps_without_validation_data_exits_2_naming_the_flag(tmp_path):
    text = tmp_path / "train.txt"
    text.write_text("a few words of training text\n" * 100)
    result = run_recipe("transformer", ["--dataset", f"text:{text}", "--sequence-length", "16",
                                        "--validation-steps", "5", "--epochs", "1",
                                        "--steps-per-epoch", "2", "--warmup-steps", "0",
                                        "--model-dir", str(tmp_path / "m")], timeout=180)
    assert result.returncode == exit_codes.BAD_INPUT, result.stdout[-3000:]
    assert (f"error: --validation-steps 5: this run has no validation data (--dataset text:{text} "
            "brings none): give --validation-dataset, or drop the flag.") in result.stdout
    assert "Traceback" not in result.stdout
