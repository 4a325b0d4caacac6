"""The full benchmark report: scaling sweep, settings comparison, input check.

Order of work: the sweep points first (each in fresh processes, while this
process only waits), then, in this process, the matmul peaks and the
settings comparison with the input-pipeline probe, all alternating. Results
go to `report.md`, `results.json` and `scaling.png` in the output folder.

Example:

    result = run_report(ReportOptions(models=("transformer",), quick=True, out_dir="out"))
"""

import dataclasses
import datetime
import os
import platform
import sys

from tfdist.bench.load import LoadMonitor
from tfdist.bench.workloads import QUICK_DATA, Workload
from tfdist.precision import cpu_model_name

QUICK = {
    "transformer": dict(size="tiny", batch=8, **QUICK_DATA["transformer"]),
    "cnn": dict(size="resnet_tiny", batch=16, **QUICK_DATA["cnn"]),
}
"""Small workloads of `--quick` (for tests: seconds per step, not minutes)."""

FULL = {
    "transformer": dict(size="tiny", sequence_length=128, vocab_size=8000, batch=16),
    "cnn": dict(size="resnet_tiny", image_size=None, batch=64),
}
"""Workloads of the default report, sized so that the whole default run
(sweep over 1..2 replicas and 1..2 workers, settings comparison, input
check, for both models) finishes in under 10 minutes on 2 CPU cores."""


ROUNDS = dict(rounds=3, steps=3, sweep_rounds=2, sweep_steps=3, warmup_steps=2)
"""How long the default report measures: the settings comparison's alternating
rounds and steps, the same for every sweep point, and the untimed steps before."""

QUICK_ROUNDS = dict(rounds=1, steps=2, sweep_rounds=1, sweep_steps=2, warmup_steps=1)
"""The same under `--quick`; a value given explicitly wins."""


@dataclasses.dataclass
class ReportOptions:
    """What `run_report` measures (the CLI's flags).

    Args:
        models: "transformer" and/or "cnn".
        out_dir: output folder.
        quick: tiny workloads and one short round (for tests).
        sizes: `{model: size}` overrides.
        batch: per-replica (weak) or global (strong) batch; None: per model.
        scaling: "weak" or "strong".
        max_replicas, max_workers: sweep extent (0 replicas: no sweep).
        precision, xla: the sweep's tfdist settings.
        factors: settings comparison factors ("precision", "xla",
            "engine"); empty for none.
        rounds, steps: alternating rounds and steps of the comparison.
        sweep_rounds, sweep_steps: the same for every sweep point.
        warmup_steps: untimed steps before each measurement.
            These five left None take `ROUNDS` (`QUICK_ROUNDS` when `quick`).
        sweep_repeats: runs of the whole sweep (each point keeps its median).
        profile: profile 2 steps of each compared setting into
            `out_dir/profiles/<model>/` for the step-time shares by op kind.
        sequence_length, vocab_size: of the Transformer's synthetic tokens.
        data: the Transformer's data, "synthetic" or "embedded".
        point_timeout: seconds per sweep point.
        command: the command line, for the report.

    Example:

    >>> ReportOptions(models=("cnn",), quick=True).batch_for("cnn")
    16
    """

    models: tuple = ("transformer", "cnn")
    out_dir: str = "bench-results"
    quick: bool = False
    sizes: dict = dataclasses.field(default_factory=dict)
    batch: int = None
    scaling: str = "weak"
    max_replicas: int = 2
    max_workers: int = 2
    precision: str = "float32"
    xla: str = "auto"
    factors: tuple = ("precision", "xla", "engine")
    rounds: int = None
    steps: int = None
    sweep_rounds: int = None
    sweep_steps: int = None
    warmup_steps: int = None
    sweep_repeats: int = 1
    profile: bool = True
    sequence_length: int = None
    vocab_size: int = None
    data: str = None
    point_timeout: float = 600.0
    command: str = ""

    def __post_init__(self):
        for name, value in (QUICK_ROUNDS if self.quick else ROUNDS).items():
            if getattr(self, name) is None:
                setattr(self, name, value)

    def workload(self, model):
        """The `Workload` of `model` under these options.

        Args:
            model: "transformer" or "cnn".

        Example:

        >>> ReportOptions(quick=True).workload("transformer").size
        'tiny'
        """
        base = (QUICK if self.quick else FULL)[model]
        options = {"size": self.sizes.get(model, base["size"])}
        if model == "transformer":
            options.update(sequence_length=self.sequence_length or base["sequence_length"],
                           vocab_size=self.vocab_size or base["vocab_size"], data=self.data)
        else:
            options["image_size"] = base["image_size"]
        return Workload(model, **options)

    def batch_for(self, model):
        """The sweep's batch (per replica for weak scaling, global for strong).

        Args:
            model: "transformer" or "cnn".

        Example:

        >>> ReportOptions().batch_for("transformer")
        16
        """
        return self.batch or (QUICK if self.quick else FULL)[model]["batch"]


def machine_meta(command=""):
    """What the figures were measured on.

    Args:
        command: the command line, recorded as is.

    Example:

    >>> machine_meta()["device_kind"]
    'CPU'
    """
    import keras
    import tensorflow as tf

    from tfdist.distribute.devices import gpu_count

    gpus = gpu_count()
    machine = (f"{gpus} GPU(s)" if gpus else f"{os.cpu_count()} CPU cores ({cpu_model_name()})")
    return {"device_kind": "GPU" if gpus else "CPU", "machine": machine,
            "tensorflow": tf.__version__, "keras": keras.__version__,
            "python": platform.python_version(),
            "date": datetime.datetime.now().isoformat(timespec="seconds"),
            "command": command}


def check_report_options(options):
    """Checks every model's workload and sweep batch of `options` before any work.

    Raises:
        ValueError: an unknown size or data, or a strong-scaling batch that
            does not split over a sweep point's replicas.

    Example:

    >>> check_report_options(ReportOptions(sizes={"transformer": "huge"}))
    Traceback (most recent call last):
    ValueError: Unknown transformer size 'huge' ...
    """
    from tfdist.bench.sweep import global_batch_for, sweep_points

    points = (sweep_points(options.max_replicas, max(options.max_workers, 1))
              if options.max_replicas > 0 else [])
    for model in options.models:
        options.workload(model)
        batch = options.batch_for(model)
        for point in points:
            global_batch_for(point, options.scaling, batch)


def run_report(options, log=print):
    """Runs the sweep and comparisons of `options` and writes the outputs.

    Args:
        options: a `ReportOptions`.
        log: called with progress lines.

    Example:

    >>> run_report(ReportOptions(quick=True, out_dir="/tmp/bench"))["outputs"]
    ['/tmp/bench/report.md', '/tmp/bench/results.json', '/tmp/bench/scaling.png']

    Returns:
        The result dict (also written to `results.json`): `meta`, `peaks`,
        `scaling` ({model: {workload, mode, batch_label, rows}}),
        `settings` ({model: comparison report}), `load`, `outputs`.
    """
    from tfdist.bench import report as report_lib
    from tfdist.bench.compare import format_comparison
    from tfdist.bench.peak import QUICK_SIZE, measure_matmul_peak
    from tfdist.bench.settings import TITLE, compare_settings
    from tfdist.bench.sweep import run_sweep, sweep_points

    check_report_options(options)
    monitor = LoadMonitor().start()
    quick = options.quick
    result = {"meta": machine_meta(options.command), "peaks": {}, "scaling": {},
              "settings": {}}
    sweeps = {}
    if options.max_replicas > 0:
        points = sweep_points(options.max_replicas, max(options.max_workers, 1))
        for model in options.models:
            workload = options.workload(model)
            batch = options.batch_for(model)
            log(f"Scaling sweep, {workload.label}, {options.scaling} scaling "
                f"({'per-replica' if options.scaling == 'weak' else 'global'} batch {batch}):")
            sweeps[model] = run_sweep(
                workload, points, mode=options.scaling, batch=batch, precision=options.precision,
                xla=options.xla, rounds=options.sweep_rounds, steps=options.sweep_steps,
                warmup_steps=options.warmup_steps,
                out_dir=options.out_dir, timeout=options.point_timeout,
                repeats=options.sweep_repeats, log=log)
    if sweeps:
        peak_policy = sweeps_precision(sweeps, options.precision)
        peak = measure_matmul_peak(peak_policy, size=QUICK_SIZE if quick else 2048)
        result["peaks"][peak_policy] = peak["flops_per_sec"]
        for model, points in sweeps.items():
            batch = options.batch_for(model)
            result["scaling"][model] = {
                "workload": options.workload(model).label, "mode": options.scaling,
                "batch_label": (f"per-replica batch {batch}" if options.scaling == "weak"
                                else f"global batch {batch}"),
                "rows": report_lib.scaling_rows(points, peak["flops_per_sec"])}
    if options.factors:
        for model in options.models:
            workload = options.workload(model)
            log(f"Settings comparison, {workload.label}:")
            # One replica: the sweep's batch is then the global batch in both modes.
            settings = compare_settings(
                workload, options.batch_for(model), factors=options.factors,
                rounds=options.rounds, steps=options.steps, warmup_steps=options.warmup_steps,
                profile_dir=(os.path.join(options.out_dir, "profiles", model)
                             if options.profile else None),
                peak_size=QUICK_SIZE if quick else None, log=log)
            result["settings"][model] = settings
            log(format_comparison(settings, TITLE))
    result["load"] = monitor.stop()
    result["outputs"] = report_lib.write_report(result, options.out_dir, log=log)
    return result


def sweeps_precision(sweeps, asked):
    """The resolved precision of the sweep points (what the peak must use).

    Args:
        sweeps: `{model: sweep points}`.
        asked: the precision asked for (used when no point succeeded).

    Example:

    >>> sweeps_precision({"cnn": [{"precision": "float32"}]}, "auto")
    'float32'
    """
    for points in sweeps.values():
        for point in points:
            if "error" not in point and point.get("precision"):
                return point["precision"]
    if asked == "auto":
        from tfdist.precision import resolve_precision
        return resolve_precision("auto").policy
    return asked


def command_line(argv):
    """The command line as typed, for the report.

    Args:
        argv: the arguments after `bench`.

    Example:

    >>> command_line(["--quick"])
    'tfdist bench --quick'
    """
    return " ".join(["tfdist bench"] + list(argv if argv is not None else sys.argv[1:]))
