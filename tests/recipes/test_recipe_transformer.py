"""The Transformer recipe end to end, in fresh processes, as a user runs it."""

import json
import os
import re
import socket
import subprocess
import sys
import time

import pytest
import yaml

from helpers.damage_util import damage_payload
from helpers.mw import REPO_ROOT, launch
from helpers.recipe_util import final_metric, run_recipe
from tfdist.data.tfrecord import write_token_tfrecords

SHORT = ["--epochs", "2", "--steps-per-epoch", "40", "--validation-steps", "4", "--verbose", "2"]


@pytest.mark.slow
@pytest.mark.multiworker
def test_two_workers_through_the_launcher_learn():
    # As a user runs it: nothing set about TensorFlow's logging, fresh workers (no fork).
    result = launch(["-m", "tfdist.recipes.transformer", "--strategy", "multi_worker_mirrored",
                     *SHORT], workers=2, timeout=420, env={"TF_CPP_MIN_LOG_LEVEL": None},
                    fork=False)
    assert result.returncode == 0, result.stdout[-4000:]
    lines = result.stdout.splitlines()
    tf_lines = [line for line in lines if re.match(r"^\[worker \d+\] [IWEF]\d{4} \d\d:", line)
                or "absl::InitializeLog" in line]
    assert tf_lines == [], "\n".join(tf_lines)
    worker_lines = [line for line in lines if line.startswith("[worker")]
    assert max(len(line) for line in worker_lines) <= 200, result.stdout[-4000:]
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
    (json.dumps({"cluster": {"worker": ["grpc://localhost:1", "localhost:2"]},
                 "task": {"type": "worker", "index": 0}}), "'grpc://localhost:1' is a URL"),
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


def test_flags_are_checked_without_importing_tensorflow():
    import subprocess
    import sys

    probe = ("import sys; from tfdist.recipes import transformer, cnn; "
             "assert transformer.main(['--epochs', '0']) == 2; "
             "assert transformer.main(['--strategy', 'mirorred']) == 2; "
             "assert transformer.main(['--precision', 'fp8']) == 2; "
             "assert transformer.main(['--epochs', '1', '--steps-per-epoch', '10', "
             "'--warmup-steps', '30']) == 2; "
             "assert cnn.main(['--warmup-steps', '200']) == 2; "
             "assert cnn.main(['--schedule', 'step', '--epochs', '1', '--steps-per-epoch', '10', "
             "'--warmup-steps', '8']) == 2; "
             "assert transformer.main(['--profile-steps', '2-3']) == 2; "
             "assert transformer.main(['--strategy', 'mirrored', '--all-reduce', 'ring']) == 2; "
             "print(sorted(m for m in ('tensorflow', 'keras') if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "[]"
    errors = result.stderr
    assert "Unknown strategy 'mirorred'. Valid names: auto, default" in errors
    assert "Unknown precision 'fp8'" in errors
    # 30 warmup steps set against a 10-step run (the recipe's default would be
    # cut to fit), and the CNN's embedded 4096 examples / 128 = 32 steps x 4
    # epochs against 200 warmup steps.
    assert "--warmup-steps 30 is not shorter than the run, which has 10 optimizer step(s)" in errors
    assert "--warmup-steps 200 is not shorter than the run, which has 128 optimizer step(s)" in errors
    assert ("--schedule step needs at least 4 optimizer steps after the warmup (--warmup-steps "
            "8), but the run has 10 in all: use --warmup-steps 6 or fewer") in errors
    assert "--profile-steps 2-3 writes into MODEL_DIR/tensorboard: add --model-dir" in errors
    assert "all_reduce='ring' is not valid for mirrored" in errors


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
                 "--dataset", "--model-dir", "--config", "--grad-accum-steps", "--clip-norm",
                 "--skip-corrupt-records"):
        assert flag in result.stdout


def _children(pid):
    with open(f"/proc/{pid}/task/{pid}/children") as listing:
        return [int(child) for child in listing.read().split()]


@pytest.mark.slow
@pytest.mark.multiworker
def test_killing_one_worker_stops_the_job_with_an_error_instead_of_hanging():
    import os
    import signal
    import subprocess
    import sys
    import threading
    import time

    from helpers.mw import REPO_ROOT, forked_workers

    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1")
    env.pop("TF_CONFIG", None)
    worker, env = forked_workers([sys.executable, "-m", "tfdist.recipes.transformer", "--strategy",
                                  "multi_worker_mirrored", "--epochs", "100", "--verbose", "2"], env)
    launcher = subprocess.Popen(
        [sys.executable, "-m", "tfdist.launch", "--workers", "2", "--grace-period", "2",
         "--timeout", "600", "--", *worker],
        cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    reader = threading.Thread(target=lambda: lines.extend(launcher.stdout), daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 240
        while not any("Epoch 1/100" in line or "tfdist run" in line for line in lines):
            assert launcher.poll() is None, "".join(lines)[-3000:]
            assert time.monotonic() < deadline, "training never started:\n" + "".join(lines)[-3000:]
            time.sleep(0.5)
        time.sleep(5)  # let the workers enter their training loop
        workers = _children(launcher.pid)
        assert len(workers) == 2
        killed_at = time.monotonic()
        os.kill(workers[1], signal.SIGKILL)
        code = launcher.wait(timeout=60)
        stopped_after = time.monotonic() - killed_at
    finally:
        if launcher.poll() is None:
            launcher.kill()
    reader.join(timeout=10)
    output = "".join(lines)
    assert code != 0
    assert "worker 1" in output and "SIGKILL" in output, output[-3000:]
    assert stopped_after < 60
    for pid in workers:  # no orphan keeps training
        assert process_gone(pid)


def process_gone(pid):
    """True when `pid` has exited (a zombie not yet reaped counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rpartition(")")[2].split()[0] == "Z"
    except (FileNotFoundError, ProcessLookupError):  # reaped, also between open and read
        return True


@pytest.mark.slow
def test_a_relaunched_run_resumes_from_its_backup(tmp_path):
    common = ["--strategy", "mirrored", "--devices", "2", "--steps-per-epoch", "20",
              "--warmup-steps", "5", "--verbose", "2", "--model-dir", str(tmp_path),
              "--backup-every", "15"]
    first = run_recipe("transformer", [*common, "--epochs", "1"])
    assert first.returncode == 0, first.stdout[-3000:]
    assert "resuming" not in first.stdout
    second = run_recipe("transformer", [*common, "--epochs", "2"])
    assert second.returncode == 0, second.stdout[-3000:]
    assert "at epoch 1 step 0 (global step 20" in second.stdout
    rows = (tmp_path / "training_log.csv").read_text().strip().splitlines()
    assert len(rows) == 1 + 2  # header, epoch 1 from the first run, epoch 2 appended


def write_text_corpus(folder, files, lines_per_file, seed):
    """Plain text files of random 12-word lines from a 14-word vocabulary."""
    import random

    rng = random.Random(seed)
    words = "the quick brown fox jumps over lazy dog and cat runs far away home".split()
    folder.mkdir()
    for i in range(files):
        with open(folder / f"part{i}.txt", "w") as f:
            for _ in range(lines_per_file):
                f.write(" ".join(rng.choice(words) for _ in range(12)) + "\n")
    return f"text:{folder}/*.txt"


def test_text_data_with_a_validation_dataset_reports_falling_validation_loss(tmp_path):
    train = write_text_corpus(tmp_path / "train", 3, 400, seed=0)
    valid = write_text_corpus(tmp_path / "valid", 1, 200, seed=1)
    result = run_recipe("transformer", [
        "--dataset", train, "--validation-dataset", valid, "--sequence-length", "32",
        "--global-batch-size", "16", "--epochs", "2", "--steps-per-epoch", "10",
        "--warmup-steps", "2", "--validation-steps", "3", "--verbose", "3"])
    assert result.returncode == 0, result.stdout[-4000:]
    first, last = final_metric(result.stdout, "val_loss")
    assert last < first
    # --verbose 3 says how each input pipeline is sharded: the validation one
    # reads the other folder's single file.
    assert "reads 1 of 1 files" in result.stdout


def test_validation_dataset_with_another_vocabulary_exits_2_naming_both(tmp_path):
    train = write_text_corpus(tmp_path / "train", 1, 50, seed=0)
    result = run_recipe("transformer", ["--dataset", train, "--validation-dataset", "embedded",
                                        "--sequence-length", "32"], timeout=120)
    assert result.returncode == 2, result.stdout[-3000:]
    assert "--validation-dataset 'embedded' has a vocabulary of" in result.stdout
    assert "has 260" in result.stdout
    assert "Traceback" not in result.stdout


def test_validation_text_reuses_a_built_training_vocabulary(tmp_path):
    import argparse

    from tfdist.data import make_source
    from tfdist.recipes.transformer import validation_source

    train_spec = write_text_corpus(tmp_path / "train", 1, 50, seed=0)
    valid_spec = write_text_corpus(tmp_path / "valid", 1, 20, seed=1)
    train = make_source(train_spec, sequence_length=16, vocabulary="build")
    config = argparse.Namespace(dataset=train_spec, seed=0, global_batch_size=8)
    validation = validation_source(valid_spec, train, config)
    assert validation.vocabulary is train.vocabulary
    assert (validation.vocab_size, validation.sequence_length) == (train.vocab_size, 16)
    assert train.vocab_size < 260  # a built vocabulary: only the bytes of the corpus


def test_a_port_in_use_fails_at_once_naming_it_and_the_process_holding_it():
    with socket.socket() as held, socket.socket() as other:
        held.bind(("127.0.0.1", 0))
        held.listen()
        other.bind(("127.0.0.1", 0))
        port, peer = held.getsockname()[1], other.getsockname()[1]
        other.close()
        tf_config = {"cluster": {"worker": [f"127.0.0.1:{port}", f"127.0.0.1:{peer}"]},
                     "task": {"type": "worker", "index": 0}}
        started = time.monotonic()
        result = run_recipe("transformer", ["--strategy", "multi_worker_mirrored"], timeout=120,
                            env={"TF_CONFIG": json.dumps(tf_config),
                                 "TFDIST_STARTUP_TIMEOUT": "300"})
        elapsed = time.monotonic() - started
    assert result.returncode == 2, result.stdout[-3000:]
    # Not the 300 s start-up deadline: TensorFlow's import is most of it.
    assert elapsed < 60, elapsed
    assert (f"error: PortInUseError: worker 0 at 127.0.0.1:{port} (TF_CONFIG) cannot start its "
            f"server: port {port} is already in use by pid {os.getpid()} (") in result.stdout
    assert "Stop that process, or give this task a free port" in result.stdout
    assert "Traceback" not in result.stdout and "waiting" not in result.stdout


@pytest.mark.multiworker
def test_a_cluster_that_does_not_form_exits_141_so_cluster_managers_retry(tmp_path):
    """A missing peer is not a bad input (exit 2, which Kubeflow's ExitCode policy
    and a SLURM requeue treat as final) but a broken cluster: 141, retried."""
    ports = []
    for _ in range(2):
        with socket.socket() as free:
            free.bind(("127.0.0.1", 0))
            ports.append(free.getsockname()[1])
    tf_config = {"cluster": {"worker": [f"127.0.0.1:{p}" for p in ports]},
                 "task": {"type": "worker", "index": 0}}
    result = run_recipe("transformer", ["--strategy", "multi_worker_mirrored", "--model-dir",
                                        str(tmp_path / "run")], timeout=150,
                        env={"TF_CONFIG": json.dumps(tf_config), "TFDIST_STARTUP_TIMEOUT": "5"})
    assert result.returncode == 141, result.stdout[-3000:]
    assert "the cluster did not form (StrategyStartupError: multi_worker_mirrored failed" in (
        result.stdout)
    assert f"never arrived: worker 1 at 127.0.0.1:{ports[1]}" in result.stdout
    assert "Traceback" not in result.stdout


@pytest.mark.multiworker
def test_a_worker_lost_during_training_makes_the_other_exit_141_naming_the_backup(tmp_path):
    """Without a launcher (a TFJob, a SLURM step), the surviving worker must not
    die with a traceback and exit 1 (final for cluster managers) but exit 141."""
    ports = []
    for _ in range(2):
        with socket.socket() as free:
            free.bind(("127.0.0.1", 0))
            ports.append(free.getsockname()[1])
    workers = []
    for index in (0, 1):
        env = dict(os.environ, PYTHONPATH=REPO_ROOT, TF_CPP_MIN_LOG_LEVEL="3",
                   TF_CONFIG=json.dumps({"cluster": {"worker": [f"127.0.0.1:{p}" for p in ports]},
                                         "task": {"type": "worker", "index": index}}))
        workers.append(subprocess.Popen(
            [sys.executable, "-m", "tfdist.recipes.transformer", "--strategy",
             "multi_worker_mirrored", "--model-dir", str(tmp_path / "run"), "--epochs", "50",
             "--verbose", "2"], cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True))
    survivor, lost = workers
    try:
        seen = ""
        deadline = time.monotonic() + 240
        while "Epoch 2/" not in seen and time.monotonic() < deadline:
            line = survivor.stdout.readline()
            if not line:
                break
            seen += line
        assert "Epoch 2/" in seen, seen[-3000:]
        lost.kill()
        output, _ = survivor.communicate(timeout=240)
    finally:
        for worker in workers:
            if worker.poll() is None:
                worker.kill()
            worker.communicate()
    assert survivor.returncode == 141, (seen + output)[-3000:]
    assert "a peer was lost (" in output
    assert f"resume from the last backup in {tmp_path / 'run' / 'backup'}" in output
    assert "Traceback" not in output


def token_tfrecords(tmp_path):
    """4 files of 100 token records (33 tokens each); record 30 of the third file damaged."""
    sequences = [[1] + [4 + (i * 7 + j) % 16 for j in range(31)] + [3] for i in range(400)]
    paths = write_token_tfrecords(sequences, str(tmp_path / "tok"), num_files=4)
    return paths, damage_payload(paths[2], 30)


TFRECORD_RUN = ["--sequence-length", "32", "--steps-per-epoch", "4", "--epochs", "1",
                "--warmup-steps", "0", "--global-batch-size", "16", "--verbose", "2"]


def test_a_corrupt_tfrecord_exits_2_naming_the_file_and_the_record(tmp_path):
    paths, offset = token_tfrecords(tmp_path)
    result = run_recipe("transformer", ["--dataset", f"tfrecord:{tmp_path}/tok-*", *TFRECORD_RUN],
                        timeout=180)
    assert result.returncode == 2, result.stdout[-3000:]
    assert (f"error: CorruptDataError: Corrupt TFRecord data: {paths[2]}: record 30 (starts at "
            f"byte {offset} of ") in result.stdout
    assert f"'corrupted record at {offset + 12}'" in result.stdout
    assert "--skip-corrupt-records" in result.stdout
    assert "Traceback" not in result.stdout and "DataLossError" not in result.stdout


def test_skip_corrupt_records_trains_and_counts_what_it_skipped(tmp_path):
    paths, offset = token_tfrecords(tmp_path)
    size = os.path.getsize(paths[2])
    result = run_recipe("transformer", ["--dataset", f"tfrecord:{tmp_path}/tok-*", *TFRECORD_RUN,
                                        "--skip-corrupt-records"], timeout=180)
    assert result.returncode == 0, result.stdout[-3000:]
    lines = result.stdout.splitlines()
    assert f"Skipping the rest of {paths[2]} from record 30 (starts at byte {offset} of {size})" \
        in result.stdout
    assert lines[-1].startswith(
        f"Corrupt TFRecord data skipped (--skip-corrupt-records): 1 damaged file, "
        f"{size - offset} bytes not read: {paths[2]}: record 30 (starts at byte {offset} of "
        f"{size}) and the rest of the file"), lines[-1]


def test_skip_corrupt_records_without_tfrecord_data_exits_2_before_tensorflow():
    result = run_recipe("transformer", ["--skip-corrupt-records"], timeout=60)
    assert result.returncode == 2
    assert "--skip-corrupt-records applies to TFRecord data" in result.stdout
    assert "'embedded:reverse'" in result.stdout


def test_a_short_run_says_how_many_passes_it_repeats_and_how_it_cut_the_default_warmup(
        tmp_path):
    """--steps-per-epoch beyond one pass repeats the data inside the epoch: said
    once. The recipe's default warmup (30 steps), not shorter than this 10-step
    run, is cut to a tenth of it, and the header says so."""
    paths = write_token_tfrecords([[1] + [4 + j % 16 for j in range(31)] + [3]] * 40,
                                  str(tmp_path / "tok"), num_files=1)
    args = ["--dataset", f"tfrecord:{paths[0]}", "--sequence-length", "32", "--steps-per-epoch",
            "10", "--epochs", "1", "--global-batch-size", "16", "--verbose", "2",
            "--model-dir", str(tmp_path / "run")]
    result = run_recipe("transformer", args, timeout=180)
    assert result.returncode == 0, result.stdout[-3000:]
    reason = "the recipe's default 30, cut to fit this 10-step run"
    assert f"cosine schedule, 1 warmup step ({reason})" in result.stdout, result.stdout[-3000:]
    record = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    assert (record["options"]["warmup_steps"], record["resolved"]["warmup_steps"]) == (1, reason)
    said = [line for line in result.stdout.splitlines() if "passes over the" in line]
    assert len(said) == 1, result.stdout[-3000:]
    assert "--steps-per-epoch 10 x global batch 16 = 160 examples per epoch, 4" in said[0]
    assert "over the 40 training examples" in said[0]
