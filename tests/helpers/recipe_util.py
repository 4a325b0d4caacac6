"""Runs a recipe as a user would: `python -m tfdist.recipes.NAME ...` in a process of its own
(forked from one with TensorFlow imported where it can be: helpers.zygote)."""

import os
import re
import subprocess
import sys

from helpers.paths import REPO_ROOT  # noqa: E402,F401
from helpers.zygote import forked_command, run_module


def _recipe_env(env):
    full_env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1")
    full_env.pop("TF_CONFIG", None)
    full_env.update(env or {})
    return full_env


def run_recipe(name, args, timeout=300, env=None):
    """Returns the CompletedProcess (stdout and stderr merged) of a recipe run:
    a process of its own, forked from this worker's process that has
    TensorFlow imported already (helpers.zygote) where its environment allows.

    Example: `assert run_recipe("cnn", ["--epochs", "1"]).returncode == 0`
    """
    return run_module(f"tfdist.recipes.{name}", args, env=_recipe_env(env), cwd=REPO_ROOT,
                      timeout=timeout)


def start_recipe(name, args, env=None):
    """Starts a recipe run and returns its Popen (stdout and stderr merged, as text);
    end it with `helpers.processes.finish`. The process stands for a run forked from
    one with TensorFlow imported where it can be (`helpers.zygote.forked_command`):
    signals sent to it reach the run, and it exits as the run does.

    Example: `process = start_recipe("translation", ["--model-dir", str(tmp_path)])`
    """
    command, env = forked_command([sys.executable, "-m", f"tfdist.recipes.{name}", *args],
                                  _recipe_env(env), REPO_ROOT)
    return subprocess.Popen(command, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def final_metric(output, name):
    """The `first -> last` pair a recipe's final block prints for `name`."""
    match = re.search(rf"^\s*(?:\[worker 0\] )?\s*{re.escape(name)}\s+([0-9.]+) -> ([0-9.]+)",
                      output, re.MULTILINE)
    assert match, f"no final {name!r} line in the output:\n{output[-3000:]}"
    return float(match.group(1)), float(match.group(2))
