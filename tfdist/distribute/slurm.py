"""SLURM: TensorFlow's `SlurmClusterResolver`, set up for tfdist.

`create_strategy(cluster_resolver="slurm")` (`--cluster-resolver slurm` in
the recipes) reads the cluster from the SLURM job step's variables.

    from tfdist.distribute.slurm import slurm_resolver
    resolver = slurm_resolver()   # inside `srun`
"""

import os
import re

import tensorflow as tf

SLURM_PORT_BASE_ENV = "TFDIST_SLURM_PORT_BASE"
"""Environment variable: the first port of the SLURM workers (default 8888; task k on a
node listens on base + k)."""


def slurm_resolver():
    """TensorFlow's `SlurmClusterResolver`, set up for tfdist.

    Its defaults ask `nvidia-smi` how many GPUs a node has (failing on CPU
    nodes) and divide them among the node's tasks (failing when SLURM already
    bound one GPU per task). Here the GPUs a task sees (`CUDA_VISIBLE_DEVICES`)
    decide: with several tasks on a node and GPUs that divide among them,
    each task gets its share, as TensorFlow would do; otherwise (one task per
    node, GPUs already bound by SLURM, a CPU node) nothing is changed. tfdist
    picks the local devices itself (see `tfdist.distribute.strategy_factory`).

    Environment: `SLURM_*` (set by `srun`), `CUDA_VISIBLE_DEVICES`, and
    `TFDIST_SLURM_PORT_BASE` (`SLURM_PORT_BASE_ENV`).

    Raises:
        ValueError: outside a SLURM job step, or a bad port base.

    Example:

    >>> resolver = slurm_resolver()  # inside `srun`
    >>> resolver.cluster_spec().as_dict()["worker"]
    ['node1:8888', 'node2:8888']
    """
    tasks_per_node = _max_tasks_per_node(os.environ.get("SLURM_STEP_TASKS_PER_NODE")
                                         or os.environ.get("SLURM_TASKS_PER_NODE") or "1")
    raw_port = os.environ.get(SLURM_PORT_BASE_ENV, "8888")
    if not raw_port.isdigit() or not 1024 <= int(raw_port) <= 65535 - tasks_per_node:
        raise ValueError(f"{SLURM_PORT_BASE_ENV}={raw_port!r} is not a port number from 1024 to "
                         f"{65535 - tasks_per_node}.")
    visible = [d for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    share = tasks_per_node > 1 and len(visible) >= tasks_per_node and (
        len(visible) % tasks_per_node == 0)
    gpus_per_task = len(visible) // tasks_per_node if share else 1
    try:
        return tf.distribute.cluster_resolver.SlurmClusterResolver(
            port_base=int(raw_port), gpus_per_node=gpus_per_task * tasks_per_node,
            gpus_per_task=gpus_per_task, auto_set_gpu=share)
    except (KeyError, RuntimeError, ValueError, OSError) as error:
        raise ValueError(
            "cluster_resolver='slurm' needs to run inside a SLURM job step (srun), with "
            f"SLURM_* variables set; SlurmClusterResolver failed: {error!r}.") from error


def _max_tasks_per_node(tasks_per_node):
    """The largest count in SLURM's tasks-per-node list, e.g. `"2(x3),1"` -> 2."""
    counts = [int(match) for match in re.findall(r"(\d+)(?:\(x\d+\))?", tasks_per_node)]
    return max(counts) if counts else 1
