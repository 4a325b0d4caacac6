"""Preemption and restarts, with real processes and signals (as TensorFlow's own
failure_handling tests do): SIGTERM/SIGINT at a random step make every worker
back up at one step and exit 143; rerunning ends with the weights of an
uninterrupted run, to the bit, dropout included. Before the first step a
signal stops at once."""

import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from helpers.recipe_util import REPO_ROOT
from helpers.compare import assert_same_final_checkpoint
from helpers.mw import with_forked_workers
from helpers.zygote import forked_command
from helpers.processes import finish, newest_backup, wait_for_backup
from tfdist.callbacks import latest_backup

PREEMPTED = 143
# With dropout: a resumed run must draw on from the backed-up seed generators.
SHORT = ["--epochs", "2", "--steps-per-epoch", "30", "--warmup-steps", "5", "--verbose", "2",
         "--precision", "float32", "--backup-every", "5", "--dropout", "0.1"]
STOPPED = re.compile(r"Stopped by (SIGTERM|SIGINT) in epoch (\d+) after step (\d+): backup written "
                     r"at global step (\d+) in .* \((?:ckpt-\d+|written by the chief)\)\. Rerun the "
                     r"same command to resume from it\.")
# The one-process runs are XLA-compiled (exact resume under XLA on every CPU);
# the workers' runs are not: XLA would add 2-3 s of compilation to each of
# their ~12 processes and is not what their tests are about.
MIRRORED = ["--strategy", "mirrored", "--devices", "2", "--xla", "on"]


def _env(**extra):
    env = dict(os.environ, PYTHONUNBUFFERED="1", **extra)
    env.pop("TF_CONFIG", None)
    env["PYTHONPATH"] = os.pathsep.join(p for p in [REPO_ROOT, env.get("PYTHONPATH", "")] if p)
    return env


def recipe_command(model_dir, *extra):
    return [sys.executable, "-m", "tfdist.recipes.transformer", *SHORT, "--model-dir",
            str(model_dir), *extra]


def launcher_command(workers, model_dir, *launcher_flags):
    return [sys.executable, "-m", "tfdist.launch", "--workers", str(workers), "--timeout", "400",
            "--startup-timeout", "180", *launcher_flags, "--",
            *recipe_command(model_dir, "--strategy", "multi_worker_mirrored", "--xla", "off")]


def forked(command, env):
    """`(command, env)` whose recipe run (or the launcher's workers' runs) is forked from a
    process with TensorFlow imported (helpers.zygote): a real process all the same, that
    takes the signals sent to it."""
    if "--" in command:  # the launcher's command: its workers' runs are forked
        return with_forked_workers(command, env, startup_timeout=180)
    return forked_command(command, env, REPO_ROOT)


def run(command, timeout=420):
    command, env = forked(command, _env())
    result = subprocess.run(command, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, timeout=timeout)
    return result.returncode, result.stdout


def start(command, **env):
    command, env = forked(command, _env(**env))
    return subprocess.Popen(command, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def workers_of(launcher):
    with open(f"/proc/{launcher.pid}/task/{launcher.pid}/children") as listing:
        return [int(child) for child in listing.read().split()]


def stop_lines(out):
    return [STOPPED.search(line) for line in out.splitlines() if STOPPED.search(line)]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """The reference runs: one process on 2 devices, and 2 workers."""
    folder = tmp_path_factory.mktemp("reference")
    code, out = run(recipe_command(folder / "mirrored", *MIRRORED))
    assert code == 0, out[-3000:]
    code, out = run(launcher_command(2, folder / "workers"))
    assert code == 0, out[-3000:]
    return folder


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_at_a_random_step_backs_up_there_and_the_rerun_is_exact(uninterrupted, tmp_path,
                                                                           signum):
    command = recipe_command(tmp_path, *MIRRORED)
    process = start(command)
    wait_for_backup(process, tmp_path)
    time.sleep(random.Random(signum).uniform(0.0, 1.5))
    process.send_signal(signum)
    code, out = finish(process, timeout=180)
    assert code == PREEMPTED, out[-3000:]
    (stop,) = stop_lines(out)
    assert stop.group(1) == signal.Signals(signum).name
    assert "Traceback" not in out
    step = int(stop.group(4))
    assert latest_backup(str(tmp_path / "backup")).global_step == step
    if signum == signal.SIGINT:
        return  # from the backup on, a rerun cannot tell which signal stopped the run
    code, out = run(command)
    assert code == 0, out[-3000:]
    assert f"(global step {step}," in out  # resumed at exactly that step
    assert_same_final_checkpoint(uninterrupted / "mirrored", tmp_path)


@pytest.mark.slow
@pytest.mark.multiworker
@pytest.mark.parametrize("target", ["worker 1", "launcher"])
def test_sigterm_to_a_worker_or_the_launcher_stops_every_worker_at_one_step(uninterrupted,
                                                                            tmp_path, target):
    command = launcher_command(2, tmp_path)
    # TensorFlow's warnings and errors shown: a worker left behind by the chief
    # would log its failed heartbeats to the chief's coordination service.
    launcher = start(command, TF_CPP_MIN_LOG_LEVEL="1")
    wait_for_backup(launcher, tmp_path)
    time.sleep(random.Random(target).uniform(0.0, 1.5))
    os.kill(launcher.pid if target == "launcher" else workers_of(launcher)[1], signal.SIGTERM)
    code, out = finish(launcher, timeout=180)
    assert code == PREEMPTED, out[-3000:]
    stops = stop_lines(out)
    assert len(stops) == 2, out[-3000:]
    assert stops[0].group(4) == stops[1].group(4), "the workers stopped at different steps"
    assert "SIGKILL" not in out and "Traceback" not in out, out[-3000:]
    assert "coordination service" not in out, out[-3000:]  # the workers left together
    assert latest_backup(str(tmp_path / "backup")).global_step == int(stops[0].group(4))
    if target == "worker 1":
        return  # from the backup on, the rerun is the launcher case's: it checks that
    code, out = run(command)
    assert code == 0, out[-3000:]
    assert f"(global step {stops[0].group(4)}," in out
    assert_same_final_checkpoint(uninterrupted / "workers", tmp_path)


@pytest.mark.slow
@pytest.mark.multiworker
def test_restarts_survive_random_kills_and_end_exact(uninterrupted, tmp_path):
    rng = random.Random(12)
    launcher = start(launcher_command(2, tmp_path, "--max-restarts", "3"))
    lines = []
    reader = threading.Thread(target=lambda: lines.extend(iter(launcher.stdout.readline, "")),
                              daemon=True)
    reader.start()
    try:
        for number, signum in enumerate((signal.SIGKILL, signal.SIGTERM, signal.SIGKILL), 1):
            # A backup newer than any so far: the (restarted) job is training.
            wait_for_backup(launcher, tmp_path, after=newest_backup(tmp_path))
            time.sleep(rng.uniform(0.0, 1.0))
            os.kill(workers_of(launcher)[rng.randrange(2)], signum)
            deadline = time.monotonic() + 120
            while not any(f"restart {number} of 3" in line for line in lines):
                assert time.monotonic() < deadline, "".join(lines)[-3000:]
                time.sleep(0.1)
        launcher.wait(timeout=300)
    finally:
        if launcher.poll() is None:
            launcher.kill()
    reader.join(timeout=10)
    out = "".join(lines)
    assert launcher.returncode == 0, out[-4000:]
    restarts = re.findall(r"tfdist\.launch: restart (\d) of 3: the job ended with (.*?);", out)
    assert [n for n, _ in restarts] == ["1", "2", "3"], out[-4000:]
    assert "SIGKILL" in restarts[0][1] and "preempted" in restarts[1][1], restarts
    assert "SIGKILL" in restarts[2][1], restarts
    assert_same_final_checkpoint(uninterrupted / "workers", tmp_path)


def _free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.multiworker
def test_sigterm_while_waiting_for_peers_stops_at_once_with_a_message(tmp_path):
    env = _env()
    env["TF_CONFIG"] = json.dumps({"cluster": {"worker": [f"127.0.0.1:{_free_port()}",
                                                          f"127.0.0.1:{_free_port()}"]},
                                   "task": {"type": "worker", "index": 0}})
    process = subprocess.Popen(recipe_command(tmp_path, "--strategy", "multi_worker_mirrored"),
                               cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
    lines = []
    try:
        deadline = time.monotonic() + 120
        while not any("waiting up to" in line for line in lines):
            assert time.monotonic() < deadline and process.poll() is None, "".join(lines)
            lines.append(process.stdout.readline())
        time.sleep(2.0)  # inside TensorFlow's start-up, which holds the interpreter
        sent = time.monotonic()
        process.send_signal(signal.SIGTERM)
        out, _ = process.communicate(timeout=30)
        took = time.monotonic() - sent
    finally:
        if process.poll() is None:
            process.kill()
    out = "".join(lines) + out
    assert process.returncode == -signal.SIGKILL, out[-3000:]
    assert took < 5.0, f"it took {took:.1f} s to stop"
    assert ("SIGTERM before the first training step ended (nothing to save yet): stopping now"
            in out), out[-3000:]


def test_a_fit_that_raises_gives_back_the_signal_handlers():
    """Keras calls no callback when fit raises: tfdist's Trainer calls the guard's
    on_fit_error, which gives back the SIGINT and SIGTERM handlers it installed
    for the fit, so Ctrl-C interrupts the program again afterwards."""
    import keras
    import numpy as np
    import tensorflow as tf

    from tfdist.callbacks import PreemptionGuard
    from tfdist.training import Trainer

    stop_signals = (signal.SIGINT, signal.SIGTERM)
    before = {number: signal.getsignal(number) for number in stop_signals}
    during = []

    class FailsAtBatch1(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            during.append({number: signal.getsignal(number) for number in stop_signals})
            if batch == 1:
                raise RuntimeError("a callback failed")

    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    data = tf.data.Dataset.from_tensor_slices(
        (np.ones((32, 4), "float32"), np.ones((32, 1), "float32"))).batch(8)
    trainer = Trainer(model, keras.optimizers.SGD(0.1), "mse")
    with pytest.raises(RuntimeError, match="a callback failed"):
        trainer.fit(data, epochs=1, callbacks=[PreemptionGuard(), FailsAtBatch1()], verbose=0)
    assert len(during) == 2 and all(handlers != before for handlers in during)  # the guard's
    assert {number: signal.getsignal(number) for number in stop_signals} == before
