"""The run loop every recipe shares.

Data flows one way: config -> strategy -> precision -> datasets (per input
pipeline) -> model, loss and optimizer built in the strategy scope -> the
training engine -> callbacks -> report. A recipe only says what differs: its
own options, how to build its data and its model (`Recipe`).

Example:

    RECIPE = Recipe(name="transformer", description="...", options=[...],
                    defaults={"global_batch_size": 64}, build_data=..., build_model=...)

    def main(argv=None):
        return run_recipe(RECIPE, argv)
"""

import dataclasses
import logging
import math
import os
import sys
from typing import Callable

from tfdist.recipes.config import COMMON_OPTIONS, ConfigError, parse_config
from tfdist.xla import resolve_xla

logger = logging.getLogger("tfdist")


@dataclasses.dataclass(frozen=True)
class RecipeData:
    """What a recipe's data builder returns.

    Attributes:
        train: the training `Source` (see `tfdist.data`).
        validation: the validation `Source`, or None.
        description: one line for the start-up block.
        tokens_per_example: tokens in one example, for tokens/s (None for
            data without a token axis).
        chance: a dict of metric name to its chance-level value, printed
            beside the final figures so a reader sees what was learned.
        info: anything the model builder needs (vocabulary size, classes...).
    """

    train: object
    validation: object
    description: str
    tokens_per_example: int = None
    chance: dict = dataclasses.field(default_factory=dict)
    info: dict = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class RecipeModel:
    """What a recipe's model builder returns (called inside the strategy scope).

    Attributes:
        model: a `keras.Model`.
        loss: a Keras loss.
        metrics: a list of Keras metrics.
        description: one line for the start-up block.
        flops_per_example: model training FLOPs per example, for MFU.
        prepare_optimizer: called with the optimizer once it is built (still
            in the strategy scope), e.g. to exclude variables from weight
            decay; None for nothing.
        xla_blocker: why the replica step of this model cannot be compiled
            with XLA (e.g. a cross-replica collective inside the model), or
            None when it can.
    """

    model: object
    loss: object
    metrics: list
    description: str
    flops_per_example: float = None
    prepare_optimizer: Callable = None
    xla_blocker: str = None


@dataclasses.dataclass(frozen=True)
class Recipe:
    """A runnable recipe: its options and how to build its data and model.

    Args:
        name: the module name under `tfdist.recipes`.
        description: the `--help` description.
        options: the recipe's own `Option`s, added to `COMMON_OPTIONS`.
        defaults: new defaults for common options (e.g. the batch size).
        build_data: `config -> RecipeData`.
        build_model: `(config, RecipeData) -> RecipeModel`, called inside
            the strategy scope.
        epilog: text after the flags in `--help`.
    """

    name: str
    description: str
    options: list
    defaults: dict
    build_data: Callable
    build_model: Callable
    epilog: str = None

    def main(self, argv=None):
        """Runs the recipe; returns the exit code (0 on success, 2 on bad input)."""
        return run_recipe(self, argv)

    def all_options(self):
        """The common options with this recipe's defaults, then its own."""
        unknown = set(self.defaults) - {option.name for option in COMMON_OPTIONS}
        if unknown:
            raise ValueError(f"Recipe {self.name!r} sets defaults for unknown options: {sorted(unknown)}.")
        common = [dataclasses.replace(option, default=self.defaults[option.name])
                  if option.name in self.defaults else option for option in COMMON_OPTIONS]
        return common + list(self.options)


def _configure_logging(verbose):
    """tfdist's own messages at INFO on stderr (the data pipeline's per-shard
    lines only with --verbose 2); other libraries' loggers are left alone."""
    if not logger.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(message)s"))
        logger.addHandler(handler)
    logger.setLevel(logging.INFO if verbose else logging.WARNING)
    logger.propagate = False
    logging.getLogger("tfdist.data").setLevel(logging.INFO if verbose >= 2 else logging.WARNING)


def _respect_xla_blocker(mode, jit_compile, reason, blocker):
    """Turns `auto` XLA off, with the reason, for a model that cannot be
    compiled; `--xla on` for such a model is an error, never a silent change."""
    if blocker is None or not jit_compile:
        return jit_compile, reason
    if mode == "on":
        raise ValueError(f"--xla on is not possible for this model: {blocker}. Use --xla off or auto.")
    return False, f"auto: {blocker}"


def _exit_error(prefix, error):
    print(f"{prefix}: error: {error}", file=sys.stderr)
    return 2


def run_recipe(recipe, argv=None):
    """Parses flags, builds everything and trains. Returns the exit code.

    Bad flags, configs, strategy names or TF_CONFIG give a one-line error
    naming the problem and exit code 2.
    """
    prog = f"python -m tfdist.recipes.{recipe.name}"
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        config = parse_config(argv, recipe.all_options(), prog=prog,
                              description=recipe.description, epilog=recipe.epilog)
    except ConfigError as error:
        return _exit_error(prog, error)
    if config.verbose is None:
        # Keras's progress bar smears into one long line when stdout is a pipe
        # (CI logs, the launcher), so default to a line per epoch there.
        config.verbose = 1 if sys.stdout.isatty() else 2
    _configure_logging(config.verbose)
    try:
        return _train(recipe, config)
    except (ValueError, RuntimeError, FileNotFoundError) as error:
        # ValueError/RuntimeError from tfdist carry teaching messages; name
        # them on one line rather than burying them in a traceback.
        if os.environ.get("TFDIST_TRACEBACK"):
            raise
        return _exit_error(prog, f"{type(error).__name__}: {error}")


def _train(recipe, config):
    # Import TensorFlow only after the flags are known to be good, and split
    # logical devices before TF initialises (create_strategy does that).
    import keras
    import tensorflow as tf

    from tfdist.callbacks import (BackupAndResume, NanGuard, ThroughputMeter, latest_backup,
                                  make_logging_callbacks)
    from tfdist.data import distribute_dataset
    from tfdist.devices import gpu_count
    from tfdist.optimizers import build_optimizer
    from tfdist.precision import apply_precision
    from tfdist.strategy import create_strategy, describe_strategy
    from tfdist.training import Trainer

    strategy = create_strategy(config.strategy, devices=config.devices, all_reduce=config.all_reduce)
    info = describe_strategy(strategy)
    precision = apply_precision(config.precision)
    jit_compile, xla_reason = resolve_xla(config.xla, precision.policy, on_gpu=gpu_count() > 0)
    keras.utils.set_random_seed(config.seed)
    if config.deterministic:
        tf.config.experimental.enable_op_determinism()

    data = recipe.build_data(config)
    if config.global_batch_size % info.num_replicas:
        raise ValueError(
            f"--global-batch-size {config.global_batch_size} does not divide evenly over "
            f"{info.num_replicas} replicas; use a multiple of {info.num_replicas}.")
    steps_per_epoch = config.steps_per_epoch or _steps_in(data.train, config.global_batch_size)
    optimizer_steps = math.ceil(steps_per_epoch * config.epochs / config.grad_accum_steps)
    pipeline = dict(seed=config.seed, deterministic=config.deterministic)
    train = distribute_dataset(strategy, data.train, config.global_batch_size, training=True,
                               **pipeline)
    validation = None
    if data.validation is not None:
        validation = distribute_dataset(strategy, data.validation, config.global_batch_size,
                                        training=False, **pipeline)

    with strategy.scope():
        built = recipe.build_model(config, data)
        jit_compile, xla_reason = _respect_xla_blocker(config.xla, jit_compile, xla_reason,
                                                       built.xla_blocker)
        optimizer = build_optimizer(
            config.optimizer, config.learning_rate, schedule=config.schedule,
            warmup_steps=config.warmup_steps, total_steps=optimizer_steps,
            weight_decay=config.weight_decay)
        if built.prepare_optimizer is not None:
            built.prepare_optimizer(optimizer)
        trainer = Trainer(built.model, optimizer, built.loss, built.metrics, strategy=strategy,
                          jit_compile=jit_compile, grad_accum_steps=config.grad_accum_steps,
                          clip_norm=config.clip_norm, steps_per_execution=config.steps_per_execution)

    say = print if info.is_chief else (lambda *args, **kwargs: None)
    say(_start_block(config, info, precision, jit_compile, xla_reason, data, built,
                     steps_per_epoch))
    meter = ThroughputMeter(
        global_batch_size=config.global_batch_size, num_replicas=info.num_replicas,
        tokens_per_example=data.tokens_per_example, flops_per_example=built.flops_per_example,
        steps_per_execution=config.steps_per_execution, print_fn=say)
    # Producers first (the loggers after them see their values); NanGuard
    # before the backup, so that a NaN step is never backed up.
    callbacks = [meter, NanGuard()]
    backup_dir = config.backup_dir or (
        os.path.join(config.model_dir, "backup") if config.model_dir else None)
    resuming = False
    if backup_dir:
        resuming = latest_backup(backup_dir) is not None
        callbacks.append(BackupAndResume(backup_dir, save_freq=config.backup_every or "epoch",
                                         max_to_keep=config.backup_keep, strategy=strategy))
    if config.model_dir:
        # CSV, TensorBoard and per-epoch weights, written by the chief only.
        callbacks += make_logging_callbacks(config.model_dir, checkpoint=True, strategy=strategy,
                                            append=resuming)
    history = trainer.fit(train, epochs=config.epochs, steps_per_epoch=steps_per_epoch,
                          validation_data=validation, validation_steps=config.validation_steps,
                          callbacks=callbacks, verbose=config.verbose if info.is_chief else 0)
    say(_final_block(history, data))
    return 0


def _steps_in(source, global_batch_size):
    size = getattr(source, "num_examples", None)
    if not size:
        raise ValueError(
            "The dataset does not know its size, so one epoch has no length: pass --steps-per-epoch.")
    steps = size // global_batch_size
    if steps < 1:
        raise ValueError(
            f"The dataset has {size} examples, fewer than one global batch of "
            f"{global_batch_size}; lower --global-batch-size.")
    return steps


def _start_block(config, info, precision, jit_compile, xla_reason, data, built, steps_per_epoch):
    per_replica = config.global_batch_size // info.num_replicas
    lines = [
        "tfdist run",
        f"  strategy      {info.name}: {info.num_replicas} replica(s) on {info.num_workers} worker(s)"
        + (f" ({info.note})" if info.note else ""),
        f"  devices       {', '.join(info.devices)}",
        f"  batch         global {config.global_batch_size}, per replica {per_replica}"
        + (f", {config.grad_accum_steps} micro-batches per optimizer step" if config.grad_accum_steps > 1 else ""),
        f"  precision     {precision.policy} ({precision.reason})",
        f"  XLA           {'on' if jit_compile else 'off'} ({xla_reason})",
        f"  dataset       {data.description}",
        f"  model         {built.description}",
        f"  optimizer     {config.optimizer}, lr {config.learning_rate:g}, {config.schedule} schedule, "
        f"{config.warmup_steps} warmup steps" + (f", clip norm {config.clip_norm:g}" if config.clip_norm else ""),
        f"  schedule      {config.epochs} epoch(s) x {steps_per_epoch} steps",
    ]
    if config.config_file:
        lines.append(f"  config        {config.config_file}")
    return "\n".join(lines)


def _final_block(history, data):
    lines = ["Final metrics:"]
    for name, values in history.history.items():
        if not values or name in ("learning_rate",):
            continue
        chance = data.chance.get(name.removeprefix("val_"))
        first = f"{values[0]:.4f} -> " if len(values) > 1 else ""
        suffix = f"  (chance: {chance:.4f})" if chance is not None else ""
        lines.append(f"  {name:<28} {first}{values[-1]:.4f}{suffix}")
    return "\n".join(lines)
