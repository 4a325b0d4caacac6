"""The suite's forked runs (tests/helpers/zygote.py): a module run forked from a
process with TensorFlow imported behaves as `python -m` in a fresh process
(argv, working directory, environment, output, exit codes, signals,
timeouts), and a run whose environment TensorFlow would read at import gets
a fresh process. A client process standing for a forked run (zygote_client.py,
for the processes tests signal and the launcher's workers) passes signals on,
ends as its run ends, takes its run with it when killed, and starts a fresh
interpreter when the server refuses its environment."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from helpers.paths import TESTS_DIR, WORKERS_DIR
from helpers.processes import finish
from helpers.recipe_util import _recipe_env
from helpers import zygote
from helpers.zygote import _server_for, forked_command, run_module

PROBE = "helpers.workers.zygote_probe"
PROBE_SCRIPT = os.path.join(WORKERS_DIR, "zygote_probe.py")


@pytest.fixture(scope="module", autouse=True)
def servers_of_this_module():
    """A table of servers of this module's own: the worker's table may be full already
    (MAX_SERVERS environments of earlier tests), and then every run would be fresh."""
    saved = dict(zygote._SERVERS)
    zygote._SERVERS.clear()
    yield zygote._SERVERS
    for server in zygote._SERVERS.values():
        server.close()
    zygote._SERVERS.clear()
    zygote._SERVERS.update(saved)


def probe(*args, env=None, timeout=120, fresh=False):
    """The probe's CompletedProcess, forked from the recipes' server (or fresh)."""
    return run_module(PROBE, list(args), env=_recipe_env(env), cwd=TESTS_DIR, timeout=timeout,
                      fork=not fresh)


def report(result):
    assert result.returncode == 0, result.stdout
    return json.loads(result.stdout.splitlines()[0])


def test_a_forked_run_sees_what_a_fresh_python_m_sees(tmp_path):
    report(probe("report"))  # the server started without this TMPDIR (its import found /tmp)
    env = {"ZYGOTE_PROBE": "forked", "TMPDIR": str(tmp_path)}
    forked = probe("report", "--flag", "x y", env=env)
    fresh = probe("report", "--flag", "x y", env=env, fresh=True)
    seen = {name: [report(forked)[name], report(fresh)[name]] for name in report(forked)}
    assert seen["tensorflow_imported_at_start"] == [True, False]  # the fork did skip the import
    for name in ("argv", "cwd", "name", "probe_variable", "path0", "tempdir"):
        assert seen[name][0] == seen[name][1], (name, seen[name])
    assert seen["tempdir"][0] == str(tmp_path)  # not the server's, cached by its tempfile
    assert seen["argv"][0] == ["report", "--flag", "x y"]
    assert seen["name"][0] == "__main__" and seen["cwd"][0] == TESTS_DIR
    assert "on stderr" in forked.stdout  # stderr merged into stdout, as the recipes' runs ask


def test_each_forked_run_is_a_process_of_its_own_with_its_own_random_state():
    first, second = report(probe("report")), report(probe("report"))
    assert first["pid"] != second["pid"] and os.getpid() not in (first["pid"], second["pid"])
    assert first["random"] != second["random"]


@pytest.mark.parametrize("args, code, text", [
    (("exit", "3"), 3, None),
    (("raise",), 1, "ValueError: the probe raised"),
    (("terminate",), -15, None),
])
def test_exit_codes_and_tracebacks_are_a_fresh_processs(args, code, text):
    for result in (probe(*args), probe(*args, fresh=True)):
        assert result.returncode == code, result.stdout
        if text:
            assert text in result.stdout


def test_carriage_returns_read_as_text_mode_reads_them():
    assert probe("carriage-return").stdout == probe("carriage-return", fresh=True).stdout == "a\nb\nc\n"


def test_a_run_past_its_timeout_is_killed_and_raises_as_subprocess_run_does():
    with pytest.raises(subprocess.TimeoutExpired) as caught:
        probe("sleep", "60", timeout=3)
    pid = int(caught.value.output.split()[0])
    with pytest.raises(ProcessLookupError):
        for _ in range(100):  # the kill is delivered; its handler reaps it
            os.kill(pid, 0)
            time.sleep(0.05)


def test_each_import_time_environment_has_a_server_of_its_own():
    recipes = _recipe_env(None)
    assert _server_for(dict(recipes, TF_CONFIG="{}", ZYGOTE_PROBE="x"), TESTS_DIR) is _server_for(recipes, TESTS_DIR)
    loud = _server_for(dict(recipes, TF_CPP_MIN_LOG_LEVEL="0"), TESTS_DIR)
    assert loud is not _server_for(recipes, TESTS_DIR)
    assert loud.environment["TF_CPP_MIN_LOG_LEVEL"] == "0"


def test_past_max_servers_the_least_recently_used_server_is_closed(servers_of_this_module):
    recipes = _recipe_env(None)
    first = _server_for(recipes, TESTS_DIR)
    others = [_server_for(dict(recipes, PYTHON_ZYGOTE_TEST=str(n)), TESTS_DIR)
              for n in range(zygote.MAX_SERVERS - 1)]
    assert _server_for(recipes, TESTS_DIR) is first  # used again: now the most recent
    newest = _server_for(dict(recipes, PYTHON_ZYGOTE_TEST="new"), TESTS_DIR)
    assert list(servers_of_this_module.values()) == [*others[1:], first, newest]
    assert others[0].process.poll() is not None  # closed
    assert report(probe("report"))["tensorflow_imported_at_start"] is True


def test_a_run_that_sets_tensorflows_log_level_gets_a_fresh_process():
    assert report(probe("report", "--tf-log-level", "0"))["tensorflow_imported_at_start"] is False
    assert report(probe("report", "--tf-log-level=0"))["tensorflow_imported_at_start"] is False
    assert report(probe("report", "--tf-log-levels"))["tensorflow_imported_at_start"] is True


def start_client(*args, env=None, run_env=None, script=False):
    """The client's Popen running the probe (`-m` or as a script), stdout and stderr merged."""
    target = [PROBE_SCRIPT] if script else ["-m", PROBE]
    command, full_env = forked_command([sys.executable, *target, *args], _recipe_env(env),
                                       TESTS_DIR, run_env=run_env)
    assert command[1] == zygote.CLIENT, command
    return subprocess.Popen(command, cwd=TESTS_DIR, env=full_env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)


def fresh_run(*args, script=False):
    target = [PROBE_SCRIPT] if script else ["-m", PROBE]
    return subprocess.run([sys.executable, *target, *args], cwd=TESTS_DIR, env=_recipe_env(None),
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120)


def gone(pid, seconds=10):
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


@pytest.mark.parametrize("script", [False, True], ids=["-m", "script"])
def test_a_client_run_sees_what_a_fresh_python_sees(script):
    client = start_client("report", "--flag", "x y", script=script)
    code, out = finish(client, timeout=120)
    forked, fresh = report(subprocess.CompletedProcess([], code, out)), report(fresh_run(
        "report", "--flag", "x y", script=script))
    assert forked["tensorflow_imported_at_start"] is True and fresh["tensorflow_imported_at_start"] is False
    for name in ("argv", "cwd", "name", "probe_variable", "path0"):
        assert forked[name] == fresh[name], (name, forked[name], fresh[name])
    assert forked["pid"] != client.pid  # the run is the server's fork; the client stands for it
    assert "on stderr" in out


@pytest.mark.parametrize("args, code", [(("exit", "3"), 3), (("raise",), 1), (("terminate",), -15),
                                        (("kill",), -9)])
def test_a_client_ends_as_its_run_ends(args, code):
    result, out = finish(start_client(*args), timeout=120)
    assert result == code == fresh_run(*args).returncode, out
    assert ("ValueError: the probe raised" in out) == (args == ("raise",))


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGUSR1])
def test_a_signal_to_the_client_or_its_group_reaches_the_run(signum):
    client = start_client("sleep", "60")
    run_pid = int(client.stdout.readline())
    assert run_pid != client.pid
    os.killpg(client.pid, signum) if signum == signal.SIGUSR1 else client.send_signal(signum)
    code, out = finish(client, timeout=30)
    # SIGINT: the run's KeyboardInterrupt traceback, then Python ends by SIGINT, as a fresh one does.
    assert code == -signum, out
    assert ("KeyboardInterrupt" in out) == (signum == signal.SIGINT)
    assert gone(run_pid)


def test_a_killed_client_takes_its_run_with_it():
    client = start_client("sleep", "60")
    run_pid = int(client.stdout.readline())
    client.kill()
    assert finish(client, timeout=30)[0] == -9
    assert gone(run_pid), "the run outlived its client"


def test_a_client_whose_environment_the_server_did_not_start_with_runs_fresh():
    client = start_client("report", run_env=_recipe_env({"TF_ZYGOTE_TEST": "other"}))
    code, out = finish(client, timeout=120)
    seen = report(subprocess.CompletedProcess([], code, out))
    assert seen["tensorflow_imported_at_start"] is False and seen["pid"] == client.pid  # exec'd
