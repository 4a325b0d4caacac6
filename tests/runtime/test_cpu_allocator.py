"""`import tfdist` asks TensorFlow for its pooled CPU allocator (unless the
environment decided otherwise), in fresh interpreters: TensorFlow's own
default is malloc (oneDNN's pool where oneDNN is on), the pool is what a
tfdist program gets, an explicit `TF_CPU_ALLOCATOR_USE_BFC=false` keeps
TensorFlow's default."""

import os
import subprocess
import sys

import pytest

from helpers.paths import REPO_ROOT
from tfdist.runtime.cpu_allocator import (POOL_ENV, POOL_LIMIT_ENV, describe_cpu_allocator,
                                          machine_memory_mb, pool_cpu_memory, pool_limit_problem)
from tfdist.runtime.onednn import ONEDNN_ENV


def test_an_environment_that_says_nothing_gets_the_pool_up_to_the_machines_memory():
    environ = {}
    assert pool_cpu_memory(environ) == environ
    assert environ == {POOL_ENV: "true", POOL_LIMIT_ENV: str(machine_memory_mb())}
    assert machine_memory_mb() > 1024


# TensorFlow reads only "1" and "true" (any case) as true: "yes" or " true" leave malloc.
@pytest.mark.parametrize("value", ["false", "0", "no", "yes", " true"])
def test_an_explicit_no_keeps_malloc_and_sets_no_limit(value):
    environ = {POOL_ENV: value}
    assert pool_cpu_memory(environ) == {}
    assert environ == {POOL_ENV: value}


def test_an_explicit_yes_or_limit_is_kept():
    environ = {POOL_ENV: "1", POOL_LIMIT_ENV: "2048"}
    assert pool_cpu_memory(environ) == {}
    assert environ == {POOL_ENV: "1", POOL_LIMIT_ENV: "2048"}
    environ = {POOL_ENV: "True"}
    assert pool_cpu_memory(environ) == {POOL_LIMIT_ENV: str(machine_memory_mb())}


# TensorFlow reads the limit as a whole number of MiB: with the pool on, "lots" and "0"
# crashed the process at its first tensor (a segmentation fault), "1.5" ran out of memory.
@pytest.mark.parametrize("limit", ["lots", "0", "1.5", "-5", "", "8 GiB", "\u0668\u0661\u0669\u0662"])
def test_a_pool_limit_tensorflow_cannot_use_is_named_and_the_pool_not_turned_on(limit):
    problem = pool_limit_problem({POOL_LIMIT_ENV: limit})
    assert problem.startswith(f"${POOL_LIMIT_ENV}={limit!r} is not a whole number of MiB > 0 "), problem
    assert f"set one such as 8192, or unset it for this machine's {machine_memory_mb()} MiB" in problem
    environ = {POOL_LIMIT_ENV: limit}
    assert pool_cpu_memory(environ) == {} and environ == {POOL_LIMIT_ENV: limit}
    # The pool asked for in the environment: the user's choice, refused by the recipes.
    assert pool_limit_problem({POOL_ENV: "true", POOL_LIMIT_ENV: limit}) == problem
    # Without the pool TensorFlow does not read the limit: nothing to say.
    assert pool_limit_problem({POOL_ENV: "false", POOL_LIMIT_ENV: limit}) is None


@pytest.mark.parametrize("limit", ["8192", " 512", "1"])
def test_a_whole_number_of_mib_is_a_limit(limit):
    assert pool_limit_problem({POOL_LIMIT_ENV: limit}) is None
    assert pool_limit_problem({POOL_ENV: "1", POOL_LIMIT_ENV: limit}) is None


def _allocator(code, **env):
    """What `cpu_allocator_in_use()` and the environment say in a fresh interpreter
    after `code`, and whether TensorFlow ran oneDNN there. oneDNN is off unless
    `env` says otherwise: TensorFlow turns it on by itself only on some CPUs
    (AVX512-VNNI, AVX512-BF16, AMX), and with it its default allocator is
    oneDNN's pool instead of malloc."""
    environ = {k: v for k, v in os.environ.items() if k not in (POOL_ENV, POOL_LIMIT_ENV)}
    environ.update({ONEDNN_ENV: "0"}, **env, PYTHONPATH=str(REPO_ROOT))
    script = (f"{code}\nfrom tfdist.runtime.cpu_allocator import cpu_allocator_in_use\n"
              "from tfdist import seam\n"
              "import os\nprint(cpu_allocator_in_use(), os.environ.get('TF_CPU_ALLOCATOR_USE_BFC'),"
              " seam.onednn_enabled())")
    result = subprocess.run([sys.executable, "-c", script], env=environ, cwd=REPO_ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=180)
    assert result.returncode == 0, result.stdout[-3000:]
    return result.stdout.strip().splitlines()[-1]


@pytest.mark.parametrize("code, env, expected", [
    # A CPU tensor made before tfdist is imported: TensorFlow's default, malloc
    # (the checker's import then imports tfdist, too late).
    ("import tensorflow as tf\ntf.zeros([1])", {}, "malloc true False"),
    # tfdist imported, before or after TensorFlow or Keras: the pool.
    ("import tfdist\nimport tensorflow", {}, "pool true False"),
    ("import tensorflow\nimport tfdist", {}, "pool true False"),
    ("import keras\nimport tfdist", {}, "pool true False"),
    # The user's choice stands.
    ("import tfdist", {POOL_ENV: "false"}, "malloc false False"),
    # With oneDNN on, TensorFlow's default is oneDNN's pool: tfdist's setting
    # gives TensorFlow's pool, the user's "false" or a tensor made first oneDNN's.
    ("import tfdist", {ONEDNN_ENV: "1"}, "pool true True"),
    ("import tfdist", {POOL_ENV: "false", ONEDNN_ENV: "1"}, "pool false True"),
    ("import tensorflow as tf\ntf.zeros([1])", {ONEDNN_ENV: "1"}, "pool true True"),
    # A limit TensorFlow cannot read: the pool, which would crash, is left off.
    ("import tfdist", {POOL_LIMIT_ENV: "lots"}, "malloc None False"),
], ids=["a tensor before tfdist", "tfdist first", "tensorflow first", "keras first",
        "explicit false", "onednn", "onednn explicit false", "onednn a tensor before tfdist",
        "a limit tensorflow cannot read"])
def test_what_a_fresh_process_allocates_with(code, env, expected):
    assert _allocator(code, **env) == expected


def test_the_doctors_line_says_where_tensors_come_from_and_how_to_change_it():
    pooled = describe_cpu_allocator("pool", {POOL_ENV: "true", POOL_LIMIT_ENV: "2048"})
    assert pooled == "TensorFlow's pool (TF_CPU_ALLOCATOR_USE_BFC=true), up to 2048 MiB"
    refused = describe_cpu_allocator("malloc", {POOL_ENV: "false"})
    assert refused.startswith("malloc (TF_CPU_ALLOCATOR_USE_BFC=false in the environment; unset it")
    onednn_default = describe_cpu_allocator("pool", {POOL_ENV: "false"}, onednn=True)
    assert onednn_default == ("oneDNN's pool (TensorFlow's default with oneDNN on; "
                              "TF_CPU_ALLOCATOR_USE_BFC=false)")
    assert describe_cpu_allocator("pool", {}, onednn=True).startswith("oneDNN's pool")
    assert describe_cpu_allocator("pool", {POOL_ENV: "1"}, onednn=True).startswith(
        "TensorFlow's pool (TF_CPU_ALLOCATOR_USE_BFC=1)")
    too_late = describe_cpu_allocator("malloc", {POOL_ENV: "true"})
    assert too_late.startswith("malloc: a CPU tensor was made before") and "import tfdist" in too_late
