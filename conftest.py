"""Collects the Python code blocks of README.md and docs/*.md as tests.

pytest-markdown-docs runs each ```python block of those files (in-process, in
a temporary working directory); a block fenced ```python notest is skipped,
and the page says in a sentence why (tests/docs/test_code_blocks.py checks
that). The plugin's own `--markdown-docs` switch is not used: it would also
import every .py file under tests/ (worker scripts included) to search their
docstrings, which changes what tests/ collects.

It also sets how many pytest-xdist workers `-n auto` (setup.cfg) starts, and
the order in which they are handed the test files.
"""

import os
import pathlib
import tempfile

import pytest
from pytest_markdown_docs.plugin import MarkdownInlinePythonItem, MarkdownTextFile

ROOT = pathlib.Path(__file__).parent
DOCS = ROOT / "docs"


def is_documentation(path):
    """Whether `path` is README.md or a page under docs/ (the files whose blocks run)."""
    path = pathlib.Path(path)
    return path.suffix == ".md" and (path == ROOT / "README.md" or DOCS in path.parents)


MAX_TEST_WORKERS = 4


def pytest_xdist_auto_num_workers(config):
    """`-n auto` (setup.cfg): one pytest-xdist worker per usable core and one more,
    at most MAX_TEST_WORKERS. With one per core the cores were busy about 1.87
    of 2: many tests wait (for worker processes to start and meet, for a
    backup, for a deadline), and the extra worker runs a test in those gaps
    (on a 2-core Zen 4, 6% and 12% less time over ten of the heaviest files,
    docs/testing.md). More would only share the same memory bandwidth and
    stretch the tests' deadlines: each worker's tests start TensorFlow
    processes of their own (recipes, localhost clusters)."""
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return min(MAX_TEST_WORKERS, (usable or 1) + 1)


HEAVY_MARKERS = ("slow", "multiworker")


def heavy_tests_per_file(items):
    """{file: how many of its tests carry a HEAVY_MARKERS mark}."""
    counts = {}
    for item in items:
        heavy = any(item.get_closest_marker(name) for name in HEAVY_MARKERS)
        counts[item.path] = counts.get(item.path, 0) + int(heavy)
    return counts


def pytest_collection_modifyitems(config, items):
    """Files with the most slow or multi-worker tests first (each file's tests in their order).

    pytest-xdist hands whole files to its workers (`--dist loadfile`) in
    collection order (`--no-loadscope-reorder`, setup.cfg). Longest first
    keeps both workers busy to the end: with the long end-to-end files last,
    one worker would run them alone while the other sat idle.
    """
    del config
    counts = heavy_tests_per_file(items)
    items.sort(key=lambda item: -counts[item.path])  # stable: files stay whole and in order


def pytest_collect_file(file_path, parent):
    if is_documentation(file_path) and not parent.config.option.markdowndocs:
        return MarkdownTextFile.from_parent(parent, path=pathlib.Path(file_path))
    return None


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    """A documentation block runs in a fresh temporary folder (it may write files)."""
    if not isinstance(item, MarkdownInlinePythonItem):
        return (yield)
    previous = os.getcwd()
    with tempfile.TemporaryDirectory(prefix="tfdist-docs-block-", ignore_cleanup_errors=True) as folder:
        os.chdir(folder)
        try:
            return (yield)
        finally:
            os.chdir(previous)
