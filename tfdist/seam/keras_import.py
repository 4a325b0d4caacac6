"""The seam to Keras's own import: matplotlib loads when Keras plots, not when it is imported.

Keras 3 imports `matplotlib.pyplot` and `matplotlib.patches` while it is
itself imported, for its two plotting functions
(`keras.visualization.plot_image_gallery` and
`plot_bounding_box_gallery`), whether or not the program ever plots. Where
matplotlib is installed that costs every process that imports Keras about
0.7 s of CPU, a fifth of importing Keras (measured: 3.5 against 2.7 s of
CPU for `import tfdist, keras`, medians of 6 alternating runs, TensorFlow
2.21, Keras 3.15, an AMX Xeon): every recipe run, every launched worker,
every test process.

`import tfdist` therefore arranges for the program's first `import keras`
(Keras is always imported after tfdist when it comes through tfdist's own
modules) to run with matplotlib hidden, and then hands those two Keras
modules a stand-in, `_ImportedOnFirstUse`, that imports the real matplotlib
module the first time the plot reads from it. The plot, and the program's
own `import matplotlib.pyplot`, are then what they would have been. Nothing
changes when matplotlib is not installed (Keras's plotting functions keep
their own "requires the matplotlib package" error), when the program
imported matplotlib first (then it is already paid for), or when Keras is
already imported.

Private: the module globals `plt` of `keras.src.visualization.plot_image_gallery`
and `patches` of `keras.src.visualization.plot_bounding_box_gallery`, which
Keras sets from its `try: import matplotlib...` at import; Keras has no
public switch for it. Pinned in `tests/test_seam.py`.

Example:

    from tfdist.seam import defer_keras_matplotlib_import

    defer_keras_matplotlib_import()   # `import tfdist` does this
    import keras                      # without matplotlib
"""

import contextlib
import importlib
import importlib.abc
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


def defer_keras_matplotlib_import():
    """Makes the process's first `import keras` leave matplotlib unimported
    until Keras plots (see the module docstring). `import tfdist` calls it.

    Does nothing when Keras or matplotlib is already imported, or when
    matplotlib is not installed.

    Returns:
        True when the hook is in place for the next `import keras`.

    Example:

    >>> import tfdist  # then:
    >>> import keras   # matplotlib loads at Keras's first plot
    """
    if "keras" in sys.modules or not _matplotlib_to_defer():
        return False
    if _KERAS_HOOK not in sys.meta_path:
        sys.meta_path.insert(0, _KERAS_HOOK)
    return True


def _matplotlib_to_defer():
    """Whether matplotlib is installed and not imported yet."""
    if "matplotlib" in sys.modules:
        return False
    try:
        return importlib.util.find_spec("matplotlib") is not None
    except (ImportError, ValueError):
        return False


class _KerasFinder(importlib.abc.MetaPathFinder):
    """Finds `keras` once, with a loader that imports it with matplotlib hidden."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != "keras":
            return None
        _remove_keras_hook()
        if not _matplotlib_to_defer():
            return None
        spec = importlib.util.find_spec(fullname)
        if spec is not None and spec.loader is not None:
            spec.loader = _KerasLoader(spec.loader, spec)
        return spec


class _KerasLoader(importlib.abc.Loader):
    """Runs Keras's real loader with matplotlib hidden, hands Keras's plotting
    modules their stand-ins, and gives the module back its real loader."""

    def __init__(self, loader, spec):
        self._loader = loader
        self._spec = spec

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._spec.loader = self._loader
        module.__loader__ = self._loader
        with _matplotlib_hidden():
            self._loader.exec_module(module)
        _give_keras_its_matplotlib_on_first_use()


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


_KERAS_HOOK = _KerasFinder()


def _remove_keras_hook():
    if _KERAS_HOOK in sys.meta_path:
        sys.meta_path.remove(_KERAS_HOOK)
