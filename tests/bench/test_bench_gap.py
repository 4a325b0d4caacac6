"""The gap to the hardware limit on fixed inputs: MFU against the fastest
same-run peak, the shares of a step (input wait, matmul, softmax/loss,
elementwise), and how the text and Markdown reports show them."""

import pytest

from tfdist.bench import figures as fig
from tfdist.bench import profile
from tfdist.bench.alternate import run_rounds
from tfdist.bench.compare import format_comparison, gap_line
from tfdist.bench.report import contender_table, render_markdown, step_share_cells


def test_fastest_peak_is_the_highest_and_names_its_precision():
    peaks = {"float32": 2.0e11, "mixed_bfloat16": 4.0e11, "mixed_float16": 2.1e11}
    assert fig.fastest_peak(peaks) == ("mixed_bfloat16", 4.0e11)
    assert fig.fastest_peak({"float32": 3.0e11}) == ("float32", 3.0e11)
    assert fig.fastest_peak({"b": 1.0, "a": 1.0}) == ("b", 1.0)  # a tie: the first
    with pytest.raises(ValueError, match="at least one measured peak, got {}"):
        fig.fastest_peak({})
    with pytest.raises(ValueError, match="peak of mixed_float16 must be a finite number > 0, "
                                         "got 0.0"):
        fig.fastest_peak({"float32": 1.0, "mixed_float16": 0.0})


def test_mfu_vs_fastest_peak_divides_by_the_fastest_not_the_own_peak():
    # 50 GFLOP/s of model work: 25% of a 200 GFLOP/s float32 peak, 12.5% of 400 bf16.
    gap = fig.mfu_vs_fastest_peak(50e9, {"float32": 2e11, "mixed_bfloat16": 4e11})
    assert gap == {"mfu_vs_fastest_peak": pytest.approx(0.125),
                   "fastest_peak_precision": "mixed_bfloat16",
                   "fastest_peak_flops_per_sec": 4e11}
    assert fig.model_flops_utilization(50e9, 2e11) == pytest.approx(0.25)  # own precision
    with pytest.raises(ValueError, match="model_flops_per_sec"):
        fig.mfu_vs_fastest_peak(-1.0, {"float32": 2e11})


def test_step_time_shares_split_the_compute_rest_by_op_kind():
    kinds = {"matmul": 0.6, "softmax/loss": 0.1, "rng and bitwise": 0.05,
             "data and copies": 0.05, "elementwise and other": 0.2}
    # 20% waiting for input; the other 80% split 60 / 10 / (5 + 5 + 20).
    shares = fig.step_time_shares(kinds, 0.2)
    assert list(shares) == ["data", "matmul", "softmax/loss", "elementwise"]
    assert shares == {"data": 0.2, "matmul": pytest.approx(0.48),
                      "softmax/loss": pytest.approx(0.08), "elementwise": pytest.approx(0.24)}
    assert sum(shares.values()) == pytest.approx(1.0)
    # Times instead of shares, missing kinds count 0, no input wait.
    assert fig.step_time_shares({"matmul": 30, "elementwise and other": 10}, 0.0) == {
        "data": 0.0, "matmul": 0.75, "softmax/loss": 0.0, "elementwise": 0.25}
    # All waiting: no compute left to split.
    assert fig.step_time_shares({"matmul": 1.0}, 1.0) == {
        "data": 1.0, "matmul": 0.0, "softmax/loss": 0.0, "elementwise": 0.0}


@pytest.mark.parametrize("kinds, wait, message", [
    ({"matmul": 0.5, "attention": 0.5}, 0.1, r"\['attention'\]; the known ones are matmul, "
                                              r"softmax/loss, rng and bitwise"),
    ({"matmul": 0.0}, 0.1, "all 0"),
    ({"matmul": -0.1, "softmax/loss": 1.1}, 0.1, "share of matmul must be a finite number >= 0"),
    ({"matmul": 1.0}, 1.5, r"input_wait_share must be in \[0, 1\], got 1.5"),
    ({"matmul": 1.0}, None, "input_wait_share must be a finite number >= 0, got None"),
])
def test_step_time_shares_name_the_bad_value(kinds, wait, message):
    with pytest.raises(ValueError, match=message):
        fig.step_time_shares(kinds, wait)


def test_step_parts_cover_every_profile_kind_once():
    grouped = [kind for _, kinds in fig.STEP_PARTS for kind in kinds]
    assert sorted(grouped) == sorted([kind for kind, _ in profile.KINDS] + [profile.OTHER])
    assert fig.STEP_SHARES == ("data", "matmul", "softmax/loss", "elementwise")


def _contender(**extra):
    figures = {"precision": "float32", "xla": False, "xla_reason": "asked for",
               "strategy": "default", "examples_per_sec": 100.0, "tokens_per_sec": 3200.0,
               "step_time_p50_ms": 80.0, "step_time_p90_ms": 90.0, "step_time_p99_ms": 99.0,
               "model_flops_per_sec": 2e10, "peak_flops_per_sec": 2e11, "mfu": 0.1,
               "mfu_vs_fastest_peak": 0.05, "fastest_peak_precision": "mixed_bfloat16",
               "fastest_peak_flops_per_sec": 4e11, "input_wait_share": 0.1}
    figures.update(extra)
    return figures


def _report():
    shares = {"data": 0.1, "matmul": 0.54, "softmax/loss": 0.09, "elementwise": 0.27}
    return {"workload_label": "transformer tiny", "global_batch_size": 8, "rounds": 1,
            "steps": 2, "peaks": {"float32": 2e11, "mixed_bfloat16": 4e11},
            "peak_matmul_size": 512, "fastest_peak": {"precision": "mixed_bfloat16",
                                                      "flops_per_sec": 4e11},
            "contenders": {"tfdist fp32": _contender(step_shares=shares),
                           "keras fp32": _contender(input_wait_share=0.25)},
            "unsupported": {"tfdist fp16": "ValueError: no"}, "comparisons": [],
            "profile_input": "memory"}


def test_gap_line_with_and_without_the_profile():
    report = _report()
    assert gap_line("tfdist fp32", report["contenders"]["tfdist fp32"]) == (
        "  tfdist fp32              MFU 10.0% vs float32 peak, 5.0% vs fastest peak "
        "(mixed_bfloat16 400.0 GFLOP/s) | step: data 10%, matmul 54%, softmax/loss 9%, "
        "elementwise 27%")
    assert gap_line("keras fp32", report["contenders"]["keras fp32"]).endswith(
        "| step: data 25%, compute 75% (not profiled)")
    assert gap_line("x", {"precision": "float32"}) == f"  {'x':<24} MFU not measured"


def test_format_comparison_adds_the_gap_block_and_keeps_the_old_lines():
    text = format_comparison(_report(), "Settings")
    lines = text.splitlines()
    assert "  matmul peak mixed_bfloat16: 400.0 GFLOP/s (512x512, same run)" in lines
    assert any(line.startswith("  tfdist fp32") and "examples/s" in line and "MFU 10.0%" in line
               for line in lines)
    header = lines.index("  gap to the hardware limit (MFU vs the same-run matmul peak of its "
                         "own precision and of the fastest one; shares of the step time):")
    assert lines[header + 1] == gap_line("tfdist fp32", _report()["contenders"]["tfdist fp32"])
    assert lines[header + 2].startswith("  keras fp32")


def test_contender_table_has_the_fastest_peak_and_step_share_columns():
    table = contender_table(_report()).splitlines()
    assert table[0].endswith("| MFU | MFU vs fastest peak (mixed_bfloat16 400.0 GFLOP/s) | "
                             "Input wait | Matmul | Softmax/loss | Elementwise |")
    assert table[2] == ("| tfdist fp32 | float32 | off | 100.0 | 3,200 | 80 / 90 / 99 | 20.0 | "
                        "200.0 | 10.0% | 5.0% | 10% | 54% | 9% | 27% |")
    assert table[3].endswith("| 10.0% | 5.0% | 25% | not profiled | not profiled | "
                             "not profiled |")
    columns = table[0].count("|")
    assert table[4].startswith("| tfdist fp16 | - | - | unsupported: ValueError: no |")
    assert table[4].count("|") == columns
    assert step_share_cells({}) == ["-"] * 4


def test_markdown_report_explains_the_step_shares():
    result = {"meta": {"device_kind": "CPU", "machine": "2 CPU cores (test)", "tensorflow": "x",
                       "keras": "y", "date": "today", "command": "tfdist bench --quick"},
              "peaks": {}, "scaling": {}, "settings": {"transformer": _report()}}
    text = render_markdown(result)
    assert "MFU vs fastest peak (mixed_bfloat16 400.0 GFLOP/s)" in text
    assert "| tfdist fp32 | float32 | off | 100.0 |" in text
    assert "Step shares: input wait is the extra step time" in text


class _Fake:
    """A contender of `run_rounds` that records which inputs it ran."""

    global_batch_size = 4

    def __init__(self, inputs=None):
        if inputs is not None:
            self.inputs = inputs
        self.ran = []

    def run(self, steps, input="pipeline"):
        self.ran.append(input)
        return [0.5] * steps


def test_run_rounds_skips_the_inputs_a_contender_does_not_offer():
    trainer, probe = _Fake(), _Fake(inputs=("pipeline",))
    results = run_rounds({"trainer": trainer, "probe": probe}, rounds=2, steps=1,
                         inputs=("pipeline", "memory"), warmup_steps=0)
    assert trainer.ran == ["pipeline", "memory", "memory", "pipeline"]  # odd rounds reversed
    assert probe.ran == ["pipeline", "pipeline"]
    assert set(results["probe"].times) == {"pipeline"}
    assert results["trainer"].pooled("memory") == [0.5, 0.5]
