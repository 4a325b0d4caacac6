"""Test session set-up: two logical CPU devices, so that MirroredStrategy runs
its real multi-replica path on a machine without GPUs (as Keras's own tests do).

This must run before TensorFlow initialises, hence at conftest import time.
The processes the tests start see no matplotlib, as in tfdist's default
install (`hide_bench_extra_from_child_processes`), and find tfdist's bytecode
written (`compile_bytecode_for_child_processes`).
"""

import os
import sys

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# Recipe runs here would each time 2-4 precision/XLA settings at start-up
# (--autotune on, the default): the rules decide instead, and the autotune
# tests turn the trial on explicitly (--autotune on / refresh).
os.environ["TFDIST_AUTOTUNE"] = "off"

from helpers.paths import REPO_ROOT, WITHOUT_BENCH_EXTRA  # noqa: E402
from helpers.young_iterators import YoungIterators  # noqa: E402
from tfdist.distribute.devices import split_cpu_into_logical_devices  # noqa: E402

LOGICAL_CPUS = 2
split_cpu_into_logical_devices(LOGICAL_CPUS)

PYTHON = sys.executable
# The tf.data iterators each test leaves alive, collected after it while young
# (see tests/helpers/young_iterators.py: old ones stall their destructor).
YOUNG_ITERATORS = YoungIterators()


def hide_bench_extra_from_child_processes(environ):
    """Puts `tests/helpers/without_bench_extra` first on the PYTHONPATH in
    `environ`: a process started with it imports TensorFlow and Keras as in
    tfdist's default install (no matplotlib, the `bench` extra), 0.3-0.7 s
    sooner. The current process's own `sys.path` is unchanged.

    Example: `hide_bench_extra_from_child_processes(os.environ)`
    """
    parts = [p for p in environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if WITHOUT_BENCH_EXTRA not in parts:
        environ["PYTHONPATH"] = os.pathsep.join([WITHOUT_BENCH_EXTRA, *parts])


def compile_bytecode_for_child_processes():
    """Writes the bytecode of tfdist and of the tests' helpers (`compileall`),
    as `pip install` does for an installed package. Where
    PYTHONDONTWRITEBYTECODE is set (it is on the project's test machines) no
    import writes it, so each of the ~300 TensorFlow processes the tests start
    would compile again the ~130 tfdist modules it imports: 0.1-0.2 s of CPU
    each. Returns whether every file compiled.

    Example: `compile_bytecode_for_child_processes()`
    """
    import compileall

    compiled = [compileall.compile_dir(os.path.join(REPO_ROOT, part), quiet=2)
                for part in ("tfdist", os.path.join("tests", "helpers"))]
    return all(compiled)


def is_xdist_controller(config):
    """Whether this pytest process hands tests to pytest-xdist workers
    (`-n 2`) rather than running them (a worker, or `-n 0`)."""
    if hasattr(config, "workerinput"):
        return False
    return config.getoption("dist", "no") != "no" and bool(config.getoption("tx", None))


BYTECODE_WRITTEN = pytest.StashKey()


def pytest_report_header(config):
    """Says, on the session's first lines, whether the bytecode was written."""
    written = config.stash.get(BYTECODE_WRITTEN, None)
    if written is None:  # a pytest-xdist worker: the session's first process wrote it
        return []
    state = "written" if written else "NOT all written (compileall failed on some file)"
    return [f"bytecode: tfdist's and the tests' helpers' {state} at the start, for the "
            "processes the tests start (compile_bytecode_for_child_processes)"]


def pytest_configure(config):
    """Once per session (pytest-xdist's controller, or pytest itself with
    `-n 0`): tfdist's bytecode is written (`compile_bytecode_for_child_processes`).
    In the process that runs tests (a pytest-xdist worker, or pytest
    itself with `-n 0`), the processes its tests start see no matplotlib
    (`hide_bench_extra_from_child_processes`) and print their Python stacks
    if they die of a fatal signal (`PYTHONFAULTHANDLER`: a SIGSEGV of a
    parameter-server chief in one whole run left nothing else to go on), and
    the tf.data iterators its tests make are watched (`YOUNG_ITERATORS`). Not
    in pytest-xdist's controller: the workers it starts keep matplotlib for
    the plot tests."""
    if not hasattr(config, "workerinput"):  # once per session, before any worker starts
        config.stash[BYTECODE_WRITTEN] = compile_bytecode_for_child_processes()
    if not is_xdist_controller(config):
        hide_bench_extra_from_child_processes(os.environ)
        os.environ.setdefault("PYTHONFAULTHANDLER", "1")
        YOUNG_ITERATORS.watch()


@pytest.fixture(autouse=True)
def _signal_mask_unchanged():
    """Fails a test that leaves signals blocked in the test process: every
    process a later test starts would inherit the mask (a launcher with
    SIGTERM blocked never forwards it)."""
    import signal

    before = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    yield
    after = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    assert after == before, (f"the test left the signal mask changed: blocked {sorted(after)}, "
                             f"before {sorted(before)}")


@pytest.fixture(autouse=True)
def _global_policy_unchanged():
    """Fails a test that leaves Keras's global dtype policy changed: the
    models of later tests in the same process would be built in it."""
    def policy():
        keras = sys.modules.get("keras")
        return keras.mixed_precision.global_policy().name if keras is not None else "float32"

    before = policy()
    yield
    after = policy()
    assert after == before, f"the test left Keras's global dtype policy {after!r}, not {before!r}"


def _under_global_policy(name):
    """Runs a test under the global Keras precision policy `name`, restoring the previous one."""
    import keras

    previous = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy(name)
    try:
        yield
    finally:
        keras.mixed_precision.set_global_policy(previous)


@pytest.fixture
def mixed_bfloat16():
    """Runs a test under the global `mixed_bfloat16` policy, restoring the previous one."""
    yield from _under_global_policy("mixed_bfloat16")


@pytest.fixture
def mixed_float16():
    """Runs a test under the global `mixed_float16` policy, restoring the previous one."""
    yield from _under_global_policy("mixed_float16")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item, nextitem):
    """After a test and its fixtures' teardown: if the test left a tf.data
    iterator alive, one full collection frees it now, while it is young, if
    only a reference cycle kept it (`helpers.young_iterators`)."""
    yield
    module_ends = nextitem is None or nextitem.path != item.path
    YOUNG_ITERATORS.collect_if_left_alive(module_ends, why=item.nodeid)
