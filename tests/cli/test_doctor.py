"""`tfdist doctor`: the report's pure parts, the all-reduce check, and the command.

What `--precision auto` picks is only asserted under a fixed hardware
description (`TFDIST_CPU_FLAGS`), never for the CPU that runs the tests.
"""

import os
import re
import subprocess
import sys

import pytest

import tfdist
from helpers.mw import REPO_ROOT
from tfdist.cli import doctor
from tfdist.precision import PRECISIONS, PrecisionChoice
from tfdist.models.builders import FUSED_BATCH_NORM_BEATS_XLA
from tfdist.xla import leave_uncompiled_where_slower, resolve_xla

TF_LOG_LINE = re.compile(r"^[IWEF]\d{4} \d\d:\d\d", re.MULTILINE)  # TensorFlow's C++ log format
AUTO_PRECISION = re.compile(r"^  --precision auto +(\S+) \((auto: .+)\)$", re.MULTILINE)
AUTO_XLA = re.compile(r"^  --xla auto +(on|off) \((auto: .+)\)$", re.MULTILINE)
AUTO_CNN_XLA = re.compile(r"^  --xla auto, CNN +(on|off) \((auto: .+)\)$", re.MULTILINE)
ALLREDUCE = re.compile(r"^  all-reduce +(.*)$", re.MULTILINE)


def _doctor(*args, cpu_flags=None, timeout=240):
    """Runs `python -m tfdist doctor ARGS` with TF_CPP_MIN_LOG_LEVEL unset (tfdist's default)."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    for name in ("TF_CONFIG", "TF_CPP_MIN_LOG_LEVEL", "TFDIST_CPU_FLAGS"):
        env.pop(name, None)
    if cpu_flags is not None:
        env["TFDIST_CPU_FLAGS"] = cpu_flags
    env["PYTHONPATH"] = os.pathsep.join(p for p in [REPO_ROOT, env.get("PYTHONPATH", "")] if p)
    return subprocess.run([sys.executable, "-m", "tfdist", "doctor", *args], cwd=REPO_ROOT,
                          env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=timeout)


@pytest.fixture(scope="module")
def real_run():
    """One full `tfdist doctor` on this machine (with the all-reduce check)."""
    return _doctor()


# ---- the command ------------------------------------------------------------------

def test_doctor_passes_its_allreduce_check_here(real_run):
    assert real_run.returncode == 0, real_run.stdout
    (line,) = ALLREDUCE.findall(real_run.stdout)
    assert re.fullmatch(r"ok: sum 3 \(expected 3\) over 2 replicas on .+, \d+\.\d\d s", line), line


def test_doctor_reports_versions_build_devices_and_cpu(real_run):
    out = real_run.stdout
    import tensorflow as tf

    assert re.search(rf"^  tfdist +{re.escape(tfdist.__version__)}$", out, re.MULTILINE), out
    assert re.search(rf"^  TensorFlow +{re.escape(tf.__version__)}", out, re.MULTILINE), out
    assert re.search(r"^  Keras +3\.", out, re.MULTILINE), out
    for label in ("CUDA", "cuDNN", "NCCL", "CPU", "model", "flags"):
        assert re.search(rf"^  {label} +\S", out, re.MULTILINE), (label, out)
    # oneDNN on or off, and why (this machine's CPU decides; the test's environment does not set it).
    from tfdist import seam

    onednn = seam.onednn_enabled()
    assert re.search(rf"^  oneDNN +{'on' if onednn else 'off'} \((TensorFlow's default on "
                     r"|TF_ENABLE_ONEDNN_OPTS=)", out, re.MULTILINE), out
    # The doctor's own process got TensorFlow's pool (import tfdist asks for it).
    assert re.search(r"^  tensor memory +TensorFlow's pool \(TF_CPU_ALLOCATOR_USE_BFC=true\), "
                     r"up to \d+ MiB$", out, re.MULTILINE), out
    if not tf.config.list_physical_devices("GPU"):
        assert re.search(r"^  GPU +none visible to TensorFlow$", out, re.MULTILINE), out
    # Labels are aligned: every value starts in the same column.
    rows = [line for line in out.splitlines() if line.startswith("  ")]
    columns = {len(line) - len(line[2:].split("  ", 1)[1].lstrip()) for line in rows}
    assert len(columns) == 1, rows


def test_doctor_auto_choices_agree_with_each_other(real_run):
    # Whatever this CPU is: the two lines are there, and XLA follows the precision.
    (policy, reason), = AUTO_PRECISION.findall(real_run.stdout)
    (xla, xla_reason), = AUTO_XLA.findall(real_run.stdout)
    assert policy in PRECISIONS and policy != "auto"
    on_gpu = "none visible to TensorFlow" not in real_run.stdout
    assert (xla == "on", xla_reason) == resolve_xla("auto", policy, on_gpu=on_gpu)
    # The CNN recipe's row: its ResNets' exception applied to that decision, as the recipe does.
    (cnn_xla, cnn_reason), = AUTO_CNN_XLA.findall(real_run.stdout)
    assert (cnn_xla == "on", cnn_reason) == leave_uncompiled_where_slower(
        "auto", xla == "on", xla_reason, FUSED_BATCH_NORM_BEATS_XLA, on_gpu=on_gpu)


def test_doctor_keeps_tensorflow_quiet_by_default(real_run):
    assert not TF_LOG_LINE.search(real_run.stdout), real_run.stdout
    assert "absl::InitializeLog" not in real_run.stdout


@pytest.mark.parametrize("cpu_flags, policy, xla, cnn_reason", [
    # float32 compiles, but not the ResNets, whose fused batch norms are faster.
    ("avx2 fma", "float32", "on", f"auto: {FUSED_BATCH_NORM_BEATS_XLA}"),
    ("avx2 amx_bf16 avx512_bf16", "mixed_bfloat16", "off",
     "auto: TensorFlow's bfloat16 CPU kernels"),
])
def test_doctor_auto_choices_follow_the_described_cpu(cpu_flags, policy, xla, cnn_reason):
    result = _doctor("--skip-allreduce", cpu_flags=cpu_flags)
    assert result.returncode == 0, result.stdout
    out = result.stdout
    if "none visible to TensorFlow" not in out:
        pytest.skip("a GPU decides auto here, not the CPU flags")
    (found, reason), = AUTO_PRECISION.findall(out)
    assert found == policy, out
    assert "$TFDIST_CPU_FLAGS" in reason
    assert AUTO_XLA.findall(out)[0][0] == xla, out
    (cnn_xla, found_reason), = AUTO_CNN_XLA.findall(out)
    assert cnn_xla == "off" and found_reason.startswith(cnn_reason), out
    flags_line = re.search(r"^  flags +(.*)$", out, re.MULTILINE).group(1)
    assert flags_line == doctor.describe_features(set(cpu_flags.split()), from_env=True)
    assert ALLREDUCE.findall(out) == ["skipped (--skip-allreduce)"]


def test_doctor_bad_flag_exits_2():
    result = _doctor("--tf-log-level", "9", timeout=60)
    assert result.returncode == 2
    assert "--tf-log-level" in result.stdout


def test_doctor_refuses_a_misspelt_cpu_flag_before_tensorflow(monkeypatch, capsys):
    monkeypatch.setenv("TFDIST_CPU_FLAGS", "AVX2 fma")
    monkeypatch.setattr(doctor, "import_tensorflow", lambda level: pytest.fail("TensorFlow started"))
    assert doctor.main(["--skip-allreduce"]) == 2
    assert ("tfdist doctor: error: $TFDIST_CPU_FLAGS names 'AVX2'"
            in capsys.readouterr().err)


def test_doctor_refuses_a_pool_limit_tensorflow_cannot_use_before_tensorflow(monkeypatch,
                                                                            capsys):
    monkeypatch.setenv("TF_CPU_BFC_MEM_LIMIT_IN_MB", "lots")
    monkeypatch.setattr(doctor, "import_tensorflow", lambda level: pytest.fail("TensorFlow started"))
    assert doctor.main(["--skip-allreduce"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tfdist doctor: error: $TF_CPU_BFC_MEM_LIMIT_IN_MB='lots' is not a "
                          "whole number of MiB > 0") and err.count("\n") == 1, err


@pytest.mark.parametrize("value", ["nan", "inf", "-1", "0", "soon"])
def test_doctor_timeout_must_be_a_finite_number_of_seconds(value, capsys):
    """nan and inf were tracebacks (ValueError, OverflowError) after the first checks; -1
    reported the all-reduce as hung after -1 s."""
    with pytest.raises(SystemExit) as exited:
        doctor.build_parser().parse_args(["--timeout", value])
    assert exited.value.code == 2
    assert (f"argument --timeout: must be a finite number of seconds > 0, got {value!r}"
            in capsys.readouterr().err)
    assert doctor.build_parser().parse_args(["--timeout", "2.5"]).timeout == 2.5


def test_main_exits_1_when_the_check_fails(monkeypatch, capsys):
    failed = doctor.CheckResult(False, 2, 3.0, where="2 logical CPU devices",
                                error="replica 1 all-reduced to [1.0], expected 3.0")
    monkeypatch.setattr(doctor, "run_allreduce_check", lambda *args, **kwargs: failed)
    assert doctor.main(["--tf-log-level", "2"]) == 1
    (line,) = ALLREDUCE.findall(capsys.readouterr().out)
    assert line == "FAILED: replica 1 all-reduced to [1.0], expected 3.0"


def test_main_exits_1_naming_a_malformed_tf_config(monkeypatch, capsys):
    monkeypatch.setenv("TF_CONFIG", '{"cluster": {"worker": ["a:1"]}, "task": {"index": 0}}')
    assert doctor.main(["--tf-log-level", "2", "--skip-allreduce"]) == 1
    out, err = capsys.readouterr()
    (row,) = re.findall(r"^  TF_CONFIG +(.*)$", out, re.MULTILINE)
    assert row.startswith("malformed: TF_CONFIG") and "Every recipe refuses it (exit 2)" in row
    assert err == f"tfdist doctor: {row[len('malformed: '):]}\n"


@pytest.mark.parametrize("environ, rows", [
    ({}, [("TF_CONFIG", "unset: this machine trains alone"), ("SLURM", "not in a SLURM job")]),
    ({"TF_CONFIG": '{"cluster": {"chief": ["a:1"], "worker": ["b:2", "c:3"]}, '
                   '"task": {"type": "worker", "index": 1}}',
      "SLURM_JOB_ID": "77", "SLURM_PROCID": "1", "SLURM_NTASKS": "3"},
     [("TF_CONFIG", "chief: 1, worker: 2; this task: worker 1 at c:3"),
      ("SLURM", "job 77, task 1 of 3 (read with --cluster-resolver slurm)")]),
    ({"TF_CONFIG": '{"cluster": {"worker": ["a:1", "b:2"]}, "task": {"type": "worker", "index": 0}}'},
     [("TF_CONFIG", "worker: 2; this task: worker 0 at a:1, the chief"),
      ("SLURM", "not in a SLURM job")]),
])
def test_cluster_rows_describe_tf_config_and_slurm(environ, rows):
    assert doctor.cluster_rows(environ) == (rows, None)


def test_cluster_rows_name_what_is_wrong_with_tf_config():
    rows, problem = doctor.cluster_rows({"TF_CONFIG": "{not json"})
    assert problem.startswith("TF_CONFIG is not valid JSON") and problem.endswith(
        "Every recipe refuses it (exit 2): fix TF_CONFIG, or unset it to train on this "
        "machine alone.")
    assert rows[0] == ("TF_CONFIG", f"malformed: {problem}")


# ---- the all-reduce check (in this process: conftest made 2 logical CPUs) ------------

def test_allreduce_check_sums_the_replicas():
    result = doctor.run_allreduce_check(["/device:CPU:0", "/device:CPU:1"], "2 logical CPUs")
    assert result.ok, result.error
    assert (result.replicas, result.value, result.expected) == (2, 3.0, 3.0)
    assert result.seconds > 0


def test_allreduce_check_reports_an_error_instead_of_raising():
    result = doctor.run_allreduce_check(["/device:CPU:0", "/device:CPU:7"], "CPU 0 and 7")
    assert not result.ok and result.value is None
    assert "CPU:7" in result.error
    assert doctor.format_check(result).startswith("FAILED: ")


# ---- pure parts ---------------------------------------------------------------------

def test_format_report_aligns_labels_across_sections():
    text = doctor.format_report([("A", [("x", "1"), ("longer", "2")]),
                                 ("B", [("yy", "first\nsecond")])])
    assert text.splitlines() == ["A", "  x       1", "  longer  2", "B", "  yy      first",
                                 "          second"]
    assert doctor.format_report([("A", [("x", "1")])], width=4) == "A\n  x     1"


def test_select_and_describe_features():
    assert doctor.select_features({"fma", "avx512_bf16", "sse2"}) == (
        ["fma", "avx512_bf16"], ["avx2", "avx512f", "amx_tile", "amx_bf16"])
    assert doctor.describe_features(set()) == "none of " + " ".join(doctor.FEATURE_FLAGS)
    every = set(doctor.FEATURE_FLAGS)
    assert doctor.describe_features(every) == " ".join(doctor.FEATURE_FLAGS)
    assert doctor.describe_features({"avx2"}, from_env=True).endswith("(from $TFDIST_CPU_FLAGS)")


def test_build_rows_say_what_is_absent():
    rows = dict(doctor.build_rows({"is_cuda_build": False}, {}))
    assert rows == {"CUDA": "not in this build (CPU-only TensorFlow)",
                    "cuDNN": "not in this build", "NCCL": "not in this build"}
    rows = dict(doctor.build_rows({"is_cuda_build": True, "cuda_version": "12.5.1",
                                   "cudnn_version": "9"}, {}))
    assert rows["CUDA"] == "12.5.1" and rows["cuDNN"] == "9"
    assert rows["NCCL"].startswith("unknown")
    assert rows["CUDA libraries"].startswith("none from pip")
    rows = dict(doctor.build_rows({"is_cuda_build": True, "cuda_version": "12.5.1"},
                                  {"nvidia-nccl-cu12": "2.23.4", "nvidia-cudnn-cu12": "9.3"}))
    assert rows["NCCL"] == "2.23.4 (pip nvidia-nccl-cu12)"
    assert rows["cuDNN"] == "not in the build info"
    assert rows["CUDA libraries"] == "nvidia-nccl-cu12 2.23.4, nvidia-cudnn-cu12 9.3"


def test_device_rows_name_gpus_and_their_compute_capability():
    rows = doctor.device_rows(["/physical_device:CPU:0"], [
        ("/physical_device:GPU:0", {"device_name": "NVIDIA A100", "compute_capability": (8, 0)}),
        ("/physical_device:GPU:1", {})])
    assert rows[0][0] == "CPU" and "/physical_device:CPU:0" in rows[0][1]
    assert rows[1:] == [("GPU 0", "NVIDIA A100, compute capability 8.0"),
                        ("GPU 1", "/physical_device:GPU:1, compute capability unknown")]
    rows = doctor.device_rows(["/physical_device:CPU:0"], [], split=["a", "b"])
    assert rows[0][1].endswith("split into 2 logical devices for the check")
    assert rows[1] == ("GPU", "none visible to TensorFlow")


def test_auto_rows():
    assert doctor.auto_rows(PrecisionChoice("mixed_bfloat16", "auto: CPU has amx_bf16"), False,
                            "auto: bf16 kernels") == [
        ("--precision auto", "mixed_bfloat16 (auto: CPU has amx_bf16)"),
        ("--xla auto", "off (auto: bf16 kernels)")]
    rows = doctor.auto_rows(PrecisionChoice("float32", "auto: no bf16"), True, "auto: fuses",
                            cnn_xla=(False, "auto: fused batch norms"))
    assert rows[1:] == [("--xla auto", "on (auto: fuses)"),
                        ("--xla auto, CNN", "off (auto: fused batch norms)")]


@pytest.mark.parametrize("all_reduced, reduced, error", [
    ([[3.0, 3.0], [3.0, 3.0]], [3.0, 3.0], None),
    ([[3.0], [2.0]], [3.0], "replica 1 all-reduced to [2.0], expected 3.0"),
    ([[3.0]], [3.0], "1 replica results came back, expected 2"),
    ([[3.0], [3.0]], [4.0], "strategy.reduce(SUM) gave [4.0], expected 3.0"),
    ([[3.0], []], [3.0], "replica 1 all-reduced to [], expected 3.0"),
])
def test_compare_allreduce(all_reduced, reduced, error):
    assert doctor.compare_allreduce(2, all_reduced, reduced) == (error is None, error)


def test_format_check_and_devices():
    ok = doctor.CheckResult(True, 2, 3.0, 3.0, 1.234, "GPU 0 and 1")
    assert doctor.format_check(ok) == "ok: sum 3 (expected 3) over 2 replicas on GPU 0 and 1, 1.23 s"
    assert doctor.format_check(doctor.CheckResult(False, 2, 3.0, error="boom")) == "FAILED: boom"
    assert doctor.check_devices(2) == (2, "GPU 0 and 1")
    assert doctor.check_devices(1, ["/device:CPU:0", "/device:CPU:1"]) == (
        ["/device:CPU:0", "/device:CPU:1"], "2 logical CPU devices")
    assert [doctor.expected_sum(n) for n in (1, 2, 4)] == [1.0, 3.0, 10.0]
