"""Autotune: the candidate grid from a described machine, the choice, the cache,
and a real trial of a Keras model trained by tfdist's engine."""

import json
import math
import os
import re

import keras
import numpy as np
import pytest
import tensorflow as tf

from tfdist.autotune import (Candidate, CandidateTiming, DecisionCache, candidate_grid,
                             candidate_precisions, choose, default_autotune_mode,
                             default_cache_path, format_decision, hardware_signature, loss_agrees,
                             run_trial, signature_key)
from tfdist.autotune.cache import cache_problem
from tfdist.autotune.trial import steps_per_round
from tfdist.recipes.auto_choices import skip_reason
from tfdist.training import Trainer

AMX = {"avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile"}
AVX2 = {"avx2", "fma"}


def labels(grid):
    return [candidate.label for candidate in grid]


@pytest.mark.parametrize("flags, expected", [
    (AMX, ["float32, XLA off", "float32, XLA on", "mixed_bfloat16, XLA off"]),
    ({"avx512_bf16"}, ["float32, XLA off", "float32, XLA on", "mixed_bfloat16, XLA off"]),
    (AVX2, ["float32, XLA off", "float32, XLA on"]),
])
def test_the_cpu_grid_holds_bfloat16_only_where_the_cpu_has_it(flags, expected):
    assert labels(candidate_grid("auto", "auto", on_gpu=False, cpu_flags=flags)) == expected


def test_half_precision_with_xla_is_timed_on_gpus_and_on_cpus_only_when_asked():
    gpu = candidate_grid("auto", "auto", on_gpu=True, gpu_capabilities=[(8, 0)])
    assert "mixed_bfloat16, XLA on" in labels(gpu) and "mixed_float16, XLA on" in labels(gpu)
    assert labels(candidate_grid("auto", "on", on_gpu=False, cpu_flags=AMX)) == [
        "float32, XLA on", "mixed_bfloat16, XLA on"]


def test_an_emulated_precision_is_named_as_not_tried():
    policies, note = candidate_precisions("auto", False, cpu_flags=AVX2)
    assert policies == ("float32",)
    assert "mixed_bfloat16 not tried" in note and "AVX512-BF16" in note


@pytest.mark.parametrize("capabilities, expected", [
    ([(8, 0), (9, 0)], ("float32", "mixed_bfloat16", "mixed_float16")),
    ([(7, 5)], ("float32", "mixed_float16")),
    ([(6, 1)], ("float32",)),
])
def test_the_gpu_grid_follows_the_oldest_compute_capability(capabilities, expected):
    policies, _ = candidate_precisions("auto", True, capabilities)
    assert policies == expected


def test_an_explicit_setting_closes_its_half_of_the_grid():
    assert labels(candidate_grid("float32", "auto", on_gpu=False, cpu_flags=AVX2)) == [
        "float32, XLA off", "float32, XLA on"]
    assert labels(candidate_grid("mixed_bfloat16", "auto", on_gpu=True)) == [
        "mixed_bfloat16, XLA off", "mixed_bfloat16, XLA on"]
    assert labels(candidate_grid("float32", "off", on_gpu=False, cpu_flags=AMX)) == [
        "float32, XLA off"]


@pytest.mark.parametrize("precision, xla, message", [
    # a grid of one Candidate("int8", ...) that failed only when the trial applied it
    ("int8", "auto", "precision must be one of auto, float32, mixed_float16, mixed_bfloat16"),
    ("bf16", "auto", "(canonical names; tfdist.precision.canonical_precision turns aliases"),
    # anything but "auto" and "on" was read as off
    ("float32", "maybe", "xla must be one of auto, on, off, got 'maybe'."),
])
def test_a_grid_for_a_setting_it_does_not_know_is_refused(precision, xla, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        candidate_grid(precision, xla, on_gpu=False, cpu_flags=AVX2)


def test_a_model_that_cannot_compile_is_never_timed_with_xla():
    grid = candidate_grid("auto", "auto", on_gpu=False, cpu_flags=AMX,
                          xla_blocker="synchronised BatchNorm all-reduces inside the model")
    assert labels(grid) == ["float32, XLA off", "mixed_bfloat16, XLA off"]


def timing(policy, jit, step, first_loss, **kwargs):
    return CandidateTiming(Candidate(policy, jit), 1.0, [step, step, step], first_loss, **kwargs)


def test_the_fastest_setting_whose_loss_agrees_with_float32_is_chosen():
    timings = [timing("float32", False, 1.0, 9.0), timing("float32", True, 0.8, 9.0),
               timing("mixed_bfloat16", False, 0.5, 9.05)]
    decision = choose(timings, global_batch_size=32)
    assert decision.choice == Candidate("mixed_bfloat16", False)
    by_label = {row["label"]: row for row in decision.rows}
    assert by_label["mixed_bfloat16, XLA off"]["examples_per_sec"] == pytest.approx(64.0)
    assert by_label["float32, XLA off"]["vs_best"] == pytest.approx(0.5)
    assert by_label["mixed_bfloat16, XLA off"]["loss_diff"] == pytest.approx(0.05 / 9.0)
    assert "1.60x the next" in decision.reason


@pytest.mark.parametrize("bad, note", [
    (dict(first_loss=9.5), "more than 5% apart"),
    (dict(first_loss=9.0, finite=False), "loss not finite"),
    (dict(first_loss=None, error="InternalError: no kernel"), "could not run"),
])
def test_a_faster_setting_that_disagrees_or_fails_is_not_chosen(bad, note):
    first_loss = bad.pop("first_loss")
    timings = [timing("float32", False, 1.0, 9.0), timing("mixed_bfloat16", False, 0.5,
                                                          first_loss, **bad)]
    decision = choose(timings, global_batch_size=32)
    assert decision.choice == Candidate("float32", False)
    assert note in decision.rows[1]["note"]
    text = format_decision(decision)
    assert "(not eligible: " in text and note in text


def test_no_eligible_setting_means_no_choice():
    decision = choose([timing("float32", False, 1.0, float("nan"), finite=False)], 32)
    assert decision.choice is None and "no setting" in decision.reason


def test_loss_agreement_tolerance():
    assert loss_agrees(9.0 * 1.049, 9.0) and not loss_agrees(9.0 * 1.051, 9.0)
    assert loss_agrees(123.0, None)


def test_fast_steps_are_run_more_often_per_round():
    assert steps_per_round(3, 0.01, 0.5) == 50  # capped
    assert steps_per_round(3, 0.1, 0.5) == 5
    assert steps_per_round(3, 2.0, 0.5) == 3


def test_the_cache_path_and_the_mode_come_from_the_environment(tmp_path):
    assert default_cache_path({"HOME": "/home/u"}) == "/home/u/.cache/tfdist/autotune.json"
    assert default_cache_path({"TFDIST_AUTOTUNE_CACHE": str(tmp_path / "a.json")}) == str(
        tmp_path / "a.json")
    assert default_autotune_mode({"TFDIST_AUTOTUNE": "refresh"}) == "refresh"
    assert default_autotune_mode({"TFDIST_AUTOTUNE": "  "}) == "on"
    with pytest.raises(ValueError, match=r"\$TFDIST_AUTOTUNE='bogus' is not allowed\. Choose one "
                                         r"of: on, off, refresh, or unset it \(on\)\."):
        default_autotune_mode({"TFDIST_AUTOTUNE": "bogus"})


def test_the_cache_keeps_decisions_per_key_in_one_json_file(tmp_path):
    path = tmp_path / "sub" / "autotune.json"
    cache = DecisionCache(str(path))
    assert cache.get("a") is None
    assert cache.put("a", {"choice": {"precision": "float32", "xla": True}})
    assert cache.put("b", {"choice": {"precision": "mixed_bfloat16", "xla": False}})
    again = DecisionCache(str(path))
    assert again.get("a")["choice"] == {"precision": "float32", "xla": True}
    assert again.get("b")["choice"]["precision"] == "mixed_bfloat16"
    assert "measured_at" in again.get("a")
    assert [name for name in os.listdir(path.parent)] == ["autotune.json"]  # no temp left


@pytest.mark.parametrize("content, problem", [
    ("{half a fi", "it is not JSON"),
    ('{"epochs": 3}', "it holds JSON that is not a tfdist autotune cache"),
    ("[1, 2]", "it holds JSON that is not a tfdist autotune cache"),
], ids=["not-json", "other-json", "a-list"])
def test_a_named_file_that_is_no_cache_is_reported_once_and_left_as_it_is(tmp_path, caplog,
                                                                          content, problem):
    path = tmp_path / "results.json"  # a mistyped --autotune-cache
    path.write_text(content)
    cache = DecisionCache(str(path))
    with caplog.at_level("WARNING", logger="tfdist"):
        assert cache.get("a") is None
        assert cache.put("a", {"choice": {}}) is False
    assert path.read_text() == content
    assert caplog.text.count("is not usable") == 1, caplog.text
    assert f"{path} is not usable ({problem}" in caplog.text and "left as it is" in caplog.text
    assert cache_problem(str(path)).startswith(problem)
    assert cache_problem(str(tmp_path)) == "it is a folder, not a file"
    assert cache_problem(str(tmp_path / "new.json")) is None


def test_the_default_cache_unreadable_is_replaced_and_another_versions_too(tmp_path, caplog,
                                                                           monkeypatch):
    monkeypatch.delenv("TFDIST_AUTOTUNE_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    path = tmp_path / "tfdist" / "autotune.json"
    path.parent.mkdir()
    path.write_text("{half a fi")
    cache = DecisionCache()
    with caplog.at_level("WARNING", logger="tfdist"):
        assert cache.get("a") is None
        assert cache.put("a", {"choice": {}})
    assert "tfdist's own file, so it is replaced" in caplog.text
    assert json.loads(path.read_text())["decisions"]["a"]["choice"] == {}
    named = tmp_path / "old.json"
    named.write_text(json.dumps({"format": 0, "entries": []}))  # an older version's cache
    assert cache_problem(str(named)) is None
    assert DecisionCache(str(named)).put("b", {"choice": {}})
    assert list(json.loads(named.read_text())["decisions"]) == ["b"]


def test_an_unwritable_cache_is_a_warning_not_an_error(tmp_path, caplog):
    blocker = tmp_path / "file"
    blocker.write_text("")
    cache = DecisionCache(str(blocker / "autotune.json"))  # its folder is a file
    with caplog.at_level("WARNING", logger="tfdist"):
        assert cache.put("a", {"choice": {}}) is False
    assert "not usable (it cannot be read: [Errno 20] Not a directory" in caplog.text
    assert "--autotune-cache" in caplog.text
    caplog.clear()
    cache = DecisionCache("/proc/tfdist-no-folder/autotune.json")  # no folder can be made there
    with caplog.at_level("WARNING", logger="tfdist"):
        assert cache.put("a", {"choice": {}}) is False
    assert "could not be cached" in caplog.text and "--autotune-cache" in caplog.text


def test_signatures_differ_by_hardware_and_agree_otherwise():
    amx = hardware_signature(AMX | {"sse"}, cpu_name="Xeon", cpus=2)
    avx2 = hardware_signature(AVX2, cpu_name="EPYC", cpus=2)
    assert amx["cpu_flags"] == ["amx_bf16", "amx_tile", "avx2", "avx512_bf16", "avx512f"]
    base = {"recipe": "transformer", "options": {"model_size": "tiny"}}
    assert signature_key(dict(base, hardware=amx)) == signature_key(dict(base, hardware=amx))
    assert signature_key(dict(base, hardware=amx)) != signature_key(dict(base, hardware=avx2))


class _Info:
    def __init__(self, name, num_workers):
        self.name, self.num_workers = name, num_workers


class _Config:
    model_parallel = 1


def test_a_trial_is_skipped_where_workers_could_disagree():
    assert "2 workers" in skip_reason(_Config(), _Info("multi_worker_mirrored", 2))
    assert "parameter servers" in skip_reason(_Config(), _Info("parameter_server", 1))
    assert skip_reason(_Config(), _Info("mirrored", 1)) is None


def _builder(fail_with_xla=False):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 16)).astype("float32")
    y = rng.integers(0, 4, size=(64,)).astype("int32")
    built = []

    def build(candidate):
        if fail_with_xla and candidate.jit_compile:
            raise ValueError("this model cannot be compiled")
        model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(32, activation="relu"),
                                  keras.layers.Dense(4),
                                  keras.layers.Activation("linear", dtype="float32")])
        built.append((candidate, keras.mixed_precision.dtype_policy().name))
        trainer = Trainer(model, keras.optimizers.SGD(0.1),
                          keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                          jit_compile=candidate.jit_compile)
        dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(32).take(1).cache().repeat()
        return trainer, dataset

    return build, built


def test_a_real_trial_times_every_setting_from_the_same_weights_and_restores_the_policy():
    build, built = _builder()
    grid = [Candidate("float32", False), Candidate("float32", True),
            Candidate("mixed_bfloat16", False)]
    before = keras.mixed_precision.dtype_policy().name
    np_state = np.random.get_state()[1].copy()
    lines = []
    timings = run_trial(grid, build, rounds=2, steps=2, min_round_seconds=0.0,
                        log=lines.append)
    assert keras.mixed_precision.dtype_policy().name == before
    np.testing.assert_array_equal(np.random.get_state()[1], np_state)  # no global seeding
    assert [policy for _, policy in built] == ["float32", "float32", "mixed_bfloat16"]
    assert [len(t.step_times) for t in timings] == [4, 4, 4]  # 2 rounds x 2 steps
    assert all(t.finite and t.error is None for t in timings)
    # The models were initialised differently; the same first loss shows that
    # every candidate started from the first one's weights.
    assert timings[1].first_loss == pytest.approx(timings[0].first_loss, rel=1e-5)
    assert timings[2].first_loss == pytest.approx(timings[0].first_loss, rel=5e-2)
    assert timings[0].first_loss != timings[2].first_loss  # bf16 really ran in bf16
    decision = choose(timings, 32)
    assert decision.choice in grid and all(row["eligible"] for row in decision.rows)
    assert sum("compiled and ran 2 steps" in line for line in lines) == 3


def test_a_setting_that_cannot_run_is_left_out_with_the_reason():
    build, _ = _builder(fail_with_xla=True)
    timings = run_trial([Candidate("float32", False), Candidate("float32", True)], build,
                        rounds=1, steps=1, min_round_seconds=0.0)
    assert timings[1].error == "ValueError: this model cannot be compiled"
    assert timings[1].step_times == [] and len(timings[0].step_times) == 1
    decision = choose(timings, 32)
    assert decision.choice == Candidate("float32", False)


def test_the_trial_budget_stops_new_rounds():
    build, _ = _builder()
    lines = []
    timings = run_trial([Candidate("float32", False)], build, rounds=5, steps=1,
                        max_seconds=1e-9, min_round_seconds=0.0, log=lines.append)
    assert len(timings[0].step_times) == 1  # the first round always runs, no second
    assert any("budget is spent" in line for line in lines)
    assert math.isfinite(timings[0].first_loss)


def test_tune_model_times_your_compiled_model_and_caches_the_decision(tmp_path):
    from tfdist.autotune import tune_model

    rng = np.random.default_rng(1)
    dataset = tf.data.Dataset.from_tensor_slices((
        rng.normal(size=(64, 8)).astype("float32"),
        rng.integers(0, 3, size=(64,)).astype("int32"))).batch(32)
    policies = []

    def build_model():
        policies.append(keras.mixed_precision.dtype_policy().name)
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(3)])
        model.compile(keras.optimizers.SGD(0.05), "sparse_categorical_crossentropy",
                      metrics=["accuracy"])
        return model

    cache = str(tmp_path / "decisions.json")
    lines = []
    first = tune_model(build_model, dataset, global_batch_size=32, precision="float32",
                       signature={"model": "dense-8-3"}, cache_path=cache, log=lines.append)
    assert policies == ["float32", "float32"]  # XLA off and on
    assert first.choice in (Candidate("float32", False), Candidate("float32", True))
    assert first.trial_seconds > 0 and len(first.rows) == 2
    again = tune_model(build_model, dataset, global_batch_size=32, precision="float32",
                       signature={"model": "dense-8-3"}, cache_path=cache, log=lines.append)
    assert len(policies) == 2  # nothing built: the cached decision
    assert again.choice == first.choice and again.measured_at
    assert "from the cache" in lines[-1]
    with pytest.raises(ValueError, match="Unknown XLA mode 'fast'"):
        tune_model(build_model, dataset, global_batch_size=32, xla="fast")


def test_a_decision_is_keyed_by_tfdist_code_so_a_new_tfdist_measures_again(tmp_path):
    from tfdist.autotune.cache import code_fingerprint
    from tfdist.autotune.tune import environment_signature

    def package(name, b_source, extra=None):
        root = tmp_path / name
        (root / "sub").mkdir(parents=True)
        (root / "a.py").write_text("X = 1\n")
        (root / "sub" / "b.py").write_text(b_source)
        if extra:
            (root / extra).write_text("not code")
        return str(root)

    before = code_fingerprint(package("old", "Y = 2\n"))
    assert code_fingerprint(package("with_notes", "Y = 2\n", "notes.txt")) == before
    assert code_fingerprint(package("new", "Y = 3\n")) != before  # one changed line
    signature = environment_signature(on_gpu=False)
    assert signature["versions"]["tfdist_code"] == code_fingerprint()
