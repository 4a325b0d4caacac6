"""The tables the documentation shows are the ones the code renders.

docs/recipes.md holds `tfdist.recipes.flag_table.render_recipe_flags()`
between its marker lines, and docs/fault-tolerance.md holds
`tfdist.runtime.exit_codes.render_table()`. Regenerate the flag tables with
`python -m tfdist.recipes.flag_table`.
"""

import os
import subprocess
import sys

from helpers.paths import REPO_ROOT
from tfdist.recipes.flag_table import BEGIN_MARKER, END_MARKER
from tfdist.runtime import exit_codes


def read_page(name):
    with open(os.path.join(REPO_ROOT, "docs", name), encoding="utf-8") as stream:
        return stream.read()


def test_the_recipes_page_shows_the_flag_tables_the_options_render():
    # The shown `--autotune` default is the one without $TFDIST_AUTOTUNE
    # (the test session sets it), so the tables are rendered in a clean process.
    env = {name: value for name, value in os.environ.items() if name != "TFDIST_AUTOTUNE"}
    rendered = subprocess.run([sys.executable, "-m", "tfdist.recipes.flag_table"], env=env,
                              capture_output=True, text=True, check=True, timeout=120).stdout
    page = read_page("recipes.md")
    assert page.count(BEGIN_MARKER) == 1 and page.count(END_MARKER) == 1
    shown = page[page.index(BEGIN_MARKER):page.index(END_MARKER) + len(END_MARKER)]
    assert shown == rendered.rstrip("\n"), (
        "docs/recipes.md's flag tables differ from the options: paste the output of "
        "`python -m tfdist.recipes.flag_table` between its marker lines.")
    for flag in ("--strategy", "--model-size", "--sync-bn", "--divergence-factor"):
        assert f"| `{flag}` |" in shown, flag


def test_the_fault_tolerance_page_shows_the_exit_code_table_the_code_uses():
    page = read_page("fault-tolerance.md")
    section = page[page.index("## Stopping, resuming and exit codes"):]
    assert exit_codes.render_table() in section
