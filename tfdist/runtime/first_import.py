"""Code run around a module's first import in the process (an import hook, used once).

tfdist changes how two libraries start up when they are first imported after
`import tfdist`: TensorFlow's C++ start-up lines are held back
(`tfdist.runtime.tf_logging`), and Keras leaves matplotlib for its first plot
(`tfdist.seam.keras_import`). Both are a context manager entered around the
module's own import code; `FirstImportHook` is the one place that puts it
there. The hook removes itself when the module's code first runs, whether or
not the import succeeds, and the module gets its real loader back; a lookup
that imports nothing (`importlib.util.find_spec`) leaves it in place.

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
        self._looking_up = False

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
        """The module's spec with its loader wrapped, until its first import; None otherwise.

        A lookup alone (`importlib.util.find_spec`, as TensorFlow does for
        Keras before importing it) leaves the hook in place: it leaves when
        the module's code runs."""
        if fullname != self.module_name or self._looking_up:
            return None
        self._looking_up = True  # the lookup below asks every finder, this one too
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            self._looking_up = False
        if spec is not None and spec.loader is not None:
            spec.loader = _LoaderInside(spec.loader, spec, self.around, self.remove)
        return spec


class _LoaderInside(importlib.abc.Loader):
    """Runs the real loader inside `around()`, after taking the hook away, and
    hands the module back its real loader."""

    def __init__(self, loader, spec, around, remove_hook):
        self._loader = loader
        self._spec = spec
        self._around = around
        self._remove_hook = remove_hook

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._remove_hook()
        self._spec.loader = self._loader
        module.__loader__ = self._loader
        with self._around():
            self._loader.exec_module(module)
