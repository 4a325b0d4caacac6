"""Where the repository, the tests and the worker scripts are.

    from helpers.paths import REPO_ROOT, WORKERS_DIR
"""

import os

TESTS_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REPO_ROOT = os.path.dirname(TESTS_DIR)
WORKERS_DIR = os.path.join(TESTS_DIR, "helpers", "workers")
# First on the PYTHONPATH of the processes the tests start (tests/conftest.py): it
# hides matplotlib from them, as in tfdist's default install.
WITHOUT_BENCH_EXTRA = os.path.join(TESTS_DIR, "helpers", "without_bench_extra")


def python_path_with_bench_extra(environ):
    """The PYTHONPATH for a process that must see the real matplotlib (the `bench`
    extra): the repository first, then `environ`'s PYTHONPATH without
    `WITHOUT_BENCH_EXTRA`.

    Example: `env["PYTHONPATH"] = python_path_with_bench_extra(os.environ)`
    """
    parts = [REPO_ROOT, *environ.get("PYTHONPATH", "").split(os.pathsep)]
    return os.pathsep.join(p for p in parts if p and p != WITHOUT_BENCH_EXTRA)
