"""The arithmetic of every figure `tfdist bench` reports, on fixed inputs."""

import math

import numpy as np
import pytest

from tfdist.bench import figures as fig
from tfdist.bench.alternate import Rounds, summarise_times
from tfdist.bench.load import others_share
from tfdist.bench.report import markdown_table, scaling_rows, scaling_table


def test_speedup_is_the_throughput_ratio():
    assert fig.speedup(300.0, 200.0) == 1.5
    assert fig.speedup(50, 200) == 0.25


@pytest.mark.parametrize("bad", [0, -1.0, float("nan"), float("inf"), "1", True, None])
def test_speedup_rejects_non_positive_or_non_numbers(bad):
    with pytest.raises(ValueError, match="must be a finite number > 0"):
        fig.speedup(bad, 1.0)
    with pytest.raises(ValueError, match="baseline_throughput"):
        fig.speedup(1.0, bad)


def test_efficiency_is_speedup_over_replica_growth():
    assert fig.scaling_efficiency(1.8, replicas=2) == pytest.approx(0.9)
    assert fig.scaling_efficiency(3.0, replicas=4) == pytest.approx(0.75)
    # From a 2-replica baseline to 8 replicas: ideal speedup 4.
    assert fig.scaling_efficiency(3.0, replicas=8, baseline_replicas=2) == pytest.approx(0.75)
    with pytest.raises(ValueError, match="replicas must be an integer >= 1, got 0"):
        fig.scaling_efficiency(1.0, replicas=0)
    with pytest.raises(ValueError, match="replicas must be an integer >= 1, got 1.5"):
        fig.scaling_efficiency(1.0, replicas=1.5)


def test_matmul_flops_counts_two_per_multiply_add():
    assert fig.matmul_flops(2048) == 2 * 2048 ** 3
    assert fig.matmul_flops(2, 3, 4) == 2 * 2 * 3 * 4
    with pytest.raises(ValueError, match="dimension k"):
        fig.matmul_flops(2, 2, 0)


def test_flops_per_sec_and_mfu():
    assert fig.flops_per_sec(2e9, 0.5) == 4e9
    assert fig.model_flops_utilization(80e9, 200e9) == pytest.approx(0.4)
    with pytest.raises(ValueError, match="peak_flops_per_sec"):
        fig.model_flops_utilization(1.0, 0.0)
    with pytest.raises(ValueError, match="seconds"):
        fig.flops_per_sec(1.0, 0.0)


def test_input_wait_share_is_the_extra_time_of_the_real_pipeline():
    assert fig.input_wait_share(0.5, 0.4) == pytest.approx(0.2)
    assert fig.input_wait_share(1.0, 0.25) == pytest.approx(0.75)
    assert fig.input_wait_share(0.4, 0.5) == 0.0  # noise: the in-memory run was slower


def test_percentiles_match_numpy_linear_interpolation():
    values = [12.0, 3.5, 7.25, 100.0, 8.0, 9.5, 11.0]
    result = fig.percentiles(values, (50, 90, 99))
    for q in (50, 90, 99):
        assert result[f"p{q}"] == pytest.approx(np.percentile(values, q))
    assert fig.percentiles([1, 2, 3, 4, 5], (50, 90)) == {"p50": 3.0, "p90": 4.6}
    with pytest.raises(ValueError, match="at least one value"):
        fig.percentiles([])
    with pytest.raises(ValueError, match="101"):
        fig.percentiles([1.0], (101,))


def test_paired_ratio_takes_the_median_of_round_ratios():
    result = fig.paired_ratio([200, 210, 150, 400], [100, 100, 100, 100])
    assert result == {"ratio": pytest.approx(2.05), "low": 1.5, "high": 4.0, "rounds": 4}
    with pytest.raises(ValueError, match="equally long"):
        fig.paired_ratio([1.0, 2.0], [1.0])


def test_input_headroom_and_advice():
    assert fig.input_headroom(1000.0, 250.0) == 4.0
    assert fig.input_bound_advice(2.0) is None
    advice = fig.input_bound_advice(1.5)
    assert "1.50x" in advice and "cache" in advice.lower()


def test_others_share_of_the_machine():
    assert others_share(30.0, 10.0, wall_seconds=20.0, cores=2) == 0.5
    assert others_share(5.0, 10.0, wall_seconds=20.0, cores=2) == 0.0
    with pytest.raises(ValueError, match="wall_seconds"):
        others_share(1.0, 1.0, wall_seconds=0.0, cores=2)


def test_summarise_times_computes_every_figure_from_pooled_step_times():
    # Two rounds of a 64-example step: times 0.5, 0.5 | 1.0, 0.5 -> mean 0.625 s.
    rounds = Rounds(64, {"pipeline": [[0.5, 0.5], [1.0, 0.5]], "memory": [[0.4, 0.6]]})
    s = summarise_times(rounds, num_replicas=2, tokens_per_example=128, flops_per_example=1e9,
                        peak_flops=2e11)
    assert s["examples_per_sec"] == pytest.approx(64 / 0.625)
    assert s["examples_per_sec_per_replica"] == pytest.approx(64 / 0.625 / 2)
    assert s["tokens_per_sec"] == pytest.approx(64 / 0.625 * 128)
    assert s["model_flops_per_sec"] == pytest.approx(64 / 0.625 * 1e9)
    assert s["mfu"] == pytest.approx(64 / 0.625 * 1e9 / 2e11)
    assert s["step_time_ms"] == pytest.approx(625.0)
    times = [0.5, 0.5, 1.0, 0.5]
    for q in (50, 90, 99):
        assert s[f"step_time_p{q}_ms"] == pytest.approx(1000 * np.percentile(times, q))
    assert s["measured_steps"] == 4
    assert s["round_examples_per_sec"] == pytest.approx([64.0 / 0.5, 64.0 / 0.75])
    # Memory rounds: 0.5 s mean vs 0.625 s with the pipeline -> 20% waiting.
    assert s["compute_step_time_ms"] == pytest.approx(500.0)
    assert s["input_wait_share"] == pytest.approx(0.2)


def test_summarise_times_without_peak_or_tokens_leaves_them_out():
    s = summarise_times(Rounds(10, {"pipeline": [[1.0]]}))
    assert s["examples_per_sec"] == 10.0
    assert not {"tokens_per_sec", "mfu", "model_flops_per_sec", "input_wait_share"} & set(s)
    with pytest.raises(ValueError, match="No measured 'pipeline' steps"):
        summarise_times(Rounds(10, {}))


def _point(replicas, workers, examples_per_sec, **extra):
    return dict(replicas=replicas, workers=workers, devices=replicas // workers,
                examples_per_sec=examples_per_sec,
                examples_per_sec_per_replica=examples_per_sec / replicas,
                global_batch_size=16 * replicas, precision="float32", xla=True,
                step_time_p50_ms=10.0, step_time_p90_ms=11.0, step_time_p99_ms=12.0, **extra)


def test_scaling_rows_speedup_efficiency_and_mfu():
    points = [_point(1, 1, 100.0, model_flops_per_sec=5e10),
              _point(2, 1, 150.0, model_flops_per_sec=7.5e10),
              _point(2, 2, 120.0, model_flops_per_sec=6e10),
              {"replicas": 4, "workers": 1, "error": "exit status 1"}]
    rows = scaling_rows(points, peak_flops=1e11)
    assert [r.get("speedup") for r in rows] == [1.0, 1.5, 1.2, None]
    assert [r.get("efficiency") for r in rows] == [1.0, 0.75, 0.6, None]
    assert [r.get("mfu") for r in rows] == [0.5, 0.75, 0.6, None]
    table = scaling_table(rows)
    assert "| 2 | 1 | float32 | on | 32 | 150.0 |" in table
    assert "1.50x | 75% |" in table
    assert "failed: exit status 1" in table


def test_scaling_rows_need_the_one_replica_baseline():
    with pytest.raises(ValueError, match="1 replica on 1 worker"):
        scaling_rows([_point(2, 1, 150.0)])


def test_markdown_table():
    assert markdown_table(["a", "b"], [[1, 2]]) == "| a | b |\n| --- | --- |\n| 1 | 2 |"


def test_percentile_values_are_finite_for_a_single_step():
    assert all(math.isfinite(v) for v in fig.percentiles([0.25]).values())
