"""Package attributes imported on first use (PEP 562), so a package import stays light.

A package that re-exports names from heavy modules (ones that import
TensorFlow) lists them in a table instead of importing them; the module is
imported when a name is first read:

    # in tfdist/data/__init__.py
    __getattr__, __dir__ = lazy_exports(__name__, {"make_source": "tfdist.data.source_factory"})

`import tfdist.data.specs` then imports no TensorFlow, while
`from tfdist.data import make_source` works as before.
"""

import importlib


def lazy_exports(package_name, names_to_modules):
    """Returns the `__getattr__` and `__dir__` of a package whose names load on first use.

    Args:
        package_name: the package's `__name__`, for the error message.
        names_to_modules: {exported name: dotted module that defines it}.

    Returns:
        `(__getattr__, __dir__)` to assign at the package's top level.

    Example:

    >>> getattr_, dir_ = lazy_exports("pkg", {"sqrt": "math"})
    >>> getattr_("sqrt")(4.0)
    2.0
    """

    def __getattr__(name):
        module_name = names_to_modules.get(name)
        if module_name is None:
            raise AttributeError(f"module {package_name!r} has no attribute {name!r}")
        return getattr(importlib.import_module(module_name), name)

    def __dir__():
        return sorted(names_to_modules)

    return __getattr__, __dir__
