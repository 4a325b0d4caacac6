"""`tfdist bench`'s GPU utilisation column: sampled through NVML on GPUs, absent on CPUs.

No GPU exists here: the sampler runs against a stand-in NVML module
(tests/helpers/fake_nvml.py, through `UtilizationSampler`'s documented `nvml=`
seam), and the table is rendered from rows as a GPU sweep would write them.
"""

import time

import pytest

from helpers.fake_nvml import FOUR_GPUS, make_nvml
from tfdist.bench.gpu_use import UtilizationSampler, mean_utilization
from tfdist.bench.report import SCALING_HEADER, scaling_rows, scaling_table


def _point(replicas, **extra):
    return dict(replicas=replicas, workers=1, devices=replicas, examples_per_sec=100.0 * replicas,
                examples_per_sec_per_replica=100.0, global_batch_size=16 * replicas,
                precision="float32", xla=True, step_time_p50_ms=10.0, step_time_p90_ms=11.0,
                step_time_p99_ms=12.0, **extra)


def test_cpu_rows_have_no_gpu_column():
    table = scaling_table(scaling_rows([_point(1), _point(2)]))
    assert "GPU utilisation" not in table
    assert table.splitlines()[0].count("|") == len(SCALING_HEADER) + 1


def test_gpu_rows_show_utilisation_and_say_why_when_it_is_missing():
    rows = scaling_rows([_point(1, gpu_utilization=0.834),
                         _point(2, gpu_utilization=None,
                                gpu_utilization_note="NVML's Python bindings are not installed"),
                         {"replicas": 4, "workers": 1, "error": "exit status 1"}])
    lines = scaling_table(rows).splitlines()
    assert lines[0].endswith("| GPU utilisation |")
    assert lines[2].endswith("| 83% |")
    assert lines[3].endswith("| n/a: NVML's Python bindings are not installed |")
    assert all(line.count("|") == lines[0].count("|") for line in lines)


def test_mean_utilisation_is_a_fraction_of_reported_samples():
    assert mean_utilization([80.0, 90.0, None]) == pytest.approx(0.85)
    assert mean_utilization([None]) is None and mean_utilization([]) is None


def test_sampler_averages_the_mapped_gpus_between_start_and_stop():
    """Stand-in NVML: TF GPUs 0 and 1 are NVML devices 1 and 3 (20% and 40%)."""
    sampler = UtilizationSampler([0, 1], interval=0.01, environ={"CUDA_VISIBLE_DEVICES": "1,3"},
                                 nvml=make_nvml(FOUR_GPUS)).start()
    time.sleep(0.05)
    figures = sampler.stop()
    assert figures["gpu_utilization"] == pytest.approx(0.30)
    assert figures["gpu_utilization_samples"] >= 2 and figures["gpu_utilization_samples"] % 2 == 0


def test_sampler_without_nvml_reports_none_and_why():
    """Stand-in NVML whose start fails as real NVML does without a driver."""
    sampler = UtilizationSampler([0], nvml=make_nvml([], init_error="Driver Not Loaded")).start()
    assert sampler.stop() == {"gpu_utilization": None, "gpu_utilization_note": (
        "NVML could not start (Driver Not Loaded): the NVIDIA driver's libnvidia-ml is missing "
        "or cannot see the GPUs.")}


def test_sampler_interval_must_be_positive():
    with pytest.raises(ValueError, match="interval must be a finite number of seconds > 0, got 0"):
        UtilizationSampler([0], interval=0)
    with pytest.raises(ValueError, match="interval must be a finite number of seconds > 0, got inf"):
        UtilizationSampler([0], interval=float("inf"))
