"""`tfdist bench autotune`: autotune's pick against every candidate measured again."""

import pytest

from tfdist.bench.autotune_check import check_autotune, format_check, pick_vs_fastest
from tfdist.bench.workloads import Workload


def test_pick_vs_fastest_is_the_ratio_to_the_best_measured_candidate():
    assert pick_vs_fastest("b", {"a": 80.0, "b": 100.0}) == (1.0, "b")
    assert pick_vs_fastest("a", {"a": 80.0, "b": 100.0, "c": None}) == (0.8, "b")
    with pytest.raises(ValueError, match="The pick 'c' was not measured"):
        pick_vs_fastest("c", {"a": 80.0, "c": None})


def test_the_table_names_each_workload_pick_and_ratio():
    text = format_check([{"workload": "transformer tiny (synthetic tokens)",
                          "global_batch_size": 32, "pick": "mixed_bfloat16, XLA off",
                          "trial_seconds": 41.2, "fastest": "float32, XLA on",
                          "pick_vs_fastest": 0.9612}])
    row = text.splitlines()[2]
    assert row.split()[:3] == ["transformer", "tiny", "(synthetic"]
    assert "mixed_bfloat16, XLA off" in row and "41 s" in row and row.endswith("0.96x")


def test_a_real_check_measures_every_candidate_again(monkeypatch):
    monkeypatch.setenv("TFDIST_CPU_FLAGS", "avx2 fma")  # the grid: float32, XLA off and on
    workload = Workload("transformer", size="tiny", sequence_length=16, vocab_size=64)
    lines = []
    report = check_autotune(workload, 8, rounds=1, steps=1, trial_seconds=1.0,
                            log=lines.append)
    assert report["pick"] in report["measured"]
    assert set(report["measured"]) == {row["label"] for row in report["trial"]}
    assert set(report["measured"]) == {"float32, XLA off", "float32, XLA on"}
    assert all(value > 0 for value in report["measured"].values())
    best = max(report["measured"].values())
    assert report["pick_vs_fastest"] == pytest.approx(report["measured"][report["pick"]] / best)
    assert report["measured"][report["fastest"]] == best
    assert any(line.startswith("autotune trial (") for line in lines)


def test_the_default_batches_are_the_recipes_defaults():
    """The issue's goal: autotune's pick is checked at the batch the recipes run by default
    (the recipes' own defaults and their shipped configs); base stays CPU-sized."""
    import os

    import yaml

    from tfdist.bench.workloads import default_batch
    from tfdist.recipes import cnn, transformer
    from tfdist.recipes.config import PACKAGED_CONFIGS

    def shipped_batch(name):
        with open(os.path.join(PACKAGED_CONFIGS, f"{name}.yaml")) as stream:
            return yaml.safe_load(stream)["global_batch_size"]

    def option_default(recipe, name):
        """The recipe's default of an option: its DEFAULTS entry, else the option's own."""
        return recipe.defaults.get(name, next(option.default for option in recipe.all_options()
                                              if option.name == name))

    assert option_default(transformer.RECIPE, "model_size") == "tiny"
    assert default_batch("transformer", "tiny") == transformer.DEFAULTS["global_batch_size"] == 64
    assert default_batch("transformer", "tiny") == shipped_batch("transformer_tiny")
    assert default_batch("transformer", "small") == shipped_batch("transformer_small") == 32
    assert option_default(cnn.RECIPE, "model") == "resnet_tiny"
    assert default_batch("cnn", "resnet_tiny") == cnn.DEFAULTS["global_batch_size"] == 128
    assert default_batch("cnn", "resnet_tiny") == shipped_batch("cnn_tiny")
    assert default_batch("transformer", "base") == 16 < shipped_batch("transformer_base")
    assert default_batch("cnn", "resnet18") == 64 and default_batch("transformer", "xl") == 32
