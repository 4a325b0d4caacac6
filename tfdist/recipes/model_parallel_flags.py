"""`--model-parallel K` and `--micro-batches M` in the recipes.

With K > 1 every worker holds one model replica split into K pipeline
stages on K of its devices (`Trainer(model_parallel=K)`): K GPUs, or without
GPUs the CPU split into K logical devices before TensorFlow starts. Data
parallelism then runs across workers only (`--strategy
multi_worker_mirrored` with one device per worker, or `auto` under
TF_CONFIG); on one machine the strategy is `one_device` (`auto`), `default`
or `one_device`. `--strategy mirrored` (one replica per device) and
`--devices N > 1` are refused with the reason, and so are `--xla on` and
`--grad-accum-steps` > 1, which the pipeline does not support; `--xla auto`
resolves to off.

Example:

    check_model_parallel_flags(config)                 # before TensorFlow
    devices = prepare_model_parallel_devices(config)   # before the strategy
"""

from tfdist.recipes.config import ConfigError

REFUSED_STRATEGIES = {
    "mirrored": (
        "--strategy mirrored runs one replica per device, but with --model-parallel {k} the "
        "{k} devices of a worker hold the stages of one replica: TensorFlow's MirroredStrategy "
        "cannot give a replica more than one device, so data parallelism across the devices "
        "of one machine is not possible together with model parallelism. Use --strategy auto "
        "(one_device here, multi_worker_mirrored under TF_CONFIG) for one replica per worker, "
        "or --model-parallel 1 for data parallelism across devices."),
    "parameter_server": (
        "--strategy parameter_server keeps variables on parameter servers and steps "
        "asynchronously; --model-parallel {k} needs each stage's variables on its own "
        "device. Use --strategy multi_worker_mirrored (one device per worker) or auto."),
}


def check_model_parallel_flags(config):
    """Refuses flag combinations that `--model-parallel` cannot honour, before TensorFlow starts.

    Args:
        config: the parsed recipe config (`model_parallel`, `micro_batches`,
            `strategy`, `devices`, `xla`, `grad_accum_steps`).

    Raises:
        ConfigError: naming the flag and the way out.

    Example:

    >>> check_model_parallel_flags(argparse.Namespace(model_parallel=2, micro_batches=None,
    ...     strategy="mirrored", devices=None, xla="auto", grad_accum_steps=1))
    Traceback (most recent call last):
    ConfigError: --strategy mirrored runs one replica per device, ...
    """
    k = config.model_parallel
    if k == 1:
        if config.micro_batches is not None:
            raise ConfigError(
                f"--micro-batches {config.micro_batches} splits each step of a model split over "
                "devices; add --model-parallel K (K >= 2), or use --grad-accum-steps for "
                "several batches per optimizer step on one device.")
        return
    if config.strategy in REFUSED_STRATEGIES:
        raise ConfigError(REFUSED_STRATEGIES[config.strategy].format(k=k))
    if config.devices is not None and config.devices > 1:
        raise ConfigError(
            f"--devices {config.devices} asks for {config.devices} replicas per worker, but with "
            f"--model-parallel {k} each worker holds one replica whose {k} stages take {k} "
            "devices (split automatically: K GPUs, or K logical CPUs). Drop --devices; for data "
            "parallelism add workers (python -m tfdist.launch --workers N).")
    if config.xla == "on":
        raise ConfigError(
            f"--xla on is not supported with --model-parallel {k}: XLA compiles one function "
            "on one device, and each pipeline stage runs on its own. Use --xla off or auto.")
    if config.grad_accum_steps > 1:
        raise ConfigError(
            f"--grad-accum-steps {config.grad_accum_steps} is not supported with "
            f"--model-parallel {k}: each pipelined step already sums its --micro-batches' "
            "gradients before one update. Raise --global-batch-size (and --micro-batches).")


def xla_blocker(config):
    """Why XLA is off with `--model-parallel` > 1 (for `--xla auto`), or None.

    Example:

    >>> xla_blocker(argparse.Namespace(model_parallel=2))
    'model parallelism (--model-parallel 2) runs each stage on its own device'
    """
    if config.model_parallel == 1:
        return None
    return (f"model parallelism (--model-parallel {config.model_parallel}) runs each stage on "
            "its own device")


def prepare_model_parallel_devices(config, gpus):
    """Makes the K stage devices exist and returns the strategy's `devices=` value.

    Without GPUs the CPU is split into K logical devices (before TensorFlow
    initialises: call this before creating the strategy). The strategy then
    gets one device per worker: `devices=1` (None for `--strategy default`,
    which takes no devices); the other K-1 devices are the later stages'.

    Args:
        config: the recipe config.
        gpus: the number of GPUs this process sees.

    Returns:
        The `devices` argument for `tfdist.distribute.strategy_factory.create_strategy`.

    Raises:
        ValueError: fewer than K GPUs visible.

    Example:

    >>> prepare_model_parallel_devices(argparse.Namespace(model_parallel=2, devices=None,
    ...                                                   strategy="auto"), gpus=0)
    1
    """
    k = config.model_parallel
    if k == 1:
        return config.devices
    provide_worker_devices("--model-parallel", k, gpus, "stage")
    return None if config.strategy == "default" else 1


def provide_worker_devices(flag, k, gpus, unit):
    """Makes K devices of this worker exist for `flag` (before TensorFlow initialises).

    With GPUs, checks that K are visible; without, splits the CPU into K
    logical devices.

    Raises:
        ValueError: fewer than K GPUs visible (naming `flag` and the way out).

    Example:

    >>> provide_worker_devices("--model-parallel", 2, gpus=0, unit="stage")
    """
    if gpus:
        if gpus < k:
            raise ValueError(f"{flag} {k} needs {k} GPUs on this worker, one per {unit}, but "
                             f"{gpus} are visible. Use {flag} {gpus} or fewer.")
        return
    from tfdist.distribute.devices import split_cpu_into_logical_devices

    split_cpu_into_logical_devices(k)


def trainer_arguments(config):
    """The `Trainer` arguments of `--model-parallel` / `--micro-batches`.

    Example:

    >>> trainer_arguments(argparse.Namespace(model_parallel=2, micro_batches=None))
    {'model_parallel': 2, 'micro_batches': None}
    """
    if config.model_parallel == 1:
        return {}
    return {"model_parallel": config.model_parallel, "micro_batches": config.micro_batches}


def stage_plan_block(trainer):
    """The start-up block's lines for the stage plan, or "" without model parallelism.

    Example:

    >>> print(stage_plan_block(trainer))
      pipeline      2 stages, 4 micro-batches per step (GPipe), bubble (K-1)/(M+K-1) = 20%
      stages        2 stages of 'decoder_lm' (repeated blocks; boundaries: block_1)
                      stage 0  /device:CPU:0  embedding .. block_0 (3 layers)  ...
    """
    plan = trainer.stage_plan
    if plan is None:
        return ""
    k, m = plan.num_stages, trainer.micro_batches
    lines = [f"  pipeline      {k} stages, {m} micro-batches per step (GPipe), bubble "
             f"(K-1)/(M+K-1) = {100 * (k - 1) / (m + k - 1):.0f}%"]
    described = plan.describe().splitlines()
    lines.append(f"  stages        {described[0]}")
    lines += [f"              {line}" for line in described[1:]]
    return "\n".join(lines)
