"""Every ```python example of README.md runs as written in a fresh process.

Each block runs on its own (so each must bring its model and data) in a
temporary directory, with the README's own imports and a deadline. A block
preceded by an `<!-- not run: reason -->` line (a fragment that needs a
cluster) is skipped with that reason; such marks are listed by
`test_the_blocks_not_run_are_few_and_say_why`.
"""

import os
import re
import subprocess
import sys
import textwrap

import pytest

from helpers.paths import REPO_ROOT  # noqa: E402
README = os.path.join(REPO_ROOT, "README.md")
NOT_RUN = re.compile(r"^\s*<!-- not run: (.+?) -->\s*$")
FENCE = re.compile(r"^(\s*)```(\w*)\s*$")
DEADLINE_SECONDS = 300


def readme_blocks(path=README):
    """`(line number, code, reason not run or None)` for every ```python block."""
    with open(path, encoding="utf-8") as f:
        lines = f.read().splitlines()
    blocks, index = [], 0
    while index < len(lines):
        fence = FENCE.match(lines[index])
        if not fence:
            index += 1
            continue
        end = index + 1
        while end < len(lines) and not FENCE.match(lines[end]):
            end += 1
        if fence.group(2) == "python":
            mark = NOT_RUN.match(lines[index - 1]) if index > 0 else None
            code = textwrap.dedent("\n".join(lines[index + 1:end]))
            blocks.append((index + 1, code, mark.group(1) if mark else None))
        index = end + 1
    return blocks


BLOCKS = readme_blocks()


@pytest.mark.parametrize("line, code, not_run", BLOCKS,
                         ids=[f"README.md:{line}" for line, _, _ in BLOCKS])
def test_readme_example_runs_as_written(line, code, not_run, tmp_path):
    if not_run:
        pytest.skip(f"README.md:{line} is marked not run: {not_run}")
    env = {name: value for name, value in os.environ.items()
           if name not in ("TF_CONFIG", "TF_CPP_MIN_LOG_LEVEL")}
    result = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=DEADLINE_SECONDS)
    assert result.returncode == 0, (
        f"README.md:{line} failed:\n{result.stderr[-4000:]}")
    # A program that imports tfdist first shows none of TensorFlow's start-up
    # lines, and tfdist itself triggers no Python warning.
    assert result.stderr.strip() == "", f"README.md:{line} wrote to stderr:\n{result.stderr}"


def test_the_blocks_not_run_are_few_and_say_why():
    assert len(BLOCKS) >= 3
    not_run = [(line, reason) for line, _, reason in BLOCKS if reason]
    assert len(not_run) <= 1, not_run
    assert all("cluster" in reason for _, reason in not_run), not_run
