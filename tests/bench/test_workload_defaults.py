"""The benchmark's workloads are the recipes' models with the recipes' defaults."""

import pytest

from tfdist.bench.workloads import (EMBEDDED_DATA, EMBEDDED_EXAMPLES, Workload,
                                    parse_model_flags)


@pytest.mark.parametrize("model", ["transformer", "cnn"])
def test_workload_defaults_are_the_recipes(model):
    import importlib

    recipe = importlib.import_module(f"tfdist.recipes.{model}").RECIPE
    defaults = {option.name: option.default for option in recipe.all_options()}
    settings = vars(parse_model_flags(model, []))
    assert {name: defaults[name] for name in settings} == settings
    assert defaults["dataset"] == EMBEDDED_DATA[model]
    assert defaults["num_examples"] == EMBEDDED_EXAMPLES
    sizes = recipe.options[0].choices
    assert Workload(model).size_choices() == sizes


def test_recipe_flags_that_do_not_shape_the_model_are_refused_by_name():
    with pytest.raises(ValueError, match="--epochs 3 does not shape the cnn benchmark"):
        parse_model_flags("cnn", ["--epochs", "3"])
    assert parse_model_flags("cnn", ["--sync-bn", "--optimizer", "sgd"]).sync_bn is True
    assert Workload("cnn", recipe_flags=("--sync-bn",)).xla_blocker().startswith("synchronised")
