"""The gap to the hardware limit on fixed inputs: MFU against the fastest
same-run peak, the shares of a step (input wait, matmul, softmax/loss,
elementwise), and how the text and Markdown reports show them."""

import pytest

from tfdist.bench import figures as fig
from tfdist.bench import profile


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
