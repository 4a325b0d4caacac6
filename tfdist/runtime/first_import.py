"""Code run around a module's first import in the process (an import hook, used once).

tfdist changes how two libraries start up when they are first imported after
`import tfdist`: TensorFlow's C++ start-up lines are held back
(`tfdist.runtime.tf_logging`), and Keras leaves matplotlib for its first plot
(`tfdist.seam.keras_import`). Both are a context manager entered around the
module's own import code; `FirstImportHook` is the one place that puts it
there. The hook removes itself at the module's first import, whether or not
the import succeeds, and the module gets its real loader back.

Example:

    hook = FirstImportHook("tensorflow", quiet_tensorflow_start_up)
    hook.install()        # False when TensorFlow is already imported
    import tensorflow     # runs inside quiet_tensorflow_start_up()
"""

import importlib.abc
import importlib.util
import sys


class FirstImportHook(importlib.abc.MetaPathFinder):
    """Runs a module's first import inside `around()`, a context manager.

    Args:
        module_name: the top-level module, e.g. "tensorflow".
        around: a callable returning a context manager; the module's import
            code runs inside it. What it raises is raised by the `import`.

    Example:

    >>> hook = FirstImportHook("tensorflow", quiet_tensorflow_start_up)
    >>> hook.install()
    True
    >>> import tensorflow  # its import code runs inside quiet_tensorflow_start_up()
    """

    def __init__(self, module_name, around):
        self.module_name = module_name
        self.around = around

    def install(self):
        """Puts the hook first on `sys.meta_path`, unless the module is imported already.

        Returns:
            True when the hook is in place for the module's first import.

        Example:

        >>> FirstImportHook("sys", contextlib.nullcontext).install()
        False
        """
        if self.module_name in sys.modules:
            return False
        if self not in sys.meta_path:
            sys.meta_path.insert(0, self)
        return True

    def remove(self):
        """Takes the hook off `sys.meta_path` (nothing if it is not there).

        Example:

        >>> hook.remove()
        """
        if self in sys.meta_path:
            sys.meta_path.remove(self)

    def find_spec(self, fullname, path=None, target=None):
        """The module's spec with its loader wrapped, at its first import; None otherwise."""
        if fullname != self.module_name:
            return None
        self.remove()
        spec = importlib.util.find_spec(fullname)
        if spec is not None and spec.loader is not None:
            spec.loader = _LoaderInside(spec.loader, spec, self.around)
        return spec


class _LoaderInside(importlib.abc.Loader):
    """Runs the real loader inside `around()` and hands the module back its real loader."""

    def __init__(self, loader, spec, around):
        self._loader = loader
        self._spec = spec
        self._around = around

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._spec.loader = self._loader
        module.__loader__ = self._loader
        with self._around():
            self._loader.exec_module(module)
