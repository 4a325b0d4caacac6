"""The `tfdist` command itself: --version, --help and dispatch, without TensorFlow."""

import importlib.metadata
import os
import subprocess
import sys

import pytest

import tfdist
from helpers.mw import REPO_ROOT
from tfdist.__main__ import COMMANDS, main, usage
from tfdist.cli.doctor import format_version


def _env():
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env.pop("TF_CONFIG", None)
    env["PYTHONPATH"] = os.pathsep.join(p for p in [REPO_ROOT, env.get("PYTHONPATH", "")] if p)
    return env


def _tfdist(*args, timeout=60):
    return subprocess.run([sys.executable, "-m", "tfdist", *args], cwd=REPO_ROOT, env=_env(),
                          capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("flag", ["--version", "-V"])
def test_version_prints_tfdist_tensorflow_and_keras_versions(flag):
    result = _tfdist(flag)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == f"tfdist {tfdist.__version__}"
    assert f"TensorFlow {importlib.metadata.version('tensorflow')}" in lines[1]
    assert f"Keras {importlib.metadata.version('keras')}" in lines[1]
    assert result.stderr == ""


@pytest.mark.parametrize("args", [["--version"], ["--help"], []])
def test_version_and_help_do_not_import_tensorflow(args):
    check = ("import sys; from tfdist.__main__ import main; code = main(%r); "
             "print(code, sorted(m for m in sys.modules if m.split('.')[0] in "
             "('tensorflow', 'keras')))" % (args,))
    result = subprocess.run([sys.executable, "-c", check], cwd=REPO_ROOT, env=_env(),
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1] == "0 []"


def test_help_lists_every_command_including_doctor():
    result = _tfdist("--help")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    start = lines.index("commands:") + 1
    listed = [line.split()[0] for line in lines[start:lines.index("", start)]]
    assert listed == list(COMMANDS)
    assert "doctor" in listed and "bench" in listed
    assert "--version" in result.stdout


def test_unknown_command_exits_2_and_names_the_valid_ones(capsys):
    assert main(["doctr"]) == 2
    err = capsys.readouterr().err
    assert "'doctr'" in err and "doctor" in err and "bench" in err


def test_main_version_in_process(capsys):
    assert main(["-V"]) == 0
    assert capsys.readouterr().out.splitlines()[0] == f"tfdist {tfdist.__version__}"


def test_format_version_says_what_is_missing():
    text = format_version({"tfdist": "9.9.9", "Python": "3.11.7", "TensorFlow": None,
                           "Keras": "3.15.1"})
    assert text.splitlines() == ["tfdist 9.9.9",
                                 "TensorFlow not installed, Keras 3.15.1, Python 3.11.7"]


def test_usage_aligns_commands_and_options():
    lines = [line for line in usage().splitlines()
             if line.startswith("  ") and not line.startswith("   ")]
    columns = {len(line) - len(line[2:].split("  ", 1)[1].lstrip()) for line in lines}
    assert len(columns) == 1, lines  # every description starts in the same column
