"""`tfdist doctor`: what this installation and machine are, and whether all-reduce works.

    tfdist doctor                     # versions, build, devices, CPU, auto choices, check
    tfdist doctor --skip-allreduce    # everything but the check (no strategy is built)
    tfdist doctor --tf-log-level 0    # with everything TensorFlow's C++ runtime says

It prints, in one aligned block: the tfdist, Python, TensorFlow and Keras
versions; what TensorFlow was built with (CUDA, cuDNN, NCCL, or that they
are not in this build); the physical devices TensorFlow sees (GPUs with name
and compute capability); the CPU's model and the feature flags that decide
precision and speed (taken from `$TFDIST_CPU_FLAGS` when it is set); what
`--precision auto` and `--xla auto` pick on this machine and why; and then
a real check: a 2-replica `MirroredStrategy` (two GPUs, or the CPU split
into two logical devices) all-reduces known values and compares the sum.
Exit status 0 when the check passes (or is skipped), 1 when it fails.

Example:

    from tfdist.cli.doctor import main
    main(["--skip-allreduce"])
"""

import argparse
import dataclasses
import importlib.metadata
import os
import platform
import sys
import threading
import time

from tfdist import __version__
from tfdist.precision import CPU_FLAGS_ENV, cpu_flags, cpu_model_name, detect_precision
from tfdist.runtime.argtypes import seconds
from tfdist.runtime.cpu_allocator import (cpu_allocator_in_use, describe_cpu_allocator,
                                          pool_limit_problem)
from tfdist.runtime.onednn import describe_onednn
from tfdist.runtime.tf_logging import add_tf_log_level_flag, import_tensorflow
from tfdist.xla import leave_uncompiled_where_slower, resolve_xla

# TensorFlow is imported in `main` through `import_tensorflow` (quiet), after
# the flags are read: nothing at module level imports it.

FEATURE_FLAGS = ("avx2", "fma", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16")
"""CPU feature flags that matter to TensorFlow's speed and to `--precision auto`."""

TENSORFLOW_DISTRIBUTIONS = ("tensorflow", "tensorflow-cpu", "tensorflow-gpu", "tensorflow-intel",
                            "tensorflow-macos", "tf-nightly", "tf-nightly-cpu")
"""pip distributions that install the `tensorflow` package, in the order asked."""

NCCL_DISTRIBUTIONS = ("nvidia-nccl-cu12", "nvidia-nccl-cu13", "nvidia-nccl-cu11")
CHECK_REPLICAS = 2
CHECK_TIMEOUT = 120.0
ALLREDUCE_LABEL = "all-reduce"


def installed_version(*names):
    """The version of the first of `names` installed as a pip distribution.

    Reads package metadata only: nothing is imported.

    Args:
        names: distribution names, e.g. "tensorflow", "tensorflow-cpu".

    Returns:
        `(name, version)` of the first one installed, or None.

    Example:

    >>> installed_version("no-such-distribution") is None
    True
    >>> installed_version("keras")[0]
    'keras'
    """
    for name in names:
        try:
            return name, importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def package_versions():
    """Versions of tfdist, Python, TensorFlow and Keras, without importing TensorFlow.

    Returns:
        `{"tfdist": ..., "Python": ..., "TensorFlow": ..., "Keras": ...}`;
        a package that is not installed has None. TensorFlow's value names
        its distribution when it is not plain `tensorflow`
        (e.g. "2.21.0 (tensorflow-cpu)").

    Example:

    >>> package_versions()["tfdist"] == __version__
    True
    """
    tensorflow = installed_version(*TENSORFLOW_DISTRIBUTIONS)
    keras = installed_version("keras")
    if tensorflow and tensorflow[0] != "tensorflow":
        tensorflow_text = f"{tensorflow[1]} ({tensorflow[0]})"
    else:
        tensorflow_text = tensorflow[1] if tensorflow else None
    return {"tfdist": __version__, "Python": platform.python_version(),
            "TensorFlow": tensorflow_text, "Keras": keras[1] if keras else None}


def format_version(versions=None):
    """The text of `tfdist --version`: tfdist's version, then what it runs on.

    Args:
        versions: a `package_versions()` dict (read when None).

    Example:

    >>> print(format_version({"tfdist": "0.1.0", "Python": "3.12.3",
    ...                       "TensorFlow": "2.21.0", "Keras": None}))
    tfdist 0.1.0
    TensorFlow 2.21.0, Keras not installed, Python 3.12.3
    """
    versions = package_versions() if versions is None else versions
    found = [f"{name} {versions.get(name) or 'not installed'}"
             for name in ("TensorFlow", "Keras", "Python")]
    return f"tfdist {versions['tfdist']}\n" + ", ".join(found)


def format_report(sections, width=None):
    """An aligned text block: section titles, then indented `label  value` rows.

    Args:
        sections: a list of `(title, rows)`; rows are `(label, value)`
            pairs. A value with line breaks continues under its first line.
        width: the label column's width (default: the longest label).

    Returns:
        The block, without a final newline.

    Example:

    >>> print(format_report([("Versions", [("tfdist", "0.1.0"), ("TensorFlow", "2.21.0")])]))
    Versions
      tfdist      0.1.0
      TensorFlow  2.21.0
    """
    if width is None:
        width = label_width(sections)
    lines = []
    for title, rows in sections:
        lines.append(title)
        for label, value in rows:
            first, *more = str(value).split("\n")
            lines.append(f"  {label:<{width}}  {first}".rstrip())
            lines += [f"  {'':<{width}}  {line}".rstrip() for line in more]
    return "\n".join(lines)


def label_width(sections):
    """The width of the longest row label of `sections` (see `format_report`).

    Example:

    >>> label_width([("A", [("cpu", 1), ("precision", 2)]), ("B", [])])
    9
    """
    return max((len(label) for _, rows in sections for label, _ in rows), default=0)


def select_features(flags):
    """Which of `FEATURE_FLAGS` the CPU has, and which it lacks.

    Args:
        flags: a set of CPU feature flags (`tfdist.precision.cpu_flags`).

    Returns:
        `(present, absent)`: two lists in `FEATURE_FLAGS` order.

    Example:

    >>> select_features({"avx2", "fma", "sse4_2"})
    (['avx2', 'fma'], ['avx512f', 'avx512_bf16', 'amx_tile', 'amx_bf16'])
    """
    present = [flag for flag in FEATURE_FLAGS if flag in flags]
    return present, [flag for flag in FEATURE_FLAGS if flag not in flags]


def describe_features(flags, from_env=False):
    """One line: the feature flags that matter, present and absent, and their source.

    Args:
        flags: a set of CPU feature flags.
        from_env: True when they come from `$TFDIST_CPU_FLAGS`, not the CPU.

    Example:

    >>> describe_features({"avx2", "fma"}, from_env=True)
    'avx2 fma; absent: avx512f avx512_bf16 amx_tile amx_bf16 (from $TFDIST_CPU_FLAGS)'
    """
    present, absent = select_features(flags)
    text = " ".join(present) or "none of " + " ".join(FEATURE_FLAGS)
    if present and absent:
        text += "; absent: " + " ".join(absent)
    if from_env:
        text += f" (from ${CPU_FLAGS_ENV})"
    return text


def nvidia_packages():
    """The installed `nvidia-*` pip distributions (CUDA libraries), `{name: version}`.

    Example:

    >>> nvidia_packages()  # after `pip install "tfdist[cuda]"`
    {'nvidia-cublas-cu12': '12.5.3.2', 'nvidia-nccl-cu12': '2.23.4', ...}
    """
    found = {}
    for dist in importlib.metadata.distributions():
        name = (dist.metadata["Name"] or "").lower()
        if name.startswith("nvidia-"):
            found[name] = dist.version
    return dict(sorted(found.items()))


def build_rows(build_info, packages):
    """Rows of what TensorFlow was built with: CUDA, cuDNN, NCCL, CUDA libraries.

    Args:
        build_info: `tf.sysconfig.get_build_info()` (a dict).
        packages: `nvidia_packages()`.

    Returns:
        A list of `(label, value)` rows; what is absent says so.

    Example:

    >>> build_rows({"is_cuda_build": False}, {})[0]
    ('CUDA', 'not in this build (CPU-only TensorFlow)')
    """
    nccl = next(((name, packages[name]) for name in NCCL_DISTRIBUTIONS if name in packages), None)
    nccl_pip = f"{nccl[1]} (pip {nccl[0]})" if nccl else None
    if build_info.get("is_rocm_build"):
        rows = [("ROCm", build_info.get("rocm_version") or "yes (version not in the build info)"),
                ("CUDA", "not in this build (ROCm TensorFlow)"),
                ("cuDNN", "not in this build"),
                ("NCCL", build_info.get("nccl_version") or "not in this build (ROCm uses RCCL)")]
        return rows
    if not build_info.get("is_cuda_build"):
        return [("CUDA", "not in this build (CPU-only TensorFlow)"),
                ("cuDNN", "not in this build"),
                ("NCCL", "not in this build")]
    cuda = build_info.get("cuda_version") or "yes (version not in the build info)"
    archs = build_info.get("cuda_compute_capabilities")
    if archs:
        cuda += f" (built against; kernels for {', '.join(archs)})"
    nccl_text = build_info.get("nccl_version") or nccl_pip or (
        "unknown: not in the build info and no nvidia-nccl pip package")
    libraries = (", ".join(f"{name} {version}" for name, version in packages.items())
                 if packages else
                 'none from pip (GPUs need them: pip install "tfdist[cuda]", or system CUDA)')
    return [("CUDA", cuda), ("cuDNN", build_info.get("cudnn_version") or "not in the build info"),
            ("NCCL", nccl_text), ("CUDA libraries", libraries)]


def device_rows(cpus, gpus, split=None):
    """Rows of the physical devices TensorFlow sees.

    Args:
        cpus: physical CPU device names.
        gpus: a list of `(name, details)`, details as from
            `tf.config.experimental.get_device_details` (`device_name`,
            `compute_capability`).
        split: the logical CPU devices made for the all-reduce check, or None.

    Example:

    >>> device_rows(["/physical_device:CPU:0"],
    ...             [("/physical_device:GPU:0", {"device_name": "NVIDIA A100-SXM4-40GB",
    ...                                          "compute_capability": (8, 0)})])[1]
    ('GPU 0', 'NVIDIA A100-SXM4-40GB, compute capability 8.0')
    """
    cores = os.cpu_count()
    cpu_text = f"{len(cpus)} physical ({', '.join(cpus)})" if cpus else "none"
    if cores:
        cpu_text += f", {cores} cores"
    if split:
        cpu_text += f"; split into {len(split)} logical devices for the check"
    rows = [("CPU", cpu_text)]
    if not gpus:
        rows.append(("GPU", "none visible to TensorFlow"))
    for index, (name, details) in enumerate(gpus):
        model = details.get("device_name") or name
        capability = details.get("compute_capability")
        text = f"{model}, compute capability {capability[0]}.{capability[1]}" if capability else (
            f"{model}, compute capability unknown")
        rows.append((f"GPU {index}", text))
    return rows


CNN_XLA_LABEL = "--xla auto, CNN"


def auto_rows(precision_choice, jit_compile, xla_reason, cnn_xla=None):
    """Rows of what `--precision auto` and `--xla auto` pick, and why.

    Args:
        precision_choice: a `tfdist.precision.PrecisionChoice`.
        jit_compile, xla_reason: `tfdist.xla.resolve_xla`'s answer.
        cnn_xla: `(jit_compile, reason)` of `--xla auto` for the CNN recipe's
            ResNets, whose step may stay uncompiled where the general rule
            compiles (`tfdist.xla.leave_uncompiled_where_slower`); None leaves
            its row out.

    Example:

    >>> from tfdist.precision import PrecisionChoice
    >>> auto_rows(PrecisionChoice("float32", "auto: no bf16"), True, "auto: fuses",
    ...           cnn_xla=(False, "auto: fused batch norms"))  # doctest: +NORMALIZE_WHITESPACE
    [('--precision auto', 'float32 (auto: no bf16)'), ('--xla auto', 'on (auto: fuses)'),
     ('--xla auto, CNN', 'off (auto: fused batch norms)')]
    """
    rows = [("--precision auto", f"{precision_choice.policy} ({precision_choice.reason})"),
            ("--xla auto", f"{'on' if jit_compile else 'off'} ({xla_reason})")]
    if cnn_xla is not None:
        cnn_jit_compile, cnn_reason = cnn_xla
        rows.append((CNN_XLA_LABEL, f"{'on' if cnn_jit_compile else 'off'} ({cnn_reason})"))
    return rows


@dataclasses.dataclass(frozen=True)
class CheckResult:
    """The outcome of the all-reduce check.

    Attributes:
        ok: whether every replica got the expected sum.
        replicas: replicas in the check.
        expected: the expected sum, 1 + 2 + ... + replicas.
        value: the reduced value (None when none came back).
        seconds: wall time of the check (strategy, trace and run).
        where: the devices, in words.
        error: why the check failed, or None.
        hung: True when the check did not finish within its timeout.

    Example:

    >>> CheckResult(True, 2, 3.0, 3.0, 0.5, "2 logical CPU devices").ok
    True
    """

    ok: bool
    replicas: int
    expected: float
    value: float = None
    seconds: float = 0.0
    where: str = ""
    error: str = None
    hung: bool = False


def cluster_rows(environ=None):
    """The "Cluster" section: what `TF_CONFIG` and SLURM tell this process.

    Args:
        environ: the environment (default `os.environ`).

    Returns:
        `(rows, problem)`: the `(label, value)` rows, and a line naming what
        every recipe would refuse (a malformed `TF_CONFIG`), or None.

    Example:

    >>> cluster_rows({})
    ([('TF_CONFIG', 'unset: this machine trains alone'), ('SLURM', 'not in a SLURM job')], None)
    """
    from tfdist.distribute.tf_config import TFConfigError, parse_tf_config

    environ = os.environ if environ is None else environ
    problem = None
    try:
        config = parse_tf_config(environ.get("TF_CONFIG", ""))
    except TFConfigError as error:
        problem = (f"{str(error).rstrip('.')}. Every recipe refuses it (exit 2): fix "
                   "TF_CONFIG, or unset it to train on this machine alone.")
        tf_config = f"malformed: {problem}"
    else:
        if config is None:
            tf_config = "unset: this machine trains alone"
        else:
            tasks = ", ".join(f"{kind}: {len(addresses)}"
                              for kind, addresses in config.cluster.items())
            tf_config = (f"{tasks}; this task: {config.task_type} {config.task_index}"
                         + (f" at {config.own_address}" if config.own_address else "")
                         + (", the chief" if config.is_chief else ""))
    job = environ.get("SLURM_JOB_ID")
    if job:
        slurm = (f"job {job}, task {environ.get('SLURM_PROCID', '?')} of "
                 f"{environ.get('SLURM_NTASKS', '?')} (read with --cluster-resolver slurm)")
    else:
        slurm = "not in a SLURM job"
    return [("TF_CONFIG", tf_config), ("SLURM", slurm)], problem


def expected_sum(replicas):
    """The sum the check expects: replica i contributes i + 1.

    Example:

    >>> expected_sum(2)
    3.0
    """
    return float(replicas * (replicas + 1) // 2)


def compare_allreduce(replicas, all_reduced, reduced):
    """Compares the check's results with `expected_sum(replicas)`.

    Args:
        replicas: replicas in sync.
        all_reduced: per replica, the values it got from its in-replica
            all-reduce (lists of floats).
        reduced: the values of `strategy.reduce(SUM, ...)` (a list of floats).

    Returns:
        `(ok, error)`: error is None when ok, else names what differed.

    Example:

    >>> compare_allreduce(2, [[3.0, 3.0], [3.0, 3.0]], [3.0, 3.0])
    (True, None)
    >>> compare_allreduce(2, [[3.0], [1.0]], [3.0])
    (False, 'replica 1 all-reduced to [1.0], expected 3.0')
    """
    expected = expected_sum(replicas)
    if len(all_reduced) != replicas:
        return False, f"{len(all_reduced)} replica results came back, expected {replicas}"
    for index, values in enumerate(all_reduced):
        if not values or any(abs(v - expected) > 1e-6 for v in values):
            return False, f"replica {index} all-reduced to {list(values)}, expected {expected}"
    if not reduced or any(abs(v - expected) > 1e-6 for v in reduced):
        return False, f"strategy.reduce(SUM) gave {list(reduced)}, expected {expected}"
    return True, None


def format_check(result):
    """The all-reduce check's line: "ok: ..." or "FAILED: reason".

    Example:

    >>> format_check(CheckResult(True, 2, 3.0, 3.0, 0.52, "2 logical CPU devices"))
    'ok: sum 3.0 (expected 3.0) over 2 replicas on 2 logical CPU devices, 0.52 s'
    >>> format_check(CheckResult(False, 2, 3.0, error="timed out"))
    'FAILED: timed out'
    """
    if not result.ok:
        return f"FAILED: {result.error}"
    return (f"ok: sum {result.value:g} (expected {result.expected:g}) over {result.replicas} "
            f"replicas on {result.where}, {result.seconds:.2f} s")


def check_devices(gpu_count, split=None):
    """The devices of the all-reduce check, and how to say where it runs.

    Args:
        gpu_count: physical GPUs visible.
        split: the logical CPU device names made for the check (used with
            fewer than 2 GPUs).

    Returns:
        `(devices, where)`: the `create_strategy` devices argument and words.

    Example:

    >>> check_devices(4)
    (2, 'GPU 0 and 1')
    >>> check_devices(0, ["/device:CPU:0", "/device:CPU:1"])
    (['/device:CPU:0', '/device:CPU:1'], '2 logical CPU devices')
    """
    if gpu_count >= CHECK_REPLICAS:
        return CHECK_REPLICAS, "GPU 0 and 1"
    return list(split or []), f"{len(split or [])} logical CPU devices"


def _allreduce(devices, where):
    import tensorflow as tf

    from tfdist.distribute.strategy_factory import create_strategy

    start = time.perf_counter()
    strategy = create_strategy("mirrored", devices=devices)
    replicas = int(strategy.num_replicas_in_sync)

    def replica_fn():
        context = tf.distribute.get_replica_context()
        value = tf.cast(context.replica_id_in_sync_group + 1, tf.float32) * tf.ones([4])
        return value, context.all_reduce(tf.distribute.ReduceOp.SUM, value)

    @tf.function
    def step():
        return strategy.run(replica_fn)

    values, all_reduced = step()
    total = strategy.reduce(tf.distribute.ReduceOp.SUM, values, axis=None)
    per_replica = [[float(v) for v in t.numpy()]
                   for t in strategy.experimental_local_results(all_reduced)]
    reduced = [float(v) for v in total.numpy()]
    seconds = time.perf_counter() - start
    ok, error = compare_allreduce(replicas, per_replica, reduced)
    return CheckResult(ok, replicas, expected_sum(replicas), reduced[0] if reduced else None,
                       seconds, where, error)


def run_allreduce_check(devices, where="", timeout=CHECK_TIMEOUT):
    """Builds a MirroredStrategy on `devices` and all-reduces known values.

    Replica i contributes a vector of i + 1; every replica's in-step
    all-reduce (`ReplicaContext.all_reduce`, what gradient aggregation uses)
    and `strategy.reduce(SUM)` must both give 1 + 2 + ... + replicas.

    Args:
        devices: `create_strategy("mirrored", devices=...)`'s argument (a
            count of GPUs, or logical CPU device names).
        where: the devices in words, for the result line.
        timeout: seconds before a check that has not finished (a hung
            collective) is reported as failed.

    Returns:
        A `CheckResult` (never raises: an error is a failed result).

    Example:

    >>> result = run_allreduce_check(["/device:CPU:0", "/device:CPU:1"], "2 logical CPUs")
    >>> result.ok, result.value
    (True, 3.0)
    """
    outcome = []

    def target():
        try:
            outcome.append(_allreduce(devices, where))
        except Exception as error:  # noqa: BLE001 - reported as the check's failure
            outcome.append(CheckResult(False, CHECK_REPLICAS, expected_sum(CHECK_REPLICAS),
                                       where=where, error=f"{type(error).__name__}: {error}"))

    thread = threading.Thread(target=target, name="tfdist-doctor-allreduce", daemon=True)
    thread.start()
    thread.join(timeout)
    if not outcome:
        return CheckResult(False, CHECK_REPLICAS, expected_sum(CHECK_REPLICAS), where=where,
                           error=f"no result after {timeout:g} s (a hung collective?)",
                           hung=True)
    return outcome[0]


def build_parser():
    """The flags of `tfdist doctor` (no arguments; see `--help`).

    Example:

    >>> build_parser().parse_args(["--skip-allreduce"]).skip_allreduce
    True
    """
    parser = argparse.ArgumentParser(
        prog="tfdist doctor",
        description="Show the tfdist, Python, TensorFlow and Keras versions, TensorFlow's build "
                    "(CUDA, cuDNN, NCCL), the devices, the CPU's feature flags, what "
                    "--precision auto and --xla auto pick here, the cluster TF_CONFIG and "
                    "SLURM describe, and check that a 2-replica MirroredStrategy all-reduce "
                    "works (exit 1 when it does not, or when TF_CONFIG is malformed).",
        epilog=f"Set ${CPU_FLAGS_ENV} (e.g. \"avx2 fma\") to see what auto would pick on "
               "another CPU.")
    add_tf_log_level_flag(parser)
    parser.add_argument("--skip-allreduce", action="store_true",
                        help="skip the all-reduce check (no strategy is built)")
    parser.add_argument("--timeout", type=seconds(), default=CHECK_TIMEOUT,
                        help="seconds the all-reduce check may take (default %(default)g)")
    return parser


def _problem_code(problem):
    """0, or 1 with `problem` on standard error."""
    if problem is None:
        return 0
    print(f"tfdist doctor: {problem}", file=sys.stderr, flush=True)
    return 1


def main(argv=None):
    """Runs `tfdist doctor`; returns the exit code.

    Args:
        argv: the flags after `doctor` (default `sys.argv[1:]`).

    Returns:
        0 when the all-reduce check passes or is skipped, 1 when it fails
        or `TF_CONFIG` is malformed, 2 for a bad `$TF_CPP_MIN_LOG_LEVEL`, a
        misspelt flag in `$TFDIST_CPU_FLAGS` or a CPU memory pool limit
        TensorFlow cannot use (`$TF_CPU_BFC_MEM_LIMIT_IN_MB`).

    Example:

    >>> main(["--skip-allreduce"])  # prints the report
    0
    """
    args = build_parser().parse_args(sys.argv[1:] if argv is None else list(argv))
    try:
        flags = cpu_flags()  # a misspelt $TFDIST_CPU_FLAGS is refused before TensorFlow starts
        pool_problem = pool_limit_problem()  # TensorFlow would crash at its first tensor
        if pool_problem is not None:
            raise ValueError(pool_problem)
        tf = import_tensorflow(args.tf_log_level)
    except ValueError as error:
        print(f"tfdist doctor: error: {error}", file=sys.stderr)
        return 2
    gpus = tf.config.list_physical_devices("GPU")
    split, split_error = None, None
    if not args.skip_allreduce and len(gpus) < CHECK_REPLICAS:
        # Before anything initialises TensorFlow's runtime.
        from tfdist.distribute.devices import split_cpu_into_logical_devices

        try:
            split = split_cpu_into_logical_devices(CHECK_REPLICAS)
        except Exception as error:  # noqa: BLE001 - reported as the check's failure
            split_error = f"{type(error).__name__}: {error}"
    gpu_details = []
    for gpu in gpus:
        try:
            gpu_details.append((gpu.name, tf.config.experimental.get_device_details(gpu)))
        except Exception:  # noqa: BLE001 - a device without details is still listed
            gpu_details.append((gpu.name, {}))
    capabilities = [tuple(details.get("compute_capability") or (0, 0))
                    for _, details in gpu_details]
    choice = detect_precision(gpu_capabilities=capabilities, flags=flags)
    jit_compile, xla_reason = resolve_xla("auto", choice.policy, on_gpu=bool(gpus))
    from tfdist.models.builders import FUSED_BATCH_NORM_BEATS_XLA  # the models import Keras

    cnn_xla = leave_uncompiled_where_slower("auto", jit_compile, xla_reason,
                                            FUSED_BATCH_NORM_BEATS_XLA, on_gpu=bool(gpus))

    cluster, cluster_problem = cluster_rows()
    versions = package_versions()
    distribution = installed_version(*TENSORFLOW_DISTRIBUTIONS)
    versions["TensorFlow"] = tf.__version__ + (
        f" ({distribution[0]})" if distribution and distribution[0] != "tensorflow" else "")
    sections = [
        ("Versions", [(name, value or "not installed") for name, value in versions.items()]
         + [("Python path", sys.executable)]),
        ("TensorFlow build", build_rows(dict(tf.sysconfig.get_build_info()), nvidia_packages())),
        ("Devices", device_rows([d.name for d in tf.config.list_physical_devices("CPU")],
                                gpu_details, split)),
        ("CPU", [("model", cpu_model_name()),
                 ("flags", describe_features(flags, from_env=CPU_FLAGS_ENV in os.environ)),
                 ("oneDNN", describe_onednn()),
                 ("tensor memory", describe_cpu_allocator(cpu_allocator_in_use()))]),
        ("Auto choices", auto_rows(choice, jit_compile, xla_reason, cnn_xla)),
        ("Cluster", cluster),
    ]
    check_section = "All-reduce check (MirroredStrategy, 2 replicas)"
    width = max(label_width(sections), len(ALLREDUCE_LABEL))
    print(format_report(sections, width), flush=True)
    if args.skip_allreduce:
        print(format_report([(check_section, [(ALLREDUCE_LABEL, "skipped (--skip-allreduce)")])],
                            width), flush=True)
        return _problem_code(cluster_problem)
    devices, where = check_devices(len(gpus), split)
    if split_error:
        result = CheckResult(False, CHECK_REPLICAS, expected_sum(CHECK_REPLICAS), where=where,
                             error=f"could not split the CPU into {CHECK_REPLICAS} logical "
                                   f"devices: {split_error}")
    else:
        result = run_allreduce_check(devices, where, timeout=args.timeout)
    print(format_report([(check_section, [(ALLREDUCE_LABEL, format_check(result))])], width),
          flush=True)
    if result.ok:
        return _problem_code(cluster_problem)
    if result.hung:
        # A collective that hangs keeps TensorFlow's threads busy; do not wait for them.
        sys.stderr.flush()
        os._exit(1)
    return 1


if __name__ == "__main__":
    sys.exit(main())
