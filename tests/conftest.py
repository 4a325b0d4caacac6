"""Test session set-up: two logical CPU devices, so that MirroredStrategy runs
its real multi-replica path on a machine without GPUs (as Keras's own tests do).

This must run before TensorFlow initialises, hence at conftest import time.
"""

import os
import sys

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# Recipe runs here would each time 2-4 precision/XLA settings at start-up
# (--autotune on, the default): the rules decide instead, and the autotune
# tests turn the trial on explicitly (--autotune on / refresh).
os.environ["TFDIST_AUTOTUNE"] = "off"

from tfdist.distribute.devices import split_cpu_into_logical_devices  # noqa: E402

LOGICAL_CPUS = 2
split_cpu_into_logical_devices(LOGICAL_CPUS)

PYTHON = sys.executable


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
