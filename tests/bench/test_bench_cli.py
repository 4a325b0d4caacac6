"""`tfdist bench` end to end: quick runs write the table, JSON and PNG, and the
figures in them are consistent with each other; without matplotlib the
report is written and only the plot is skipped.

No test depends on the CPU that runs it: every run describes the CPU through
`TFDIST_CPU_FLAGS` (what `--precision auto` reads), so what auto picks is
fixed by the test.
"""

import importlib
import inspect
import json
import os
import re
import subprocess
import sys

import pytest

from helpers.mw import REPO_ROOT
from helpers.paths import python_path_with_bench_extra
from helpers.zygote import run_module
from tfdist.bench.figures import step_time_shares
from tfdist.xla import resolve_xla

AVX2_CPU = "avx2 fma"
TF_LOG_LINE = re.compile(r"^[IWEF]\d{4} \d\d:\d\d", re.MULTILINE)  # TensorFlow's C++ log
BF16_CPU = "avx2 amx_bf16 avx512_bf16"


class NoMatplotlib:
    """A meta-path finder that makes matplotlib unimportable (as if not installed)."""

    def find_spec(self, name, path=None, target=None):
        if name == "matplotlib" or name.startswith("matplotlib."):
            raise ModuleNotFoundError(f"No module named {name!r} (blocked)", name=name)
        return None


# Runs tfdist bench's command line in a process where matplotlib cannot be imported.
BENCH_WITHOUT_MATPLOTLIB = ("import sys\n" + inspect.getsource(NoMatplotlib)
                            + "sys.meta_path.insert(0, NoMatplotlib())\n"
                            "from tfdist.bench.commands import main\n"
                            "sys.exit(main(sys.argv[1:]))\n")


def _env(cpu_flags=AVX2_CPU, tf_log_level="2"):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL=tf_log_level or "", PYTHONUNBUFFERED="1",
               TFDIST_CPU_FLAGS=cpu_flags)
    env.pop("TF_CONFIG", None)
    if tf_log_level is None:  # tfdist's own default (quiet)
        env.pop("TF_CPP_MIN_LOG_LEVEL")
    # With matplotlib (the bench extra) where the processes the tests start have none.
    env["PYTHONPATH"] = python_path_with_bench_extra(env)
    return env


def _run(args, timeout=300, cpu_flags=AVX2_CPU, tf_log_level="2",
         python_args=("-m", "tfdist.bench")):
    if python_args[0] == "-m":  # forked from a process with TensorFlow imported (helpers.zygote)
        return run_module(python_args[1], [*python_args[2:], *args], env=_env(cpu_flags, tf_log_level),
                          cwd=REPO_ROOT, timeout=timeout)
    return subprocess.run([sys.executable, *python_args] + args, cwd=REPO_ROOT,
                          env=_env(cpu_flags, tf_log_level), stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=timeout)


@pytest.mark.slow
def test_quick_report_writes_table_json_and_plot(tmp_path):
    out = tmp_path / "bench"
    # One single-process point and one two-worker point through the launcher.
    result = _run(["--quick", "--models", "transformer", "--max-replicas", "1",
                   "--max-workers", "2", "--compare", "engine", "--out", str(out)])
    assert result.returncode == 0, result.stdout[-3000:]

    data = json.loads((out / "results.json").read_text())
    rows = data["scaling"]["transformer"]["rows"]
    assert [(r["replicas"], r["workers"]) for r in rows] == [(1, 1), (2, 2)]
    assert all("error" not in r for r in rows), rows
    base, two = rows
    assert two["strategy"] == "multi_worker_mirrored" and two["global_batch_size"] == 16
    assert two["speedup"] == pytest.approx(two["examples_per_sec"] / base["examples_per_sec"])
    assert two["efficiency"] == pytest.approx(two["speedup"] / 2)
    peak = data["peaks"]["float32"]
    assert two["mfu"] == pytest.approx(two["model_flops_per_sec"] / peak)
    assert two["tokens_per_sec"] == pytest.approx(two["examples_per_sec"] * 32)
    assert 0.0 <= two["input_wait_share"] <= 1.0
    assert two["step_time_p50_ms"] <= two["step_time_p90_ms"] <= two["step_time_p99_ms"]

    settings = data["settings"]["transformer"]
    (engine,) = settings["comparisons"]
    ours = settings["contenders"][engine["numerator"]]
    theirs = settings["contenders"][engine["denominator"]]
    assert (ours["engine"], theirs["engine"]) == ("tfdist", "keras")
    assert engine["ratio"] == pytest.approx(ours["round_examples_per_sec"][0]
                                            / theirs["round_examples_per_sec"][0])
    check = settings["input_pipeline"]
    assert check["headroom"] == pytest.approx(check["pipeline_examples_per_sec"]
                                              / check["training_examples_per_sec"])

    # Profiled by default: each setting's step split into input wait and compute kinds.
    assert (out / "profiles" / "transformer").is_dir()
    for name, figures in settings["contenders"].items():
        kinds = {k: v["share"] for k, v in settings["profiles"][name]["kinds"].items()}
        assert figures["step_shares"] == pytest.approx(
            step_time_shares(kinds, figures["input_wait_share"]))
        assert figures["mfu_vs_fastest_peak"] <= figures["mfu"]

    table = (out / "report.md").read_text()
    assert "| Replicas | Workers | Precision | XLA |" in table
    fastest = settings["fastest_peak"]
    assert (f"| MFU vs fastest peak ({fastest['precision']} "
            f"{fastest['flops_per_sec'] / 1e9:.1f} GFLOP/s) | Input wait |") in table
    assert "CPU figures" in table
    assert "tfdist / keras fit" in table
    png = (out / "scaling.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000


@pytest.mark.slow
@pytest.mark.parametrize("cpu_flags, auto_precision, auto_xla, profile", [
    (AVX2_CPU, "float32", True, False),
    (BF16_CPU, "mixed_bfloat16", False, True),
])
def test_quick_engine_comparison_prints_ratios_and_writes_json(tmp_path, cpu_flags,
                                                                auto_precision, auto_xla,
                                                                profile):
    goals = not profile  # each adds contenders: one run each keeps the suite short
    path = tmp_path / "engine.json"
    result = _run(["engine", "--quick", "--same-xla", "off", "--json-out", str(path)]
                  + (["--profile", str(tmp_path / "profiles")] if profile else [])
                  + (["--goals"] if goals else []),
                  cpu_flags=cpu_flags)
    assert result.returncode == 0, result.stdout[-3000:]
    assert "same settings (float32, XLA off, strategy default): tfdist / keras fit:" in result.stdout
    assert "defaults vs defaults: tfdist / keras fit:" in result.stdout
    report = json.loads(path.read_text())
    labels = [c["label"] for c in report["comparisons"]]
    defaults = next(c for c in report["comparisons"]
                    if c["label"] == "defaults vs defaults: tfdist / keras fit")
    if goals:
        _check_goals(report, result.stdout)
    else:
        assert "goals" not in report and "speed goals" not in result.stdout
        assert labels[-1] == defaults["label"]
    # Keras's defaults resolve to the same run as the float32, XLA off pair on a
    # CPU-only machine (compile's jit_compile="auto" is off there): measured once.
    assert defaults["denominator"] == "keras fp32 xla-off"
    ours = report["contenders"][defaults["numerator"]]
    # tfdist's defaults follow the CPU described by TFDIST_CPU_FLAGS, not this machine's.
    assert ours["strategy"] == "one_device"
    assert (ours["precision"], ours["xla"]) == (auto_precision, auto_xla), ours
    assert "TFDIST_CPU_FLAGS" in ours["precision_reason"]
    assert (ours["xla"], ours["xla_reason"]) == resolve_xla("auto", auto_precision, on_gpu=False)
    assert auto_precision in report["peaks"]
    for name, figures in report["contenders"].items():
        assert figures["mfu"] == pytest.approx(
            figures["model_flops_per_sec"] / report["peaks"][figures["precision"]])
    # The gap to the hardware limit: bf16's peak is measured even with float32
    # contenders only, and MFU is also taken against the fastest peak, named.
    assert {"float32", "mixed_bfloat16"} <= set(report["peaks"])
    fastest = max(report["peaks"], key=report["peaks"].get)
    assert report["fastest_peak"] == {"precision": fastest,
                                      "flops_per_sec": report["peaks"][fastest]}
    assert "  gap to the hardware limit (" in result.stdout
    for name, figures in report["contenders"].items():
        assert figures["fastest_peak_precision"] == fastest
        assert figures["mfu_vs_fastest_peak"] == pytest.approx(
            figures["model_flops_per_sec"] / report["peaks"][fastest])
        assert 0.0 <= figures["input_wait_share"] <= 1.0
        gap = next(line for line in result.stdout.splitlines()
                   if re.match(rf"  {re.escape(name)} +MFU ", line))
        assert f"% vs fastest peak ({fastest} " in gap
        if profile:
            kinds = {k: v["share"] for k, v in report["profiles"][name]["kinds"].items()}
            assert figures["step_shares"] == pytest.approx(
                step_time_shares(kinds, figures["input_wait_share"]))
            assert "| step: data " in gap and ", elementwise " in gap
        else:
            assert "step_shares" not in figures and "compute" in gap


def _check_goals(report, out):
    """--goals on the described AVX2 CPU: Keras fit with Keras's loss at float32 (the
    one precision autotune tries there), XLA off and on; the goal's denominator is
    the fastest of them (the settings on other CPUs: test_bench_goals.py)."""
    keras_best = {name: figures for name, figures in report["contenders"].items()
                  if name.endswith("keras-loss")}
    assert sorted((f["precision"], f["xla"]) for f in keras_best.values()) == [
        ("float32", False), ("float32", True)], keras_best
    assert all(f["engine"] == "keras" and f["loss"] == "keras" for f in keras_best.values())
    assert report["contenders"]["tfdist defaults"]["loss"] == "recipe"
    goal = next(c for c in report["comparisons"] if c["label"].startswith("goal: "))
    assert goal["denominator"] == max(keras_best, key=lambda n: keras_best[n]["examples_per_sec"])
    assert goal["numerator"] == "tfdist defaults"
    throughput, mfu = report["goals"]
    assert throughput["value"] == goal["ratio"] and throughput["target"] == 1.4
    assert throughput["met"] == (goal["ratio"] >= 1.4)
    defaults = report["contenders"]["tfdist defaults"]
    assert mfu["value"] == defaults["mfu_vs_fastest_peak"]
    assert mfu["target"] is None and mfu["met"] is None  # no goal for the quick tiny model
    assert "TFDIST_CPU_FLAGS" in report["goals_cpu"]
    assert "speed goals on this CPU (" in out
    assert f"throughput vs keras fit: {goal['ratio']:.2f}x, goal >= 1.40x: " in out
    # The ceiling: the model's forward and backward alone, in the defaults' precision and XLA
    # setting, against the same Keras best.
    alone = report["contenders"]["model alone"]
    assert alone["engine"] == "model" and alone["strategy"] == "default"
    assert (alone["precision"], alone["xla"]) == (defaults["precision"], defaults["xla"])
    ceiling = next(c for c in report["comparisons"] if c["label"].startswith("ceiling: "))
    assert (ceiling["numerator"], ceiling["denominator"]) == ("model alone", goal["denominator"])
    ratio_ceiling, mfu_ceiling = report["ceilings"]
    assert ratio_ceiling["value"] == ceiling["ratio"]
    assert ratio_ceiling["reachable"] == (ceiling["ratio"] >= 1.4)
    assert mfu_ceiling["value"] == alone["mfu_vs_fastest_peak"]
    assert f"    throughput ratio: {ceiling['ratio']:.2f}x, goal >= 1.40x: " in out


@pytest.mark.slow
@pytest.mark.parametrize("args, message", [
    (["--models", "rnn"], "'rnn' not allowed"),
    (["--sizes", "transformer=huge"], "Unknown transformer size 'huge'"),
    (["--scaling", "strong", "--batch", "15", "--max-replicas", "2"],
     "global batch 15 does not split evenly over 2 replicas"),
])
def test_bad_arguments_fail_fast_with_the_bad_value(args, message):
    result = _run(args + ["--out", "/nonexistent/never-written"], timeout=120)
    assert result.returncode == 2
    assert message in result.stdout


@pytest.mark.parametrize("parser, args, message", [
    ("report", ["--point-timeout", "nan"],
     "argument --point-timeout: must be a finite number of seconds > 0, got 'nan'"),
    ("report", ["--models", ""], "argument --models: --models: '' names none; choose from "
                                 "transformer, cnn (comma-separated)"),
    ("report", ["--compare", ","], "argument --compare: --compare: ',' names none"),
    ("parameter-server", ["--timeout", "inf"],
     "argument --timeout: must be a finite number of seconds > 0, got 'inf'"),
])
def test_flags_a_run_could_not_use_are_refused_when_parsed(parser, args, message, capsys):
    """A NaN or infinite point timeout failed at the first two-worker point, after the
    single-process measurements; an empty --models measured nothing and wrote a report."""
    from tfdist.bench import commands, ps_bench

    build = commands.report_parser if parser == "report" else ps_bench.build_parser
    with pytest.raises(SystemExit) as exited:
        build().parse_args(args)
    assert exited.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("args, flag", [
    (["--quick", "--models", "transformer", "--max-replicas", "0", "--compare", "none", "--out"],
     "report: error: --out"),
    (["engine", "--quick", "--json-out"], "engine: error: --json-out"),
    (["resume", "--quick", "--json-out"], "resume: error: --json-out"),
    (["engine", "--quick", "--profile"], "engine: error: --profile"),
])
def test_an_output_path_that_cannot_be_written_is_refused_before_any_work(tmp_path, args, flag):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder\n")
    path = str(blocker / "results" / "out.json")
    result = _run(args + [path], timeout=120)
    assert result.returncode == 2, result.stdout[-2000:]
    assert (f"tfdist bench {flag} {path}: cannot write there (Not a directory): name a folder "
            "on a disk this user can write to.") in result.stdout
    assert "Wrote" not in result.stdout and "round" not in result.stdout.lower()


def test_prepare_output_file_creates_the_folder_and_refuses_a_folder(tmp_path):
    from tfdist.bench.flags import prepare_output_file

    prepare_output_file(str(tmp_path / "new" / "report.json"), "--json-out")
    assert (tmp_path / "new").is_dir() and not (tmp_path / "new" / "report.json").exists()
    assert list((tmp_path / "new").iterdir()) == []  # the probe file is gone
    with pytest.raises(ValueError, match=r"--json-out .*new: is a folder; name a file"):
        prepare_output_file(str(tmp_path / "new"), "--json-out")


def _scaling_result():
    from tfdist.bench.report import scaling_rows

    point = {"replicas": 1, "workers": 1, "precision": "float32", "xla": True,
             "global_batch_size": 8, "examples_per_sec": 100.0, "tokens_per_sec": 3200.0,
             "examples_per_sec_per_replica": 100.0, "step_time_p50_ms": 80.0,
             "step_time_p90_ms": 90.0, "step_time_p99_ms": 99.0, "input_wait_share": 0.1}
    two = dict(point, replicas=2, global_batch_size=16, examples_per_sec=150.0,
               examples_per_sec_per_replica=75.0)
    return {"meta": {"device_kind": "CPU", "machine": "2 CPU cores (test)", "tensorflow": "x",
                     "keras": "y", "date": "today", "command": "tfdist bench --quick"},
            "peaks": {}, "settings": {},
            "scaling": {"transformer": {"workload": "transformer tiny", "mode": "weak",
                                        "batch_label": "per-replica batch 8",
                                        "rows": scaling_rows([point, two])}}}


def test_write_report_without_matplotlib_skips_only_the_plot(tmp_path, monkeypatch):
    from tfdist.bench.plot import matplotlib_available
    from tfdist.bench.report import write_report

    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setattr(sys, "meta_path", [NoMatplotlib()] + sys.meta_path)
    assert not matplotlib_available()
    with pytest.raises(ImportError):
        importlib.import_module("matplotlib")  # the blocker works

    said = []
    paths = write_report(_scaling_result(), str(tmp_path), log=said.append)

    assert paths == [str(tmp_path / "report.md"), str(tmp_path / "results.json")]
    assert "| Replicas | Workers |" in (tmp_path / "report.md").read_text()
    assert json.loads((tmp_path / "results.json").read_text())["scaling"]["transformer"]["rows"]
    assert not (tmp_path / "scaling.png").exists()
    assert len(said) == 1 and "scaling.png" in said[0] and 'tfdist[bench]' in said[0], said


def test_write_report_with_matplotlib_draws_the_plot(tmp_path):
    pytest.importorskip("matplotlib")
    from tfdist.bench.report import write_report

    said = []
    paths = write_report(_scaling_result(), str(tmp_path), log=said.append)

    assert paths[-1] == str(tmp_path / "scaling.png")
    assert (tmp_path / "scaling.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert said == []


@pytest.mark.slow
def test_quick_report_without_matplotlib_says_so_at_start_and_writes_the_rest(tmp_path):
    out = tmp_path / "bench"
    # No TF_CPP_MIN_LOG_LEVEL: the bench's own default must keep TensorFlow quiet too.
    result = _run(["--quick", "--models", "transformer", "--max-replicas", "1",
                   "--max-workers", "1", "--compare", "none", "--out", str(out)],
                  tf_log_level=None, python_args=("-c", BENCH_WITHOUT_MATPLOTLIB))
    assert result.returncode == 0, result.stdout[-3000:]
    assert not TF_LOG_LINE.search(result.stdout), result.stdout[-3000:]
    assert "absl::InitializeLog" not in result.stdout
    lines = result.stdout.splitlines()
    warnings = [i for i, line in enumerate(lines) if 'pip install "tfdist[bench]"' in line
                and "scaling.png" in line]
    assert warnings, result.stdout[-3000:]
    sweep_start = next(i for i, line in enumerate(lines) if line.startswith("Scaling sweep"))
    assert warnings[0] < sweep_start, result.stdout[-3000:]  # said before the work starts
    assert (out / "report.md").is_file() and (out / "results.json").is_file()
    assert not (out / "scaling.png").exists()
    data = json.loads((out / "results.json").read_text())
    assert [(r["replicas"], r["workers"]) for r in data["scaling"]["transformer"]["rows"]] == [
        (1, 1)]
    assert f"Wrote {out / 'report.md'}, {out / 'results.json'}\n" in result.stdout
    assert "Traceback" not in result.stdout
