"""The last release's module paths keep working, with a DeprecationWarning naming the new one."""

import importlib
import subprocess
import sys
import warnings

import pytest

from tfdist.old_paths import OLD_PATHS, find_moved_name


def _import_fresh(old_path):
    sys.modules.pop(old_path, None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        module = importlib.import_module(old_path)
    return module, [w for w in caught if issubclass(w.category, DeprecationWarning)]


def _a_public_name(module_names):
    for module_name in module_names:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError:
            continue
        names = [n for n in vars(module) if not n.startswith("_")
                 and getattr(vars(module)[n], "__module__", None) == module_name]
        if names:
            return module, names[0]
    raise AssertionError(f"none of {module_names} exists or defines a public name")


@pytest.mark.parametrize("old_path", sorted(OLD_PATHS))
def test_an_old_path_gives_the_names_of_its_new_home_and_says_where_it_went(old_path):
    new_module, name = _a_public_name(OLD_PATHS[old_path])
    module, deprecations = _import_fresh(old_path)
    assert getattr(module, name) is getattr(new_module, name)
    assert len(deprecations) == 1, deprecations
    assert OLD_PATHS[old_path][0] in str(deprecations[0].message)


def test_a_name_that_moved_nowhere_is_an_error_naming_the_new_modules():
    with pytest.raises(AttributeError, match="tfdist.runtime.exit_codes.*'no_such_name'"):
        find_moved_name("tfdist.exit_codes", "no_such_name")


def test_a_real_module_is_never_shadowed_by_an_old_path():
    for old_path in OLD_PATHS:
        assert importlib.util.find_spec(old_path).loader.__class__.__name__ == "OldPathFinder", (
            f"{old_path} exists as a real module again; remove it from OLD_PATHS")


def test_import_tfdist_imports_no_tensorflow_and_gives_trainer_and_create_strategy_on_use():
    probe = ("import sys, tfdist; light = 'tensorflow' not in sys.modules; "
             "print(light, tfdist.Trainer.__name__, tfdist.create_strategy.__name__)")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         timeout=300, check=True).stdout.split()
    assert out == ["True", "Trainer", "create_strategy"]


def test_the_strategy_module_users_imported_most_still_gives_its_names_from_the_new_wing():
    sys.modules.pop("tfdist.strategy", None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from tfdist.strategy import create_strategy, describe_strategy, is_chief  # noqa: PLC0415
    from tfdist.distribute import collectives, introspection, strategy_factory  # noqa: PLC0415
    assert (create_strategy, describe_strategy, is_chief) == (
        strategy_factory.create_strategy, introspection.describe_strategy, collectives.is_chief)
