"""The documentation site builds with `mkdocs build --strict`, and strict means strict.

The first test builds the real site (pages and the API reference generated
from the docstrings) into a temporary folder: a broken link, a page missing
from the nav or a mkdocstrings failure fails it. The second builds a one-page
site with the same validation settings and hooks around a broken link, to show
that the settings that quiet docstring noise do not hide broken links.
"""

import os
import subprocess
import sys

import yaml

from helpers.paths import REPO_ROOT

MKDOCS_YML = os.path.join(REPO_ROOT, "mkdocs.yml")


def mkdocs_build(config_file, site_dir, cwd):
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", config_file,
         "--site-dir", str(site_dir)],
        cwd=cwd, capture_output=True, text=True, timeout=600)


def test_the_documentation_builds_strictly(tmp_path):
    result = mkdocs_build(MKDOCS_YML, tmp_path / "site", REPO_ROOT)
    assert result.returncode == 0, f"mkdocs build --strict failed:\n{result.stderr[-6000:]}"
    for page in ("index.html", "recipes/index.html", "api/training/index.html"):
        assert (tmp_path / "site" / page).is_file(), page
    api = (tmp_path / "site" / "api" / "training" / "index.html").read_text(encoding="utf-8")
    assert "tfdist.training.trainer.Trainer" in api       # submodules are documented


def test_a_broken_link_in_a_page_fails_the_strict_build(tmp_path):
    with open(MKDOCS_YML, encoding="utf-8") as stream:
        config = yaml.safe_load(stream)
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "index.md").write_text("# Home\n\nSee [the flags](recipes.md#flags).\n")
    small = {"site_name": "broken", "docs_dir": str(docs), "strict": True,
             "validation": config["validation"],
             "hooks": [os.path.join(REPO_ROOT, hook) for hook in config["hooks"]],
             "plugins": ["autorefs"]}
    (tmp_path / "mkdocs.yml").write_text(yaml.safe_dump(small))
    result = mkdocs_build(str(tmp_path / "mkdocs.yml"), tmp_path / "site", tmp_path)
    assert result.returncode != 0, result.stderr
    assert "recipes.md" in result.stderr, result.stderr
