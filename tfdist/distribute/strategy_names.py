"""Strategy names and all-reduce names, checked without importing TensorFlow.

The recipes validate `--strategy` and `--all-reduce` with these before
TensorFlow starts; `tfdist.distribute.strategy_factory.create_strategy` uses
the same checks.

Example:

    key = check_strategy_name("mirrored")
"""

STRATEGY_NAMES = ("auto", "default", "one_device", "mirrored", "multi_worker_mirrored",
                  "parameter_server")
"""Names `create_strategy` accepts."""

UNSUPPORTED_STRATEGIES = {
    "central_storage": (
        "tfdist does not support 'central_storage' yet: its variables on the parameter "
        "device cannot be updated by Keras's batch normalization (they need an aggregation "
        "Keras does not give them), and Keras's metrics and evaluation are aggregated wrongly "
        "under it. Use 'mirrored' on one machine."),
    "tpu": (
        "tfdist does not support 'tpu' yet: it is built and tested for GPUs and CPUs "
        "only. Use 'mirrored' or 'multi_worker_mirrored' on GPU machines, or Keras's "
        "own TPU support."),
}
"""Strategy names tfdist knows but refuses, with the reason."""

ALL_REDUCE_NAMES = {
    "mirrored": ("nccl", "hierarchical_copy", "reduction_to_one_device"),
    "multi_worker_mirrored": ("auto", "ring", "nccl"),
}
"""All-reduce implementations each strategy accepts (None = TensorFlow's choice)."""

CLUSTER_RESOLVER_NAMES = ("tf_config", "slurm")
"""Names `create_strategy`'s `cluster_resolver` accepts besides a ClusterResolver instance
(the recipes' `--cluster-resolver` choices)."""


def check_strategy_name(name):
    """Validates a strategy name without starting TensorFlow; returns its canonical key.

    Case and "-" vs "_" do not matter. Names tfdist knows but does not
    support (`UNSUPPORTED_STRATEGIES`) are refused with the reason and
    what to use instead.

    Raises:
        ValueError: unknown or unsupported; the message lists the valid names.

    Example:

    >>> check_strategy_name("Multi-Worker-Mirrored")
    'multi_worker_mirrored'
    """
    if not isinstance(name, str):
        raise ValueError(f"Strategy name must be a string, got {name!r}. Valid names: "
                         f"{', '.join(STRATEGY_NAMES)}.")
    key = name.strip().lower().replace("-", "_")
    if key in UNSUPPORTED_STRATEGIES:
        raise ValueError(UNSUPPORTED_STRATEGIES[key])
    if key not in STRATEGY_NAMES:
        raise ValueError(f"Unknown strategy {name!r}. Valid names: {', '.join(STRATEGY_NAMES)}.")
    return key


def check_all_reduce_name(strategy_key, all_reduce):
    """Validates an all-reduce name for a (checked) strategy key.

    `auto` strategies are not checked here (the strategy is picked later).

    Raises:
        ValueError: the name does not fit the strategy; the valid ones are named.

    Example:

    >>> check_all_reduce_name("mirrored", "nccl")
    """
    if all_reduce is None or strategy_key == "auto":
        return
    if strategy_key not in ALL_REDUCE_NAMES:
        raise ValueError(
            f"all_reduce={all_reduce!r} does not apply to strategy {strategy_key!r}, which does not "
            "all-reduce. It applies to: "
            + "; ".join(f"{k} ({', '.join(v)})" for k, v in ALL_REDUCE_NAMES.items()) + ".")
    if all_reduce not in ALL_REDUCE_NAMES[strategy_key]:
        raise ValueError(f"all_reduce={all_reduce!r} is not valid for {strategy_key}; valid: "
                         f"{', '.join(ALL_REDUCE_NAMES[strategy_key])} (or None for TensorFlow's choice).")
