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
import os
import shlex
import socket
import sys
import time
from typing import Callable

from tfdist.runtime import exit_codes
from tfdist.runtime.gpu_memory import gpu_memory_notice, parse_gpu_memory
from tfdist.runtime.quick_exit import skip_exit_garbage_collection
from tfdist.recipes.auto_choices import rule_choices, settle_auto_choices
from tfdist.recipes.config import COMMON_OPTIONS, ConfigError, parse_config, parse_step_range
from tfdist.recipes.model_parallel_flags import prepare_model_parallel_devices, stage_plan_block
from tfdist.recipes.model_parallel_flags import trainer_arguments as model_parallel_arguments
from tfdist.recipes.tensor_parallel_flags import (check_resume_degree, prepare_split_optimizer,
                                                  prepare_tensor_parallel_devices,
                                                  tensor_parallel_block)
from tfdist.recipes.tensor_parallel_flags import trainer_arguments as tensor_parallel_arguments
from tfdist.recipes.preflight import check_before_tensorflow, settle_run_length, warmup_reason
from tfdist.recipes.recipe_optimizer import build_recipe_optimizer, optimizer_steps
from tfdist.recipes.record import (RunHistory, changed_keys, config_values, describe_changes,
                                   read_record, render_record, settle_record, write_record,
                                   writer_of_backup)
from tfdist.recipes.run_report import (backup_name, environment_errno,
                                   environment_line, final_block, finished_anyway_line,
                                   gpu_memory_line, interrupted_line, missing_outputs_line,
                                   newest_backup, out_of_memory_line, outputs_block, preempted_line,
                                   save_full_error, skipped_line, start_block, error_summary)
from tfdist.runtime.stop_signals import PREEMPTED_EXIT_CODE, Preempted
from tfdist.xla import respect_xla_blocker

# Kept as names for callers; the table with every code and its meaning is tfdist.runtime.exit_codes.
INTERRUPTED_EXIT_CODE = exit_codes.INTERRUPTED
CLUSTER_LOST_EXIT_CODE = exit_codes.CLUSTER_LOST
"""Exit code when the cluster did not form in time or a peer was lost during
training. Cluster managers retry codes >= 128 (Kubeflow's ExitCode policy,
a SLURM requeue); the relaunched job resumes from its last backup."""

# TensorFlow's errors when a collective or the coordination service loses a
# peer (connection refused or reset, heartbeat timeout, aborted collective).
_CLUSTER_ERRORS = ("UnavailableError", "DeadlineExceededError", "AbortedError",
                   "CancelledError")
# Strategies that train on this machine alone: a TF_CONFIG does not make them a cluster.
_SINGLE_MACHINE = ("one_device", "mirrored", "default")
logger = logging.getLogger("tfdist")

PEER_EXIT_WAIT = 20.0
"""Seconds a multi-worker run waits at exit for the other workers (below the
30 s a cluster manager or the launcher gives between SIGTERM and SIGKILL)."""


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
        xla_blocker: `config -> str or None`: why the model this config
            builds cannot be XLA-compiled (known before it is built, for
            `--print-config`); None when every model can be.
        xla_slower_on_cpu: `config -> str or None`: why `--xla auto` leaves
            the step of the model this config builds uncompiled on CPUs,
            where XLA would slow it down (`--xla on` still compiles it);
            None when the general rules apply.
        train_examples: `config -> int or None`: the number of training
            examples when it is known without reading data (an embedded
            dataset), so that a warmup longer than the run is refused before
            TensorFlow starts.
        epilog: text after the flags in `--help`.
        check_config: `config -> None`, raising `ConfigError` for flags
            this recipe cannot honour (checked before TensorFlow starts,
            also for `--print-config`); None for none.
        callbacks: `(config, data, built, info) -> list` of the recipe's own
            Keras callbacks (`info`: the `describe_strategy` of the run),
            placed after the NaN and divergence guards and before the
            backups and loggers, so that what they add to an epoch's logs
            is written to the CSV, TensorBoard, the results block and the
            run record; None for none.
        layout_map: `(config, device_mesh, model) -> keras.distribution.LayoutMap`:
            how `--tensor-parallel K` splits the recipe's model; None when the
            recipe has no layout (then `--tensor-parallel` > 1 is refused).

    Example:

    >>> RECIPE = Recipe(name="transformer", description="...", options=[], defaults={},
    ...                 build_data=build_data, build_model=build_model)
    >>> RECIPE.main(["--epochs", "1"])  # doctest: +SKIP
    0
    """

    name: str
    description: str
    options: list
    defaults: dict
    build_data: Callable
    build_model: Callable
    xla_blocker: Callable = None
    xla_slower_on_cpu: Callable = None
    train_examples: Callable = None
    epilog: str = None
    check_config: Callable = None
    callbacks: Callable = None
    layout_map: Callable = None

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
    lines only with --verbose 3); other libraries' loggers are left alone."""
    if not logger.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(message)s"))
        logger.addHandler(handler)
    logger.setLevel(logging.INFO if verbose else logging.WARNING)
    logger.propagate = False
    logging.getLogger("tfdist.data").setLevel(logging.INFO if verbose >= 3 else logging.WARNING)
    # Said in the outputs block at the end instead of in the middle of the bar.
    logging.getLogger("tfdist.callbacks.profiler").setLevel(logging.WARNING)


def _exit_error(prefix, error):
    print(f"{prefix}: error: {error}", file=sys.stderr)
    return exit_codes.BAD_INPUT


def run_recipe(recipe, argv=None):
    """Parses flags, builds everything and trains. Returns the exit code.

    Every way a run ends has one code from `tfdist.runtime.exit_codes` and one line:
    bad flags, configs, strategy names or TF_CONFIG, and environment faults
    (a read-only or full disk, a model dir that is a file or used by another
    run) exit 2 (flag and config errors before TensorFlow starts). SIGTERM or
    Ctrl-C (SIGINT) during training: every worker backs up at one step, one
    line says where and which backup a rerun resumes from, exit 143
    (`PREEMPTED_EXIT_CODE`); after the last training step such a signal ends
    the run normally (exit 0); Ctrl-C before training is set up exits 130. A
    lost peer or ps task exits 141. The model dir is locked for the run
    (`tfdist.runtime.run_lock`) and every run leaves an entry in `MODEL_DIR/runs/`.

    Example:

    >>> run_recipe(RECIPE, ["--epochs", "1", "--model-dir", "runs/a"])
    0
    """
    prog = f"python -m tfdist.recipes.{recipe.name}"
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        config = parse_config(argv, recipe.all_options(), prog=prog,
                              description=recipe.description, epilog=recipe.epilog)
        check_before_tensorflow(recipe, config)
    except ConfigError as error:
        return _exit_error(prog, error)
    if config.verbose is None:
        # Keras's progress bar smears into one long line when stdout is a pipe
        # (CI logs, the launcher), so default to a line per epoch there.
        config.verbose = 1 if sys.stdout.isatty() else 2
    _configure_logging(config.verbose)
    where = {"command": f"{prog} {shlex.join(argv)}".strip(), "model_dir": config.model_dir,
             "batch": (config.global_batch_size, config.grad_accum_steps, config.precision)}
    skip_exit_garbage_collection()  # exit right after the last line, not seconds later
    try:
        return _run(recipe, config, prog, where)
    finally:
        _restore_process_state(where)


def _restore_process_state(where):
    """Leaves a program that called `main()` as the run found it: SIGTERM/SIGINT
    were blocked for the run (the program, and the processes it starts later,
    get them back; one that came after the run's last look, while it closed
    its record or waited for its peers, has nothing left to stop), and the
    run set Keras's global dtype policy to its precision."""
    stop_signals = where.pop("stop_signals", None)
    if stop_signals is not None:
        stop_signals.discard_pending()
        stop_signals.close()
    if "policy_before" in where:
        import keras

        keras.mixed_precision.set_global_policy(where.pop("policy_before"))


def _run(recipe, config, prog, where):
    """Trains (or prints the config); turns every way the run ends into its exit code and line."""
    try:
        if config.print_config:
            return _print_config(recipe, config)
        code = _train(recipe, config, where)
        _end_run(where, code, where.get("outcome", "finished"))
        _leave_together(where)
        return code
    except KeyboardInterrupt:
        code, line = exit_codes.INTERRUPTED, interrupted_line()
    except Preempted as stop:
        history = where.get("history")
        if history is not None and stop.backup is not None:
            history.note_backup(stop.backup.path)
        code, line = PREEMPTED_EXIT_CODE, preempted_line(stop, where)
        where["stopped_together"] = True
    except Exception as error:  # noqa: BLE001 - re-raised unless it is one of the known faults
        try:
            code, line = _known_fault(prog, error, where)
        except BaseException:
            _end_run(where, exit_codes.FAILED, f"failed: {type(error).__name__}: "
                                               f"{error_summary(str(error))}")
            raise
    print(line, file=sys.stderr, flush=True)
    _end_run(where, code, line.removeprefix(f"{prog}: "))
    if where.get("stopped_together"):
        _leave_together(where)
    return code


def _leave_together(where):
    """Workers of a multi-worker run that finished or stopped at one agreed step
    exit together: the chief, which hosts TensorFlow's coordination service,
    does not leave while another worker still talks to it (that worker would
    spend ~10 s failing to reach it). Bounded by PEER_EXIT_WAIT seconds."""
    if where.get("collective_workers", 1) > 1:
        from tfdist.seam import wait_for_peers_at_exit

        wait_for_peers_at_exit(timeout_seconds=PEER_EXIT_WAIT)


TRACEBACK_ENV = "TFDIST_TRACEBACK"
"""Set to 1 (or true, yes, on) to see an error the runner explains as Python raised it."""


def tracebacks_asked(environ=None):
    """Whether `$TFDIST_TRACEBACK` asks for the full traceback instead of the one line.

    Unset, empty, 0, false, no and off (any case) keep the one line.

    Example:

    >>> tracebacks_asked({"TFDIST_TRACEBACK": "0"})
    False
    """
    value = (os.environ if environ is None else environ).get(TRACEBACK_ENV, "")
    return value.strip().lower() not in ("", "0", "false", "no", "off")


def _known_fault(prog, error, where):
    """(exit code, one line) for an error the runner explains; re-raises any other."""
    name = type(error).__name__
    if tracebacks_asked():
        raise error
    # By name: tfdist.training.ps_loop and tfdist.distribute.strategy_factory import TensorFlow.
    if name == "ParameterServerLostError":
        return _cluster_lost(prog, error, where, "a parameter-server task was lost")
    if name == "StrategyStartupError":
        return _cluster_lost(prog, error, where, "the cluster did not form")
    if isinstance(error, OSError) and not isinstance(error, FileNotFoundError):
        return exit_codes.BAD_INPUT, environment_line(prog, error, where)
    if isinstance(error, ConfigError):  # a flag refused once the data is known: as before TensorFlow
        return exit_codes.BAD_INPUT, f"{prog}: error: {error}"
    if isinstance(error, (ValueError, RuntimeError, FileNotFoundError)):
        # ValueError/RuntimeError from tfdist carry teaching messages; name
        # them on one line rather than burying them in a traceback.
        return exit_codes.BAD_INPUT, f"{prog}: error: {name}: {error}"
    if "tensorflow" in type(error).__module__:
        fault = environment_errno(error)  # a full disk also comes as ResourceExhaustedError
        if fault is not None:
            return exit_codes.BAD_INPUT, environment_line(prog, error, where, fault)
        if name == "ResourceExhaustedError":  # a tensor did not fit: the batch is the lever
            return exit_codes.BAD_INPUT, out_of_memory_line(prog, error, where)
        if name in _CLUSTER_ERRORS:
            return _cluster_lost(prog, error, where, "a peer was lost")
    raise error


def _end_run(where, code, outcome):
    """Closes the run's history entry and settles config.yaml (the record of the
    run that wrote the newest backup)."""
    history = where.pop("history", None)
    if history is None:
        return
    try:
        history.finish(outcome, code)
    except OSError as error:  # the fault being reported may be this very disk
        logger.warning("Could not complete the run record in %s: %s", where["model_dir"], error)
        return
    _settle_record(where)


def _settle_record(where):
    """Makes config.yaml the record of the run that wrote the newest backup (also
    called by the chief right after a guard deleted this run's suspect backups,
    before any worker exits and gets the job stopped)."""
    try:
        newest = newest_backup(where.get("backup_dir"))
        if newest is not None:
            settle_record(where["model_dir"], newest.path)
    except OSError as error:  # the fault being reported may be this very disk
        logger.warning("Could not complete the run record in %s: %s", where["model_dir"], error)


def _cluster_lost(prog, error, where, what):
    """(the retryable exit code, one line) for a cluster that broke."""
    if tracebacks_asked():
        raise error
    text = str(getattr(error, "message", error))
    summary = error_summary(text)
    full = save_full_error(error, where) if summary != text.strip() else None
    backup = newest_backup(where.get("backup_dir"))
    retry = f"a cluster manager retries exit {CLUSTER_LOST_EXIT_CODE}"
    if backup:
        resume = (f"; run the same command again ({retry}) to resume from the last backup in "
                  f"{where['backup_dir']} ({backup_name(backup)})")
    elif where.get("backup_dir"):
        resume = (f"; run the same command again ({retry}); no backup in "
                  f"{where['backup_dir']} yet, so it starts over")
    else:
        resume = f"; run the same command again to retry ({retry})"
    line = f"{prog}: {what} ({type(error).__name__}: {summary}){resume}."
    if full:
        line += f" Full error: {full}"
    return CLUSTER_LOST_EXIT_CODE, line


def _print_config(recipe, config):
    """`--print-config`: the options and what `auto` resolves to here, as YAML.

    TensorFlow is imported only to count GPUs where some may be present
    (`tfdist.runtime.gpu_presence`): on a machine without any, the preview
    takes a fraction of a second.
    """
    from tfdist.runtime.gpu_presence import gpus_certainly_absent

    gpus = 0 if gpus_certainly_absent() else _gpus_from_tensorflow(config.tf_log_level)
    precision, jit_compile, xla_reason = rule_choices(recipe, config, on_gpu=gpus > 0)
    resolved = {"precision": precision.policy, "precision_reason": precision.reason,
                "xla": jit_compile, "xla_reason": xla_reason,
                "gpu_memory": gpu_memory_line(config, gpus)}
    if config.autotune != "off" and "auto" in (config.precision, config.xla):
        resolved["autotune"] = (f"{config.autotune}: at start-up a trial on the model (or its "
                                "cached decision) may replace the rules' precision and XLA above")
    if config.strategy == "auto":
        resolved["strategy"] = "auto: decided at start-up from TF_CONFIG and the devices"
    if reason := warmup_reason(config):
        resolved["warmup_steps"] = reason
    print(render_record(config_values(config, recipe.all_options()), resolved, config.config_file),
          end="")
    return exit_codes.FINISHED


def _gpus_from_tensorflow(tf_log_level):
    """The GPUs TensorFlow sees, imported quietly at `tf_log_level`."""
    from tfdist.runtime.tf_logging import import_tensorflow

    import_tensorflow(tf_log_level)
    from tfdist.distribute.devices import gpu_count

    return gpu_count()


def _serving_task(config):
    """This task's `ClusterConfig` when it only serves (a parameter-server worker or ps task)."""
    from tfdist.distribute.tf_config import parse_tf_config
    from tfdist.distribute.ps_cluster import is_serving_task

    if config.cluster_resolver != "tf_config":
        return None
    cluster = parse_tf_config()
    return cluster if is_serving_task(cluster, config.strategy) else None


def _serve(recipe, config, cluster):
    """Runs a worker or ps task of a parameter-server job until it is stopped."""
    from tfdist.runtime.tf_logging import import_tensorflow

    import_tensorflow(config.tf_log_level)
    from tfdist.runtime.gpu_memory import apply_gpu_memory
    from tfdist.distribute.ps_cluster import serve_task
    from tfdist.distribute.startup import write_ready_file

    apply_gpu_memory(parse_gpu_memory(config.gpu_memory))
    print(f"python -m tfdist.recipes.{recipe.name}: {cluster.task_type} {cluster.task_index} at "
          f"{cluster.own_address} serves the parameter-server chief (the chief trains, logs and "
          "backs up; this task stops with SIGTERM).", flush=True)
    serve_task(cluster, on_ready=write_ready_file)
    return exit_codes.FINISHED


def _train(recipe, config, where):
    serving = _serving_task(config)
    if serving is not None:
        return _serve(recipe, config, serving)
    if config.strategy in _SINGLE_MACHINE:
        _ignore_stray_tf_config(config)
    backup_dir = config.backup_dir or (
        os.path.join(config.model_dir, "backup") if config.model_dir else None)
    where["backup_dir"] = backup_dir  # named by the stop lines, from the start
    if config.model_dir and _alone_before_tensorflow(config):
        # Before TensorFlow: a model dir in use is refused at once.
        where["lock"] = _lock_model_dir(config, where)
    # TensorFlow starts only after the flags are known to be good, quietly
    # unless asked, and logical devices are split before it initialises
    # (create_strategy does that).
    from tfdist.runtime.stop_signals import BlockedStopSignals
    from tfdist.runtime.tf_logging import import_tensorflow

    # SIGTERM/SIGINT wait for a step boundary (blocked in every thread,
    # TensorFlow's included); before the first step a watchdog stops the
    # process at once, as there is nothing to save yet.
    signals = BlockedStopSignals.install(f"python -m tfdist.recipes.{recipe.name}")
    where["stop_signals"] = signals  # closed when run_recipe returns
    tf = import_tensorflow(config.tf_log_level)
    # GPU memory is configured before anything can initialise the devices.
    from tfdist.runtime.gpu_memory import apply_gpu_memory

    gpus = apply_gpu_memory(parse_gpu_memory(config.gpu_memory))
    notice = gpu_memory_notice(config.gpu_memory, gpus)
    if notice:
        logger.info(notice)
    import keras

    from tfdist.callbacks import (BackupAndResume, NanGuard, ProfilerWindow, ThroughputMeter,
                                  latest_backup, make_logging_callbacks)
    from tfdist.callbacks.preemption import PreemptionGuard
    from tfdist.data import describe_epoch_passes, distribute_dataset, make_dataset_fn
    from tfdist.distribute.strategy_factory import create_strategy
    from tfdist.distribute.introspection import describe_strategy
    from tfdist.training import Trainer

    devices = prepare_model_parallel_devices(config, gpus)  # K stage devices exist first
    strategy_name, devices = prepare_tensor_parallel_devices(config, gpus, devices)  # shards too
    strategy = create_strategy(strategy_name, devices=devices, all_reduce=config.all_reduce,
                               cluster_resolver=config.cluster_resolver)
    info = describe_strategy(strategy)
    where["collective_workers"] = info.num_workers if info.name != "parameter_server" else 1
    say = print if info.is_chief else (lambda *args, **kwargs: None)
    if config.model_dir and info.is_chief and "lock" not in where:
        where["lock"] = _lock_model_dir(config, where)  # the chief of a cluster
    if config.deterministic:
        tf.config.experimental.enable_op_determinism()

    data = recipe.build_data(config)
    if data.validation is None and config.validation_steps is not None:
        raise ConfigError(
            f"--validation-steps {config.validation_steps}: this run has no validation data "
            f"(--dataset {config.dataset} brings none): give --validation-dataset, or drop the flag.")
    if config.global_batch_size % info.num_replicas:
        raise ValueError(
            f"--global-batch-size {config.global_batch_size} does not divide evenly over "
            f"{info.num_replicas} replicas; use a multiple of {info.num_replicas}.")
    steps_per_epoch = config.steps_per_epoch or _steps_in(data.train, config.global_batch_size)
    settle_run_length(config, steps_per_epoch)
    if config.steps_per_epoch and info.is_chief:
        repeats = describe_epoch_passes(data.train, config.global_batch_size, steps_per_epoch)
        if repeats:
            logger.warning(repeats)
    total_steps = optimizer_steps(config, steps_per_epoch)
    precision, jit_compile, xla_reason, autotune_summary = settle_auto_choices(
        recipe, config, info, data, on_gpu=gpus > 0,
        rules=rule_choices(recipe, config, on_gpu=gpus > 0), total_steps=total_steps, say=say)
    where["policy_before"] = keras.mixed_precision.global_policy()  # back when main() returns
    keras.mixed_precision.set_global_policy(precision.policy)
    where["batch"] = (config.global_batch_size, config.grad_accum_steps, precision.policy)
    keras.utils.set_random_seed(config.seed)
    pipeline = dict(seed=config.seed, deterministic=config.deterministic)
    # The pipeline function itself goes to fit, which distributes it and, when
    # resuming, builds it at the data position instead of replaying it (the batch
    # was checked above to split evenly over the replicas).
    train = make_dataset_fn(data.train, config.global_batch_size, training=True, **pipeline)
    validation = None
    if data.validation is not None:
        validation = distribute_dataset(strategy, data.validation, config.global_batch_size,
                                        training=False, **pipeline)

    with strategy.scope():
        built = recipe.build_model(config, data)
        jit_compile, xla_reason = respect_xla_blocker(config.xla, jit_compile, xla_reason,
                                                       built.xla_blocker)
        optimizer = build_recipe_optimizer(config, total_steps, built)
        trainer = Trainer(built.model, optimizer, built.loss, built.metrics, strategy=strategy,
                          jit_compile=jit_compile, grad_accum_steps=config.grad_accum_steps,
                          clip_norm=config.clip_norm, steps_per_execution=config.steps_per_execution,
                          **model_parallel_arguments(config),
                          **tensor_parallel_arguments(recipe, config, built.model))
        prepare_split_optimizer(built, trainer)

    # The record (config.yaml) keeps the choices and their reasons, not where
    # they came from: a resumed run that reads the cached decision is the
    # same configuration as the run that measured it.
    resolved = {
        "strategy": info.name, "replicas": info.num_replicas, "workers": info.num_workers,
        "precision": precision.policy, "precision_reason": precision.reason,
        "xla": jit_compile, "xla_reason": xla_reason, "gpu_memory": gpu_memory_line(config, gpus),
        "steps_per_epoch": steps_per_epoch, "optimizer_steps": total_steps,
        "tensorflow": tf.__version__, "keras": keras.__version__,
    }
    if reason := warmup_reason(config):
        resolved["warmup_steps"] = reason
    resumed_from = latest_backup(backup_dir) if backup_dir else None
    resuming = resumed_from is not None
    if config.model_dir and info.is_chief:
        _record_run(recipe, config, resolved, resumed_from, where)
    say(start_block(config, info, precision, jit_compile, xla_reason, data, built,
                     steps_per_epoch, resolved["gpu_memory"] if gpus else None,
                     autotune_summary))
    if trainer.stage_plan is not None:
        say(stage_plan_block(trainer))
    if trainer.shard_plan is not None:
        say(tensor_parallel_block(trainer))
    meter = ThroughputMeter(
        global_batch_size=config.global_batch_size, num_replicas=info.num_replicas,
        tokens_per_example=data.tokens_per_example, flops_per_example=built.flops_per_example,
        steps_per_execution=config.steps_per_execution, log_every=config.log_every, print_fn=None)
    # Producers first (the loggers after them see their values); NanGuard
    # before the backup, so that a NaN step is never backed up.
    callbacks = [meter, NanGuard()]
    if config.divergence_factor:
        # Right after NanGuard: a diverged step is never backed up, and
        # BackupAndResume keeps the last backup the guard saw healthy.
        callbacks.append(divergence_guard(config, backup_dir))
    if recipe.callbacks is not None:
        callbacks += recipe.callbacks(config, data, built, info)
    backup = None
    if backup_dir:
        backup = BackupAndResume(backup_dir, save_freq=config.backup_every or "epoch",
                                 max_to_keep=config.backup_keep, strategy=strategy,
                                 on_discard=lambda: _settle_record(where))
        callbacks.append(backup)
        if "history" in where:
            callbacks.append(_backup_recorder(keras, backup, where))
    # After the backup: on SIGTERM/SIGINT every worker backs up at one agreed step.
    guard = PreemptionGuard(backup, signals=signals, strategy=strategy)
    callbacks.append(guard)
    if config.model_dir:
        # CSV, TensorBoard (every --log-every steps and every epoch) and
        # per-epoch weights, written by the chief only.
        callbacks += make_logging_callbacks(
            config.model_dir, checkpoint=True, strategy=strategy, append=resuming,
            update_freq=config.log_every,
            # A split model's checkpoints hold the model as built (kernels gathered).
            checkpoint_model=(trainer.gathered_model if getattr(config, "tensor_parallel", 1) > 1
                              else None))
    if config.profile_steps:
        first, last, _ = parse_step_range(config.profile_steps)
        callbacks.append(ProfilerWindow(os.path.join(config.model_dir, "tensorboard", "train"),
                                        start_step=first - 1, stop_step=last))
    try:
        history = trainer.fit(train, epochs=config.epochs, steps_per_epoch=steps_per_epoch,
                              validation_data=validation, validation_steps=config.validation_steps,
                              callbacks=callbacks, verbose=min(config.verbose, 2) if info.is_chief else 0)
    except tf.errors.DataLossError as error:
        # TensorFlow names the byte offset of a damaged record, not its file.
        from tfdist.data import explain_data_loss
        raise explain_data_loss(error, [data.train, data.validation]) from error
    say(final_block(history, data, meter.summary))
    if "history" in where:
        where["history"].note_results(final_metrics(history))
    if getattr(trainer, "worker_steps", None):
        say("  steps per worker  " + ", ".join(
            f"worker {index}: {count}" for index, count in sorted(trainer.worker_steps.items())))
    if config.skip_corrupt_records:
        say(skipped_line([data.train, data.validation], info.num_workers))
    if config.model_dir and info.is_chief:
        block, missing = outputs_block(config.model_dir, backup_dir, config.profile_steps)
        print(block)
        if missing:
            where["outcome"] = f"finished without writing {', '.join(missing)}"
            print(missing_outputs_line(recipe, config.model_dir, missing), file=sys.stderr,
                  flush=True)
            return exit_codes.FAILED
    # A SIGTERM/SIGINT taken at the last step, or still pending (it came later).
    late = getattr(guard, "signal_after_last_step", None) or signals.pending()
    if late:
        where["outcome"] = f"finished; {late} arrived after the last training step"
        print(finished_anyway_line(late), file=sys.stderr, flush=True)
    return exit_codes.FINISHED


def final_metrics(history):
    """The last epoch's model metrics of a fit's `History` (what the run record keeps).

    Example:

    >>> final_metrics(trainer.fit(...))
    {'loss': 0.31, 'accuracy': 0.92, 'val_loss': 0.35, 'val_accuracy': 0.9}
    """
    from tfdist.callbacks.progress import model_metrics

    return {name: float(values[-1])
            for name, values in model_metrics(history.history).items() if values}


def divergence_guard(config, backup_dir):
    """The `DivergenceGuard` for `--divergence-factor`: judged after max(20
    steps, the learning-rate warmup in batches), with advice naming the flags.

    Example:

    >>> divergence_guard(parse_config(["--warmup-steps", "100"], ...), "run/backup").warmup
    100
    """
    from tfdist.callbacks import DivergenceGuard
    from tfdist.callbacks.divergence import DEFAULT_WARMUP

    warmup = max(DEFAULT_WARMUP, config.warmup_steps * config.grad_accum_steps)
    if backup_dir:
        hint = (f"To resume from the last good backup in {backup_dir}, rerun with the same flags "
                "but a lower --learning-rate (e.g. a tenth), or with --clip-norm or a longer "
                "--warmup-steps.")
    else:
        hint = ("Nothing was saved (add --model-dir DIR to make runs resumable); rerun with a "
                "lower --learning-rate, or with --clip-norm or a longer --warmup-steps.")
    hint += f" --divergence-factor 0 turns this check off (now {config.divergence_factor:g})."
    return DivergenceGuard(factor=config.divergence_factor, warmup=warmup, hint=hint)


def _record_run(recipe, config, resolved, resumed_from, where):
    """Starts the run's entry in MODEL_DIR/runs/; a resumed run first names what
    changed since the run that wrote the backup it resumes from.

    `config.yaml` is written here only in a fresh folder; otherwise it is
    replaced once this run writes a backup (`_backup_recorder`) and settled
    at the end (`_end_run`), so a refused or diverged run never replaces the
    record of the run whose backups are left.
    """
    values = config_values(config, recipe.all_options())
    if resumed_from is not None:
        writer = writer_of_backup(config.model_dir, resumed_from.path)
        reference = writer if writer is not None else read_record(config.model_dir)
        check_resume_degree(config, reference, resumed_from.path)
        changes = changed_keys(reference, {"options": values, "resolved": resolved})
        if changes:
            logger.warning("Resuming in %s with a different configuration than the run that "
                           "wrote its backups: %s.", config.model_dir, describe_changes(changes))
    lock = where.get("lock")
    run = dict(lock.holder) if lock is not None else {
        "host": socket.gethostname(), "pid": os.getpid(), "command": where["command"],
        "started": time.strftime("%Y-%m-%d %H:%M:%S %Z")}
    where["record"] = (values, resolved, config.config_file)
    where["history"] = RunHistory.start(config.model_dir, values, resolved, config.config_file,
                                        run=run)
    if resumed_from is None and read_record(config.model_dir) is None:
        write_record(config.model_dir, values, resolved, config.config_file)


def _backup_recorder(keras, backup, where):
    """A callback (placed after `backup`) that notes each backup this run writes
    in its history entry and, from its first one on, makes config.yaml this
    run's record (the newest backup is now this run's)."""

    class RecordBackups(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.seen = None

        def _check(self, *args, **kwargs):
            info = backup.last_backup
            history = where.get("history")
            if info is None or not info.path or info.path == self.seen or history is None:
                return
            first = not history.backups
            self.seen = info.path
            history.note_backup(info.path)
            if first:
                write_record(where["model_dir"], *where["record"])

        on_train_batch_end = on_epoch_end = on_train_end = _check

    return RecordBackups()


def _lock_model_dir(config, where):
    """Takes the model dir's lock for this run (see `tfdist.runtime.run_lock`),
    creating the folder. A folder that cannot be created where its parent
    should be (`/proc/run`) is a `ConfigError` naming the flag; the other
    faults of the disk are `environment_line`'s."""
    from tfdist.runtime.run_lock import acquire

    try:
        return acquire(config.model_dir, command=where["command"])
    except FileNotFoundError as error:
        raise ConfigError(
            f"--model-dir {config.model_dir}: the folder cannot be created there "
            f"({error.strerror}): name a folder on a disk this user can write to.") from None


def _alone_before_tensorflow(config):
    """Whether this process trains alone (and so owns the model dir), known
    from the flags and TF_CONFIG before TensorFlow starts."""
    from tfdist.distribute.tf_config import parse_tf_config

    if config.strategy in _SINGLE_MACHINE:
        return True
    return (config.strategy == "auto" and config.cluster_resolver == "tf_config"
            and parse_tf_config() is None)


def _ignore_stray_tf_config(config):
    """A single-machine strategy trains and writes alone: a TF_CONFIG left in
    the environment is named in one warning line and ignored (removed from
    this process's environment, so that nothing treats the run as a worker)."""
    from tfdist.distribute.tf_config import parse_tf_config

    cluster = parse_tf_config()  # a malformed TF_CONFIG is still an error naming the field
    if cluster is None:
        return
    tasks = sum(len(addresses) for addresses in cluster.cluster.values())
    logger.warning(
        "TF_CONFIG names this process %s %d of a %d-task cluster, but --strategy %s trains on "
        "this machine alone: TF_CONFIG is ignored and this run trains and writes its outputs "
        "by itself. Unset TF_CONFIG, or use --strategy multi_worker_mirrored to join the "
        "cluster.", cluster.task_type, cluster.task_index, tasks, config.strategy)
    os.environ.pop("TF_CONFIG", None)


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


