"""The module paths of the release before the package got one wing per topic.

`from tfdist.strategy import create_strategy` keeps working for one release:
the old path is a stand-in module that finds each name in the module(s) it
moved to, with a `DeprecationWarning` that names the new path. Real modules
always win: the stand-ins are found only where no file exists.

    import warnings
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        from tfdist.strategy import create_strategy   # DeprecationWarning: use tfdist.distribute...
"""

import importlib
import importlib.abc
import importlib.util
import sys
import warnings

_STRATEGY = ("tfdist.distribute.strategy_factory", "tfdist.distribute.introspection",
             "tfdist.distribute.startup", "tfdist.distribute.slurm",
             "tfdist.distribute.collectives")
_RECIPE_RUNNER = ("tfdist.recipes.recipe_runner", "tfdist.recipes.recipe_types",
                  "tfdist.recipes.preflight", "tfdist.recipes.recipe_optimizer",
                  "tfdist.recipes.auto_choices", "tfdist.recipes.run_report")

OLD_PATHS = {
    "tfdist.strategy": _STRATEGY,
    "tfdist.strategy_names": ("tfdist.distribute.strategy_names",),
    "tfdist.device_limits": ("tfdist.distribute.device_limits",),
    "tfdist.cluster": ("tfdist.distribute.tf_config",),
    "tfdist.ps_cluster": ("tfdist.distribute.ps_cluster",),
    "tfdist.devices": ("tfdist.distribute.devices",),
    "tfdist.ports": ("tfdist.distribute.ports",),
    "tfdist.stop_signals": ("tfdist.runtime.stop_signals",),
    "tfdist.tf_logging": ("tfdist.runtime.tf_logging",),
    "tfdist.gpu_memory": ("tfdist.runtime.gpu_memory",),
    "tfdist.nvml": ("tfdist.runtime.nvml",),
    "tfdist.argtypes": ("tfdist.runtime.argtypes",),
    "tfdist.exit_codes": ("tfdist.runtime.exit_codes",),
    "tfdist.run_lock": ("tfdist.runtime.run_lock",),
    "tfdist.doctor": ("tfdist.cli.doctor",),
    "tfdist.dataset_specs": ("tfdist.data.specs",),
    "tfdist.optimizers": ("tfdist.schedules.optimizers",),
    "tfdist.training.pipeline": ("tfdist.training.model_parallel.gpipe",),
    "tfdist.training.stages": ("tfdist.training.model_parallel.stages",),
    "tfdist.training.placement": ("tfdist.training.model_parallel.placement",),
    "tfdist.training.parameter_server": ("tfdist.training.ps_loop",),
    "tfdist.bench.parameter_server": ("tfdist.bench.ps_bench",),
    "tfdist.bench.model_parallel": ("tfdist.bench.pipeline_bench",),
    "tfdist.bench.cli": ("tfdist.bench.commands",),
    "tfdist.launch.cli": ("tfdist.launch.arguments",),
    "tfdist.launch.cluster": ("tfdist.launch.local_cluster",),
    "tfdist.launch.runner": ("tfdist.launch.supervisor",),
    "tfdist.data.factory": ("tfdist.data.source_factory",),
    "tfdist.data.pipeline": ("tfdist.data.input_pipeline",),
    "tfdist.schedules.factory": ("tfdist.schedules.schedule_factory",),
    "tfdist.models.transformer": ("tfdist.models.transformer_lm",),
    "tfdist.recipes.runner": _RECIPE_RUNNER,
    "tfdist.recipes.autotune": ("tfdist.recipes.auto_choices",),
    "tfdist.recipes.model_parallel": ("tfdist.recipes.model_parallel_flags",),
}


def _caller_stack_level():
    """The `warnings` stack level of the first frame outside the import machinery."""
    frame, level = sys._getframe(1), 1  # pylint: disable=protected-access
    while frame is not None and (frame.f_code.co_filename.startswith("<frozen importlib")
                                 or frame.f_code.co_filename == __file__):
        frame, level = frame.f_back, level + 1
    return level


def find_moved_name(old_path, name):
    """Returns `name` from the module(s) that `old_path` moved to.

    Args:
        old_path: a key of `OLD_PATHS`, e.g. "tfdist.strategy".
        name: the attribute to find, e.g. "create_strategy".

    Raises:
        AttributeError: naming the new modules, when none of them defines `name`.

    Example:

    >>> find_moved_name("tfdist.exit_codes", "BAD_INPUT")
    2
    """
    for module_name in OLD_PATHS[old_path]:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as error:
            if error.name != module_name:
                raise
            continue
        if hasattr(module, name):
            return getattr(module, name)
    raise AttributeError(f"{old_path} moved to {' / '.join(OLD_PATHS[old_path])}, "
                         f"which define no {name!r}")


class OldPathFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds the stand-in module of an old path (last on `sys.meta_path`).

    Example:

        sys.meta_path.append(OldPathFinder())
    """

    def find_spec(self, fullname, path=None, target=None):  # noqa: D102 (importlib protocol)
        del path, target
        if fullname in OLD_PATHS:
            return importlib.util.spec_from_loader(fullname, self)
        return None

    def create_module(self, spec):  # noqa: D102
        del spec  # the default module

    def exec_module(self, module):  # noqa: D102
        old_path = module.__name__
        new_paths = " / ".join(OLD_PATHS[old_path])
        module.__doc__ = f"Moved: {old_path} is now {new_paths}."
        module.__getattr__ = lambda name: find_moved_name(old_path, name)
        warnings.warn(f"{old_path} moved to {new_paths}; import from there "
                      "(the old path goes away in the next release)",
                      DeprecationWarning, stacklevel=_caller_stack_level())


def install_old_paths():
    """Makes the old module paths importable (once per process).

    Example:

        install_old_paths()
        from tfdist.strategy import create_strategy  # works, with a DeprecationWarning
    """
    if not any(isinstance(finder, OldPathFinder) for finder in sys.meta_path):
        sys.meta_path.append(OldPathFinder())
