"""Tests of tfdist.launch, the local multi-worker launcher.

Every test starts the real launcher and real worker processes (tiny Python
scripts in tests/helpers/workers/launch_*.py, and one real TensorFlow job) and checks
their exit codes and output. Every launcher run has a hard deadline; worker
scripts end themselves after 60 s, so nothing outlives a failed test for long.
"""

import io
import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from tfdist.launch import EXIT_STARTUP_TIMEOUT, EXIT_TIMEOUT, launch

from helpers.paths import REPO_ROOT, WORKERS_DIR  # noqa: E402
PY = sys.executable


def script(name):
    return os.path.join(WORKERS_DIR, name)


def launcher_env(**extra):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    env.pop("TF_CONFIG", None)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in [REPO_ROOT, env.get("PYTHONPATH", "")] if p)
    env.update(extra)
    return env


def start(launcher_args, worker_args, env=None, blocked=()):
    """Starts `python -m tfdist.launch <launcher_args> -- <worker_args>`, with
    the signals `blocked` blocked in it from the start (as a parent's mask is
    inherited)."""
    return subprocess.Popen(
        [PY, "-m", "tfdist.launch", *launcher_args, "--", *worker_args],
        cwd=REPO_ROOT, env=env or launcher_env(), stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
        preexec_fn=(lambda: signal.pthread_sigmask(signal.SIG_BLOCK, blocked)) if blocked else None)


def finish(proc, deadline):
    """Waits for the launcher at most `deadline` seconds (then stops it and
    fails the test); returns (exit code, stdout, stderr, seconds taken)."""
    began = time.monotonic()
    try:
        out, err = proc.communicate(timeout=deadline)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)  # the launcher forwards it to its workers
        try:
            out, err = proc.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
        pytest.fail(f"launcher still running after {deadline}s\nstdout:\n{out}\nstderr:\n{err}")
    return proc.returncode, out, err, time.monotonic() - began


def run(launcher_args, worker_args, deadline=30, env=None):
    return finish(start(launcher_args, worker_args, env), deadline)


def actions(*steps_per_rank):
    return [PY, script("launch_actions.py"), *steps_per_rank]


def lines_of(text, rank):
    prefix = f"[worker {rank}] "
    return [line[len(prefix):] for line in text.splitlines() if line.startswith(prefix)]


def assert_dead(pid_file, within=5.0):
    """The process whose pid is in `pid_file` is gone (within a few seconds,
    for the reaping of a re-parented zombie)."""
    with open(pid_file) as f:
        pid = int(f.read())
    deadline = time.monotonic() + within
    while True:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        if time.monotonic() > deadline:
            pytest.fail(f"worker process {pid} is still running after the launcher exited")
        time.sleep(0.1)


def wait_until_started(proc, tmp_path, workers):
    """Waits until every worker has written tmp_path/pid-<rank>."""
    deadline = time.monotonic() + 20
    while not all((tmp_path / f"pid-{rank}").exists() for rank in range(workers)):
        if time.monotonic() > deadline or proc.poll() is not None:
            proc.kill()
            pytest.fail(f"workers did not start: {proc.communicate()}")
        time.sleep(0.05)


# ---- environment --------------------------------------------------------------

def test_workers_are_quiet_about_tensorflow_unless_the_environment_says_otherwise():
    env = launcher_env()
    del env["TF_CPP_MIN_LOG_LEVEL"]
    code, out, err, _ = run(["--workers", "2"], [PY, script("launch_env.py")], env=env)
    assert code == 0, err
    for rank in range(2):
        (line,) = [x for x in lines_of(out, rank) if x.startswith("ENV ")]
        assert json.loads(line[len("ENV "):])["TF_CPP_MIN_LOG_LEVEL"] == "3"


def test_each_rank_gets_its_tf_config_and_env():
    env = launcher_env(TF_CONFIG='{"cluster": {"worker": ["elsewhere:1"]}}')
    code, out, err, _ = run(["--workers", "3", "--devices-per-worker", "2", "--startup-timeout", "100"],
                            [PY, script("launch_env.py")], env=env)
    assert code == 0, err
    assert "TF_CONFIG from the environment is replaced" in err
    seen = {}
    for rank in range(3):
        (line,) = [x for x in lines_of(out, rank) if x.startswith("ENV ")]
        seen[rank] = json.loads(line[len("ENV "):])
        assert lines_of(err, rank) == [f"stderr of rank {rank}"]
    cluster = json.loads(seen[0]["TF_CONFIG"])["cluster"]
    assert list(cluster) == ["worker"] and len(cluster["worker"]) == 3
    ports = set()
    for address in cluster["worker"]:
        host, port = address.rsplit(":", 1)
        assert host == "127.0.0.1"
        ports.add(int(port))
    assert len(ports) == 3
    ready_files = set()
    for rank, env_seen in seen.items():
        assert json.loads(env_seen["TF_CONFIG"]) == {
            "cluster": cluster, "task": {"type": "worker", "index": rank}}
        assert env_seen["TFDIST_RANK"] == str(rank)
        assert env_seen["TFDIST_WORLD_SIZE"] == "3"
        assert env_seen["TFDIST_DEVICES_PER_WORKER"] == "2"
        assert env_seen["PYTHONUNBUFFERED"] == "1"
        assert env_seen["TF_CPP_MIN_LOG_LEVEL"] == "2"  # the launcher's own, kept
        # Workers give up before the launcher does, so they can name the missing peer.
        assert env_seen["TFDIST_STARTUP_TIMEOUT"] == "90"
        ready_files.add(env_seen["TFDIST_READY_FILE"])
    assert len(ready_files) == 3
    (ready_dir,) = {os.path.dirname(path) for path in ready_files}
    assert not os.path.exists(ready_dir), "the launcher must remove its temp dir"


def test_devices_per_worker_is_unset_when_not_given():
    code, out, err, _ = run(["--workers", "1"], [PY, script("launch_env.py")])
    assert code == 0, err
    (line,) = [x for x in lines_of(out, 0) if x.startswith("ENV ")]
    assert json.loads(line[len("ENV "):])["TFDIST_DEVICES_PER_WORKER"] is None


# ---- output -------------------------------------------------------------------

def test_every_line_is_prefixed_whole_and_on_its_stream():
    count = 300
    code, out, err, _ = run(["--workers", "2"], [PY, script("launch_chatty.py"), str(count)])
    assert code == 0, err
    for text, name in ((out, "out"), (err, "err")):
        for rank in range(2):
            pattern = re.compile(rf"{name} rank={rank} i=(\d+) {str(rank) * 300}")
            numbers = []
            for line in lines_of(text, rank):
                match = pattern.fullmatch(line)
                if match:
                    numbers.append(int(match.group(1)))
                else:
                    assert line.startswith("tail ") and name == "out", line[:120]
            assert numbers == list(range(count)), f"{name} of worker {rank}"
    worker_out = [x for x in out.splitlines() if not x.startswith("tfdist.launch: ")]
    assert all(re.match(r"\[worker [01]\] ", x) for x in worker_out)
    assert "[worker 0] tail rank=0 without newline" in out.splitlines()
    assert "[worker 1] tail rank=1 without newline" in out.splitlines()


# ---- exit codes ---------------------------------------------------------------

def test_all_workers_succeed_exit_0():
    code, out, err, _ = run(["--workers", "4"], actions("print=hello {rank}"))
    assert code == 0, err
    for rank in range(4):
        assert lines_of(out, rank) == [f"hello {rank}"]


def test_one_failure_stops_the_others_and_returns_its_code(tmp_path):
    done = str(tmp_path / "done-{rank}")
    pid = str(tmp_path / "pid-{rank}")
    code, _, err, took = run(
        ["--workers", "3"],
        actions(f"pid={pid},ready,sleep=20,write={done}",
                f"pid={pid},ready,sleep=0.5,exit=3",
                f"pid={pid},ready,sleep=20,write={done}"))
    assert code == 3, err
    assert took < 15, f"took {took:.1f}s"
    assert re.search(r"worker 1 failed with exit code 3", err), err
    for rank in (0, 2):
        assert_dead(str(tmp_path / f"pid-{rank}"))
        assert not (tmp_path / f"done-{rank}").exists()


def test_max_restarts_starts_a_failed_job_again_and_says_why(tmp_path):
    marker = str(tmp_path / "failed-once-{rank}")
    code, out, err, _ = run(["--workers", "2", "--max-restarts", "2"],
                            actions(f"ready,print=run,once={marker}:3", "ready,sleep=0.5,print=run"),
                            deadline=60)
    assert code == 0, err
    assert re.search(r"restart 1 of 2: the job ended with worker 0 failed \(exit code 3\); "
                     r"starting it again", err), err
    assert err.count("starting 2 worker(s)") == 2
    assert lines_of(out, 0).count("run") == 2  # the whole job ran again


def test_max_restarts_gives_up_with_the_last_failure(tmp_path):
    code, _, err, _ = run(["--workers", "1", "--max-restarts", "1"], actions("ready,exit=4"),
                          deadline=60)
    assert code == 4, err
    assert "restart 1 of 1" in err and "no restart left (--max-restarts 1 used); exit status 4" in err


def test_a_preempted_worker_lets_the_others_finish_their_stop(tmp_path):
    # Exit 143: the worker saved its backup; the others stop at the same step
    # by themselves, so they get no SIGTERM and are waited for.
    trapped = str(tmp_path / "trapped-{rank}")
    done = str(tmp_path / "done-{rank}")
    code, _, err, _ = run(["--workers", "2"],
                          actions("ready,sleep=0.3,exit=143", f"ready,trap={trapped},sleep=2,write={done}"),
                          deadline=60)
    assert code == 143, err
    assert "worker 0 stopped after SIGTERM/SIGINT with its backup written" in err
    assert (tmp_path / "done-1").exists() and not (tmp_path / "trapped-1").exists()


def test_worker_killed_by_signal_gives_128_plus_signal():
    code, _, err, took = run(["--workers", "2"],
                             actions("ready,sleep=20", "ready,sleep=0.3,kill=9"))
    assert code == 137, err
    assert took < 15
    assert "worker 1 failed with signal 9 (SIGKILL)" in err


def test_stubborn_worker_is_killed_after_the_grace_period(tmp_path):
    pid = str(tmp_path / "pid-{rank}")
    code, _, err, took = run(["--workers", "2", "--grace-period", "1"],
                             actions(f"pid={pid},ignore,ready,sleep=30",
                                     f"pid={pid},ready,sleep=0.5,exit=4"))
    assert code == 4, err
    assert took < 15
    assert re.search(r"worker\(s\) 0 still running 1\.[0-9]s after SIGTERM \(the 1s grace period "
                     r"\(--grace-period\) is over\); sending SIGKILL\.", err), err
    assert_dead(str(tmp_path / "pid-0"))


def test_command_that_cannot_start_exits_127():
    code, _, err, _ = run(["--workers", "2"], ["/nonexistent/tfdist-no-such-command"])
    assert code == 127
    assert "/nonexistent/tfdist-no-such-command" in err


# ---- deadlines ----------------------------------------------------------------

def test_startup_deadline_names_the_ranks_never_ready(tmp_path):
    pid = str(tmp_path / "pid-{rank}")
    code, _, err, took = run(["--workers", "3", "--startup-timeout", "2"],
                             actions(f"pid={pid},ready,sleep=30",
                                     f"pid={pid},sleep=30",
                                     f"pid={pid},ready,sleep=30"))
    assert code == EXIT_STARTUP_TIMEOUT, err
    assert took < 20
    assert re.search(r"worker\(s\) 1 did not become ready within the start-up "
                     r"deadline of 2s", err), err
    for rank in range(3):
        assert_dead(str(tmp_path / f"pid-{rank}"))


def test_exiting_0_counts_as_ready_and_0_disables_the_startup_deadline():
    code, _, err, _ = run(["--workers", "2", "--startup-timeout", "1"],
                          actions("exit=0", "ready,sleep=2"))
    assert code == 0, err
    code, _, err, _ = run(["--workers", "2", "--startup-timeout", "0"],
                          actions("sleep=1.5"))
    assert code == 0, err


def test_job_timeout_exits_124(tmp_path):
    pid = str(tmp_path / "pid-{rank}")
    code, _, err, took = run(["--workers", "2", "--timeout", "1.5"],
                             actions(f"pid={pid},ready,sleep=30"))
    assert code == EXIT_TIMEOUT == 124, err
    assert took < 15
    assert "job deadline of 1.5s (--timeout) exceeded" in err
    for rank in range(2):
        assert_dead(str(tmp_path / f"pid-{rank}"))


# ---- signals to the launcher ---------------------------------------------------

@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_signal_to_launcher_is_forwarded_and_every_signal_exits_143(tmp_path, signum):
    # The workers stop as the recipes do after writing a backup: exit 143.
    trapped = str(tmp_path / "signal-{rank}")
    pid = str(tmp_path / "pid-{rank}")
    proc = start(["--workers", "2"], actions(f"trap={trapped}:143,pid={pid},sleep=30"))
    wait_until_started(proc, tmp_path, 2)
    proc.send_signal(signum)
    code, _, err, _ = finish(proc, 15)
    assert code == 143, err
    assert f"received {signum.name}; forwarding it to the workers" in err
    assert (f"stopped on {signum.name}: worker(s) 0, 1 exited 143 (stopped after writing a "
            "backup); exit status 143.") in err
    for rank in range(2):
        assert (tmp_path / f"signal-{rank}").read_text() == signum.name
        assert_dead(str(tmp_path / f"pid-{rank}"))


def test_a_launcher_started_with_the_signals_blocked_still_forwards_them(tmp_path):
    # E.g. started by a program that blocks SIGTERM/SIGINT, as a recipe run
    # does: the mask is inherited, and blocked handlers would never run.
    trapped = str(tmp_path / "signal-{rank}")
    pid = str(tmp_path / "pid-{rank}")
    proc = start(["--workers", "2"], actions(f"trap={trapped}:143,pid={pid},sleep=30"),
                 blocked={signal.SIGTERM, signal.SIGINT, signal.SIGHUP})
    wait_until_started(proc, tmp_path, 2)
    proc.send_signal(signal.SIGTERM)
    code, _, err, _ = finish(proc, 15)
    assert code == 143, err
    assert "received SIGTERM; forwarding it to the workers" in err
    for rank in range(2):
        assert (tmp_path / f"signal-{rank}").read_text() == "SIGTERM"


def test_a_signal_that_finds_the_workers_finishing_exits_0(tmp_path):
    trapped = str(tmp_path / "signal-{rank}")
    pid = str(tmp_path / "pid-{rank}")
    proc = start(["--workers", "2"], actions(f"trap={trapped},pid={pid},sleep=30"))
    wait_until_started(proc, tmp_path, 2)
    proc.send_signal(signal.SIGINT)
    code, _, err, _ = finish(proc, 15)
    assert code == 0, err
    assert "stopped on SIGINT: worker(s) 0, 1 exited 0 (the job had finished); exit status 0." \
        in err


def test_a_second_signal_cuts_the_grace_period_short_and_says_how_long_it_waited(tmp_path):
    pid = str(tmp_path / "pid-{rank}")
    proc = start(["--workers", "2", "--grace-period", "30"],
                 actions(f"ignore,pid={pid},sleep=30"))
    wait_until_started(proc, tmp_path, 2)
    proc.send_signal(signal.SIGTERM)
    time.sleep(1.0)
    proc.send_signal(signal.SIGTERM)
    code, _, err, took = finish(proc, 20)
    assert took < 10, err
    match = re.search(r"worker\(s\) 0, 1 still running ([0-9.]+)s after SIGTERM \(another "
                      r"SIGTERM to the launcher cut the 30s grace period short\); sending "
                      r"SIGKILL\.", err)
    assert match, err
    assert 0.5 < float(match.group(1)) < 8, err
    # Killed before they saved anything: the workers' status, not "stopped with a backup".
    assert code == 137, err
    assert "stopped on SIGTERM: worker 0 ended with signal 9 (SIGKILL), exit status 137; " \
           "exit status 137." in err
    for rank in range(2):
        assert_dead(str(tmp_path / f"pid-{rank}"))


def test_workers_die_when_the_launcher_is_sigkilled_and_its_folder_goes_at_the_next_start(
        tmp_path):
    scratch_dir = tmp_path / "tmp"
    scratch_dir.mkdir()
    env = launcher_env(TMPDIR=str(scratch_dir))
    pid = str(tmp_path / "pid-{rank}")
    proc = start(["--workers", "2"], actions(f"pid={pid},sleep=30"), env=env)
    wait_until_started(proc, tmp_path, 2)
    proc.kill()
    proc.communicate(timeout=15)
    for rank in range(2):
        assert_dead(str(tmp_path / f"pid-{rank}"))
    [left] = [p for p in scratch_dir.iterdir() if p.name.startswith("tfdist-launch-")]
    assert left.name.startswith(f"tfdist-launch-{proc.pid}-")
    # Kept: a folder of a live process (this one), and one without an owner to judge.
    from tfdist.launch import scratch
    live = scratch.make_ready_dir(str(scratch_dir))
    unowned = scratch_dir / "tfdist-launch-legacy1"
    unowned.mkdir()
    code, _, err, _ = run(["--workers", "1"], actions("exit=0"), env=env)
    assert code == 0, err
    assert (f"removed 1 temporary folder(s) of launchers that are no longer running: {left}"
            in err), err
    assert not left.exists() and os.path.isdir(live) and unowned.is_dir()
    assert sorted(p.name for p in scratch_dir.iterdir()) == sorted(
        [os.path.basename(live), unowned.name])


# ---- bad input ----------------------------------------------------------------

@pytest.mark.parametrize("args, named", [
    (["--workers", "0"], "'0'"),
    (["--workers", "two"], "'two'"),
    (["--workers", "2", "--devices-per-worker", "0"], "'0'"),
    (["--workers", "2", "--timeout", "-1"], "'-1'"),
    (["--workers", "2", "--startup-timeout", "-5"], "'-5'"),
    (["--workers", "2", "--grace-period", "nan"],
     "must be a finite number of seconds >= 0 (0 disables it), got 'nan'"),
    (["--workers", "2", "--timeout", "inf"], "'inf'"),
])
def test_bad_arguments_exit_2_naming_the_value(args, named):
    code, out, err, _ = run(args, [PY, "-c", "print('must not run')"])
    assert code == 2
    assert "error: argument --" in err and named in err, err
    assert "must not run" not in out


def test_a_host_that_is_no_address_exits_2_naming_it():
    host = "not..valid"  # refused by the name encoding itself: no lookup, so no DNS wait anywhere
    code, out, err, _ = run(["--workers", "2", "--host", host], [PY, "-c", "print('must not run')"])
    assert code == 2, err
    assert f"Cannot resolve host {host!r}: " in err and "Traceback" not in err, err
    assert "must not run" not in out


def test_missing_command_exits_2():
    proc = subprocess.run([PY, "-m", "tfdist.launch", "--workers", "2", "--"],
                          cwd=REPO_ROOT, env=launcher_env(), capture_output=True,
                          text=True, timeout=30)
    assert proc.returncode == 2
    assert "missing the worker command after --" in proc.stderr


# ---- Python API and import cost -------------------------------------------------

def test_python_api_returns_the_status_and_prefixes_output():
    out, err = io.StringIO(), io.StringIO()
    code = launch([PY, script("launch_actions.py"), "print=hi {rank},exit=0", "exit=5"],
                  2, startup_timeout=30, timeout=30, output=out, errors=err,
                  env=launcher_env())
    assert code == 5, err.getvalue()
    assert "worker 1 failed with exit code 5" in err.getvalue()
    code = launch([PY, script("launch_actions.py"), "print=hi {rank}"], 2,
                  timeout=30, output=out, errors=err, env=launcher_env())
    assert code == 0, err.getvalue()
    assert {"[worker 0] hi 0", "[worker 1] hi 1"} <= set(out.getvalue().splitlines())


@pytest.mark.parametrize("kwargs, named", [
    ({"command": "python train.py", "workers": 2}, "'python train.py'"),
    ({"command": ["true"], "workers": 0}, "workers must be an integer >= 1, got 0"),
    ({"command": ["true"], "workers": 1, "timeout": -1}, "timeout"),
    ({"command": ["true"], "workers": 1, "grace_period": float("inf")},
     "grace_period must be a finite number of seconds >= 0 or None (SIGKILL at once), got inf; "
     "0 means the same."),
    ({"command": ["true"], "workers": 1, "devices_per_worker": 1.5}, "got 1.5"),
])
def test_python_api_rejects_bad_arguments(kwargs, named):
    with pytest.raises(ValueError, match=re.escape(named)):
        launch(**kwargs)


@pytest.mark.multiworker
@pytest.mark.parametrize("network, reachable", [("private", False), ("shared", True)])
def test_workers_servers_are_reachable_only_in_a_shared_network(tmp_path, network, reachable):
    """TensorFlow's servers listen on every interface; in the launcher's private
    network (the default) nothing outside the job reaches them."""
    import socket

    stop = tmp_path / "stop"
    proc = start(["--workers", "2", "--network", network, "--timeout", "150"],
                 [PY, script("launch_tf_listen.py"), str(stop)])
    try:
        ports = []
        deadline = time.monotonic() + 120
        while len(ports) < 2 and time.monotonic() < deadline and proc.poll() is None:
            line = proc.stdout.readline()
            if " PORT " in line:
                ports.append(int(line.split()[-1]))
        assert len(ports) == 2, "the workers did not start"
        for port in ports:
            with socket.socket() as sock:
                sock.settimeout(5)
                assert (sock.connect_ex(("127.0.0.1", port)) == 0) is reachable, port
    finally:
        stop.touch()
        code, _, err, _ = finish(proc, 60)
    assert code == 0, err
    if network == "shared":
        assert "listen on every interface" in err
    else:
        assert "private network: the workers see only lo" in err


def test_launcher_does_not_import_tensorflow():
    check = ("import sys, tfdist.launch, tfdist.launch.arguments; "
             "print(sorted(m for m in sys.modules if m.split('.')[0] in "
             "('tensorflow', 'keras')))")
    proc = subprocess.run([PY, "-c", check], cwd=REPO_ROOT, env=launcher_env(),
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


# ---- real TensorFlow -----------------------------------------------------------

@pytest.mark.multiworker
def test_two_tensorflow_workers_all_reduce():
    code, out, err, _ = run(["--workers", "2", "--startup-timeout", "150", "--timeout", "170"],
                            [PY, script("launch_tf_allreduce.py")], deadline=190)
    assert code == 0, f"stdout:\n{out}\nstderr:\n{err}"
    for rank in range(2):
        assert f"replicas=2 task={rank} allreduce=3" in lines_of(out, rank), out


def test_a_stale_folder_is_one_whose_launcher_is_certainly_gone(tmp_path):
    # Real processes: a live one (sleep) and a finished one; owner files as a launcher writes them.
    from tfdist.launch import scratch
    live = subprocess.Popen(["sleep", "30"])
    dead = subprocess.Popen(["true"])
    dead.wait()
    try:
        here = scratch.process_identity(live.pid)
        owners = {
            "live": here,
            "reused_pid": dict(here, started=here["started"] - 1),  # the pid now runs another
            "dead": dict(here, pid=dead.pid),
            "other_boot": dict(here, boot="another-boot-id"),
            "other_container": dict(here, pid=dead.pid, pid_namespace="pid:[1]"),
        }
        for name, owner in owners.items():
            folder = tmp_path / f"tfdist-launch-{owner['pid']}-{name}"
            folder.mkdir()
            (folder / "owner").write_text(json.dumps(owner))
        (tmp_path / "tfdist-launch-no-owner-file").mkdir()
        removed = scratch.remove_stale_ready_dirs(str(tmp_path))
        assert sorted(os.path.basename(path).split("-", 3)[3] for path in removed) == [
            "dead", "other_boot", "reused_pid"]
        assert sorted(p.name.split("-", 3)[3] for p in tmp_path.iterdir()) == [
            "live", "other_container", "owner-file"]
    finally:
        live.kill()
        live.wait()
