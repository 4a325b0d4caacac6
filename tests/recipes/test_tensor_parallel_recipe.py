"""`--tensor-parallel K` in the recipes: run in-process on the test session's 2 logical CPUs.

The transformer recipe split over 2 devices prints the same losses as on one
(SGD, float32), and its start block names the split layers and the bytes each
device holds; what the split cannot do yet is refused before TensorFlow starts.
"""

import re

import numpy as np
import pytest

from tfdist.recipes import transformer
from tfdist.recipes.config import ConfigError, parse_config
from tfdist.recipes.preflight import check_before_tensorflow

SHORT = ["--optimizer", "sgd", "--precision", "float32", "--xla", "off", "--epochs", "1",
         "--steps-per-epoch", "3", "--validation-steps", "1", "--warmup-steps", "0",
         "--global-batch-size", "16", "--num-examples", "48", "--verbose", "2"]


def _figures(out):
    """The final block's metric lines (`loss  3.3083 ...`) and the epoch line's figures."""
    results = out[out.index("Results"):out.index("Throughput")]
    epoch = re.findall(r"(?:val_)?(?:loss|accuracy): [0-9.]+", out)
    return [line.split()[:2] for line in results.splitlines()[1:]], epoch


def test_transformer_split_over_two_devices_prints_the_losses_of_one(capsys, tmp_path):
    assert transformer.main([*SHORT, "--tensor-parallel", "2",
                             "--model-dir", str(tmp_path / "split")]) == 0
    split_out = capsys.readouterr().out
    assert transformer.main([*SHORT, "--tensor-parallel", "1",
                             "--model-dir", str(tmp_path / "one")]) == 0
    one_out = capsys.readouterr().out
    # The split run's epoch checkpoint holds the model as built (kernels gathered), so it
    # loads where the unsplit run's does, with the same weights.
    from helpers.compare import final_checkpoint_weights

    split_weights = final_checkpoint_weights(tmp_path / "split")
    one_weights = final_checkpoint_weights(tmp_path / "one")
    assert split_weights.keys() == one_weights.keys()
    for name, value in one_weights.items():
        np.testing.assert_allclose(split_weights[name], value, rtol=1e-5, atol=1e-6,
                                   err_msg=name)
    split_figures, one_figures = _figures(split_out), _figures(one_out)
    assert split_figures[0] and split_figures[1], split_out
    for split, one in zip(split_figures, one_figures, strict=True):
        assert split == one, (split_out, one_out)
    for text in ("tensor parallel  tensor_parallel=2 over mesh axis 'model' of 'decoder_lm' "
                 "(8 layers split), shards on CPU:0, CPU:1",
                 "block_1/ffn_out  row-parallel  kernel (512, 128) -> 2 x (256, 128)",
                 "block_0/attention  heads-parallel  4 heads -> 2 x 2"):
        assert text in split_out, split_out
    assert "tensor parallel" not in one_out
    line = next(line for line in split_out.splitlines() if "bytes/device" in line)
    split_mib = [float(figure) for figure in re.findall(r"split ([0-9.]+) MiB", line)]
    rest_mib = [float(figure) for figure in re.findall(r"rest ([0-9.]+) MiB", line)]
    assert len(split_mib) == 2 and abs(split_mib[0] - split_mib[1]) <= 0.05 * split_mib[0], line
    assert rest_mib[0] > 0 and rest_mib[1] == 0, line  # the replicated rest is on the first device


def test_transformer_split_runs_bfloat16_with_accumulation(capsys, mixed_bfloat16):
    """The recipe passes --precision bf16 and --grad-accum-steps to the split (their equality
    with one device is checked at the Trainer, tests/training/tensor_parallel/). The
    `mixed_bfloat16` fixture puts the global policy back afterwards (the recipe sets it)."""
    flags = [flag for flag in SHORT if flag not in ("--precision", "float32")]
    assert transformer.main([*flags, "--precision", "bf16", "--grad-accum-steps", "2",
                             "--steps-per-epoch", "4", "--tensor-parallel", "2"]) == 0
    out = capsys.readouterr().out
    assert "mixed_bfloat16" in out and "(8 layers split)" in out, out
    losses = [float(figure) for figure in re.findall(r"(?<!val_)loss: ([0-9.]+)", out)]
    assert losses and all(0 < loss < 20 for loss in losses), out


@pytest.mark.parametrize("recipe,flags,words", [
    (transformer, ["--strategy", "mirrored"], ["--strategy mirrored", "--strategy auto"]),
    (transformer, ["--devices", "2"], ["--devices 2", "Drop --devices"]),
    (transformer, ["--model-parallel", "2"], ["--model-parallel 2", "Use one of them"]),
    (transformer, ["--xla", "on"], ["--xla on", "--xla off or auto"]),
])
def test_what_the_split_cannot_do_yet_is_refused_before_tensorflow(recipe, flags, words):
    config = parse_config([*flags, "--tensor-parallel", "2"], recipe.RECIPE.all_options(),
                          prog=recipe.RECIPE.name)
    with pytest.raises(ConfigError) as raised:
        check_before_tensorflow(recipe.RECIPE, config)
    message = str(raised.value)
    assert "--tensor-parallel 2" in message and "\n" not in message, message
    for word in words:
        assert word in message, message


def test_auto_choices_resolve_to_what_the_split_runs():
    from tfdist.precision import PrecisionChoice
    from tfdist.recipes.auto_choices import rule_choices
    from tfdist.recipes.tensor_parallel_flags import precision_under_tensor_parallel

    config = parse_config(["--tensor-parallel", "2"], transformer.RECIPE.all_options(),
                          prog="transformer")
    check_before_tensorflow(transformer.RECIPE, config)
    precision, jit_compile, reason = rule_choices(transformer.RECIPE, config, on_gpu=True)
    assert precision.policy == "float32"
    assert jit_compile is False and "--tensor-parallel 2" in reason
    # On a GPU with fast bfloat16, auto would pick it: the split turns it to float32, saying why.
    half = precision_under_tensor_parallel(config, PrecisionChoice("mixed_bfloat16", "auto: GPU"))
    assert half.policy == "float32" and "--tensor-parallel 2" in half.reason


def test_the_split_copy_keeps_the_resnet_weight_decay_exclusions():
    """The cnn recipe's ResNet excludes batch norm and biases from weight decay, by variable:
    the split copy's own variables get the same exclusions (prepare_split_optimizer), so a
    strong decay trains the split model like one device."""
    import keras
    import numpy as np

    from tfdist.models import resnet_layout_map
    from tfdist.models.builders import build_image_classifier
    from tfdist.recipes.tensor_parallel_flags import prepare_split_optimizer
    from tfdist.training import Trainer

    rng = np.random.default_rng(0)
    x = rng.normal(size=(16, 16, 16, 3)).astype("float32")
    y = rng.integers(0, 4, size=(16,)).astype("int32")
    mesh = keras.distribution.DeviceMesh((2,), ["model"], devices=["cpu:0", "cpu:1"])

    def train(split, prepare_split=True):
        keras.utils.set_random_seed(11)
        built = build_image_classifier("resnet_tiny", 4, (16, 16, 3))
        optimizer = keras.optimizers.SGD(0.1, weight_decay=0.5)
        built.prepare_optimizer(optimizer)
        extra = ({"tensor_parallel": 2, "layout_map": resnet_layout_map(mesh, "resnet_tiny")}
                 if split else {})
        trainer = Trainer(built.model, optimizer, built.loss, **extra)
        if prepare_split:
            prepare_split_optimizer(built, trainer)
        trainer.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
        return {v.path: np.asarray(v) for v in built.model.weights}

    one, two = train(False), train(True)
    for path, value in one.items():
        np.testing.assert_allclose(two[path], value, rtol=1e-5, atol=1e-5, err_msg=path)
    unprepared = train(True, prepare_split=False)  # the copy's BN gammas would decay
    assert not np.allclose(unprepared["stem_bn/gamma"], one["stem_bn/gamma"], atol=1e-4)


def test_in_a_cluster_auto_gives_one_split_replica_per_worker(monkeypatch):
    import json

    from tfdist.recipes.tensor_parallel_flags import tensor_parallel_strategy

    def resolved(*flags):
        config = parse_config(["--tensor-parallel", "2", *flags],
                              transformer.RECIPE.all_options(), prog="transformer")
        check_before_tensorflow(transformer.RECIPE, config)
        return tensor_parallel_strategy(config)

    assert resolved() == ("default", None)
    assert resolved("--strategy", "multi_worker_mirrored") == ("multi_worker_mirrored", 1)
    assert resolved("--cluster-resolver", "slurm") == ("multi_worker_mirrored", 1)
    monkeypatch.setenv("TF_CONFIG", json.dumps({
        "cluster": {"worker": ["localhost:1", "localhost:2"]},
        "task": {"type": "worker", "index": 0}}))
    assert resolved() == ("multi_worker_mirrored", 1)
    assert resolved("--strategy", "default") == ("default", None)  # ignores TF_CONFIG
    for strategy in ("mirrored", "one_device", "parameter_server"):
        config = parse_config(["--tensor-parallel", "2", "--strategy", strategy],
                              transformer.RECIPE.all_options(), prog="transformer")
        with pytest.raises(ConfigError, match=f"--tensor-parallel 2 with --strategy {strategy}: "
                                              "each worker holds one replica split"):
            check_before_tensorflow(transformer.RECIPE, config)


def test_bytes_per_device_counts_each_shard_and_its_slots_where_they_live():
    """Measured from the variables' placement: each device holds half of the split layers'
    weights and momentum slots; the replicated rest (head, iteration counter) is on the first."""
    import keras

    from tfdist.recipes.tensor_parallel_flags import bytes_per_device
    from tfdist.training import Trainer

    keras.utils.set_random_seed(1)
    inputs = keras.Input((8,))
    hidden = keras.layers.Dense(32, activation="relu", name="up")(inputs)
    back = keras.layers.Dense(8, name="down")(hidden)
    model = keras.Model(inputs, keras.layers.Dense(3, name="head")(back))
    model.compile(keras.optimizers.SGD(0.1, momentum=0.9), "mse")
    layout_map = keras.distribution.LayoutMap(keras.distribution.DeviceMesh(
        (2,), ["model"], devices=["cpu:0", "cpu:1"]))
    layout_map["up/kernel"] = (None, "model")
    layout_map["down/kernel"] = ("model", None)
    trainer = Trainer(model, tensor_parallel=2, layout_map=layout_map)
    sizes = list(bytes_per_device(trainer).values())
    # Float32 weights and their momentum: each device has half of up's kernel and bias and half
    # of down's kernel; down's bias, added once after the sum, is on the first device.
    per_shard, down_bias = (8 * 16 + 16 + 16 * 8) * 4 * 2, 8 * 4 * 2
    assert [size["split"] for size in sizes] == [per_shard + down_bias, per_shard]
    head = (8 * 3 + 3) * 4 * 2
    assert sizes[1]["rest"] == 0 and sizes[0]["rest"] >= head


def test_resuming_a_backup_of_another_degree_is_refused_naming_both():
    import argparse

    from tfdist.recipes.tensor_parallel_flags import check_resume_degree

    written_split = {"options": {"tensor_parallel": 2}}
    with pytest.raises(ValueError, match="written with --tensor-parallel 2, this run has "
                                         "--tensor-parallel 1: .* Resume with --tensor-parallel 2"):
        check_resume_degree(argparse.Namespace(tensor_parallel=1), written_split, "b/ckpt-6")
    with pytest.raises(ValueError, match="written with --tensor-parallel 1, this run has "
                                         "--tensor-parallel 2"):
        check_resume_degree(argparse.Namespace(tensor_parallel=2), {"options": {}}, "b/ckpt-6")
    check_resume_degree(argparse.Namespace(tensor_parallel=2), written_split, "b/ckpt-6")
    check_resume_degree(argparse.Namespace(tensor_parallel=2), None, "b/ckpt-6")  # unknown


@pytest.mark.slow
@pytest.mark.multiworker
def test_two_workers_of_two_shards_train_like_the_whole_model_and_resume_exactly(tmp_path):
    """`--strategy auto` under the launcher's TF_CONFIG: one split replica per worker
    (multi_worker_mirrored, one device each, 2 shard devices beside it), with the
    figures of the same 2 workers without the split; a SIGTERM to the launcher
    mid-epoch stops both workers after a backup, and the rerun ends with the
    uninterrupted run's weights to the bit (--deterministic: the shards share the
    CPU's thread pool, whose split of a matmul otherwise varies by 1e-8)."""
    import csv
    import signal

    from helpers.compare import assert_same_final_checkpoint
    from helpers.mw import launch, start_launch
    from helpers.processes import finish, newest_backup, wait_for_backup

    flags = ["--optimizer", "sgd", "--precision", "float32", "--xla", "off", "--epochs", "1",
             "--steps-per-epoch", "60", "--validation-steps", "1", "--warmup-steps", "2",
             "--global-batch-size", "16", "--dropout", "0", "--autotune", "off",
             "--backup-every", "10", "--deterministic", "--verbose", "2"]

    def recipe(k, model_dir):
        return ["-m", "tfdist.recipes.transformer", *flags, "--tensor-parallel", str(k),
                "--model-dir", str(model_dir)]

    logs = {}
    for k in (2, 1):
        result = launch(recipe(k, tmp_path / f"tp{k}"), workers=2, timeout=240)
        assert result.returncode == 0, result.stdout[-4000:]
        assert "multi_worker_mirrored: 2 replica(s) on 2 worker(s)" in result.stdout
        assert ("(8 layers split), shards on CPU:0, CPU:1" in result.stdout) == (k == 2)
        with open(tmp_path / f"tp{k}" / "training_log.csv") as stream:
            logs[k] = list(csv.DictReader(stream))
    for split, whole in zip(logs[2], logs[1], strict=True):
        for key in ("loss", "accuracy", "val_loss", "val_accuracy"):
            assert float(split[key]) == pytest.approx(float(whole[key]), rel=1e-5), key

    stopped = tmp_path / "stopped"
    # The grace period of a real preemption: both workers write the backup before exiting.
    launcher = start_launch(recipe(2, stopped), workers=2, timeout=240, grace_period=30)
    wait_for_backup(launcher, stopped, after=1)  # step 20 of 60
    launcher.send_signal(signal.SIGTERM)
    code, out = finish(launcher, timeout=120)
    assert code == 143 and newest_backup(stopped) < 7, out[-3000:]  # not at the epoch end
    result = launch(recipe(2, stopped), workers=2, timeout=240)
    assert result.returncode == 0, result.stdout[-4000:]
    resumed = re.search(r"resuming from \S+ at epoch 0 step (\d+) ", result.stdout)
    assert resumed and 20 <= int(resumed.group(1)) < 60, result.stdout[-4000:]
    assert_same_final_checkpoint(tmp_path / "tp2", stopped)


def test_the_bench_formula_and_trace_reading():
    from tfdist.bench.tensor_parallel_bench import all_reduce_volume, communication_activity

    # tiny: 2 blocks, d 128; batch 32 x 64 tokens, 2 shards, float32.
    volume = all_reduce_volume(2, 32, 64, 128, 2, vocabulary_split=False)
    assert volume["all_reduces"] == 8 and volume["values_each"] == 32 * 64 * 128
    assert volume["all_reduce_bytes"] == 8 * 32 * 64 * 128 * 4
    assert volume["moved_bytes"] == 2 * volume["all_reduce_bytes"]
    four = all_reduce_volume(2, 32, 64, 128, 4, vocabulary_split=False)
    assert four["moved_bytes"] == 6 * volume["all_reduce_bytes"]
    assert all_reduce_volume(2, 32, 64, 128, 2)["all_reduces"] == 10  # + embedding, projection
    lines = {"tf_Compute/1": [("block_0/ffn_in/MatMul", 0, 6), ("x/_12:_Send", 6, 1),
                              ("block_0/ffn_out/AddN", 7, 1)],
             "tf_Compute/2": [("x/_13:_Recv", 0, 2)],
             "python": [("fit", 0, 100)]}
    assert communication_activity(lines) == {"sends": 1, "share": 4 / 10}
    assert communication_activity({"python": [("fit", 0, 1)]}) is None


def test_the_bench_subcommand_runs_quick_and_reports_both_settings(tmp_path):
    import json
    import os
    import subprocess
    import sys

    from helpers.paths import REPO_ROOT

    out = tmp_path / "tp.json"
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=REPO_ROOT)
    result = subprocess.run(
        [sys.executable, "-m", "tfdist", "bench", "tensor-parallel", "--quick",
         "--json-out", str(out)], cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-4000:]
    assert "one device" in result.stdout and "split over 2 devices" in result.stdout
    assert "all-reduces (4 per block, 2 for the embedding and output projection" in result.stdout
    report = json.loads(out.read_text())
    one, split = report["rows"]
    assert (one["K"], split["K"]) == (1, 2)
    assert one["sends"] == 0 < split["sends"]  # one device sends nothing between devices
    assert 0 < split["communication share"] < 1
    assert all(row["examples/s"] > 0 for row in report["rows"])
    assert report["volume"]["all_reduces"] == 4 * report["settings"]["num_layers"] + 2
