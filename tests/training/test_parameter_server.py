"""Parameter-server training: real chief, worker and ps processes on localhost.

The chief drives a `ClusterCoordinator`; the workers and the ps task serve
(`tests/helpers/workers/ps_train_worker.py`). Asynchronous training is not equal to
one device, so these tests check what it promises: the model learns, every
worker trains, the optimizer counts every step once, a lost worker is
survived, a lost ps task is a clear error.
"""

import json
import os
import socket
import sys

import pytest

from helpers.mw import launch
from tfdist.distribute.tf_config import StrategyStartupError, parse_tf_config
from tfdist.distribute.ps_cluster import check_parameter_server_cluster, is_serving_task, wait_for_tasks
from helpers.paths import WORKERS_DIR  # noqa: E402

WORKER = os.path.join(WORKERS_DIR, "ps_train_worker.py")
STEPS = 3 * 40  # epochs x steps per epoch in the worker script


def ps_config(task_type="chief", index=0, ps=("127.0.0.1:1",), workers=("127.0.0.1:2",)):
    cluster = {"chief": ["127.0.0.1:3"], "worker": list(workers), "ps": list(ps)}
    return parse_tf_config({"cluster": cluster, "task": {"type": task_type, "index": index}})


def run_job(tmp_path, *extra, grace_period=2):
    result = launch([WORKER, "--out", str(tmp_path)] + list(extra), workers=2, ps=1, timeout=200,
                    startup_timeout=120, grace_period=grace_period)
    report = tmp_path / "chief.json"
    return result, json.loads(report.read_text()) if report.exists() else None


# ---------------------------------------------------------------- the cluster


def test_a_parameter_server_cluster_needs_chief_workers_and_ps():
    check_parameter_server_cluster(ps_config())
    no_ps = parse_tf_config({"cluster": {"chief": ["a:1"], "worker": ["b:1"]},
                             "task": {"type": "chief", "index": 0}})
    with pytest.raises(ValueError, match="has no 'ps' task .*1 chief, 1 worker"):
        check_parameter_server_cluster(no_ps)
    with pytest.raises(ValueError, match="tfdist.launch --workers N --ps M"):
        check_parameter_server_cluster(None)


def test_only_worker_and_ps_tasks_serve():
    assert is_serving_task(ps_config("worker"), "parameter_server")
    assert is_serving_task(ps_config("ps"), "auto")  # auto picks parameter_server with ps tasks
    assert not is_serving_task(ps_config("chief"), "parameter_server")
    assert not is_serving_task(ps_config("worker"), "multi_worker_mirrored")
    assert not is_serving_task(None, "parameter_server")


def test_the_chief_waits_for_its_tasks_and_names_those_that_never_answer():
    listening, other = socket.socket(), socket.socket()
    for sock in (listening, other):
        sock.bind(("127.0.0.1", 0))
        sock.listen()
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    closed_port = closed.getsockname()[1]
    closed.close()
    try:
        up, up_too = (f"127.0.0.1:{sock.getsockname()[1]}" for sock in (listening, other))
        assert wait_for_tasks(ps_config(ps=[up], workers=[up_too]), timeout=5) < 5
        down = f"127.0.0.1:{closed_port}"
        with pytest.raises(StrategyStartupError) as error:
            wait_for_tasks(ps_config(ps=[down], workers=[up]), timeout=1)
    finally:
        listening.close()
        other.close()
    message = str(error.value)
    assert f"ps 0 at {down} never did" in message and "worker 0" not in message
    assert "TFDIST_STARTUP_TIMEOUT" in message


# ---------------------------------------------------------------- real jobs


def test_parameter_server_training_learns_on_every_worker_and_counts_every_step(tmp_path):
    result, report = run_job(tmp_path)
    assert result.returncode == 0, result.stdout[-3000:]
    assert report["strategy"] == "parameter_server"
    history, chance = report["history"], report["chance_loss"]
    assert history["loss"][-1] < 0.2 * chance, history
    assert history["loss"][-1] < history["loss"][0]
    assert history["val_loss"][-1] < 0.2 * chance and report["evaluate"]["loss"] < 0.2 * chance
    steps = report["steps_by_worker"]
    assert set(steps) == {"0", "1"} and all(count > 0 for count in steps.values()), steps
    assert sum(steps.values()) == STEPS
    # Keras's own read-then-write increment would lose steps between racing workers.
    assert report["iterations"] == STEPS
    assert report["predict_shape"] == [128, 8, 12]
    refusals = report["refusals"]
    assert "fit(y=..., batch_size=...) is not supported under parameter_server" in refusals["arrays"]
    assert "steps_per_epoch is required under parameter_server" in refusals["no_steps_per_epoch"]
    assert "grad_accum_steps=2 is not supported under parameter_server" in refusals["grad_accum"]


def test_losing_a_worker_is_survived_and_its_steps_run_on_the_other(tmp_path):
    result, report = run_job(tmp_path, "--lose", "worker")
    assert result.returncode == 0, result.stdout[-3000:]
    steps = report["steps_by_worker"]
    # Worker 1 died after the first epoch (40 steps shared by both workers).
    assert sum(steps.values()) == STEPS and steps["0"] > STEPS / 2 and steps.get("1", 0) < 40
    assert report["iterations"] == STEPS
    assert report["history"]["loss"][-1] < 0.2 * report["chance_loss"]


def test_losing_the_parameter_server_is_a_clear_error(tmp_path):
    # The chief needs a few seconds to notice the lost ps task (TensorFlow's
    # coordinator retries first); the launcher gives it the grace period to say so.
    result, report = run_job(tmp_path, "--lose", "ps", grace_period=30)
    assert report is None
    assert result.returncode == 141, result.stdout[-3000:]
    assert "LOST: Parameter-server training stopped: a ps task (ps 0 at 127.0.0.1:" in result.stdout
    assert "resumes from the last backup" in result.stdout


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
