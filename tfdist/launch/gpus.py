"""Giving each localhost worker GPUs of its own (`--gpus-per-worker K`).

Without it every worker sees every GPU, and on a multi-GPU machine all the
workers would pile onto the same devices. With it, worker i gets
`CUDA_VISIBLE_DEVICES` = the i-th group of K GPUs of those the launcher
itself may use: its own `CUDA_VISIBLE_DEVICES` when set, otherwise the GPUs
`nvidia-smi -L` lists. Asking for more GPUs than there are is an error, never
a silent fall-back to the CPU (a worker whose `CUDA_VISIBLE_DEVICES` names no
real GPU would quietly train on the CPU).

Nothing here imports TensorFlow.

Example:

    ids = visible_gpus(os.environ)                    # e.g. ['0', '1', '2', '3']
    assign_gpus(ids, workers=2, gpus_per_worker=2)    # [['0', '1'], ['2', '3']]
"""

import subprocess

NVIDIA_SMI_TIMEOUT = 20.0
"""Seconds `nvidia-smi -L` may take before the launcher gives up on it."""


def nvidia_smi_gpus(timeout=NVIDIA_SMI_TIMEOUT):
    """GPU indices listed by `nvidia-smi -L` ("GPU 0: ..."), or [] when the
    tool is missing, fails or does not answer within `timeout` seconds.

    Example:

    >>> nvidia_smi_gpus()  # a machine with two GPUs
    ['0', '1']
    """
    try:
        listing = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True,
                                 timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return []
    if listing.returncode != 0:
        return []
    ids = []
    for line in listing.stdout.splitlines():
        head = line.split(":", 1)[0].split()
        if len(head) == 2 and head[0] == "GPU" and head[1].isdigit():
            ids.append(head[1])
    return ids


def visible_gpus(env, list_gpus=nvidia_smi_gpus):
    """The GPU ids the launcher may hand out to its workers.

    Args:
        env: the launcher's environment (a mapping). A `CUDA_VISIBLE_DEVICES`
            in it wins: its comma-separated ids or UUIDs, in order; empty or
            "-1" means no GPU.
        list_gpus: called with no arguments when `CUDA_VISIBLE_DEVICES` is
            unset; returns the machine's GPU ids (default: `nvidia-smi -L`).

    Returns:
        A list of id strings (possibly empty).

    Example:

    >>> visible_gpus({"CUDA_VISIBLE_DEVICES": "2,3"})
    ['2', '3']
    >>> visible_gpus({"CUDA_VISIBLE_DEVICES": "-1"})
    []
    """
    if "CUDA_VISIBLE_DEVICES" in env:
        ids = [part.strip() for part in env["CUDA_VISIBLE_DEVICES"].split(",") if part.strip()]
        return [] if ids[:1] == ["-1"] else ids
    return list(list_gpus())


def assign_gpus(gpu_ids, workers, gpus_per_worker):
    """Splits `gpu_ids` into one group of `gpus_per_worker` per worker.

    Args:
        gpu_ids: the GPUs to hand out (see `visible_gpus`), in order.
        workers: the number of workers, >= 1.
        gpus_per_worker: GPUs each worker gets, >= 1.

    Returns:
        A list of `workers` lists of ids; GPUs beyond `workers *
        gpus_per_worker` stay unused.

    Raises:
        ValueError: fewer GPUs than `workers * gpus_per_worker` (the message
            names the counts and the GPUs found).

    Example:

    >>> assign_gpus(["0", "1", "2"], workers=3, gpus_per_worker=1)
    [['0'], ['1'], ['2']]
    """
    needed = workers * gpus_per_worker
    if len(gpu_ids) < needed:
        found = ", ".join(gpu_ids) if gpu_ids else "none"
        raise ValueError(
            f"gpus_per_worker={gpus_per_worker} for {workers} worker(s) needs {needed} GPU(s), "
            f"but {len(gpu_ids)} are visible to the launcher (found: {found}; from "
            f"CUDA_VISIBLE_DEVICES if set, else nvidia-smi -L). Lower --gpus-per-worker or "
            f"--workers, or leave --gpus-per-worker out to let every worker see every GPU.")
    return [list(gpu_ids[rank * gpus_per_worker:(rank + 1) * gpus_per_worker])
            for rank in range(workers)]
