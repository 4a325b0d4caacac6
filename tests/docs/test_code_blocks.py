"""The documentation's code blocks: the run ones, the skipped ones and their reasons.

pytest-markdown-docs runs every ```python block of README.md and docs/ (see
conftest.py at the repository's root). These tests check what the plugin does
not: that a block fenced ```python notest says why in the sentence before it,
that the README's engine example writes nothing to stderr in a fresh process
(no TensorFlow start-up lines, no Python warning from tfdist), and that a
failing block fails the suite through the root conftest.
"""

import glob
import os
import re
import shutil
import subprocess
import sys

from markdown_it import MarkdownIt

from helpers.paths import REPO_ROOT

README = os.path.join(REPO_ROOT, "README.md")
PAGES = [README] + sorted(glob.glob(os.path.join(REPO_ROOT, "docs", "**", "*.md"), recursive=True))
REASON = re.compile(r"not run by the test suite: \w+", re.IGNORECASE)


def python_blocks(path):
    """(first line, fence info, code, text of the paragraph before) of each Python block."""
    with open(path, encoding="utf-8") as stream:
        tokens = MarkdownIt("commonmark").parse(stream.read())
    blocks = []
    for index, token in enumerate(tokens):
        if token.type == "fence" and token.info.split()[:1] in (["python"], ["py"]):
            before = next((tokens[i].content for i in range(index - 1, -1, -1)
                           if tokens[i].type == "inline"), "")
            blocks.append((token.map[0] + 1, token.info.split(), token.content, before))
    return blocks


def test_every_block_not_run_says_why_and_they_are_few():
    blocks = [(os.path.relpath(path, REPO_ROOT), block) for path in PAGES
              for block in python_blocks(path)]
    run = [where for where, (_, info, _, _) in blocks if "notest" not in info]
    not_run = [(where, line, before) for where, (line, info, _, before) in blocks
               if "notest" in info]
    assert len(run) >= 4, run
    assert len(not_run) <= 2, not_run
    for where, line, before in not_run:
        assert REASON.search(before), (
            f"{where}:{line} is fenced ```python notest without a reason: say in the sentence "
            f"before it 'not run by the test suite: <why>'.")


def test_the_readme_engine_example_writes_nothing_to_stderr(tmp_path):
    engine = [code for _, info, code, _ in python_blocks(README)
              if "notest" not in info and "Trainer(model" in code]
    assert len(engine) == 1, engine
    env = {name: value for name, value in os.environ.items()
           if name not in ("TF_CONFIG", "TF_CPP_MIN_LOG_LEVEL")}
    result = subprocess.run([sys.executable, "-c", engine[0]], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-4000:]
    assert result.stderr.strip() == "", f"README.md's engine example wrote to stderr:\n{result.stderr}"


def test_a_failing_block_fails_the_suite(tmp_path):
    shutil.copy(os.path.join(REPO_ROOT, "conftest.py"), tmp_path / "conftest.py")
    (tmp_path / "docs").mkdir()
    (tmp_path / "README.md").write_text("# r\n\n```python\nassert 1 + 1 == 2\n```\n")
    (tmp_path / "docs" / "page.md").write_text(
        "# p\n\n```python\nraise RuntimeError('a broken example')\n```\n\n"
        "Not run by the test suite: it needs a cluster.\n\n```python notest\nraise SystemExit\n```\n")
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         "--rootdir", str(tmp_path), "-c", os.devnull, "README.md", "docs"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert result.returncode == 1, result.stdout[-3000:]
    assert "1 failed, 1 passed" in result.stdout, result.stdout[-3000:]
    assert "a broken example" in result.stdout
