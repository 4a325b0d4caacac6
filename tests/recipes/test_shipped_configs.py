"""Every shipped YAML recipe (tfdist/recipes/configs/*.yaml) passes `--print-config`
as shipped and trains on its default data for a few steps.

The configs are found by glob, so a new one is covered without editing this file.
"""

import glob
import logging
import os
import re

import pytest

from helpers.recipe_util import run_recipe
from tfdist.recipes import cnn, transformer, translation
from tfdist.recipes.config import PACKAGED_CONFIGS, ConfigError, parse_config
from tfdist.recipes.preflight import check_options_for_the_dataset
from tfdist.schedules.choices import MIN_STEPS_AFTER_WARMUP, SCHEDULES_SHAPED_BY_THE_RUN

RECIPES = (transformer.RECIPE, cnn.RECIPE, translation.RECIPE)
SHIPPED = sorted(os.path.basename(path)[:-len(".yaml")]
                 for path in glob.glob(os.path.join(PACKAGED_CONFIGS, "*.yaml")))


def shipped_path(name):
    """The shipped file (by path: `--config NAME` would prefer one in $TFDIST_RECIPES_DIR)."""
    return os.path.join(PACKAGED_CONFIGS, f"{name}.yaml")

# Configs sized for GPUs and real data: on 2 CPU cores one step of the shipped
# size takes minutes (transformer_base at batch 256: 86 s a step; ResNet-50 at
# batch 1024 and 224x224 does not fit in memory). The training run keeps the
# config's model, optimizer, schedule kind and every other value, and shrinks
# only the batch (and the images and example count for ResNet-50).
CPU_SIZED = {
    "transformer_base": ["--global-batch-size", "8"],
    "cnn_cifar10_resnet18": ["--global-batch-size", "32"],
    "imagenet_resnet50": ["--global-batch-size", "8", "--image-size", "64", "--num-examples", "64"],
}

# Shipped configs whose few-step run is checked elsewhere, cheaper (the suite's time budget).
RUN_ELSEWHERE = {
    # The recipe's one end-to-end run trains with it.
    "translation_tiny": "tests/recipes/test_recipe_translation.py",
    # In-process: the 44 M-parameter model's step graph takes over a minute to trace here.
    "translation_base": "tests/recipes/test_recipe_translation.py",
}


def shipped_config(name):
    """(recipe, parsed config) of a shipped config: the recipe whose options accept all its
    keys; where several do (the Transformer and translation recipes share their
    keys), the one the file name starts with."""
    parsed = []
    for recipe in RECIPES:
        try:
            parsed.append((recipe, parse_config(["--config", shipped_path(name)], recipe.all_options(),
                                                prog=recipe.name)))
        except ConfigError:
            continue
    if len(parsed) > 1:
        parsed = [(recipe, config) for recipe, config in parsed
                  if name.startswith(recipe.name + "_")]
    assert len(parsed) == 1, (f"{name}.yaml should parse under exactly one recipe (or be named "
                              f"after one of those it parses under), "
                              f"parses under {[recipe.name for recipe, _ in parsed]}")
    return parsed[0]


@pytest.fixture
def restored_tfdist_logging():
    """A recipe's main configures the `tfdist` loggers; later tests get them back as they were."""
    names = ("tfdist", "tfdist.data", "tfdist.callbacks.profiler")
    saved = [(logging.getLogger(name), logging.getLogger(name).level,
              list(logging.getLogger(name).handlers), logging.getLogger(name).propagate)
             for name in names]
    yield
    for logger, level, handlers, propagate in saved:
        logger.setLevel(level)
        logger.handlers[:] = handlers
        logger.propagate = propagate


def test_every_shipped_config_is_found():
    assert {"transformer_tiny", "transformer_small", "cnn_tiny", "translation_tiny",
            "translation_base"} <= set(SHIPPED)


@pytest.mark.parametrize("name", SHIPPED)
def test_print_config_as_shipped_exits_0(name, capsys, restored_tfdist_logging):
    # In-process: the pre-flight checks run before TensorFlow, and --print-config
    # only asks TensorFlow for GPUs, which this test process has already imported.
    recipe, _ = shipped_config(name)
    code = recipe.main(["--config", shipped_path(name), "--print-config"])
    out, err = capsys.readouterr()
    assert code == 0, f"--config {name} --print-config exited {code}:\n{err}"
    assert f"{name}.yaml" in out and "global_batch_size:" in out, out


def short_run_flags(name, recipe, config):
    """The flags that make a shipped config's run a few steps long (and CPU-sized), nothing else."""
    post_warmup = (MIN_STEPS_AFTER_WARMUP if config.schedule in SCHEDULES_SHAPED_BY_THE_RUN
                   else 1)
    warmup = 0 if post_warmup > 1 else 1
    steps = warmup + post_warmup
    flags = ["--epochs", "1", "--steps-per-epoch", str(steps), "--validation-steps", "1",
             "--verbose", "2"]
    if config.warmup_steps >= steps:
        # Every shipped warmup (20 steps and up) is longer than a few-step run.
        # This does not hide a warmup that is too long for the config's own run:
        # the pre-flight check refuses that even under --print-config, which
        # test_print_config_as_shipped_exits_0 runs with no flag but the config.
        flags += ["--warmup-steps", str(warmup)]
    if config.xla != "on":
        flags += ["--xla", "off"]  # `auto` would compile (about 20 s here); a GPU-less host may pick off too
    if recipe.train_examples(config) is None:
        # Data that needs a download or files (TFDS, ImageNet TFRecords), absent
        # here: the recipe's embedded data swapped in; the header comment of the
        # config says what it needs.
        default = next(option.default for option in recipe.all_options() if option.name == "dataset")
        flags += ["--dataset", default]
        if getattr(config, "validation_dataset", None):
            flags += ["--validation-dataset", default]
    return flags + CPU_SIZED.get(name, []), steps


def test_configs_run_elsewhere_are_shipped():
    assert set(RUN_ELSEWHERE) <= set(SHIPPED)


@pytest.mark.slow
@pytest.mark.parametrize("name", [name for name in SHIPPED if name not in RUN_ELSEWHERE])
def test_trains_as_shipped_for_a_few_steps(name, tmp_path):
    recipe, config = shipped_config(name)
    flags, steps = short_run_flags(name, recipe, config)
    result = run_recipe(recipe.name, ["--config", shipped_path(name), *flags, "--model-dir", str(tmp_path / "run")],
                        timeout=240)
    assert result.returncode == 0, result.stdout[-4000:]
    assert re.search(rf"^{steps}/{steps} - .*\bloss: [0-9.]+", result.stdout, re.MULTILINE), \
        f"no epoch line for {steps} steps:\n{result.stdout[-3000:]}"
    # The config's keys its swapped-in data does not read are named, not dropped.
    swapped = parse_config(["--config", shipped_path(name), *flags], recipe.all_options(),
                           prog=recipe.name)
    check_options_for_the_dataset(recipe.all_options(), swapped)
    for key, value in swapped.unread_config_options:
        assert f"{key}: {value}" in result.stdout.split("  not read      ", 1)[-1].splitlines()[0], \
            result.stdout[:3000]
