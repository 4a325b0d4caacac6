import os
import re

import pytest

from tfdist.recipes.config import (COMMON_OPTIONS, ConfigError, Option, find_config_file,
                                   parse_config, shipped_configs)

OPTIONS = COMMON_OPTIONS + [Option("model_size", str, "tiny", "Model size.", choices=("tiny", "base"))]


def parse(argv):
    return parse_config(argv, OPTIONS, prog="test")


def test_defaults_apply_when_nothing_is_given():
    config = parse([])
    assert config.strategy == "auto" and config.global_batch_size == 64 and config.model_size == "tiny"
    assert config.explicit == set() and config.config_file is None


def test_flags_are_converted_and_recorded_as_explicit():
    config = parse(["--strategy", "mirrored", "--global-batch-size", "32", "--learning-rate", "3e-4",
                    "--deterministic"])
    assert config.global_batch_size == 32 and config.learning_rate == pytest.approx(3e-4)
    assert config.deterministic is True
    assert config.explicit == {"strategy", "global_batch_size", "learning_rate", "deterministic"}


def test_yaml_overrides_defaults_and_flags_override_yaml(tmp_path):
    path = tmp_path / "recipe.yaml"
    path.write_text("strategy: mirrored\nglobal-batch-size: 128\nepochs: 3\n")
    config = parse(["--config", str(path), "--epochs", "5"])
    assert config.strategy == "mirrored" and config.global_batch_size == 128 and config.epochs == 5
    assert config.config_file == str(path)


def test_unknown_yaml_key_lists_the_valid_ones(tmp_path):
    path = tmp_path / "recipe.yaml"
    path.write_text("global_batch: 128\n")
    with pytest.raises(ConfigError) as error:
        parse(["--config", str(path)])
    assert "'global_batch'" in str(error.value) and "global_batch_size" in str(error.value)


@pytest.mark.parametrize("argv, fragment", [
    (["--global-batch-size", "0"], "global_batch_size must be >= 1, got 0"),
    (["--global-batch-size", "many"], "global_batch_size must be int, got 'many'"),
    (["--precision", "fp8"], "Unknown precision 'fp8'. Valid precisions: auto, float32"),
    (["--strategy", "mirorred"], "Unknown strategy 'mirorred'. Valid names: auto, default"),
    (["--strategy", "central_storage"], "does not support 'central_storage' yet"),
    (["--profile-steps", "9-3"], "A-B with 1 <= A <= B"),
    (["--tf-log-level", "5"], "tf_log_level=5 is not allowed"),
    (["--xla", "maybe"], "xla='maybe' is not allowed"),
    (["--deterministic", "perhaps"], "deterministic must be bool"),
    (["--devices", "65"], "flag --devices: devices=65 is more than 64, the most devices per worker"),
    (["--devices", "0"], "devices must be >= 1, got 0"),
    (["--skip-corrupt-records", "sometimes"], "skip_corrupt_records must be bool"),
    (["--gpu-memory", "limit:0"],
     "flag --gpu-memory: gpu_memory 'limit:0': the limit must be a positive whole number of MB"),
    (["--gpu-memory", "all"], "gpu_memory must be growth (allocate as needed), preallocate"),
    (["--cluster-resolver", "k8s"],
     "flag --cluster-resolver: cluster_resolver='k8s' is not allowed. Choose one of: tf_config, slurm."),
    (["--learning-rate", "0"], "flag --learning-rate: learning_rate must be > 0.0, got 0.0."),
    (["--learning-rate", "nan"], "flag --learning-rate: learning_rate must be a finite number, got nan."),
    (["--weight-decay", "inf"], "flag --weight-decay: weight_decay must be a finite number, got inf."),
    (["--clip-norm", "0"], "flag --clip-norm: clip_norm must be > 0.0, got 0.0."),
    (["--adam-epsilon", "0"], "flag --adam-epsilon: adam_epsilon must be > 0.0, got 0.0."),
    (["--seed", "-1"], "flag --seed: seed must be >= 0, got -1."),
    (["--seed", str(2 ** 32)], "flag --seed: seed must be <= 4294967295, got 4294967296."),
])
def test_bad_flag_values_name_the_value(argv, fragment):
    with pytest.raises(ConfigError) as error:
        parse(argv)
    assert fragment in str(error.value)


def test_the_largest_seed_is_accepted():
    assert parse(["--seed", str(2 ** 32 - 1)]).seed == 2 ** 32 - 1


def test_tfdist_autotune_sets_the_default_and_a_bad_value_is_refused_naming_it(monkeypatch):
    monkeypatch.setenv("TFDIST_AUTOTUNE", " Refresh ")
    assert parse([]).autotune == "refresh"
    assert parse(["--autotune", "off"]).autotune == "off"
    monkeypatch.setenv("TFDIST_AUTOTUNE", "sometimes")
    with pytest.raises(ConfigError, match=r"^\$TFDIST_AUTOTUNE: autotune='sometimes' is not "
                                          r"allowed\. Choose one of: on, off, refresh\.$"):
        parse([])
    assert parse(["--autotune", "on"]).autotune == "on"  # the flag overrides the variable
    monkeypatch.delenv("TFDIST_AUTOTUNE")
    assert parse([]).autotune == "on"


def test_bad_yaml_value_names_the_file(tmp_path):
    path = tmp_path / "recipe.yaml"
    path.write_text("model_size: huge\n")
    with pytest.raises(ConfigError) as error:
        parse(["--config", str(path)])
    assert str(path) in str(error.value) and "tiny, base" in str(error.value)


def test_an_empty_yaml_value_means_the_default_only_where_that_is_none(tmp_path):
    path = tmp_path / "recipe.yaml"
    path.write_text("steps_per_epoch: null\nvalidation_steps:\n")
    config = parse(["--config", str(path)])
    assert (config.steps_per_epoch, config.validation_steps) == (None, None)
    path.write_text("epochs:\n")
    with pytest.raises(ConfigError, match=rf"^Config file {re.escape(str(path))}: epochs is empty "
                                          r"\(null\), but it needs a value \(int; the default is "
                                          r"1\): give one, or remove the line for the default\.$"):
        parse(["--config", str(path)])


def test_missing_config_says_where_it_looked():
    with pytest.raises(ConfigError) as error:
        find_config_file("no_such_recipe", search_dirs=["/nonexistent"])
    assert "no_such_recipe" in str(error.value) and "/nonexistent" in str(error.value)
    assert "The shipped configs: " in str(error.value) and "transformer_tiny" in str(error.value)


def test_a_missing_config_path_is_named_once_where_it_was_looked_for(tmp_path):
    path = str(tmp_path / "absent.yaml")
    with pytest.raises(ConfigError) as error:
        find_config_file(path, search_dirs=["/nonexistent", str(tmp_path)])
    looked_at = str(error.value).split("Looked at: ")[1].split(". The shipped")[0].split(", ")
    assert looked_at == [path, path + ".yaml", path + ".yml"]


def test_named_config_is_found_in_a_recipes_folder(tmp_path):
    (tmp_path / "mine.yaml").write_text("epochs: 2\n")
    assert find_config_file("mine", search_dirs=[str(tmp_path)]) == str(tmp_path / "mine.yaml")


@pytest.mark.parametrize("alias, policy", [
    ("bf16", "mixed_bfloat16"), ("mixed_bf16", "mixed_bfloat16"), ("BF16-mixed", "mixed_bfloat16"),
    ("fp16", "mixed_float16"), ("16-mixed", "mixed_float16"), ("fp32", "float32"),
    ("float32", "float32"), ("auto", "auto"),
])
def test_precision_aliases_map_to_keras_policies(alias, policy):
    assert parse(["--precision", alias]).precision == policy


def test_strategy_names_are_canonicalised_before_tensorflow():
    assert parse(["--strategy", "Multi-Worker-Mirrored"]).strategy == "multi_worker_mirrored"


def test_shipped_recipes_are_found_by_name_from_any_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("TFDIST_RECIPES_DIR", raising=False)
    path = find_config_file("transformer_tiny")
    assert path.endswith(os.path.join("tfdist", "recipes", "configs", "transformer_tiny.yaml"))
    assert {"transformer_tiny", "cnn_tiny", "imagenet_resnet50"} <= set(shipped_configs())


def test_recipes_dir_env_is_searched_before_the_shipped_recipes(tmp_path, monkeypatch):
    (tmp_path / "transformer_tiny.yaml").write_text("epochs: 7\n")
    monkeypatch.setenv("TFDIST_RECIPES_DIR", str(tmp_path))
    assert find_config_file("transformer_tiny") == str(tmp_path / "transformer_tiny.yaml")
    assert parse(["--config", "transformer_tiny"]).epochs == 7


def test_a_recipes_dir_entry_that_is_not_a_folder_is_refused_not_skipped(tmp_path, monkeypatch):
    # Skipped, a misspelt folder would let the shipped transformer_tiny stand in for the user's.
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "transformer_tiny.yaml").write_text("epochs: 7\n")
    a_file = tmp_path / "recipes.txt"
    a_file.write_text("")
    for entry, what in ((tmp_path / "mien", "which does not exist"),
                        (a_file, "which is a file, not a folder")):
        monkeypatch.setenv("TFDIST_RECIPES_DIR", os.pathsep.join([str(mine), str(entry)]))
        with pytest.raises(ConfigError) as error:
            parse(["--config", "transformer_tiny"])
        message = str(error.value)
        assert message.startswith(f"$TFDIST_RECIPES_DIR lists {str(entry)!r}, {what}: ")
        assert "Fix the path, or remove it from $TFDIST_RECIPES_DIR" in message
        assert "\n" not in message
    # Empty entries (a trailing ':') are no folder named; a path given as such needs no search.
    monkeypatch.setenv("TFDIST_RECIPES_DIR", str(mine) + os.pathsep)
    assert parse(["--config", "transformer_tiny"]).epochs == 7
    monkeypatch.setenv("TFDIST_RECIPES_DIR", str(tmp_path / "mien"))
    assert parse(["--config", str(mine / "transformer_tiny.yaml")]).epochs == 7


@pytest.mark.parametrize("text, where, problem", [
    ("epochs: [1,\n", "line 2, column 1", "expected the node content, but found '<stream end>' "
                                          "(while parsing a flow node)"),
    ("epochs: 1\n\tseed: 2\n", "line 2, column 1", "found character '\\t' that cannot start any "
                                                   "token (while scanning for the next token)"),
    ("epochs: seed: 2\n", "line 1, column 13", "mapping values are not allowed here"),
])
def test_a_config_file_that_is_not_yaml_is_one_line_naming_where(tmp_path, text, where, problem):
    path = tmp_path / "recipe.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as error:
        parse(["--config", str(path)])
    assert str(error.value) == (f"Config file {path} is not valid YAML: {where}: {problem}. Fix "
                                f"the file (`--print-config` without `--config` prints a valid one).")


def test_the_device_limit_is_named_with_a_count_that_works(tmp_path):
    from tfdist.distribute.device_limits import MAX_DEVICES_PER_WORKER

    assert MAX_DEVICES_PER_WORKER == 64
    assert parse(["--devices", "64"]).devices == 64
    path = tmp_path / "recipe.yaml"
    path.write_text("devices: 1000\n")
    with pytest.raises(ConfigError) as error:
        parse(["--config", str(path)])
    message = str(error.value)
    assert str(path) in message and "devices=1000 is more than 64" in message
    assert f"{os.cpu_count()} core(s)" in message
    assert f"devices={min(os.cpu_count(), 64)} (one per core)" in message


def test_skip_corrupt_records_is_refused_without_tfrecord_data():
    import argparse

    from tfdist.recipes.preflight import check_skip_corrupt_records

    def config(dataset, validation=None):
        return argparse.Namespace(skip_corrupt_records=True, dataset=dataset,
                                  validation_dataset=validation)

    with pytest.raises(ConfigError) as error:
        check_skip_corrupt_records(config("embedded:reverse", "text:/v/*.txt"))
    assert "tfrecord:GLOB, imagenet_tfrecord:GLOB" in str(error.value)
    assert "'embedded:reverse' and 'text:/v/*.txt'" in str(error.value)
    check_skip_corrupt_records(config("tfrecord:/d/*"))
    check_skip_corrupt_records(config("shapes", " ImageNet_TFRecord:/v/*"))
    check_skip_corrupt_records(argparse.Namespace(skip_corrupt_records=False, dataset="shapes"))


@pytest.mark.parametrize("argv, value", [
    ([], "preallocate"), (["--gpu-memory", "growth"], "growth"),
    (["--gpu-memory", "Limit:4096"], "limit:4096"),
])
def test_gpu_memory_flag_is_canonicalised(argv, value):
    assert parse(argv).gpu_memory == value


def test_gpu_memory_and_cluster_resolver_from_yaml(tmp_path):
    path = tmp_path / "recipe.yaml"
    path.write_text("gpu_memory: limit:2048\ncluster-resolver: SLURM\n")
    config = parse(["--config", str(path)])
    assert config.gpu_memory == "limit:2048" and config.cluster_resolver == "slurm"
    assert {"gpu_memory", "cluster_resolver"} <= config.explicit
    path.write_text("gpu_memory: limit:4 GB\n")
    with pytest.raises(ConfigError, match=f"config file {path}: gpu_memory 'limit:4 GB'"):
        parse(["--config", str(path)])


def test_cluster_resolver_names_match_the_strategy_factory():
    from tfdist.recipes.config import CLUSTER_RESOLVERS
    from tfdist.distribute.strategy_names import CLUSTER_RESOLVER_NAMES

    assert CLUSTER_RESOLVERS == CLUSTER_RESOLVER_NAMES
    assert parse([]).cluster_resolver == "tf_config"


@pytest.mark.parametrize("strategy, refused", [
    ("auto", False), ("multi_worker_mirrored", False), ("mirrored", True), ("one_device", True),
    ("default", True),
])
def test_slurm_resolver_is_refused_with_a_single_machine_strategy(strategy, refused):
    from tfdist.recipes.preflight import check_cluster_resolver

    config = parse(["--strategy", strategy, "--cluster-resolver", "slurm"])
    if refused:
        with pytest.raises(ConfigError) as error:
            check_cluster_resolver(config)
        assert (f"--cluster-resolver slurm finds the workers of a multi-worker run, but "
                f"--strategy {strategy} trains on this machine alone") in str(error.value)
    else:
        check_cluster_resolver(config)
    check_cluster_resolver(parse(["--strategy", strategy]))  # tf_config: always fine


def test_slurm_resolver_is_refused_with_parameter_servers():
    from tfdist.recipes.preflight import check_cluster_resolver

    with pytest.raises(ConfigError, match="parameter_server reads its chief, worker and ps "
                                          "tasks from TF_CONFIG only"):
        check_cluster_resolver(parse(["--strategy", "parameter_server",
                                      "--cluster-resolver", "slurm"]))


def test_print_config_shows_both_flags_and_what_gpu_memory_does_here():
    import tensorflow as tf
    import yaml

    from helpers.recipe_util import run_recipe

    result = run_recipe("cnn", ["--print-config", "--gpu-memory", "limit:512", "--cluster-resolver",
                                "slurm", "--strategy", "multi_worker_mirrored"], timeout=180)
    assert result.returncode == 0, result.stdout[-2000:]
    record = yaml.safe_load(result.stdout[result.stdout.index("options:"):])
    assert record["options"]["gpu_memory"] == "limit:512"
    assert record["options"]["cluster_resolver"] == "slurm"
    if not tf.config.list_physical_devices("GPU"):
        assert record["resolved"]["gpu_memory"] == "limit:512: no effect, TensorFlow sees no GPU"


def test_gpu_memory_contradicting_the_environment_is_refused_before_tensorflow(monkeypatch):
    from tfdist.recipes.preflight import check_before_tensorflow
    from tfdist.recipes.transformer import RECIPE

    monkeypatch.setenv("TF_FORCE_GPU_ALLOW_GROWTH", "false")
    config = parse_config(["--gpu-memory", "growth"], RECIPE.all_options(), prog="test")
    with pytest.raises(ConfigError, match=r"--gpu-memory: gpu_memory growth contradicts "
                                          r"\$TF_FORCE_GPU_ALLOW_GROWTH=false"):
        check_before_tensorflow(RECIPE, config)
    monkeypatch.setenv("TF_FORCE_GPU_ALLOW_GROWTH", "true")
    check_before_tensorflow(RECIPE, parse_config([], RECIPE.all_options(), prog="test"))


def test_misspelt_cpu_flags_are_refused_before_tensorflow(monkeypatch):
    """`avx512bf16` counted as absent: `auto` picked float32 for a bfloat16 CPU, silently."""
    from tfdist.recipes.preflight import check_before_tensorflow
    from tfdist.recipes.transformer import RECIPE

    config = parse_config([], RECIPE.all_options(), prog="test")
    monkeypatch.setenv("TFDIST_CPU_FLAGS", "avx2 avx512bf16")
    with pytest.raises(ConfigError, match=r"\$TFDIST_CPU_FLAGS names 'avx512bf16'.*did you mean "
                                          r"'avx512_bf16'"):
        check_before_tensorflow(RECIPE, config)
    monkeypatch.setenv("TFDIST_CPU_FLAGS", "avx2 avx512_bf16 sse4_2")
    check_before_tensorflow(RECIPE, config)


def test_slurm_resolver_reaches_the_strategy_factory():
    from helpers.recipe_util import run_recipe

    env = {name: "" for name in ("SLURM_PROCID", "SLURM_JOB_ID")}
    result = run_recipe("transformer", ["--strategy", "multi_worker_mirrored", "--cluster-resolver",
                                        "slurm", "--epochs", "1", "--steps-per-epoch", "2",
                                        "--warmup-steps", "0"], timeout=180, env=env)
    assert result.returncode == 2, result.stdout[-2000:]
    assert "cluster_resolver='slurm' needs to run inside a SLURM job step (srun)" in result.stdout


@pytest.mark.parametrize("argv, steps_per_epoch, warmup, reason", [
    # The default 30 against 20 steps: a tenth of the run.
    ([], 20, 2, "the recipe's default 30, cut to fit this 20-step run"),
    # It ends before a 300-step run: kept.
    ([], 300, 30, None),
    # 4 micro-batches a step: 40 batches are 10 optimizer steps.
    (["--grad-accum-steps", "4"], 40, 1, "the recipe's default 30, cut to fit this 10-step run"),
    # Fewer than 10 steps: no warmup.
    ([], 9, 0, "the recipe's default 30, cut to fit this 9-step run"),
    # `step` needs 4 steps after the warmup: 30 of 33 would leave 3.
    (["--schedule", "step"], 33, 3, "the recipe's default 30, cut to fit this 33-step run"),
    (["--schedule", "step"], 34, 30, None),
    # `inverse_sqrt` peaks at the warmup's end: at least 1 step, even under 10 steps.
    (["--schedule", "inverse_sqrt"], 9, 1, "the recipe's default 30, cut to fit this 9-step run"),
    (["--schedule", "inverse_sqrt"], 2, 1, "the recipe's default 30, cut to fit this 2-step run"),
])
def test_the_recipes_default_warmup_is_cut_to_fit_a_shorter_run(argv, steps_per_epoch, warmup,
                                                                 reason):
    from tfdist.recipes.preflight import (check_warmup, describe_warmup, fit_default_warmup,
                                          warmup_reason)
    from tfdist.recipes.transformer import RECIPE

    config = parse_config(["--epochs", "1", *argv], RECIPE.all_options(), prog="test")  # 30
    fit_default_warmup(config, steps_per_epoch)
    assert (config.warmup_steps, warmup_reason(config)) == (warmup, reason)
    check_warmup(config, steps_per_epoch)  # what is left passes
    assert describe_warmup(config) == (f"{warmup} warmup {'step' if warmup == 1 else 'steps'}"
                                       + (f" ({reason})" if reason else ""))


def test_a_warmup_the_user_set_is_never_cut_and_a_shorter_run_cuts_the_default_again(tmp_path):
    from tfdist.recipes.preflight import check_warmup, fit_default_warmup, warmup_reason
    from tfdist.recipes.transformer import RECIPE

    path = tmp_path / "warmup.yaml"
    path.write_text("warmup_steps: 30\n")
    for argv in (["--warmup-steps", "30"], ["--config", str(path)]):
        config = parse_config(["--epochs", "1", *argv], RECIPE.all_options(), prog="test")
        fit_default_warmup(config, 20)
        assert (config.warmup_steps, warmup_reason(config)) == (30, None)
        with pytest.raises(ConfigError, match=r"--warmup-steps 30 is not shorter than the run, "
                                              r"which has 20 optimizer step\(s\)"):
            check_warmup(config, 20)
    config = parse_config(["--epochs", "1"], RECIPE.all_options(), prog="test")
    fit_default_warmup(config, 200)  # before TensorFlow: the run's length from the data's size
    fit_default_warmup(config, 20)  # the data read: shorter
    assert (config.warmup_steps, warmup_reason(config)) == (
        2, "the recipe's default 30, cut to fit this 20-step run")
    with pytest.raises(ConfigError, match=r"Use --warmup-steps 0 \(no warmup\), or a longer run"):
        check_warmup(parse_config(["--epochs", "1", "--warmup-steps", "5"], RECIPE.all_options(),
                                  prog="test"), 3)


@pytest.mark.parametrize("epochs, steps_per_epoch, every, refused", [
    (1, 8, 4, None),
    (2, 3, 2, None),  # 6 batches: an update straddles the epoch end, none is left over
    (3, 3, 2, "the run's 9 batches (3 epoch(s) x 3) are not a multiple of it, so the last 1 "
              "would be trained and never applied. Use --steps-per-epoch 2 or 4"),
    (1, 3, 4, "the run's 3 batches (1 epoch(s) x 3) are not a multiple of it, so the last 3 "
              "would be trained and never applied. Use --steps-per-epoch 4 (a multiple of 4)."),
])
def test_accumulation_that_would_leave_batches_unapplied_is_refused(epochs, steps_per_epoch,
                                                                    every, refused):
    from tfdist.recipes.preflight import check_accumulation

    config = parse(["--epochs", str(epochs), "--grad-accum-steps", str(every)])
    if refused is None:
        check_accumulation(config, steps_per_epoch)
        return
    with pytest.raises(ConfigError, match=re.escape(f"--grad-accum-steps {every}: {refused}")):
        check_accumulation(config, steps_per_epoch)


@pytest.mark.parametrize("argv, steps_per_epoch, refused", [
    (["--warmup-steps", "0"], 100, r"--schedule inverse_sqrt peaks at the end of its warmup, so "
                                   r"it needs --warmup-steps 1 or more, got 0: use --warmup-steps "
                                   r"10, or another --schedule\."),
    ([], 1, r"--schedule inverse_sqrt rises through its warmup \(at least 1 step\) and then "
            r"decays, so it needs a run of at least 2 optimizer steps, but the run has 1 "
            r"optimizer step\(s\) \(1 epoch\(s\) x 1 steps\)"),
    (["--warmup-steps", "3"], 3, r"--warmup-steps 3 is not shorter than the run, which has 3 "
                                 r"optimizer step\(s\) \(1 epoch\(s\) x 3 steps\)\. Use "
                                 r"--warmup-steps 1, or a longer run"),
])
def test_inverse_sqrt_without_a_warmup_is_refused_naming_the_way_out(argv, steps_per_epoch,
                                                                     refused):
    from tfdist.recipes.preflight import check_warmup, fit_default_warmup
    from tfdist.recipes.translation import RECIPE

    config = parse_config(["--epochs", "1", *argv], RECIPE.all_options(), prog="test")
    assert config.schedule == "inverse_sqrt"  # the translation recipe's default
    fit_default_warmup(config, steps_per_epoch)
    with pytest.raises(ConfigError, match=refused):
        check_warmup(config, steps_per_epoch)


REFUSED_BEFORE_TENSORFLOW = """
import sys
from tfdist.recipes import {recipe} as recipe
code = recipe.RECIPE.main({argv!r})
print("exit", code, "tensorflow imported:", "tensorflow" in sys.modules)
"""


@pytest.mark.parametrize("recipe, argv, refused", [
    ("transformer", ["--steps-per-epoch", "3", "--warmup-steps", "50"], "--warmup-steps 50"),
    ("cnn", ["--steps-per-epoch", "3", "--warmup-steps", "50"], "--warmup-steps 50"),
    ("translation", ["--steps-per-epoch", "3", "--warmup-steps", "50"], "--warmup-steps 50"),
    ("translation", ["--dataset", "text:only_one.de"], "--dataset: Dataset 'text:only_one.de'"),
    ("transformer", ["--epochs", "1", "--steps-per-epoch", "6", "--grad-accum-steps", "4"],
     "--grad-accum-steps 4: the run's 6 batches (1 epoch(s) x 6) are not a multiple of it, so "
     "the last 2 would be trained and never applied. Use --steps-per-epoch 4 or 8 (a multiple "
     "of 4)."),
    ("transformer", ["--log-every", "5"],
     "--log-every 5 writes into MODEL_DIR/tensorboard: add --model-dir DIR."),
    ("translation", ["--dataset", "text:absent.de,absent.en"],
     "--dataset text:absent.de,absent.en: absent.de does not exist on this machine."),
    ("transformer", ["--dataset", "text:/no/such/folder/*.txt"],
     "--dataset text:/no/such/folder/*.txt: /no/such/folder does not exist"),
    ("cnn", ["--validation-dataset", "image_folder:no_such_folder"],
     "--validation-dataset image_folder:no_such_folder: no_such_folder does not exist"),
    ("transformer", ["--sequence-length", "64"],
     "--sequence-length 64 has no effect on --dataset embedded:reverse"),
    ("cnn", ["--num-classes", "10"], "--num-classes 10 has no effect on --dataset shapes"),
    ("translation", ["--download"], "--download prepares tfds: data"),
    ("cnn", ["--backup-every", "20"], "--backup-every 20 shapes the run's backups, but it writes none"),
    ("transformer", ["--backup-keep", "3"], "--backup-keep 3 shapes the run's backups"),
    ("cnn", ["--autotune", "off", "--autotune-budget", "5"],
     "--autotune-budget 5.0 sets the autotune trial, but --autotune off runs none"),
])
def test_flags_refused_by_the_preflight_never_start_tensorflow(recipe, argv, refused):
    """A refused flag is one line and exit 2 in a fraction of a second: no recipe's pre-flight
    check imports TensorFlow (about 2 s of start-up), whatever datasets it parses."""
    import subprocess
    import sys

    script = REFUSED_BEFORE_TENSORFLOW.format(recipe=recipe, argv=argv)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            timeout=60)
    assert result.stdout.strip() == "exit 2 tensorflow imported: False", (result.stdout,
                                                                          result.stderr[-2000:])
    assert refused in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_only_local_paths_that_cannot_exist_are_refused_before_tensorflow(tmp_path):
    from tfdist.data.specs import missing_local_path

    (tmp_path / "a.txt").write_text("x\n")
    assert missing_local_path(f"text:{tmp_path}/a.txt") is None
    assert missing_local_path(f"text:{tmp_path}/a.txt,{tmp_path}/b.txt") == f"{tmp_path}/b.txt"
    # A pattern whose folder exists passes even if it matches nothing: the reader's own glob
    # (which, unlike Python's, also matches hidden files) names what it finds or does not.
    assert missing_local_path(f"tfrecord:{tmp_path}/*.tfrecord") is None
    assert missing_local_path(f"tfrecord:{tmp_path}/gone/shard-?.tfrecord") == f"{tmp_path}/gone"
    assert missing_local_path(f"image_folder:{tmp_path}") is None
    assert missing_local_path(f"image_folder:{tmp_path}/gone") == f"{tmp_path}/gone"
    for spec in ("text:gs://bucket/*.txt", "tfds:imdb_reviews", "shapes", "embedded:sort"):
        assert missing_local_path(spec) is None, spec


def test_print_config_reads_no_data_so_a_missing_dataset_path_is_not_refused():
    from tfdist.recipes.preflight import check_before_tensorflow
    from tfdist.recipes.transformer import RECIPE

    argv = ["--dataset", "text:/no/such/folder/*.txt"]
    with pytest.raises(ConfigError, match="/no/such/folder does not exist"):
        check_before_tensorflow(RECIPE, parse_config(argv, RECIPE.all_options(), prog="test"))
    check_before_tensorflow(RECIPE, parse_config(argv + ["--print-config"], RECIPE.all_options(),
                                                 prog="test"))


# (recipe, option flag, value, a dataset that reads it, one that does not)
DATASET_SPECIFIC_OPTIONS = [
    ("transformer", "--sequence-length", "64", "tfds:imdb_reviews", "embedded:sort"),
    ("transformer", "--num-examples", "512", "embedded:copy", "tfds:imdb_reviews"),
    ("cnn", "--num-examples", "512", "shapes", "tfds_images:cifar10"),
    ("cnn", "--num-classes", "10", "imagenet_tfrecord:gs://bucket/train-*", "shapes"),
    ("translation", "--num-examples", "512", "embedded", "tfds:wmt14_translate/de-en"),
    ("translation", "--max-source-words", "8", "embedded:translation", "tfds:wmt14_translate/de-en"),
    ("translation", "--subword-vocab-size", "4000", "tfds:wmt14_translate/de-en", "embedded"),
    ("translation", "--subword-model", "bpe", "tfds:wmt14_translate/de-en", "embedded"),
    ("translation", "--max-tokens", "32", "tfds:wmt14_translate/de-en", "embedded"),
    ("translation", "--max-train-pairs", "1000", "tfds:wmt14_translate/de-en", "embedded"),
]


@pytest.mark.parametrize("recipe, flag, value, reads, ignores", DATASET_SPECIFIC_OPTIONS)
def test_an_option_the_dataset_does_not_read_is_refused_not_dropped(recipe, flag, value, reads,
                                                                     ignores):
    import importlib

    from tfdist.recipes.preflight import check_options_for_the_dataset

    options = importlib.import_module(f"tfdist.recipes.{recipe}").RECIPE.all_options()
    check_options_for_the_dataset(options, parse_config(["--dataset", reads, flag, value], options,
                                                        prog="test"))
    check_options_for_the_dataset(options, parse_config(["--dataset", ignores], options, prog="test"))
    with pytest.raises(ConfigError) as refused:
        check_options_for_the_dataset(options, parse_config(["--dataset", ignores, flag, value],
                                                            options, prog="test"))
    assert str(refused.value).startswith(f"{flag} {value} has no effect on --dataset {ignores}: only ")
    assert str(refused.value).endswith("Drop the flag, or give such a --dataset.")


def test_a_config_file_key_the_dataset_does_not_read_names_the_file(tmp_path):
    from tfdist.recipes.preflight import check_before_tensorflow
    from tfdist.recipes.transformer import RECIPE

    path = tmp_path / "mine.yaml"
    path.write_text("dataset: embedded:reverse\nsequence_length: 64\n")
    config = parse_config(["--config", str(path)], RECIPE.all_options(), prog="test")
    assert config.explicit == {"dataset", "sequence_length"} and config.from_flags == set()
    with pytest.raises(ConfigError, match=rf"^sequence_length: 64 \(in {path}\) has no effect on "
                                          rf"--dataset embedded:reverse: only tfds, tfrecord and "
                                          rf"text data read it. Remove sequence_length from {path}"):
        check_before_tensorflow(RECIPE, config)
    # --dataset given as a flag (a config written for other data): the run goes on, and its
    # start block names what it does not read.
    config = parse_config(["--config", str(path), "--dataset", "embedded:sort"],
                          RECIPE.all_options(), prog="test")
    check_before_tensorflow(RECIPE, config)
    assert config.unread_config_options == [("sequence_length", 64)]
    with pytest.raises(ConfigError, match="^--sequence-length 32 has no effect"):
        check_before_tensorflow(RECIPE, parse_config(["--config", str(path), "--dataset", "embedded:sort",
                                                      "--sequence-length", "32"],
                                                     RECIPE.all_options(), prog="test"))


def test_download_is_kept_when_either_dataset_is_tfds():
    from tfdist.recipes.preflight import check_before_tensorflow
    from tfdist.recipes.translation import RECIPE

    for argv in (["--dataset", "tfds:wmt14_translate/de-en"],
                 ["--dataset", "text:a.de,a.en", "--validation-dataset", "tfds:wmt14_translate/de-en",
                  "--print-config"]):
        check_before_tensorflow(RECIPE, parse_config(argv + ["--download"], RECIPE.all_options(),
                                                     prog="test"))


def test_backup_flags_are_kept_when_the_run_writes_backups():
    from tfdist.recipes.preflight import check_backup_flags
    from tfdist.recipes.transformer import RECIPE

    for where in (["--model-dir", "runs/a"], ["--backup-dir", "backups/a"]):
        check_backup_flags(parse_config(where + ["--backup-every", "5", "--backup-keep", "3"],
                                        RECIPE.all_options(), prog="test"))


@pytest.mark.parametrize("argv, why", [
    (["--autotune", "off", "--autotune-cache", "cache.json"], "--autotune off runs none"),
    (["--autotune", "on", "--precision", "float32", "--xla", "off", "--autotune-budget", "5"],
     "--precision float32 and --xla off leave it nothing to choose, so none runs"),
    # The suite's processes run with TFDIST_AUTOTUNE=off (tests/conftest.py): `--autotune`'s default.
    (["--autotune-budget", "5"], "autotune is off ($TFDIST_AUTOTUNE=off) and runs none"),
])
def test_autotune_flags_for_a_run_without_a_trial_are_refused(argv, why):
    from tfdist.recipes.preflight import check_autotune_flags
    from tfdist.recipes.transformer import RECIPE

    with pytest.raises(ConfigError, match=f"sets the autotune trial, but {re.escape(why)}: drop"):
        check_autotune_flags(parse_config(argv, RECIPE.all_options(), prog="test"))


def test_autotune_flags_are_kept_while_a_choice_is_open():
    from tfdist.recipes.preflight import check_autotune_flags
    from tfdist.recipes.transformer import RECIPE

    for argv in (["--autotune", "on", "--precision", "float32", "--autotune-budget", "5"],
                 ["--autotune", "refresh", "--xla", "off", "--autotune-cache", "cache.json"]):
        check_autotune_flags(parse_config(argv, RECIPE.all_options(), prog="test"))


def test_an_autotune_cache_that_holds_something_else_is_refused_before_tensorflow(tmp_path,
                                                                                  monkeypatch):
    """A mistyped --autotune-cache (a folder, the user's own JSON, a file that is not JSON)
    is named with what it holds: the trial would never replace it, so it would cache nothing.
    $TFDIST_AUTOTUNE_CACHE is checked the same way; a missing file is fine (created)."""
    from tfdist.recipes.preflight import check_autotune_flags
    from tfdist.recipes.transformer import RECIPE

    (tmp_path / "results.json").write_text('{"bleu": 27.3}')
    (tmp_path / "notes.txt").write_text("mine")
    monkeypatch.delenv("TFDIST_AUTOTUNE_CACHE", raising=False)
    for path, holds in ((tmp_path, "it is a folder, not a file"),
                        (tmp_path / "results.json", "it holds JSON that is not a tfdist autotune cache"),
                        (tmp_path / "notes.txt", "it is not JSON")):
        config = parse_config(["--autotune", "on", "--autotune-cache", str(path)],
                              RECIPE.all_options(), prog="test")
        with pytest.raises(ConfigError, match=re.escape(f"--autotune-cache {path}: {holds}")):
            check_autotune_flags(config)
    monkeypatch.setenv("TFDIST_AUTOTUNE_CACHE", str(tmp_path / "results.json"))
    with pytest.raises(ConfigError, match=re.escape(f"$TFDIST_AUTOTUNE_CACHE {tmp_path / 'results.json'}: ")):
        check_autotune_flags(parse_config(["--autotune", "on"], RECIPE.all_options(), prog="test"))
    monkeypatch.setenv("TFDIST_AUTOTUNE_CACHE", str(tmp_path / "new" / "autotune.json"))
    check_autotune_flags(parse_config(["--autotune", "on"], RECIPE.all_options(), prog="test"))
    assert (tmp_path / "results.json").read_text() == '{"bleu": 27.3}'
