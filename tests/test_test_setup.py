"""The suite's own set-up (tests/conftest.py): the processes the tests start see no
matplotlib, as in tfdist's default install, while the tests themselves do."""

import importlib.util
import os
import subprocess
import sys

from helpers.paths import WITHOUT_BENCH_EXTRA


def test_child_processes_start_without_matplotlib():
    result = subprocess.run([sys.executable, "-c", "import matplotlib"], capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 1, result.stderr
    assert "ModuleNotFoundError" in result.stderr, result.stderr
    assert "tests/helpers/without_bench_extra" in result.stderr, result.stderr


def test_the_test_process_keeps_matplotlib_for_the_plot_tests():
    assert WITHOUT_BENCH_EXTRA not in sys.path
    assert os.environ["PYTHONPATH"].split(os.pathsep)[0] == WITHOUT_BENCH_EXTRA
    spec = importlib.util.find_spec("matplotlib")
    assert spec is not None and WITHOUT_BENCH_EXTRA not in spec.origin, spec
