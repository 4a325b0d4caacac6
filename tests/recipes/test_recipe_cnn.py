"""The CNN recipe end to end, in fresh processes, as a user runs it."""

import pytest

from helpers.damage_util import damage_payload
from helpers.mw import launch
from helpers.recipe_util import final_metric, run_recipe

SHORT = ["--epochs", "2", "--steps-per-epoch", "24", "--validation-steps", "2", "--verbose", "2",
         "--warmup-steps", "5"]


@pytest.mark.slow
def test_mirrored_on_two_logical_devices_learns():
    # Precision and XLA pinned: what `auto` picks depends on the CPU; float32 with
    # XLA compiles on any CPU (auto leaves the ResNet's step uncompiled on CPUs).
    result = run_recipe("cnn", ["--strategy", "mirrored", "--devices", "2", "--precision", "fp32",
                                "--xla", "on", *SHORT])
    assert result.returncode == 0, result.stdout[-4000:]
    out = result.stdout
    assert "mirrored: 2 replica(s) on 1 worker(s)" in out
    assert "global 128, per replica 64" in out and "XLA           on" in out
    first, last = final_metric(out, "loss")
    assert last < first
    assert final_metric(out, "accuracy")[1] > 0.25  # chance: 1/8


@pytest.mark.slow
@pytest.mark.multiworker
def test_two_workers_through_the_launcher_train():
    result = launch(["-m", "tfdist.recipes.cnn", "--strategy", "multi_worker_mirrored",
                     "--global-batch-size", "64", *SHORT], workers=2, timeout=420)
    assert result.returncode == 0, result.stdout[-4000:]
    assert "multi_worker_mirrored: 2 replica(s) on 2 worker(s)" in result.stdout
    first, last = final_metric(result.stdout, "loss")
    assert last < first


def test_sync_bn_turns_auto_xla_off_and_says_why():
    # The reason must be the blocker's (the collective), not the fused batch norms'.
    result = run_recipe("cnn", ["--strategy", "mirrored", "--devices", "2", "--sync-bn",
                                "--precision", "float32",
                                "--epochs", "1", "--steps-per-epoch", "2", "--warmup-steps", "0",
                                "--verbose", "0"])
    assert result.returncode == 0, result.stdout[-4000:]
    assert "XLA           off (auto: synchronised batch norm" in result.stdout
    assert "synchronised batch norm" in result.stdout


def test_sync_bn_with_forced_xla_is_a_clear_error():
    result = run_recipe("cnn", ["--sync-bn", "--xla", "on", "--strategy", "default", "--warmup-steps", "0",
                                "--epochs", "1", "--steps-per-epoch", "2"])
    assert result.returncode == 2
    assert "--xla on is not possible" in result.stdout and "--xla off" in result.stdout


def test_missing_tfrecords_name_the_pattern():
    result = run_recipe("cnn", ["--dataset", "imagenet_tfrecord:/nonexistent/train-*",
                                "--strategy", "default"], timeout=120)
    assert result.returncode == 2
    assert "/nonexistent/train-*" in result.stdout
    assert "Traceback" not in result.stdout


@pytest.mark.parametrize("name", ["cnn_tiny", "cnn_cifar10_resnet18", "imagenet_resnet50"])
def test_shipped_yaml_recipes_parse(name):
    from tfdist.recipes.cnn import RECIPE
    from tfdist.recipes.config import parse_config

    config = parse_config(["--config", name], RECIPE.all_options(), prog="cnn")
    assert config.model.startswith("resnet")
    if name == "imagenet_resnet50":
        assert config.learning_rate == pytest.approx(0.1 * config.global_batch_size / 256)
        assert config.warmup_steps == 5 * config.steps_per_epoch and config.epochs == 90


def test_a_corrupt_imagenet_tfrecord_met_in_training_exits_2_naming_the_file(tmp_path):
    from tfdist.data import write_image_tfrecords
    from tfdist.data.images import generate_shapes

    images, labels = generate_shapes(128, 32)
    paths = write_image_tfrecords(images, labels, str(tmp_path / "train"), num_files=4)
    offset = damage_payload(paths[1], 20)
    result = run_recipe("cnn", ["--dataset", f"imagenet_tfrecord:{tmp_path}/train-*",
                                "--num-classes", "8", "--image-size", "32", "--epochs", "1",
                                "--steps-per-epoch", "3", "--global-batch-size", "16",
                                "--warmup-steps", "0", "--verbose", "2"], timeout=180)
    assert result.returncode == 2, result.stdout[-3000:]
    assert "tfdist run" in result.stdout  # it failed in training, not before
    assert (f"error: CorruptDataError: Corrupt TFRecord data: {paths[1]}: record 20 (starts at "
            f"byte {offset} of ") in result.stdout
    assert f"TensorFlow said 'corrupted record at {offset + 12}'" in result.stdout
    assert "Traceback" not in result.stdout
