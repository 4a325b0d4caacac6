"""What a user sees and keeps from a recipe run: a quiet, readable console, a
record of the configuration in the model dir, TensorBoard scalars per step and
a profile on request, the auto choices for a described CPU, and Ctrl-C."""

import glob
import os
import re
import signal
import subprocess
import sys
import time

import pytest
import yaml

from helpers.recipe_util import REPO_ROOT, final_metric

# TensorFlow's C++ (absl) log line: severity letter, MMDD, time, thread, file:line].
TF_LOG_LINE = re.compile(r"^(\[worker \d+\] )?[IWEF]\d{4} \d\d:\d\d:\d\d")
AVX2_ONLY = "fpu sse sse2 avx avx2 fma"
AMX = "fpu sse sse2 avx avx2 fma avx512f avx512_bf16 amx_bf16 amx_tile"


def run_user(name, args, env=None, timeout=300):
    """`run_recipe` with TF_CPP_MIN_LOG_LEVEL unset (as on a fresh shell)."""
    full = dict(os.environ, PYTHONUNBUFFERED="1")
    full.pop("TF_CONFIG", None)
    full.pop("TF_CPP_MIN_LOG_LEVEL", None)
    full.update(env or {})
    return subprocess.run([sys.executable, "-m", f"tfdist.recipes.{name}", *args], cwd=REPO_ROOT,
                          env=full, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=timeout)


def tensorboard_scalars(folder):
    """{tag: [steps]} of the scalar summaries in the event files under `folder`."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    steps = {}
    for path in glob.glob(os.path.join(folder, "events.out.tfevents.*")):
        events = EventAccumulator(path, size_guidance={"tensors": 0, "scalars": 0})
        events.Reload()
        for tag in events.Tags().get("tensors", []) + events.Tags().get("scalars", []):
            items = events.Tensors(tag) if tag in events.Tags().get("tensors", []) else events.Scalars(tag)
            steps.setdefault(tag, []).extend(item.step for item in items)
    return steps


@pytest.fixture(scope="module")
def recorded_run(tmp_path_factory):
    """A default Transformer run on 2 devices, shortened, with a model dir,
    per-step TensorBoard scalars and a profile of steps 6-7."""
    model_dir = tmp_path_factory.mktemp("run") / "model"
    args = ["--strategy", "mirrored", "--devices", "2", "--epochs", "2", "--steps-per-epoch", "30",
            "--warmup-steps", "5", "--model-dir", str(model_dir), "--log-every", "10",
            "--profile-steps", "6-7"]
    result = run_user("transformer", args)
    assert result.returncode == 0, result.stdout[-4000:]
    return {"args": args, "model_dir": model_dir, "out": result.stdout}


@pytest.mark.slow
def test_mirrored_on_two_logical_devices_learns(recorded_run):
    out = recorded_run["out"]
    assert "mirrored: 2 replica(s) on 1 worker(s)" in out
    assert "global 64, per replica 32" in out
    assert "Throughput:" in out and "tokens/s" in out
    first, last = final_metric(out, "loss")
    assert last < 0.8 * first


@pytest.mark.slow
def test_default_run_shows_no_tensorflow_log_lines_and_short_epoch_lines(recorded_run):
    out = recorded_run["out"]
    tf_lines = [line for line in out.splitlines()
                if TF_LOG_LINE.match(line) or "absl::InitializeLog" in line or "oneDNN" in line]
    assert tf_lines == [], "\n".join(tf_lines)
    assert out.count("tfdist run") == 1
    epoch_lines = [line for line in out.splitlines() if re.match(r"^\d+/\d+ - ", line)]
    assert len(epoch_lines) == 2, out
    assert max(len(line) for line in out.splitlines()) <= 200, out
    # Raw figures stay out of the bar; units come on the line after it.
    assert "model_flops_per_sec" not in out and "examples_per_sec" not in out
    assert re.search(r"^  lr \d\.\d\de[-+]\d\d \| [\d.]+k? tok/s \| [\d.]+k? examples/s \| "
                     r"[\d.]+ ms/step \| [\d.]+ [MGT]FLOP/s$", out, re.MULTILINE), out


@pytest.mark.slow
def test_summary_separates_model_metrics_from_speed(recorded_run):
    out = recorded_run["out"]
    results = out[out.index("Results (first epoch -> last):"):out.index("Throughput:")]
    for name in ("loss", "accuracy", "val_loss", "val_accuracy"):
        assert re.search(rf"^  {name}\s+[\d.e-]+ -> [\d.e-]+  \(chance: [\d.]+\)$", results,
                         re.MULTILINE), results
    assert "per_sec" not in results and "step_time" not in results and "GFLOP" not in results
    first, last = final_metric(out, "loss")
    assert last < first
    assert re.search(r"^Throughput: [\d.]+k? examples/s \([\d.]+k? per replica\) \| [\d.]+k? tokens/s",
                     out, re.MULTILINE), out


@pytest.mark.slow
def test_model_dir_records_the_resolved_configuration_and_says_where_outputs_went(recorded_run):
    model_dir = recorded_run["model_dir"]
    record = yaml.safe_load((model_dir / "config.yaml").read_text())
    options, resolved = record["options"], record["resolved"]
    assert options["epochs"] == 2 and options["steps_per_epoch"] == 30
    assert options["precision"] == "auto" and options["log_every"] == 10
    assert resolved["strategy"] == "mirrored" and resolved["replicas"] == 2
    assert resolved["precision"] in ("float32", "mixed_bfloat16")
    assert f"precision     {resolved['precision']} ({resolved['precision_reason']})" in recorded_run["out"]
    assert resolved["optimizer_steps"] == 60
    assert f"Outputs in {model_dir}:" in recorded_run["out"]
    assert f"tensorboard --logdir {model_dir / 'tensorboard'}" in recorded_run["out"]


@pytest.mark.slow
def test_log_every_writes_per_step_scalars_and_profile_steps_a_trace(recorded_run):
    train = recorded_run["model_dir"] / "tensorboard" / "train"
    scalars = tensorboard_scalars(str(train))
    assert sorted(set(scalars["batch_loss"])) == [10, 20, 30, 40, 50, 60], scalars
    assert len(set(scalars["batch_tokens_per_sec"])) >= 5, scalars
    assert sorted(set(scalars["epoch_loss"])) == [0, 1], scalars
    traces = glob.glob(str(train / "plugins" / "profile" / "*" / "*.xplane.pb"))
    assert traces, os.listdir(train)
    assert "(profile of steps 6-7: Profile tab)" in recorded_run["out"]


@pytest.mark.slow
def test_resuming_with_another_configuration_names_the_changed_keys(recorded_run):
    args = list(recorded_run["args"])
    args[args.index("--epochs") + 1] = "3"
    result = run_user("transformer", args + ["--learning-rate", "0.002"])
    assert result.returncode == 0, result.stdout[-4000:]
    warning = [line for line in result.stdout.splitlines() if line.startswith("Resuming in")]
    assert warning, result.stdout[-3000:]
    assert "epochs: 2 -> 3" in warning[0] and "learning_rate: 0.003 -> 0.002" in warning[0]
    assert "resolved.optimizer_steps: 60 -> 90" in warning[0]
    assert "seed" not in warning[0]  # unchanged keys are not named
    record = yaml.safe_load((recorded_run["model_dir"] / "config.yaml").read_text())
    assert record["options"]["epochs"] == 3  # the record now describes the latest run


@pytest.mark.parametrize("flags, policy, jit", [
    (AVX2_ONLY, "float32", True),
    (AMX, "mixed_bfloat16", False),
])
def test_print_config_shows_auto_choices_for_a_described_cpu(flags, policy, jit):
    result = run_user("transformer", ["--print-config", "--epochs", "5"],
                      env={"TFDIST_CPU_FLAGS": flags}, timeout=120)
    assert result.returncode == 0, result.stdout[-3000:]
    record = yaml.safe_load(result.stdout)
    assert record["options"]["epochs"] == 5 and record["options"]["model_size"] == "tiny"
    assert record["resolved"]["precision"] == policy
    assert "$TFDIST_CPU_FLAGS" in record["resolved"]["precision_reason"]
    assert record["resolved"]["xla"] is jit


def test_print_config_applies_a_model_that_cannot_compile():
    result = run_user("cnn", ["--print-config", "--sync-bn"],
                      env={"TFDIST_CPU_FLAGS": AVX2_ONLY}, timeout=120)
    assert result.returncode == 0, result.stdout[-3000:]
    resolved = yaml.safe_load(result.stdout)["resolved"]
    assert resolved["precision"] == "float32"
    assert resolved["xla"] is False and "synchronised batch norm" in resolved["xla_reason"]


def test_print_config_leaves_the_resnets_step_uncompiled_on_cpus_unless_asked():
    """float32 on a CPU, where auto compiles the Transformer's step: the ResNet's fused
    batch norms are faster uncompiled, so auto leaves XLA off, saying why; `--xla on`
    still compiles it."""
    resolved = {}
    for xla in ("auto", "on"):
        result = run_user("cnn", ["--print-config", "--xla", xla],
                          env={"TFDIST_CPU_FLAGS": AVX2_ONLY}, timeout=120)
        assert result.returncode == 0, result.stdout[-3000:]
        resolved[xla] = yaml.safe_load(result.stdout)["resolved"]
    assert resolved["auto"]["precision"] == "float32"
    assert resolved["auto"]["xla"] is False
    assert "fused batch-norm kernels run its step faster" in resolved["auto"]["xla_reason"]
    assert resolved["on"]["xla"] is True


@pytest.mark.parametrize("how", ["flag", "env"])
def test_tensorflow_logging_is_shown_when_asked_for(how):
    """A one-step run (a default run shows none: `recorded_run`'s test above)."""
    args = ["--epochs", "1", "--steps-per-epoch", "1", "--warmup-steps", "0", "--validation-steps",
            "1", "--autotune", "off", "--xla", "off", "--precision", "float32"]
    env = {"TFDIST_CPU_FLAGS": AVX2_ONLY}
    if how == "flag":
        args.append("--tf-log-level=0")
    else:
        env["TF_CPP_MIN_LOG_LEVEL"] = "0"
    result = run_user("transformer", args, env=env, timeout=120)
    assert result.returncode == 0, result.stdout[-3000:]
    assert any(TF_LOG_LINE.match(line) for line in result.stdout.splitlines()), result.stdout[-3000:]


@pytest.mark.slow
def test_ctrl_c_prints_one_line_with_where_it_stopped_and_how_to_resume(tmp_path):
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env.pop("TF_CONFIG", None)
    command = [sys.executable, "-m", "tfdist.recipes.transformer", "--strategy", "mirrored",
               "--devices", "2", "--epochs", "2", "--steps-per-epoch", "400", "--model-dir",
               str(tmp_path / "model"), "--backup-every", "5", "--verbose", "2"]
    process = subprocess.Popen(command, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 180
        while not glob.glob(str(tmp_path / "model" / "backup" / "ckpt-*.index")):
            assert time.monotonic() < deadline and process.poll() is None, "no backup was written"
            time.sleep(0.5)
        process.send_signal(signal.SIGINT)
        out, _ = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
    # Ctrl-C is a stop like SIGTERM: a backup at the next step, exit 143 (restartable).
    assert process.returncode == 143, out[-3000:]
    assert "Traceback" not in out and "KeyboardInterrupt" not in out
    line = [text for text in out.splitlines() if text.startswith("Stopped by")]
    assert len(line) == 1, out[-3000:]
    assert re.match(r"Stopped by SIGINT in epoch 1 after step \d+: backup written at global step "
                    r"\d+ in .*backup \(ckpt-\d+\)\. Rerun the same command to resume from it\.$",
                    line[0]), line[0]
