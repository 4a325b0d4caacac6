"""The speed goals' rules (`tfdist.bench.goals`): which Keras settings "Keras's best"
is chosen from, how the fastest is picked, and how a goal is judged. The goals
measured end to end: tests/bench/test_bench_cli.py (`engine --quick --goals`)."""

import pytest

from tfdist.bench.compare import fastest_of
from tfdist.bench.goals import (CEILING_LABEL, GOAL_LABEL, MFU_GOALS, MODEL_ALONE, RATIO_GOAL,
                                evaluate_ceilings, evaluate_goals, format_goals, goal_entrants,
                                keras_best_candidates)
from tfdist.bench.workloads import Workload


@pytest.mark.parametrize("cpu_flags, gpus, precisions", [
    ({"avx2", "fma"}, [], ["float32"]),
    ({"avx2", "avx512_bf16"}, [], ["float32", "mixed_bfloat16"]),
    ({"avx2", "amx_bf16"}, [], ["float32", "mixed_bfloat16"]),
    ({"avx2"}, [(8, 0)], ["float32", "mixed_bfloat16", "mixed_float16"]),
    ({"avx2"}, [(7, 0)], ["float32", "mixed_float16"]),
])
def test_keras_best_is_chosen_from_autotunes_precisions_each_with_xla_off_and_on(cpu_flags, gpus,
                                                                                  precisions):
    settings = keras_best_candidates(cpu_flags, gpus)
    expected = [(p, x) for p in precisions for x in ("off", "on")]
    for setting, (precision, xla) in zip(settings, expected, strict=True):
        assert (setting.engine, setting.loss) == ("keras", "keras")
        assert (setting.precision, setting.xla) == (precision, xla)


def test_goal_entrants_compare_the_defaults_and_the_model_alone_with_every_keras_setting():
    entrants, [(label, ours, theirs), ceiling] = goal_entrants({"avx2", "amx_bf16"}, [])
    assert label == GOAL_LABEL and ours == "tfdist defaults"
    *keras, model_alone = entrants
    assert theirs == tuple(e.name for e in keras)
    assert len(set(theirs)) == 4
    assert all(e.setting.engine == "keras" for e in keras)
    # A float32 Keras run must work; a half precision may be unsupported and is then left out.
    assert [e.optional for e in keras] == [False, False, True, True]
    # The ceiling: the model alone in the defaults' precision and XLA, against the same Keras best.
    assert ceiling == (CEILING_LABEL, MODEL_ALONE, theirs)
    assert model_alone.name == MODEL_ALONE and not model_alone.optional
    assert (model_alone.setting.engine, model_alone.setting.precision,
            model_alone.setting.xla, model_alone.strategy) == ("model", "auto", "auto", "default")


def test_fastest_of_picks_the_measured_one_with_the_most_examples_per_second():
    summaries = {"a": {"examples_per_sec": 9.0}, "b": {"examples_per_sec": 12.0},
                 "c": {"examples_per_sec": 11.0}}
    alias = {"a": "a", "b": "b", "c": "c", "a2": "a"}
    assert fastest_of(("a", "b", "c"), alias, summaries) == "b"
    assert fastest_of(("a2", "c"), alias, summaries) == "c"
    assert fastest_of("a2", alias, summaries) == "a"
    assert fastest_of(("gone", "c"), alias, summaries) == "c"  # one not built: skipped
    assert fastest_of(("gone",), alias, summaries) == "gone"  # reported as not measured


def _report(ratio, mfu):
    return {"comparisons": [{"label": GOAL_LABEL, "numerator": "tfdist defaults",
                             "denominator": "keras bf16 xla-off keras-loss", "ratio": ratio}],
            "contenders": {"tfdist defaults": {
                "mfu_vs_fastest_peak": mfu, "fastest_peak_precision": "mixed_bfloat16",
                "fastest_peak_flops_per_sec": 1.2e12}}}


@pytest.mark.parametrize("ratio, mfu, met", [
    (RATIO_GOAL, MFU_GOALS[("transformer", "small")], (True, True)),
    (RATIO_GOAL - 0.01, MFU_GOALS[("transformer", "small")] - 0.01, (False, False)),
    (1.9, 0.2, (True, False)),
])
def test_a_goal_is_met_at_its_target_and_not_below(ratio, mfu, met):
    goals = evaluate_goals(_report(ratio, mfu), Workload("transformer", size="small"))
    assert [g["value"] for g in goals] == [ratio, mfu]
    assert [g["target"] for g in goals] == [RATIO_GOAL, MFU_GOALS[("transformer", "small")]]
    assert tuple(g["met"] for g in goals) == met
    text = format_goals(goals, "a described CPU")
    for goal, verdict in zip(goals, met, strict=True):
        line = next(line for line in text.splitlines() if goal["goal"] + ":" in line)
        assert line.count("NOT MET") == (not verdict)


def _report_with_ceiling(ratio, mfu, ceiling_ratio, ceiling_mfu):
    report = _report(ratio, mfu)
    report["comparisons"].append({"label": CEILING_LABEL, "numerator": MODEL_ALONE,
                                  "denominator": "keras bf16 xla-off keras-loss",
                                  "ratio": ceiling_ratio})
    report["contenders"][MODEL_ALONE] = {"mfu_vs_fastest_peak": ceiling_mfu}
    return report


@pytest.mark.parametrize("ceiling_ratio, ceiling_mfu, reachable", [
    (RATIO_GOAL, MFU_GOALS[("transformer", "small")], (True, True)),
    (RATIO_GOAL - 0.03, MFU_GOALS[("transformer", "small")] - 0.01, (False, False)),
    (1.6, 0.4, (True, False)),
])
def test_a_ceiling_under_its_goal_says_no_engine_can_reach_it(ceiling_ratio, ceiling_mfu,
                                                               reachable):
    report = _report_with_ceiling(1.1, 0.3, ceiling_ratio, ceiling_mfu)
    workload = Workload("transformer", size="small")
    ceilings = evaluate_ceilings(report, workload)
    assert [c["ceiling"] for c in ceilings] == ["throughput ratio", "MFU"]
    assert [c["value"] for c in ceilings] == [ceiling_ratio, ceiling_mfu]
    assert [c["target"] for c in ceilings] == [RATIO_GOAL, MFU_GOALS[("transformer", "small")]]
    assert tuple(c["reachable"] for c in ceilings) == reachable
    text = format_goals(evaluate_goals(report, workload), "a described CPU", ceilings)
    assert "ceilings (the model's forward and backward alone" in text
    for ceiling, verdict in zip(ceilings, reachable, strict=True):
        line = next(line for line in text.splitlines()
                    if line.strip().startswith(ceiling["ceiling"] + ":"))
        assert ("out of any engine's reach here" in line) == (not verdict), line
        assert MODEL_ALONE in line


def test_a_report_without_the_ceiling_has_no_ceiling_lines():
    report = _report(1.1, 0.3)  # as written before the model alone was timed
    assert evaluate_ceilings(report, Workload("transformer", size="small")) == []
    assert "ceilings" not in format_goals(evaluate_goals(report, Workload("transformer",
                                                                         size="small")), "cpu")


def test_a_size_without_an_mfu_goal_is_measured_but_not_judged():
    goals = evaluate_goals(_report(1.2, 0.3), Workload("transformer", size="tiny"))
    assert goals[1]["value"] == 0.3 and goals[1]["target"] is None and goals[1]["met"] is None
    assert "no MFU goal for transformer tiny" in goals[1]["detail"]
    assert "not judged" in format_goals(goals, "cpu")


def test_an_unmeasured_keras_side_is_not_judged():
    report = _report(1.0, 0.5)
    report["comparisons"][0] = {"label": GOAL_LABEL, "numerator": "tfdist defaults",
                                "denominator": "keras fp32 xla-off keras-loss",
                                "error": "keras fp32 xla-off keras-loss: ValueError: no"}
    throughput, _ = evaluate_goals(report, Workload("transformer", size="small"))
    assert throughput["value"] is None and throughput["met"] is None
    assert "not measured" in throughput["detail"]


def test_a_report_without_the_goal_comparison_is_refused_naming_the_flag():
    with pytest.raises(ValueError, match="--goals"):
        evaluate_goals({"comparisons": [], "contenders": {}}, Workload("transformer"))


def test_keras_standard_loss_is_what_a_keras_user_writes():
    loss, (metric,) = Workload("transformer", size="tiny").keras_standard_loss()
    assert type(loss).__name__ == "SparseCategoricalCrossentropy" and loss.ignore_class == 0
    assert loss.from_logits and type(metric).__name__ == "SparseCategoricalAccuracy"
    loss, _ = Workload("cnn").keras_standard_loss()
    assert loss.ignore_class is None
    with pytest.raises(ValueError, match="label smoothing"):
        Workload("cnn", recipe_flags=("--label-smoothing", "0.1")).keras_standard_loss()
