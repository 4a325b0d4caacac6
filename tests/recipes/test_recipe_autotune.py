"""`--autotune` in a recipe run, from outside: a trial on the run's own model,
its decision cached and reused, and the refusals."""

import json

import pytest
import yaml

from helpers.recipe_util import run_recipe
from tfdist.recipes.config import ConfigError, parse_config
from tfdist.recipes.transformer import RECIPE

AVX2_ONLY = "avx2 fma"  # a described CPU: float32 only, XLA on and off
SHORT = ["--epochs", "1", "--steps-per-epoch", "3", "--warmup-steps", "0",
         "--global-batch-size", "16"]


def _start_line(output, key):
    for line in output.splitlines():
        if line.startswith(f"  {key} "):
            return line[len(key) + 2:].strip()
    raise AssertionError(f"no '{key}' line in the start block:\n{output[-3000:]}")


@pytest.fixture(scope="module")
def trial_runs(tmp_path_factory):
    cache = tmp_path_factory.mktemp("autotune") / "decisions.json"
    env = {"TFDIST_CPU_FLAGS": AVX2_ONLY, "TFDIST_AUTOTUNE_CACHE": str(cache)}
    measured = run_recipe("transformer", SHORT + ["--autotune", "refresh", "--autotune-budget", "1"],
                          env=env, timeout=300)
    # A longer run (epochs are not part of the signature) reuses the decision.
    cached = run_recipe("transformer", SHORT[:1] + ["2"] + SHORT[2:],
                        env=dict(env, TFDIST_AUTOTUNE="on"), timeout=300)
    return measured, cached, cache


def test_a_trial_times_each_setting_on_the_model_and_the_run_uses_the_fastest(trial_runs):
    measured, _, cache = trial_runs
    out = measured.stdout
    assert measured.returncode == 0, out[-4000:]
    assert "autotune: timing 2 settings" in out
    assert "float32, XLA off compiled and ran 2 steps" in out
    assert "float32, XLA on compiled and ran 2 steps" in out
    assert "stopped after 1 round(s): the trial's 1 s budget is spent" in out
    rows = {line.split("  ")[1].strip(): line for line in out.splitlines()
            if line.startswith("  float32, XLA ")}
    assert set(rows) == {"float32, XLA off", "float32, XLA on"}
    chosen = [label for label, line in rows.items() if line.endswith("<- chosen")]
    assert len(chosen) == 1
    xla = _start_line(out, "XLA")
    assert xla.startswith("on (autotune:" if chosen[0].endswith("on") else "off (autotune:")
    assert _start_line(out, "precision").startswith("float32 (autotune:")
    autotune = _start_line(out, "autotune")
    assert autotune.startswith(f"{chosen[0]}, measured in ")
    assert "mixed_bfloat16 not tried" in autotune and str(cache) in autotune
    decisions = json.loads(cache.read_text())["decisions"]
    assert len(decisions) == 1
    (entry,) = decisions.values()
    assert entry["choice"] == {"precision": "float32", "xla": chosen[0].endswith("on")}
    assert entry["signature"]["options"]["model_size"] == "tiny"
    assert "epochs" not in entry["signature"]["options"]  # a longer run reuses it


def test_the_next_run_starts_from_the_cached_decision(trial_runs):
    measured, cached, cache = trial_runs
    assert cached.returncode == 0, cached.stdout[-4000:]
    assert "autotune trial (from the cache, measured" in cached.stdout
    assert "compiled and ran" not in cached.stdout
    assert _start_line(cached.stdout, "XLA").split()[0] == _start_line(
        measured.stdout, "XLA").split()[0]
    assert f"cached in {cache}" in _start_line(cached.stdout, "autotune")


def test_print_config_says_a_trial_may_change_the_auto_choices():
    result = run_recipe("transformer", ["--print-config", "--autotune", "on"],
                        env={"TFDIST_CPU_FLAGS": AVX2_ONLY, "TF_CPP_MIN_LOG_LEVEL": "3"},
                        timeout=120)
    assert result.returncode == 0, result.stdout[-3000:]
    resolved = yaml.safe_load(result.stdout)["resolved"]
    assert resolved["autotune"].startswith("on: at start-up a trial")


def test_an_unknown_autotune_mode_names_the_allowed_ones():
    with pytest.raises(ConfigError, match=r"autotune='sometimes' is not allowed.*on, off, refresh"):
        parse_config(["--autotune", "sometimes"], RECIPE.all_options(), prog="t")
    assert parse_config(["--autotune", " OFF"], RECIPE.all_options(), prog="t").autotune == "off"
    with pytest.raises(ConfigError, match="autotune_budget must be >= 1.0"):
        parse_config(["--autotune-budget", "0"], RECIPE.all_options(), prog="t")
