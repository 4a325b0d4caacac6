"""`--tensor-parallel K` in the recipes.

With K > 1 the recipe's model has its large layers split over K devices of
this worker (`Trainer(tensor_parallel=K, layout_map=...)`, see
`tfdist.training.tensor_parallel`): K GPUs, or without GPUs the CPU split
into K logical devices before TensorFlow starts. The layout is the recipe's
own (`Recipe.layout_map`: the transformer recipe uses
`tfdist.models.decoder_lm_layout_map`, the cnn recipe
`tfdist.models.resnet_layout_map`). What the split does not support yet is
refused from the flags, before TensorFlow starts, naming the flag and the
way out: another strategy than `auto`, `default` or `multi_worker_mirrored`,
`--devices`, `--model-parallel`, `--xla on`. Data parallelism combines split
copies across workers: `--strategy multi_worker_mirrored` (or `auto` in a
cluster) gets one replica per worker; on one machine `--strategy auto`
resolves to `default`. `--precision auto` resolves to float32 (an explicit `--precision bf16` /
`fp16` runs mixed, `--grad-accum-steps` accumulates) and `--xla auto` to off.

Example:

    check_tensor_parallel_flags(RECIPE, config)        # before TensorFlow
    prepare_tensor_parallel_devices(config, gpus)      # before the strategy
"""

from tfdist.recipes.config import ConfigError
from tfdist.recipes.model_parallel_flags import provide_worker_devices

TENSOR_PARALLEL_STRATEGIES = ("auto", "default", "multi_worker_mirrored")
"""The `--strategy` values `--tensor-parallel K > 1` runs under (auto resolves to default on
one machine, to multi_worker_mirrored with one device per worker in a cluster)."""


def check_tensor_parallel_flags(recipe, config):
    """Refuses flag combinations that `--tensor-parallel` cannot honour, before TensorFlow starts.

    Args:
        recipe: the `Recipe` (a recipe without a layout cannot split its model).
        config: the parsed recipe config.

    Raises:
        ConfigError: naming the flag and the way out.

    Example:

    >>> check_tensor_parallel_flags(RECIPE, argparse.Namespace(tensor_parallel=2,
    ...     strategy="mirrored", ...))
    Traceback (most recent call last):
    ConfigError: --tensor-parallel 2 with --strategy mirrored: ...
    """
    k = getattr(config, "tensor_parallel", 1)
    if k == 1:
        return
    if recipe.layout_map is None:
        raise ConfigError(
            f"--tensor-parallel {k}: the {recipe.name} recipe has no tensor-parallel layout for "
            "its model yet. Drop --tensor-parallel (data parallelism over the devices: "
            "--strategy mirrored).")
    if config.model_parallel > 1:
        raise ConfigError(
            f"--tensor-parallel {k} with --model-parallel {config.model_parallel} (pipeline "
            "stages that are themselves split) is not supported yet. Use one of them.")
    if config.strategy not in TENSOR_PARALLEL_STRATEGIES:
        raise ConfigError(
            f"--tensor-parallel {k} with --strategy {config.strategy}: each worker holds one "
            f"replica split over {k} of its devices, and TensorFlow's {config.strategy} "
            "strategy cannot give a replica more than one device (or keeps the variables on "
            "parameter servers). Use --strategy auto (default on one machine, "
            "multi_worker_mirrored with one device per worker in a cluster), default or "
            "multi_worker_mirrored, or --tensor-parallel 1.")
    if config.devices is not None and config.devices > 1:
        raise ConfigError(
            f"--devices {config.devices} asks for {config.devices} replicas, but with "
            f"--tensor-parallel {k} one replica is split over {k} devices (taken "
            f"automatically: {k} GPUs, or {k} logical CPUs). Drop --devices.")
    if config.xla == "on":
        raise ConfigError(
            f"--xla on is not supported with --tensor-parallel {k} yet: XLA compiles one "
            "function for one device, and each shard runs on its own. Use --xla off or auto.")


def _finds_cluster(config):
    """Whether `--strategy auto` finds a cluster: `--cluster-resolver slurm`, or a TF_CONFIG
    from which the strategy factory's own rule picks a multi-worker strategy."""
    if config.cluster_resolver != "tf_config":
        return True
    from tfdist.distribute.strategy_factory import choose_strategy

    return choose_strategy(devices=1, cluster_resolver="tf_config")[0] != "one_device"


def check_resume_degree(config, reference, backup):
    """Refuses to resume a backup written with another `--tensor-parallel` degree.

    A backup holds each shard of a split layer as a variable of its own, so it
    restores only into the same split.

    Args:
        config: this run's config.
        reference: the record (`{"options": {...}, ...}`) of the run that
            wrote the backup, or None when unknown.
        backup: the backup's path, for the message.

    Raises:
        ValueError: the degrees differ (the message names both and the way out).

    Example:

    >>> check_resume_degree(argparse.Namespace(tensor_parallel=1),
    ...                     {"options": {"tensor_parallel": 2}}, "run/backup/ckpt-6")
    Traceback (most recent call last):
    ValueError: The backup run/backup/ckpt-6 was written with --tensor-parallel 2, ...
    """
    options = (reference or {}).get("options") or {}
    written = options.get("tensor_parallel", 1)
    k = getattr(config, "tensor_parallel", 1)
    if reference is None or written == k:
        return
    raise ValueError(
        f"The backup {backup} was written with --tensor-parallel {written}, this run has "
        f"--tensor-parallel {k}: a backup holds each shard of a split layer as a variable of "
        f"its own and restores only into the same split. Resume with --tensor-parallel "
        f"{written}, or start over with a new --backup-dir (or --model-dir).")


def xla_blocker(config):
    """Why XLA is off with `--tensor-parallel` > 1 (for `--xla auto`), or None.

    Example:

    >>> xla_blocker(argparse.Namespace(tensor_parallel=2))
    'tensor parallelism (--tensor-parallel 2) runs each shard on its own device'
    """
    k = getattr(config, "tensor_parallel", 1)
    if k == 1:
        return None
    return f"tensor parallelism (--tensor-parallel {k}) runs each shard on its own device"


def precision_under_tensor_parallel(config, precision):
    """`precision`, or float32 with the reason when `--tensor-parallel` > 1 and `--precision`
    is auto (an explicit half precision is kept: the split runs it, but auto does not choose
    it there unmeasured).

    Example:

    >>> precision_under_tensor_parallel(config, PrecisionChoice("mixed_bfloat16", "auto: GPU"))
    PrecisionChoice(policy='float32', reason='auto: tensor parallelism ... keeps float32 ...')
    """
    k = getattr(config, "tensor_parallel", 1)
    if k == 1 or precision.policy == "float32" or getattr(config, "precision", "auto") != "auto":
        return precision
    from tfdist.precision import PrecisionChoice

    return PrecisionChoice("float32", f"auto: tensor parallelism (--tensor-parallel {k}) keeps "
                                      "float32 under auto (ask for --precision bf16 or fp16)")


def prepare_tensor_parallel_devices(config, gpus, devices):
    """Makes the K shard devices exist (before TensorFlow initialises) and returns
    `(strategy name, devices)` to create the strategy with.

    With K > 1: `("default", None)` on one worker, `("multi_worker_mirrored",
    1)` (one replica per worker, its K shard devices beside it) for `--strategy
    multi_worker_mirrored` or for `auto` in a cluster (TF_CONFIG of several
    tasks, SLURM). Without GPUs the CPU is split into K logical devices. With
    K = 1, `config.strategy` and `devices` unchanged.

    Raises:
        ValueError: fewer than K GPUs visible.

    Example:

    >>> prepare_tensor_parallel_devices(argparse.Namespace(tensor_parallel=2, strategy="auto",
    ...                                                    cluster_resolver="tf_config"),
    ...                                 gpus=0, devices=None)
    ('default', None)
    """
    k = getattr(config, "tensor_parallel", 1)
    if k == 1:
        return config.strategy, devices
    provide_worker_devices("--tensor-parallel", k, gpus, "shard")
    return tensor_parallel_strategy(config)


def tensor_parallel_strategy(config):
    """`(strategy name, devices)` for `--tensor-parallel K > 1`: one replica per worker.

    Example:

    >>> tensor_parallel_strategy(argparse.Namespace(strategy="auto", cluster_resolver="slurm"))
    ('multi_worker_mirrored', 1)
    """
    if config.strategy == "multi_worker_mirrored" or (
            config.strategy == "auto" and _finds_cluster(config)):
        return "multi_worker_mirrored", 1
    return "default", None


def trainer_arguments(recipe, config, model):
    """The `Trainer` arguments of `--tensor-parallel`: K and the recipe's layout of `model`
    over K devices.

    Example:

    >>> trainer_arguments(transformer.RECIPE, argparse.Namespace(tensor_parallel=2), model)
    {'tensor_parallel': 2, 'layout_map': <...LayoutMap object at ...>}
    """
    k = getattr(config, "tensor_parallel", 1)
    if k == 1:
        return {}
    import keras

    from tfdist.training.tensor_parallel.split import shard_devices

    mesh = keras.distribution.DeviceMesh((k,), ["model"], devices=shard_devices(k))
    return {"tensor_parallel": k, "layout_map": recipe.layout_map(config, mesh, model)}


def prepare_split_optimizer(built, trainer):
    """Repeats the model's optimizer preparation (weight-decay exclusions) for the split copy.

    `built.prepare_optimizer` ran on the model the recipe built; the split
    copy the Trainer trains has variables of its own, which Keras's
    exclusions (by variable) would not cover.

    Example:

    >>> prepare_split_optimizer(built, trainer)   # after Trainer(tensor_parallel=2, ...)
    """
    if getattr(trainer, "shard_plan", None) is None or built.prepare_optimizer is None:
        return
    built.prepare_optimizer(trainer.optimizer, trainer.model)


def bytes_per_device(trainer):
    """Bytes each device holds, by the variables' placement: the split layers' (their
    weights and optimizer slots) and the rest (replicated layers, their slots, the
    optimizer's own counters).

    Builds the optimizer (its slots are created next to each shard) when it
    is not built yet, so the figures include the slots. A slot belongs to the
    variable it was made from (Keras names it `<variable path>_<slot>`, same shape).

    Returns:
        A dict `{device name: {"split": bytes, "rest": bytes}}`, in device order.

    Example:

    >>> bytes_per_device(trainer)["/job:localhost/replica:0/task:0/device:CPU:1"]
    {'split': 393216, 'rest': 0}
    """
    from tfdist.training.model_parallel.placement import variable_bytes_by_device
    from tfdist.training.tensor_parallel.split import SHARDED_LAYERS

    model, optimizer = trainer.model, trainer.optimizer
    if optimizer is not None and not optimizer.built:
        optimizer.build(model.trainable_variables)
    split = [v for layer in _all_layers(model) if isinstance(layer, SHARDED_LAYERS)
             for v in layer.weights]
    split_ids = {id(v) for v in split}
    prefixes = {v.path.replace("/", "_") + "_": tuple(v.shape) for v in split}
    slots = list(optimizer.variables) if optimizer is not None else []
    split_slots = [s for s in slots if prefixes.get(_slot_owner(s.name, prefixes)) == tuple(s.shape)]
    split_ids.update(id(s) for s in split_slots)
    everything = list(model.variables) + slots
    rest = [v for v in everything if id(v) not in split_ids]
    split_bytes = variable_bytes_by_device(split + split_slots)
    rest_bytes = variable_bytes_by_device(rest)
    devices = sorted(set(split_bytes) | set(rest_bytes))
    return {device: {"split": split_bytes.get(device, 0), "rest": rest_bytes.get(device, 0)}
            for device in devices}


def _slot_owner(name, prefixes):
    """The longest of `prefixes` that `name` starts with, or None."""
    owners = [prefix for prefix in prefixes if name.startswith(prefix)]
    return max(owners, key=len) if owners else None


def _all_layers(model):
    """The model's layers and, one level down, their sub-layers (a block's split `ffn_in`)."""
    from tfdist.seam import direct_sublayers

    found = []
    for layer in model.layers:
        found.append(layer)
        found += list(direct_sublayers(layer))
    return found


def tensor_parallel_block(trainer):
    """The start-up block's lines for the split, or "" without tensor parallelism.

    Example:

    >>> print(tensor_parallel_block(trainer))
      tensor parallel  tensor_parallel=2 over mesh axis 'model' of 'decoder_lm' (8 layers split), shards on CPU:0, CPU:1
                         block_0/attention  heads-parallel  4 heads -> 2 x 2
                         ...
      bytes/device     CPU:0 split 0.125 MiB + rest 1.500 MiB, CPU:1 split 0.125 MiB + rest 0.000 MiB
    """
    plan = getattr(trainer, "shard_plan", None)
    if plan is None:
        return ""
    described = plan.describe().splitlines()
    devices = ", ".join(device.rsplit("device:", 1)[-1] for device in plan.devices or ())
    lines = [f"  tensor parallel  {described[0]}, shards on {devices}"]
    lines += [f"                 {line}" for line in described[1:]]
    sizes = bytes_per_device(trainer)
    lines.append("  bytes/device     " + ", ".join(
        f"{device.rsplit('device:', 1)[-1]} split {size['split'] / 2**20:.3f} MiB + rest "
        f"{size['rest'] / 2**20:.3f} MiB" for device, size in sizes.items())
        + " (split layers' weights and optimizer slots + the replicated rest, by placement)")
    return "\n".join(lines)
