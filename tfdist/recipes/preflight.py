"""The checks a recipe makes from its flags alone, before TensorFlow starts.

Each raises `ConfigError` naming the flag and the way out (exit 2).

Example:

    check_before_tensorflow(RECIPE, parse_config(["--warmup-steps", "10"], ...))
"""

import os

from tfdist.autotune.cache import CACHE_ENV, cache_problem
from tfdist.autotune.modes import why_flags_rule_out_a_trial
from tfdist.data.specs import TFRECORD_SCHEMES, dataset_scheme, missing_local_path
from tfdist.precision import cpu_flags
from tfdist.recipes.config import ConfigError
from tfdist.recipes.model_parallel_flags import check_model_parallel_flags
from tfdist.recipes.recipe_optimizer import optimizer_steps
from tfdist.recipes.record import HISTORY_DIR, RECORD_FILE
from tfdist.recipes.tensor_parallel_flags import check_tensor_parallel_flags
from tfdist.runtime.cpu_allocator import pool_limit_problem
from tfdist.runtime.gpu_memory import check_allow_growth_env
from tfdist.schedules.choices import (MIN_STEPS_AFTER_WARMUP, MOMENT_SETTINGS,
                                      SCHEDULES_NEEDING_WARMUP, SCHEDULES_SHAPED_BY_THE_RUN,
                                      moment_setting_fault)


def check_optimizer_moments(config):
    """`--adam-beta1`, `--adam-beta2` and `--adam-epsilon` only for an optimizer
    that has them, betas below 1.

    Raises:
        ConfigError: naming the flag, the optimizer and those that have it.

    Example:

    >>> check_optimizer_moments(parse_config(["--optimizer", "sgd", "--adam-beta2", "0.98"], ...))
    Traceback (most recent call last):
    ConfigError: --adam-beta2 0.98: optimizer 'sgd' has no beta_2; ...
    """
    for flag, setting, value in (("--adam-beta1", "beta_1", config.adam_beta1),
                                 ("--adam-beta2", "beta_2", config.adam_beta2),
                                 ("--adam-epsilon", "epsilon", config.adam_epsilon)):
        fault = moment_setting_fault(config.optimizer, setting, value)
        if fault == "missing":
            owners = " or ".join(MOMENT_SETTINGS[setting])
            raise ConfigError(f"{flag} {value:g}: optimizer {config.optimizer!r} has no "
                              f"{setting}; use --optimizer {owners}, or drop the flag.")
        if fault == "range":
            raise ConfigError(f"{flag} {value:g}: a moment decay must be below 1 (e.g. 0.98).")


def check_before_tensorflow(recipe, config):
    """Checks what can be checked from the flags alone, before TensorFlow starts.

    The strategy, precision and `--gpu-memory` values are checked while
    parsing; here: the all-reduce name for the strategy, `--cluster-resolver`
    against the strategy, `--gpu-memory` against
    `$TF_FORCE_GPU_ALLOW_GROWTH`, a warmup that must end before the run does
    (when the run's length is known without reading data), and the flags
    that need `--model-dir` (or `--backup-dir`), `$TFDIST_CPU_FLAGS`'s
    spelling, and the CPU memory pool's limit (`pool_limit_problem`).

    Raises:
        ConfigError: naming the flag and the way out.

    Example:

    >>> check_before_tensorflow(RECIPE, parse_config(["--warmup-steps", "10"], ...))
    """
    from tfdist.distribute.strategy_names import check_all_reduce_name

    try:
        check_all_reduce_name(config.strategy, config.all_reduce)
    except ValueError as error:
        raise ConfigError(f"--all-reduce: {error}") from None
    check_cluster_resolver(config)
    check_model_parallel_flags(config)
    check_tensor_parallel_flags(recipe, config)
    if recipe.check_config is not None:
        recipe.check_config(config)
    try:
        check_allow_growth_env(config.gpu_memory, explicit="gpu_memory" in config.explicit)
    except ValueError as error:
        raise ConfigError(f"--gpu-memory: {error}") from None
    check_optimizer_moments(config)
    check_options_for_the_dataset(recipe.all_options(), config)
    check_skip_corrupt_records(config)
    check_dataset_paths(config)
    check_output_folders(config)
    check_tensorboard_flags(config)
    check_backup_flags(config)
    check_autotune_flags(config)
    try:
        cpu_flags()  # a misspelt $TFDIST_CPU_FLAGS would make `auto` pick for another CPU
    except ValueError as error:
        raise ConfigError(str(error)) from None
    pool_problem = pool_limit_problem()
    if pool_problem is not None:
        raise ConfigError(pool_problem)
    steps_per_epoch = config.steps_per_epoch
    if steps_per_epoch is None and recipe.train_examples is not None:
        examples = recipe.train_examples(config)
        if examples is not None:
            steps_per_epoch = max(examples // config.global_batch_size, 1)
    if steps_per_epoch is not None:
        settle_run_length(config, steps_per_epoch)


def settle_run_length(config, steps_per_epoch):
    """The checks and the warmup cut that the run's length decides, for
    `steps_per_epoch` batches an epoch: `check_accumulation`,
    `fit_default_warmup`, `check_warmup`. Called before TensorFlow with the
    length the flags give, and again once the data is read.

    Raises:
        ConfigError: from the checks, naming the flag and the way out.

    Example:

    >>> settle_run_length(parse_config(["--epochs", "1"], RECIPE.all_options(), "demo"), 20)
    """
    check_accumulation(config, steps_per_epoch)
    fit_default_warmup(config, steps_per_epoch)
    check_warmup(config, steps_per_epoch)


def check_options_for_the_dataset(options, config):
    """Refuses an option the user set that the run's `--dataset` does not read:
    an `Option` whose `for_datasets` leaves out the dataset's scheme
    (`--sequence-length` for an embedded task, which fixes its own length;
    `--num-examples` for files, which are read whole).

    A value from the `--config` file is refused too, unless `--dataset` came as
    a flag (a shipped config run on other data, say): then the run goes on and
    its start block names the value it does not use
    (`config.unread_config_options`, `(name, value)` pairs).

    Raises:
        ConfigError: naming the option, its value, the dataset, the datasets
            that read it and the way out.

    Example:

    >>> check_options_for_the_dataset(RECIPE.all_options(), parse_config(
    ...     ["--sequence-length", "64"], RECIPE.all_options(), "transformer"))
    Traceback (most recent call last):
    ConfigError: --sequence-length 64 has no effect on --dataset embedded:reverse: ...
    """
    scheme = dataset_scheme(config.dataset)
    from_flags = getattr(config, "from_flags", set())
    config.unread_config_options = []
    for option in options:
        if (option.for_datasets is None or scheme in option.for_datasets
                or option.name not in getattr(config, "explicit", ())):
            continue
        value = getattr(config, option.name)
        if option.name not in from_flags and "dataset" in from_flags:
            config.unread_config_options.append((option.name, value))
            continue
        if option.name in from_flags:
            setting, way_out = f"{option.flag} {value}", "Drop the flag"
        else:
            setting = f"{option.name}: {value} (in {config.config_file})"
            way_out = f"Remove {option.name} from {config.config_file}"
        raise ConfigError(f"{setting} has no effect on --dataset {config.dataset}: only "
                          f"{readers(option)} data read it. {way_out}, or give such a --dataset.")


def readers(option):
    """The dataset schemes that read `option`, as words: "tfds, tfrecord and text".

    Example:

    >>> readers(Option("n", int, 1, "n", for_datasets=("shapes",)))
    'shapes'
    """
    *most, last = option.for_datasets
    return f"{', '.join(most)} and {last}" if most else last


def check_tensorboard_flags(config):
    """Refuses `--profile-steps`, and a `--log-every` given, for a run without
    `--model-dir`: both write into MODEL_DIR/tensorboard.

    Raises:
        ConfigError: naming the flag and `--model-dir`.

    Example:

    >>> check_tensorboard_flags(parse_config(["--log-every", "10"], RECIPE.all_options(), "cnn"))
    Traceback (most recent call last):
    ConfigError: --log-every 10 writes into MODEL_DIR/tensorboard: add --model-dir DIR.
    """
    if config.model_dir:
        return
    given = [("--profile-steps", config.profile_steps)]
    if "log_every" in getattr(config, "explicit", ()):
        given.append(("--log-every", config.log_every))
    for flag, value in given:
        if value is not None:
            raise ConfigError(f"{flag} {value} writes into MODEL_DIR/tensorboard: add --model-dir DIR.")


def check_backup_flags(config):
    """Refuses `--backup-every` / `--backup-keep` set for a run that writes no backup
    (neither `--model-dir` nor `--backup-dir`).

    Raises:
        ConfigError: naming the flag and the two ways to get backups.

    Example:

    >>> check_backup_flags(parse_config(["--backup-every", "50"], RECIPE.all_options(), "cnn"))
    Traceback (most recent call last):
    ConfigError: --backup-every 50 shapes the run's backups, but it writes none: ...
    """
    if config.model_dir or config.backup_dir:
        return
    for name in ("backup_every", "backup_keep"):
        if name in getattr(config, "explicit", ()):
            flag = "--" + name.replace("_", "-")
            raise ConfigError(f"{flag} {getattr(config, name)} shapes the run's backups, but it "
                              "writes none: add --model-dir DIR (backups in DIR/backup) or "
                              "--backup-dir DIR, or drop the flag.")


def check_autotune_flags(config):
    """Refuses `--autotune-budget` / `--autotune-cache` set for a run that runs no
    autotune trial: autotune off (`--autotune off`, or `$TFDIST_AUTOTUNE=off`), or
    both `--precision` and `--xla` given, which leaves it nothing to choose.

    Raises:
        ConfigError: naming the flag, why no trial runs and the way out.

    Example:

    >>> check_autotune_flags(parse_config(["--autotune", "off", "--autotune-budget", "5"],
    ...                                   RECIPE.all_options(), "cnn"))
    Traceback (most recent call last):
    ConfigError: --autotune-budget 5.0 sets the autotune trial, but --autotune off runs none: ...
    """
    explicit = getattr(config, "explicit", ())
    ruled_out = why_flags_rule_out_a_trial(config.autotune, config.precision, config.xla)
    if ruled_out is None:
        check_autotune_cache(config)
        return
    if ruled_out == "off":
        why = ("--autotune off runs none" if "autotune" in explicit
               else "autotune is off ($TFDIST_AUTOTUNE=off) and runs none")
    else:
        why = (f"--precision {config.precision} and --xla {config.xla} leave it nothing to choose, "
               "so none runs")
    for name in ("autotune_budget", "autotune_cache"):
        if name in explicit:
            flag = "--" + name.replace("_", "-")
            raise ConfigError(f"{flag} {getattr(config, name)} sets the autotune trial, but {why}: "
                              "drop the flag, or let autotune choose (--autotune on with "
                              "--precision auto or --xla auto).")


def check_autotune_cache(config, environ=None):
    """Refuses an autotune cache the user named (`--autotune-cache`, else
    `$TFDIST_AUTOTUNE_CACHE`) that holds something other than a cache: a folder, a
    file that is not JSON or JSON that is not a decision cache, which the trial
    would otherwise leave uncached (it never replaces such a file).

    Raises:
        ConfigError: naming the flag or variable, the path, what it holds and the way out.

    Example:

    >>> check_autotune_cache(argparse.Namespace(autotune_cache="/tmp"))
    Traceback (most recent call last):
    ConfigError: --autotune-cache /tmp: it is a folder, not a file; ...
    """
    environ = os.environ if environ is None else environ
    if getattr(config, "autotune_cache", None):
        source, path = "--autotune-cache", config.autotune_cache
    elif environ.get(CACHE_ENV):
        source, path = f"${CACHE_ENV}", environ[CACHE_ENV]
    else:
        return
    problem = cache_problem(path)
    if problem:
        raise ConfigError(f"{source} {path}: {problem}; name a file for the autotune decisions "
                          "(it is created if missing), or move this one away.")


def check_dataset_paths(config):
    """Refuses a `--dataset` or `--validation-dataset` naming a local file or folder that does
    not exist (see `tfdist.data.specs.missing_local_path`). Not under `--print-config`, which
    reads no data: a config shipped for a cluster prints anywhere.

    Raises:
        ConfigError: naming the flag, the path and the way out.

    Example:

    >>> check_dataset_paths(argparse.Namespace(dataset="text:/no/such/file.txt"))
    Traceback (most recent call last):
    ConfigError: --dataset text:/no/such/file.txt: /no/such/file.txt does not exist ...
    """
    if getattr(config, "print_config", False):
        return
    for flag, spec in (("--dataset", config.dataset),
                       ("--validation-dataset", getattr(config, "validation_dataset", None))):
        missing = missing_local_path(spec) if spec else None
        if missing:
            raise ConfigError(f"{flag} {spec}: {missing} does not exist on this machine. Check "
                              "the path (relative paths start in the current folder).")


def check_cluster_resolver(config):
    """Refuses `--cluster-resolver slurm` with a strategy that never reads a cluster.

    Only `auto` and `multi_worker_mirrored` find their cluster through the
    resolver; one_device, mirrored and default train on this machine alone.

    Raises:
        ConfigError: naming the strategy and the way out.

    Example:

    >>> check_cluster_resolver(argparse.Namespace(cluster_resolver="slurm", strategy="mirrored"))
    Traceback (most recent call last):
    ConfigError: --cluster-resolver slurm finds the workers of a multi-worker run ...
    """
    if config.cluster_resolver == "tf_config" or config.strategy in ("auto", "multi_worker_mirrored"):
        return
    if config.strategy == "parameter_server":
        raise ConfigError(
            f"--cluster-resolver {config.cluster_resolver}: --strategy parameter_server reads "
            "its chief, worker and ps tasks from TF_CONFIG only. Set TF_CONFIG on every task "
            "(Kubeflow's TFJob does; `python -m tfdist.launch --workers N --ps M` on one machine).")
    raise ConfigError(
        f"--cluster-resolver {config.cluster_resolver} finds the workers of a multi-worker run, "
        f"but --strategy {config.strategy} trains on this machine alone and would ignore it. Use "
        "--strategy multi_worker_mirrored (or auto), or drop --cluster-resolver.")


MODEL_DIR_FOLDERS = ("backup", "checkpoints", "tensorboard", HISTORY_DIR, "errors")
"""The folders a run keeps in its --model-dir (`backup` unless --backup-dir names
another place; `checkpoints` and `tensorboard` from `tfdist.callbacks.make_logging_callbacks`;
`runs` from the record; `errors` from `tfdist.recipes.run_report.save_full_error`)."""
MODEL_DIR_FILES = (RECORD_FILE, "training_log.csv")
"""The files a run writes in its --model-dir."""


def check_output_folders(config):
    """Refuses a --model-dir or --backup-dir that names something other than a folder,
    and a --model-dir where a file stands in place of a folder the run keeps there
    (`MODEL_DIR_FOLDERS`) or a folder in place of one of its files (`MODEL_DIR_FILES`).

    Raises:
        ConfigError: naming the flag, the path and the way out.

    Example:

    >>> check_output_folders(argparse.Namespace(model_dir="notes.txt", backup_dir=None))
    Traceback (most recent call last):
    ConfigError: --model-dir notes.txt is a file, not a folder ...
    """
    for flag, path in (("--model-dir", config.model_dir),
                       ("--backup-dir", getattr(config, "backup_dir", None))):
        if path and os.path.lexists(path) and not os.path.isdir(path):
            raise ConfigError(f"{flag} {path} is a file, not a folder: name a folder (it is "
                              "created if missing), e.g. the file's name without its extension.")
        parent = os.path.dirname(os.path.abspath(path)) if path else None
        while parent and not os.path.lexists(parent):
            parent = os.path.dirname(parent)
        if parent and not os.path.isdir(parent):
            raise ConfigError(f"{flag} {path}: {parent} is a file, not a folder; name a folder "
                              "whose parents are folders.")
    if config.model_dir and os.path.isdir(config.model_dir):
        own_backup = not getattr(config, "backup_dir", None)
        check_model_dir_entries(
            config.model_dir, [name for name in MODEL_DIR_FOLDERS if name != "backup" or own_backup],
            MODEL_DIR_FILES)


def check_model_dir_entries(model_dir, folders, files):
    """Refuses a file where the run keeps one of `folders` in `model_dir`, or a folder
    where it writes one of `files` (found before TensorFlow starts, not when the run
    first writes there). A recipe checks its own entries with it too.

    Raises:
        ConfigError: naming the model dir, the entry and the way out.

    Example:

    >>> check_model_dir_entries("runs/a", folders=["tokenizer"], files=["translation.json"])
    """
    for name in folders:
        path = os.path.join(model_dir, name)
        if os.path.lexists(path) and not os.path.isdir(path):
            raise ConfigError(f"--model-dir {model_dir}: {path} is a file, but the run keeps a "
                              f"folder of that name there ({name}/); move the file away or name "
                              "another --model-dir.")
    for name in files:
        path = os.path.join(model_dir, name)
        if os.path.isdir(path):
            raise ConfigError(f"--model-dir {model_dir}: {path} is a folder, but the run writes "
                              "a file of that name there; move the folder away or name another "
                              "--model-dir.")


def check_skip_corrupt_records(config):
    """Refuses --skip-corrupt-records when no dataset of the run is read from TFRecords.

    Raises:
        ConfigError: naming the datasets and the schemes the flag applies to.

    Example:

    >>> check_skip_corrupt_records(argparse.Namespace(skip_corrupt_records=True,
    ...                                               dataset="embedded"))
    Traceback (most recent call last):
    ConfigError: --skip-corrupt-records applies to TFRecord data ...
    """
    if not getattr(config, "skip_corrupt_records", False):
        return
    specs = [spec for spec in (config.dataset, getattr(config, "validation_dataset", None)) if spec]
    if any(dataset_scheme(spec) in TFRECORD_SCHEMES for spec in specs):
        return
    raise ConfigError(
        f"--skip-corrupt-records applies to TFRecord data ({', '.join(s + ':GLOB' for s in TFRECORD_SCHEMES)}),"
        f" but this run reads only {' and '.join(map(repr, specs)) or 'no dataset'}: there are no "
        "records to skip. Drop the flag.")


def check_accumulation(config, steps_per_epoch):
    """Refuses a `--grad-accum-steps K` run whose batches (epochs x steps per
    epoch) are not a multiple of K: its last batches would be trained, their
    gradients summed, and never applied.

    Raises:
        ConfigError: naming the flag, the run's batches and steps per epoch
            that fit.

    Example:

    >>> check_accumulation(argparse.Namespace(grad_accum_steps=4, epochs=1), 6)
    Traceback (most recent call last):
    ConfigError: --grad-accum-steps 4: the run's 6 batches (1 epoch(s) x 6) are not ...
    """
    every = config.grad_accum_steps
    batches = config.epochs * steps_per_epoch
    if every <= 1 or batches % every == 0:
        return
    fits = sorted({multiple for multiple in (steps_per_epoch // every * every,
                                              -(-steps_per_epoch // every) * every) if multiple})
    raise ConfigError(
        f"--grad-accum-steps {every}: the run's {batches} batches ({config.epochs} epoch(s) x "
        f"{steps_per_epoch}) are not a multiple of it, so the last {batches % every} would be "
        "trained and never applied. Use --steps-per-epoch "
        + " or ".join(map(str, fits)) + f" (a multiple of {every}).")


def fit_default_warmup(config, steps_per_epoch):
    """Cuts the recipe's default warmup to a tenth of a run it would not end
    before (and to what a schedule shaped by the run needs after it; at
    least 1 step for a schedule that peaks at the warmup's end,
    `inverse_sqrt`), and says so in `config.warmup_cut` (`warmup_reason`).
    A warmup the user set (flag or `--config` file) is left as it is, for
    `check_warmup` to refuse. Called again with a shorter run, it cuts the
    default again.

    Example:

    >>> config = argparse.Namespace(warmup_steps=30, epochs=1, grad_accum_steps=1,
    ...                             schedule="cosine", explicit=set())
    >>> fit_default_warmup(config, 20)
    >>> config.warmup_steps, warmup_reason(config)
    (2, "the recipe's default 30, cut to fit this 20-step run")
    """
    if "warmup_steps" in getattr(config, "explicit", ()):
        return
    cut = getattr(config, "warmup_cut", None)
    default = cut[0] if cut else config.warmup_steps
    if not default:
        return
    total = optimizer_steps(config, steps_per_epoch)
    longest = total - 1
    if getattr(config, "schedule", None) in SCHEDULES_SHAPED_BY_THE_RUN:
        longest = total - MIN_STEPS_AFTER_WARMUP
    if default <= longest:
        return
    config.warmup_steps = max(min(total // 10, longest), _least_warmup(config))
    config.warmup_cut = (default, total)


def _least_warmup(config):
    """1 for a schedule that peaks at the end of its warmup, else 0."""
    return 1 if getattr(config, "schedule", None) in SCHEDULES_NEEDING_WARMUP else 0


def warmup_reason(config):
    """Why the warmup is not the recipe's default (`fit_default_warmup`), or None.

    Example:

    >>> warmup_reason(argparse.Namespace(warmup_steps=2, warmup_cut=(30, 20)))
    "the recipe's default 30, cut to fit this 20-step run"
    """
    cut = getattr(config, "warmup_cut", None)
    if cut is None:
        return None
    default, total = cut
    return f"the recipe's default {default}, cut to fit this {total}-step run"


def describe_warmup(config):
    """The warmup as the run's header says it (with `warmup_reason`).

    Example:

    >>> describe_warmup(argparse.Namespace(warmup_steps=2, warmup_cut=(30, 20)))
    "2 warmup steps (the recipe's default 30, cut to fit this 20-step run)"
    """
    reason = warmup_reason(config)
    steps = "step" if config.warmup_steps == 1 else "steps"
    return f"{config.warmup_steps} warmup {steps}" + (f" ({reason})" if reason else "")


def _shorter_warmup(total, least=0):
    """The warmup `check_warmup` suggests for a run of `total` optimizer steps
    (at least `least` steps)."""
    if total // 10 <= least:
        return f"--warmup-steps {least}" + (" (no warmup)" if least == 0 else "")
    return f"--warmup-steps {total // 10} (a tenth of the run) or fewer"


def check_warmup(config, steps_per_epoch):
    """Refuses a warmup that does not end before the last optimizer step, or
    leaves too few steps for a schedule shaped by the run (`step`,
    `cosine_restarts`: `MIN_STEPS_AFTER_WARMUP`).

    Raises:
        ConfigError: naming the warmup, the run's optimizer steps and the way out.

    Example:

    >>> check_warmup(argparse.Namespace(warmup_steps=30, epochs=1, grad_accum_steps=1), 10)
    Traceback (most recent call last):
    ConfigError: --warmup-steps 30 is not shorter than the run ...
    """
    total = optimizer_steps(config, steps_per_epoch)
    schedule = getattr(config, "schedule", None)
    run = (f"{total} optimizer step(s) ({config.epochs} epoch(s) x {steps_per_epoch} steps"
           + (f" / {config.grad_accum_steps} micro-batches" if config.grad_accum_steps > 1 else "")
           + ")")
    least = _least_warmup(config)
    if least and total <= least:
        raise ConfigError(
            f"--schedule {schedule} rises through its warmup (at least {least} step) and "
            f"then decays, so it needs a run of at least {least + 1} optimizer steps, but the "
            f"run has {run}: use a longer run (--epochs, --steps-per-epoch), or another "
            "--schedule.")
    if config.warmup_steps < least:
        raise ConfigError(
            f"--schedule {schedule} peaks at the end of its warmup, so it needs --warmup-steps "
            f"{least} or more, got {config.warmup_steps}: use --warmup-steps "
            f"{max(total // 10, least)}, or another --schedule.")
    if config.warmup_steps and config.warmup_steps >= total:
        raise ConfigError(
            f"--warmup-steps {config.warmup_steps} is not shorter than the run, which has "
            f"{run}. Use {_shorter_warmup(total, least)}, or a longer run (--epochs, "
            "--steps-per-epoch).")
    if schedule in SCHEDULES_SHAPED_BY_THE_RUN and total - config.warmup_steps < MIN_STEPS_AFTER_WARMUP:
        fewer = total - MIN_STEPS_AFTER_WARMUP
        way_out = (f"use --warmup-steps {fewer} or fewer, or a longer run" if fewer >= 0
                   else "use a longer run")
        raise ConfigError(
            f"--schedule {schedule} needs at least {MIN_STEPS_AFTER_WARMUP} optimizer steps after "
            f"the warmup (--warmup-steps {config.warmup_steps}), but the run has {total} in all: "
            f"{way_out} (--epochs, --steps-per-epoch), or another --schedule.")
