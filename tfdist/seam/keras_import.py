"""The seam to Keras's own import: matplotlib loads when Keras plots, not when it is imported.

Keras 3 imports `matplotlib.pyplot` and `matplotlib.patches` while it is
itself imported, for its two plotting functions
(`keras.visualization.plot_image_gallery` and
`plot_bounding_box_gallery`), whether or not the program ever plots. Where
matplotlib is installed that costs every process that imports Keras about
0.4 s of CPU, 13% of importing Keras (measured: 2.99 against 2.59 s of CPU
for `import keras` after `import tfdist`, medians of 8 alternating
processes, TensorFlow 2.21, Keras 3.15, an AMX Xeon): every recipe run,
every launched worker, every test process.

`import tfdist` therefore runs the program's first `import keras` (Keras
is always imported after tfdist when it comes through tfdist's own modules)
inside `keras_import_without_matplotlib`: matplotlib is hidden while Keras's
import code runs, and then those two Keras modules get a stand-in,
`_ImportedOnFirstUse`, that imports the real matplotlib module the first
time the plot reads from it. The plot, and the program's
own `import matplotlib.pyplot`, are then what they would have been. Nothing
changes when matplotlib is not installed (Keras's plotting functions keep
their own "requires the matplotlib package" error), when the program
imported matplotlib first (then it is already paid for), or when Keras is
already imported. While Keras's import code runs (and only then), another
thread that imports matplotlib would find it missing; tfdist starts no
thread before it imports Keras.

Private: the module globals `plt` of `keras.src.visualization.plot_image_gallery`
and `patches` of `keras.src.visualization.plot_bounding_box_gallery`, which
Keras sets from its `try: import matplotlib...` at import; Keras has no
public switch for it. Pinned in `tests/test_seam.py`.

Example:

    from tfdist.seam import keras_import_without_matplotlib

    with keras_import_without_matplotlib():   # `import tfdist` arranges this
        import keras                          # matplotlib loads at its first plot
"""

import contextlib
import importlib
import importlib.util
import sys

# Keras module -> (its global set from a matplotlib import, the module it imports).
KERAS_MATPLOTLIB_GLOBALS = {
    "keras.src.visualization.plot_image_gallery": ("plt", "matplotlib.pyplot"),
    "keras.src.visualization.plot_bounding_box_gallery": ("patches", "matplotlib.patches"),
}


class _ImportedOnFirstUse:
    """Stands for a module that is imported (`importlib.import_module`) the
    first time an attribute is read from it, and is then that module's
    attribute: the module is the one in `sys.modules`, shared with every
    other `import` of it.

    Args:
        module_name: the module's full name, e.g. "matplotlib.pyplot".

    Example:

    >>> json_module = _ImportedOnFirstUse("json")
    >>> json_module.dumps([1])
    '[1]'
    """

    def __init__(self, module_name):
        self.module_name = module_name

    def __getattr__(self, attribute):
        if attribute == "module_name":  # not set yet (a copy being built): no recursion
            raise AttributeError(attribute)
        return getattr(importlib.import_module(self.module_name), attribute)

    def __repr__(self):
        return f"<module {self.module_name!r}, imported on first use>"


@contextlib.contextmanager
def keras_import_without_matplotlib():
    """Keras imported inside the block leaves matplotlib for its first plot
    (see the module docstring). `import tfdist` runs the process's first
    `import keras` inside it (`tfdist.runtime.first_import.FirstImportHook`).

    Nothing changes when matplotlib is not installed or already imported,
    or when Keras is already imported (the block then imports nothing).

    Example:

    >>> with keras_import_without_matplotlib():
    ...     import keras
    >>> "matplotlib" in sys.modules
    False
    """
    if not _matplotlib_to_defer():
        yield
        return
    with _matplotlib_hidden():
        yield
    _give_keras_its_matplotlib_on_first_use()


def _matplotlib_to_defer():
    """Whether matplotlib is installed and not imported yet."""
    if "matplotlib" in sys.modules:
        return False
    try:
        return importlib.util.find_spec("matplotlib") is not None
    except (ImportError, ValueError):
        return False


@contextlib.contextmanager
def _matplotlib_hidden():
    """`import matplotlib...` fails with ImportError inside the block (as if
    not installed); outside it imports as ever."""
    sys.modules["matplotlib"] = None
    try:
        yield
    finally:
        if "matplotlib" in sys.modules and sys.modules["matplotlib"] is None:
            del sys.modules["matplotlib"]


def _give_keras_its_matplotlib_on_first_use():
    """Sets each Keras global that its hidden matplotlib import left None to an
    `_ImportedOnFirstUse` of the module it imports."""
    for keras_module, (name, matplotlib_module) in KERAS_MATPLOTLIB_GLOBALS.items():
        module = sys.modules.get(keras_module)
        if module is not None and getattr(module, name, False) is None:
            setattr(module, name, _ImportedOnFirstUse(matplotlib_module))
