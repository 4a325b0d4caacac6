"""The exit-time garbage collection a finished run skips (tfdist.runtime.quick_exit).

Each case runs a real child process and looks at the collector from an
`atexit` handler that runs after tfdist's: what the interpreter's exit passes
would still have to scan. Without the handler that is every object the
process made (hundreds of thousands with Keras loaded); with it, next to none.
"""

import subprocess
import sys
import textwrap

from helpers.recipe_util import REPO_ROOT

# Registered before tfdist's handler, so it runs after it (atexit is last-in, first-out).
CHECK_AT_EXIT = """
import atexit, gc
atexit.register(lambda: print(f"at exit: {len(gc.get_objects())} objects to scan, "
                              f"{gc.get_freeze_count()} frozen", flush=True))
"""


def exit_counts(program):
    """Runs `program` after CHECK_AT_EXIT in a child; returns (its output, scanned, frozen)."""
    result = subprocess.run([sys.executable, "-c", CHECK_AT_EXIT + textwrap.dedent(program)],
                            cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    last = result.stdout.strip().splitlines()[-1]
    assert last.startswith("at exit: "), result.stdout
    scanned, frozen = (int(word) for word in last.split() if word.isdigit())
    return result.stdout, scanned, frozen


def test_with_keras_loaded_the_exit_passes_have_next_to_nothing_to_scan():
    out, scanned, frozen = exit_counts("""
        import keras
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
        from tfdist.runtime.quick_exit import skip_exit_garbage_collection
        print(skip_exit_garbage_collection(), skip_exit_garbage_collection())
    """)
    assert out.splitlines()[0] == "True False", out  # installed once
    assert frozen > 100_000 and scanned < 1_000, out


def test_without_it_the_exit_passes_scan_everything():
    out, scanned, frozen = exit_counts("""
        import keras
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
    """)
    assert frozen == 0 and scanned > 100_000, out


def test_a_recipe_run_installs_it():
    out, scanned, frozen = exit_counts("""
        from tfdist.recipes.transformer import main
        assert main(["--print-config"]) == 0
    """)
    assert "model_dir" in out and frozen > 0 and scanned < 1_000, out
