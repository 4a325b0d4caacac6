"""The Transformer recipe under parameter_server, as a user runs it:
`python -m tfdist.launch --workers 2 --ps 2 -- python -m tfdist.recipes.transformer
--strategy parameter_server`, with a worker killed (SIGKILL) after the first epoch."""

import json
import os
import re
import signal
import subprocess
import sys
import time

from mw import REPO_ROOT

EPOCHS, STEPS = 3, 20


def find_task(task_type, index, marker):
    """The pid of the process whose TF_CONFIG is that task and whose command line has `marker`."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if marker.encode() not in f.read():
                    continue
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = dict(item.split(b"=", 1) for item in f.read().split(b"\0") if b"=" in item)
        except OSError:
            continue
        task = json.loads(env.get(b"TF_CONFIG", b"{}")).get("task", {})
        if task == {"type": task_type, "index": index}:
            return int(pid)
    return None


def test_transformer_recipe_learns_and_survives_a_lost_worker(tmp_path):
    model_dir = str(tmp_path / "run")
    command = [sys.executable, "-m", "tfdist.launch", "--workers", "2", "--ps", "2",
               "--timeout", "300", "--grace-period", "5", "--",
               sys.executable, "-m", "tfdist.recipes.transformer", "--strategy", "parameter_server",
               "--epochs", str(EPOCHS), "--steps-per-epoch", str(STEPS), "--warmup-steps", "5",
               "--model-dir", model_dir]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1",
               PYTHONPATH=REPO_ROOT)
    env.pop("TF_CONFIG", None)
    job = subprocess.Popen(command, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True)
    lines, killed = [], None
    deadline = time.monotonic() + 330
    try:
        for line in job.stdout:
            lines.append(line)
            if killed is None and re.match(rf"\[chief\] {STEPS}/{STEPS} ", line):
                killed = find_task("worker", 1, model_dir)
                assert killed, "worker 1 not found"
                os.kill(killed, signal.SIGKILL)
            assert time.monotonic() < deadline, "".join(lines[-50:])
        job.wait(timeout=30)
    finally:
        job.kill()
    output = "".join(lines)
    assert job.returncode == 0, output[-4000:]
    assert killed and "worker 1 exited with signal 9" in output
    chance, last = map(float, re.search(
        r"\[chief\]   loss +[\d.]+ -> ([\d.]+) +\(chance: ([\d.]+)\)", output).groups()[::-1])
    assert last < 0.5 * chance, output[-3000:]
    steps = dict(map(int, pair) for pair in re.findall(r"worker (\d): (\d+)", output.split(
        "steps per worker", 1)[1].splitlines()[0]))
    assert sum(steps.values()) == EPOCHS * STEPS and steps[0] > steps[1] > 0, steps
    # The token table is split over both ps tasks, and they hold about equal shares.
    assert "token embedding in 2 shards (one per ps task)" in output
    sizes = [float(size) for size in re.findall(r"ps \d: ([\d.]+) MiB", output)]
    assert len(sizes) == 2 and min(sizes) > 0.8 * max(sizes), sizes
    assert os.path.isdir(os.path.join(model_dir, "backup"))
