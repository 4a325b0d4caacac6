"""Parameter-server jobs in tfdist.launch (`--ps M`): a chief, N workers and M
ps tasks, where the chief's exit is the job's.

The TensorFlow tests run a real ParameterServerStrategy job on localhost
(tests/helpers/workers/launch_ps_task.py: ps and worker tasks are real
`tf.distribute.Server`s, the chief trains a Keras model through a
`ClusterCoordinator`). The failure rules are also checked with tiny
non-TensorFlow tasks (tests/helpers/workers/launch_ps_actions.py), which start in a
fraction of a second. Every launcher run has a hard deadline and every task a
watchdog.
"""

import io
import json
import re
import signal
import time

import pytest

from tfdist.distribute.tf_config import parse_tf_config
from tfdist.launch import launch
from tfdist.launch import local_cluster as cluster_lib
from test_launch import PY, assert_dead, finish, launcher_env, run, script, start

TASKS = ["chief-0", "worker-0", "worker-1", "ps-0"]


def ps_actions(**steps):
    """The command of launch_ps_actions.py with STEPS per task type or task,
    e.g. ps_actions(chief="ready,exit=3", worker="ready,sleep=30")."""
    return [PY, script("launch_ps_actions.py"), *(f"{key}={value}" for key, value in steps.items())]


def lines_of(text, label):
    prefix = f"[{label}] "
    return [line[len(prefix):] for line in text.splitlines() if line.startswith(prefix)]


def assert_all_dead(tmp_path, tasks=TASKS):
    for task in tasks:
        assert_dead(str(tmp_path / f"{task}.pid"))


# ---- the cluster each task is given (no processes) ----------------------------------

def test_every_task_gets_the_tf_config_of_a_chief_workers_and_ps_job():
    tasks = cluster_lib.job_tasks(2, ps=1)
    assert tasks == [("chief", 0), ("worker", 0), ("worker", 1), ("ps", 0)]
    cluster = cluster_lib.cluster_spec("127.0.0.1", [3000, 3001, 3002, 3003], tasks)
    assert cluster == {"chief": ["127.0.0.1:3000"],
                       "worker": ["127.0.0.1:3001", "127.0.0.1:3002"],
                       "ps": ["127.0.0.1:3003"]}
    base = {"TFDIST_RANK": "9", "PATH": "/bin"}
    gpus = [["0"], ["1"], ["2"], []]
    for task, gpu_group in zip(tasks, gpus, strict=True):
        env = cluster_lib.task_env(base, cluster, task, f"/tmp/{task[0]}{task[1]}.ready",
                                   devices_per_worker=2, startup_timeout=90.0, gpus=gpu_group)
        assert json.loads(env["TF_CONFIG"]) == {
            "cluster": cluster, "task": {"type": task[0], "index": task[1]}}
        config = parse_tf_config(env["TF_CONFIG"])  # tfdist accepts it as it is
        assert (config.task_type, config.task_index) == task
        assert env["TFDIST_WORLD_SIZE"] == "3"  # the chief and the workers
        assert env["TFDIST_READY_FILE"] == f"/tmp/{task[0]}{task[1]}.ready"
        assert env["TFDIST_STARTUP_TIMEOUT"] == "90"
        assert env["CUDA_VISIBLE_DEVICES"] == ",".join(gpu_group)
        assert env["PATH"] == "/bin"
        if task[0] == "ps":
            assert "TFDIST_RANK" not in env and "TFDIST_DEVICES_PER_WORKER" not in env
        else:  # TensorFlow's id_in_cluster: the chief 0, then the workers
            assert env["TFDIST_RANK"] == str(config.worker_index)
            assert env["TFDIST_DEVICES_PER_WORKER"] == "2"
    assert [cluster_lib.task_label(task) for task in tasks] == [
        "chief", "worker 0", "worker 1", "ps 0"]
    assert base == {"TFDIST_RANK": "9", "PATH": "/bin"}, "the base env must not change"


def test_without_ps_the_cluster_is_workers_only_as_before():
    assert cluster_lib.job_tasks(2, ps=0) == [("worker", 0), ("worker", 1)]
    cluster = cluster_lib.cluster_spec("127.0.0.1", [3000, 3001])
    assert cluster == {"worker": ["127.0.0.1:3000", "127.0.0.1:3001"]}
    env = cluster_lib.worker_env({}, cluster, 1, "/tmp/r")
    assert env["TFDIST_RANK"] == "1" and env["TFDIST_WORLD_SIZE"] == "2"
    assert json.loads(env["TF_CONFIG"])["task"] == {"type": "worker", "index": 1}


def test_launched_tasks_see_their_env_and_gpus_and_lines_are_prefixed(tmp_path):
    env = launcher_env(CUDA_VISIBLE_DEVICES="0,1,2,3")
    code, out, err, _ = run(["--workers", "2", "--ps", "1", "--gpus-per-worker", "1",
                             "--devices-per-worker", "2", "--grace-period", "2"],
                            [PY, script("launch_ps_env.py"), str(tmp_path)], env=env)
    assert code == 0, err
    assert "GPUs per worker: chief: 0; worker 0: 1; worker 1: 2; ps 0: none" in err
    seen = {}
    for label in ("chief", "worker 0", "worker 1", "ps 0"):
        (line,) = [x for x in lines_of(out, label) if x.startswith("ENV ")]
        seen[label] = json.loads(line[len("ENV "):])
    assert [seen[label]["TFDIST_RANK"] for label in seen] == ["0", "1", "2", None]
    assert [seen[label]["CUDA_VISIBLE_DEVICES"] for label in seen] == ["0", "1", "2", ""]
    assert [seen[label]["TFDIST_DEVICES_PER_WORKER"] for label in seen] == ["2", "2", "2", None]
    cluster = json.loads(seen["chief"]["TF_CONFIG"])["cluster"]
    assert list(cluster) == ["chief", "worker", "ps"]
    assert [len(cluster[kind]) for kind in cluster] == [1, 2, 1]
    assert json.loads(seen["ps 0"]["TF_CONFIG"]) == {
        "cluster": cluster, "task": {"type": "ps", "index": 0}}
    assert len({entry["TFDIST_READY_FILE"] for entry in seen.values()}) == 4


def test_too_few_gpus_for_the_chief_and_workers_is_an_error_before_starting():
    env = launcher_env(CUDA_VISIBLE_DEVICES="0,1")
    code, out, err, _ = run(["--workers", "2", "--ps", "1", "--gpus-per-worker", "1"],
                            [PY, "-c", "print('must not run')"], env=env)
    assert code == 2, err
    assert "needs 3 GPU(s), but 2 are visible" in err
    assert "the chief counts as a worker: 3 = 1 chief + 2 worker(s); ps tasks get no GPU" in err
    assert "must not run" not in out


# ---- bad input ------------------------------------------------------------------

@pytest.mark.parametrize("value", ["-1", "two", "1.5"])
def test_bad_ps_count_is_an_argparse_error_naming_the_value(value):
    code, out, err, _ = run(["--workers", "2", "--ps", value], [PY, "-c", "print('must not run')"])
    assert code == 2
    assert f"error: argument --ps: must be an integer >= 0, got '{value}'" in err, err
    assert "must not run" not in out


@pytest.mark.parametrize("ps", [-1, 1.0, True, "1"])
def test_python_api_rejects_a_bad_ps_count(ps):
    with pytest.raises(ValueError, match=re.escape(f"ps must be an integer >= 0, got {ps!r}")):
        launch(["true"], 1, ps=ps)


# ---- failure rules, with tiny tasks ----------------------------------------------------

def test_chief_exit_ends_the_job_and_stubborn_servers_are_killed_without_failing_it(tmp_path):
    pid = str(tmp_path / "{task}.pid")
    code, out, err, took = run(
        ["--workers", "2", "--ps", "1", "--grace-period", "1"],
        ps_actions(chief=f"pid={pid},ready,sleep=0.5,print=trained",
                   worker=f"pid={pid},ready,sleep=30",
                   ps=f"pid={pid},ignore,ready,sleep=30"))
    assert code == 0, err
    assert took < 15
    assert lines_of(out, "chief") == ["trained"]
    assert "chief exited with exit code 0, the job's exit status; stopping the workers" in err
    assert re.search(r"ps 0 still running 1\.[0-9]s after SIGTERM \(the 1s grace period "
                     r"\(--grace-period\) is over\); sending SIGKILL\.", err), err
    assert_all_dead(tmp_path)


def test_lost_worker_is_announced_and_the_job_goes_on(tmp_path):
    pid = str(tmp_path / "{task}.pid")
    code, out, err, _ = run(
        ["--workers", "2", "--ps", "1", "--grace-period", "1"],
        ps_actions(chief=f"pid={pid},ready,sleep=3,print=trained",
                   worker=f"pid={pid},ready,sleep=30",
                   worker1=f"pid={pid},ready,exit=7",
                   ps=f"pid={pid},ready,sleep=30"))
    assert code == 0, err
    assert err.count("worker 1 exited with exit code 7; the chief's coordinator "
                     "re-schedules its steps on the other workers.") == 1, err
    assert lines_of(out, "chief") == ["trained"]
    assert_all_dead(tmp_path)


def test_lost_ps_task_waits_for_the_failing_chief_and_returns_its_status(tmp_path):
    code, _, err, _ = run(
        ["--workers", "1", "--ps", "1", "--grace-period", "10"],
        ps_actions(chief="ready,sleep=2.5,exit=141", worker="ready,sleep=30",
                   ps="ready,kill=9"))
    assert code == 141, err
    assert ("ps 0 exited with signal 9 (SIGKILL), exit status 137; the chief will fail "
            "(its share of the variables is lost): waiting up to 10s (--grace-period)") in err
    assert "chief exited with exit code 141" in err


def test_lost_ps_task_and_a_chief_that_does_not_exit_stop_the_job_after_the_grace_period(
        tmp_path):
    pid = str(tmp_path / "{task}.pid")
    code, _, err, took = run(
        ["--workers", "1", "--ps", "1", "--grace-period", "1"],
        ps_actions(chief=f"pid={pid},ready,sleep=30", worker=f"pid={pid},ready,sleep=30",
                   ps=f"pid={pid},ready,sleep=0.2,exit=0"))
    assert code == 1, err  # a ps task that ends, even with 0, is a failure
    assert took < 15
    assert ("the chief did not exit within 1s (--grace-period) after ps 0 was lost; "
            "stopping the job with ps 0's exit status 1.") in err
    assert_all_dead(tmp_path, ["chief-0", "worker-0"])


def test_losing_the_last_worker_stops_the_job_after_the_grace_period():
    code, _, err, took = run(
        ["--workers", "1", "--ps", "1", "--grace-period", "1"],
        ps_actions(chief="ready,sleep=30", worker="ready,sleep=0.2,kill=9", ps="ready,sleep=30"))
    assert code == 137, err
    assert took < 15
    assert "worker 0 exited with signal 9 (SIGKILL), exit status 137; the chief will fail " \
           "(no worker is left)" in err


def test_startup_deadline_names_every_task_not_ready_ps_tasks_included(tmp_path):
    pid = str(tmp_path / "{task}.pid")
    code, _, err, took = run(
        ["--workers", "1", "--ps", "2", "--startup-timeout", "2", "--grace-period", "1"],
        ps_actions(chief=f"pid={pid},sleep=30", worker=f"pid={pid},ready,sleep=30",
                   ps=f"pid={pid},ready,sleep=30", ps1=f"pid={pid},sleep=30"))
    assert code == 125, err
    assert took < 15
    assert re.search(r"chief, ps 1 did not become ready within the start-up deadline of 2s",
                     err), err
    assert_all_dead(tmp_path, ["chief-0", "worker-0", "ps-0", "ps-1"])


def test_max_restarts_restarts_the_whole_job_when_the_chief_fails(tmp_path):
    marker = str(tmp_path / "failed-once")
    code, out, err, _ = run(
        ["--workers", "1", "--ps", "1", "--max-restarts", "1", "--grace-period", "1"],
        ps_actions(chief=f"ready,once={marker}:3,print=trained", worker="ready,sleep=30",
                   ps="ready,sleep=30,print=never"))
    assert code == 0, err
    assert re.search(r"restart 1 of 1: the job ended with chief failed \(exit code 3\)", err), err
    assert err.count("starting a parameter-server job") == 2
    assert lines_of(out, "chief") == ["trained"]


def test_signal_to_the_launcher_reaches_every_task_of_a_ps_job(tmp_path):
    pid, trapped = str(tmp_path / "{task}.pid"), str(tmp_path / "{task}.signal")
    proc = start(["--workers", "2", "--ps", "1"],
                 ps_actions(chief=f"trap={trapped}:143,pid={pid},sleep=30",
                            worker=f"trap={trapped},pid={pid},sleep=30",
                            ps=f"trap={trapped},pid={pid},sleep=30"))
    deadline = time.monotonic() + 20
    while not all((tmp_path / f"{task}.pid").exists() for task in TASKS):
        assert time.monotonic() < deadline and proc.poll() is None, "the tasks did not start"
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    code, _, err, _ = finish(proc, 15)
    assert code == 143, err  # the chief's, as when it stops by itself
    assert "stopped on SIGTERM: chief exited 143 (stopped after writing a backup)" in err
    for task in TASKS:
        assert (tmp_path / f"{task}.signal").read_text() == "SIGTERM", task
    assert_all_dead(tmp_path)


def test_python_api_runs_a_ps_job_and_prefixes_every_task(tmp_path):
    out, err = io.StringIO(), io.StringIO()
    code = launch([PY, script("launch_ps_env.py"), str(tmp_path), "4"], 2, ps=2,
                  startup_timeout=0, timeout=30, grace_period=1, output=out, errors=err,
                  env=launcher_env())
    assert code == 4, err.getvalue()
    assert "chief exited with exit code 4" in err.getvalue()
    for label in ("chief", "worker 0", "worker 1", "ps 0", "ps 1"):
        assert len([x for x in lines_of(out.getvalue(), label) if x.startswith("ENV ")]) == 1


# ---- real TensorFlow: ParameterServerStrategy + ClusterCoordinator ---------------------

TF_LAUNCH = ["--startup-timeout", "60", "--timeout", "80", "--grace-period", "5"]


@pytest.mark.multiworker
def test_tensorflow_ps_job_trains_and_the_servers_are_stopped(tmp_path):
    code, out, err, _ = run(["--workers", "2", "--ps", "1", *TF_LAUNCH],
                            [PY, script("launch_ps_task.py"), "--sync-dir", str(tmp_path)],
                            deadline=100)
    assert code == 0, f"stdout:\n{out}\nstderr:\n{err}"
    (result,) = [x for x in lines_of(out, "chief") if x.startswith("RESULT ")]
    assert re.fullmatch(r"RESULT steps=20 loss=\d+\.\d+", result), result
    for label in ("worker 0", "worker 1", "ps 0"):
        assert f"serving {label}" in lines_of(out, label), out
    assert "chief exited with exit code 0" in err
    assert "still running" not in err  # the servers stopped at SIGTERM
    assert_all_dead(tmp_path)


@pytest.mark.multiworker
def test_tensorflow_ps_job_survives_a_worker_killed_mid_training(tmp_path):
    code, out, err, _ = run(["--workers", "2", "--ps", "1", *TF_LAUNCH],
                            [PY, script("launch_ps_task.py"), "--sync-dir", str(tmp_path),
                             "--kill-worker", "1"],
                            deadline=100)
    assert code == 0, f"stdout:\n{out}\nstderr:\n{err}"
    assert "killing myself" in lines_of(out, "worker 1")
    chief = lines_of(out, "chief")
    # The second half of the steps ran after worker 1 was gone.
    assert chief.index("worker 1 is gone") < next(
        i for i, x in enumerate(chief) if x.startswith("RESULT steps=20 "))
    assert ("worker 1 exited with signal 9 (SIGKILL), exit status 137; the chief's "
            "coordinator re-schedules its steps on the other workers.") in err
    assert_all_dead(tmp_path)


@pytest.mark.multiworker
def test_tensorflow_ps_job_returns_the_failing_chiefs_status(tmp_path):
    code, out, err, _ = run(["--workers", "1", "--ps", "1", *TF_LAUNCH],
                            [PY, script("launch_ps_task.py"), "--sync-dir", str(tmp_path),
                             "--chief-exit", "3", "--steps", "4"],
                            deadline=100)
    assert code == 3, f"stdout:\n{out}\nstderr:\n{err}"
    assert any(x.startswith("RESULT steps=4 ") for x in lines_of(out, "chief")), out
    assert "chief exited with exit code 3, the job's exit status; stopping the workers" in err
    assert_all_dead(tmp_path, ["chief-0", "worker-0", "ps-0"])
