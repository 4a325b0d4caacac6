"""Comparing settings in one process: build entrants, alternate, report ratios.

An `Entrant` is a `Setting` under a named strategy; a comparison is a pair
of entrant names whose throughput ratio is reported (the median of the
round-by-round ratios, see `figures.paired_ratio`). The engine benchmark
(`engine_compare`) and the settings benchmark (`settings`) are both lists of
entrants and comparisons run through `run_comparison`.

Example:

    entrants = [Entrant("fp32", Setting("tfdist", "float32", "off")),
                Entrant("bf16", Setting("tfdist", "mixed_bfloat16", "off"))]
    report = run_comparison(entrants, [("bf16 vs fp32", "bf16", "fp32")],
                            Workload("transformer", size="small"), global_batch_size=32)
    print(format_comparison(report))
"""

import dataclasses
import logging
import os
import time

from tfdist.bench import figures as fig
from tfdist.bench.alternate import run_rounds, summarise, summarise_times
from tfdist.bench.engines import Contender, Setting
from tfdist.bench.load import LoadMonitor

logger = logging.getLogger("tfdist")


@dataclasses.dataclass(frozen=True)
class Entrant:
    """A contender to build: a `Setting` under a named strategy.

    Args:
        name: a unique short name, e.g. "tfdist fp32 xla-off".
        setting: the `Setting`.
        strategy: a `tfdist.distribute.strategy_factory.create_strategy` name ("default",
            "one_device", "mirrored", "auto", ...).
        devices: devices for the strategy (None: its default).
        optional: when building or warming it up fails (e.g. a precision
            this machine cannot run), report it as unsupported and go on.

    Example:

    >>> Entrant("bf16", Setting("tfdist", "mixed_bfloat16", "off"), optional=True).strategy
    'default'
    """

    name: str
    setting: Setting
    strategy: str = "default"
    devices: int = None
    optional: bool = False


class PipelineProbe:
    """The input pipeline alone, as a contender that alternates with training.

    `run(steps)` fetches `steps * batches_per_step` global batches from the
    training pipeline (the same source, batch and shuffling) and returns
    the time of each batch.

    Args:
        workload: the `Workload`.
        global_batch_size: examples per batch.
        seed: shuffle seed.
        batches_per_step: batches fetched per requested step (the pipeline
            is much faster than training; more batches give a steadier rate).

    Example:

    >>> probe = PipelineProbe(Workload("cnn"), 128)
    >>> probe.warm_up()
    >>> len(probe.run(2))
    40
    """

    policy = "float32"
    inputs = ("pipeline",)
    num_replicas = 1
    flops_per_example = None
    strategy_name = "none"

    def __init__(self, workload, global_batch_size, seed=0, batches_per_step=20):
        from tfdist.data import make_dataset_fn

        data = workload.build_data(global_batch_size)
        self.global_batch_size = global_batch_size
        self.tokens_per_example = data.tokens_per_example
        self.batches_per_step = batches_per_step
        self._dataset = make_dataset_fn(data.train, global_batch_size, training=True,
                                        seed=seed)(None)

    def run(self, steps, input="pipeline", warmup_steps=1):
        """Fetches batches; returns per-batch seconds.

        Args:
            steps: requested steps (`steps * batches_per_step` batches are timed).
            input: ignored (the pipeline is the input); for the contender interface.
            warmup_steps: batches fetched first and left out (iterator start-up).

        Example:

        >>> len(PipelineProbe(Workload("cnn"), 128, batches_per_step=10).run(2))
        20
        """
        iterator = iter(self._dataset)
        for _ in range(warmup_steps):
            next(iterator)
        times = []
        last = time.perf_counter()
        for _ in range(steps * self.batches_per_step):
            next(iterator)
            now = time.perf_counter()
            times.append(now - last)
            last = now
        return times

    def warm_up(self, steps=2, inputs=("pipeline",)):
        """Builds the iterator once (file reads, shuffle buffer), unmeasured.

        Args:
            steps: steps to fetch (times `batches_per_step`).
            inputs: ignored; for the contender interface.

        Example:

        >>> probe.warm_up()
        """
        self.run(steps, warmup_steps=0)

    def describe(self):
        """What this contender is, in the keys of `Contender.describe`.

        Example:

        >>> probe.describe()["engine"]
        'input pipeline only'
        """
        return {"engine": "input pipeline only", "precision": self.policy, "xla": False,
                "xla_reason": "no model"}


PIPELINE = "input pipeline"
"""Name of the `PipelineProbe` entry in a comparison report."""


def build_entrants(entrants, workload, global_batch_size, seed=0, log=None):
    """Builds a `Contender` per entrant.

    An entrant that resolves to exactly what an earlier one is (same engine,
    strategy, devices, precision and XLA) shares that contender instead of
    being measured twice. An optional entrant that fails to build is left
    out and reported as unsupported.

    Args:
        entrants: a list of `Entrant`s.
        workload: the `Workload` every contender trains.
        global_batch_size: examples per step.
        seed: weights and data order.
        log: called with a line per unsupported entrant, or None.

    Returns:
        `(contenders, alias, unsupported)`: `{name: Contender}` of the
        distinct ones, `{entrant name: measured contender name}`, and
        `{entrant name: error message}`.

    Example:

    >>> contenders, alias, _ = build_entrants(engine_entrants()[0], Workload("cnn"), 64)
    >>> alias["keras defaults"]  # jit_compile="auto" is off on a CPU-only machine
    'keras fp32 xla-off'
    """
    from tfdist.distribute.strategy_factory import create_strategy

    log = log or (lambda line: None)
    strategies, contenders, alias, keys, unsupported = {}, {}, {}, {}, {}
    for entrant in entrants:
        key = (entrant.strategy, entrant.devices)
        if key not in strategies:
            strategies[key] = create_strategy(entrant.strategy, devices=entrant.devices)
        try:
            contender = Contender(entrant.setting, workload, strategies[key], global_batch_size,
                                  seed=seed)
        except Exception as error:  # noqa: BLE001 - reported, not hidden
            if not entrant.optional:
                raise
            unsupported[entrant.name] = f"{type(error).__name__}: {error}"
            log(f"  {entrant.name}: not supported here ({unsupported[entrant.name][:200]})")
            continue
        identity = (entrant.setting.engine, entrant.setting.loss, contender.strategy_name,
                    entrant.devices, contender.policy, contender.jit_compile)
        if identity in keys:
            alias[entrant.name] = keys[identity]
            continue
        keys[identity] = entrant.name
        alias[entrant.name] = entrant.name
        contenders[entrant.name] = contender
    return contenders, alias, unsupported


def _warm_up(contenders, entrants, steps, unsupported, log, inputs=("pipeline",)):
    optional = {e.name for e in entrants if e.optional}
    for name in list(contenders) if steps else ():
        start = time.perf_counter()
        try:
            contenders[name].warm_up(steps, inputs)
        except Exception as error:  # noqa: BLE001 - reported, not hidden
            if name not in optional:
                raise
            unsupported[name] = f"{type(error).__name__}: {error}"
            log(f"  {name}: not supported here ({unsupported[name][:200]})")
            del contenders[name]
            continue
        log(f"  warm-up {name}: {time.perf_counter() - start:.0f} s")


REFERENCE_PEAKS = ("float32", "mixed_bfloat16")
"""Precisions whose matmul peak a comparison measures even when no contender
runs in them, so that the fastest peak of the machine is known (bfloat16 is
often twice float32 on a recent CPU); each takes about a second."""


def _measure_peaks(policies, reference, size, peaks, errors, log):
    from tfdist.bench.peak import measure_matmul_peak

    for policy in policies:
        if policy in errors:
            continue
        try:
            flops = measure_matmul_peak(policy, size=size)["flops_per_sec"]
        except Exception as error:  # noqa: BLE001 - reported, not hidden
            if policy not in reference:
                raise
            errors[policy] = f"{type(error).__name__}: {error}"
            log(f"  matmul peak {policy}: not measured here ({errors[policy][:200]})")
            continue
        peaks[policy] = max(peaks.get(policy, 0.0), flops)


def run_comparison(entrants, comparisons, workload, global_batch_size, *, rounds=5, steps=4,
                   warmup_steps=2, seed=0, measure_peaks=True, pipeline_probe=False,
                   peak_size=None, profile_dir=None, input_share=False,
                   reference_peaks=REFERENCE_PEAKS, log=None):
    """Builds the entrants, runs them in alternating rounds and reports.

    Args:
        entrants: a list of `Entrant`s (unique names).
        comparisons: a list of `(label, numerator entrant, denominator
            entrant)`; the ratio is numerator / denominator throughput. The
            denominator may be a tuple of entrants: the fastest of them
            measured (`fastest_of`).
        workload: a `tfdist.bench.workloads.Workload`.
        global_batch_size: examples per step.
        rounds: alternating rounds, >= 1.
        steps: measured steps per contender and round.
        warmup_steps: unmeasured steps per contender before the rounds.
        seed: weights and data order (the same for every contender).
        measure_peaks: measure the matmul peak of each precision in use
            and of `reference_peaks`, before and after the rounds (the best
            counts), for MFU against the contender's own precision and
            against the fastest peak of the run.
        pipeline_probe: also alternate the input pipeline alone
            (`PipelineProbe`), for the input-bound check.
        peak_size: side of the peak matmul (None: `peak.DEFAULT_SIZE`).
        profile_dir: after the rounds, profile 2 steps of each contender
            into `profile_dir/<name>` and add where the time goes
            (`tfdist.bench.profile`) to the report as `profiles`; with
            `input_share`, the profiled steps train on the batch replayed
            from memory (no input wait in the op times), and each
            contender gets `step_shares` (`figures.step_time_shares`).
        input_share: also run every contender on one batch replayed from
            memory, in the same alternating rounds, for its input-wait share
            (`input_wait_share`, `compute_step_time_ms`).
        reference_peaks: precisions whose peak is measured even when no
            contender uses them (a failure there is reported in
            `peak_errors`, not raised).
        log: called with progress lines, or None.

    Returns:
        A JSON-able dict: `workload`, `global_batch_size`, `rounds`,
        `steps`, `contenders` ({name: figures}), `comparisons` (label,
        numerator, denominator, their examples/s, `ratio`, `low`, `high`,
        `rounds`; or `error` when one side is unsupported), `unsupported`,
        `peaks` ({precision: FLOP/s}), `fastest_peak` ({precision,
        flops_per_sec}; each contender with model FLOPs then has
        `mfu_vs_fastest_peak`, `fastest_peak_precision` and
        `fastest_peak_flops_per_sec`), `peak_errors`, `load` (see
        `LoadMonitor`), with the probe `input_pipeline`, and with a
        profile `profiles` and `profile_input`.

    Example:

    >>> report = run_comparison(entrants, [("bf16 vs fp32", "bf16", "fp32")],
    ...                         Workload("transformer", size="tiny"), 16, rounds=3)
    >>> report["comparisons"][0]["ratio"]
    0.53
    """
    from tfdist.bench.peak import DEFAULT_SIZE

    names = [e.name for e in entrants]
    if len(set(names)) != len(names):
        raise ValueError(f"Entrant names must be unique, got {names}.")
    for label, a, b in comparisons:
        if a not in names or not set(_as_tuple(b)) <= set(names):
            raise ValueError(f"Comparison {label!r} names {a!r} and {b!r}; entrants are {names}.")
    log = log or (lambda line: None)
    monitor = LoadMonitor().start()
    contenders, alias, unsupported = build_entrants(entrants, workload, global_batch_size,
                                                    seed=seed, log=log)
    inputs = ("pipeline", "memory") if input_share else ("pipeline",)
    _warm_up(contenders, entrants, warmup_steps, unsupported, log, inputs)
    if pipeline_probe:
        contenders[PIPELINE] = PipelineProbe(workload, global_batch_size, seed=seed)
        contenders[PIPELINE].warm_up()
    size = peak_size or DEFAULT_SIZE
    peaks, peak_errors = {}, {}
    in_use = {c.policy for n, c in contenders.items() if n != PIPELINE}
    reference = set(reference_peaks) - in_use
    policies = sorted(in_use | reference)
    if measure_peaks:
        _measure_peaks(policies, reference, size, peaks, peak_errors, log)
    results = run_rounds(contenders, rounds, steps, inputs=inputs, warmup_steps=0, log=log)
    if measure_peaks:
        _measure_peaks(policies, reference, size, peaks, peak_errors, log)
    summaries = {}
    for name, contender in contenders.items():
        if name == PIPELINE:
            continue
        summaries[name] = summarise(contender, results[name], peaks.get(contender.policy))
        summaries[name]["strategy"] = contender.strategy_name
        if peaks and summaries[name].get("model_flops_per_sec") is not None:
            summaries[name].update(
                fig.mfu_vs_fastest_peak(summaries[name]["model_flops_per_sec"], peaks))
    profiles = {}
    profile_input = "memory" if input_share else "pipeline"
    if profile_dir:
        from tfdist.bench.profile import capture_profile, summarise_profile

        for name, contender in contenders.items():
            if name != PIPELINE:
                folder = os.path.join(profile_dir, name.replace(" ", "_"))
                profiles[name] = summarise_profile(capture_profile(contender, folder,
                                                                   input=profile_input))
                wait = summaries[name].get("input_wait_share")
                if wait is not None and profiles[name]["total"] > 0:
                    summaries[name]["step_shares"] = fig.step_time_shares(
                        {kind: v["share"] for kind, v in profiles[name]["kinds"].items()}, wait)
    report = {"workload": dataclasses.asdict(workload), "workload_label": workload.label,
              "global_batch_size": global_batch_size, "rounds": rounds, "steps": steps,
              "contenders": summaries, "unsupported": unsupported,
              "peaks": peaks, "peak_matmul_size": size, "peak_errors": peak_errors}
    if peaks:
        precision, flops = fig.fastest_peak(peaks)
        report["fastest_peak"] = {"precision": precision, "flops_per_sec": flops}
    report["comparisons"] = [
        _comparison(label, alias.get(a, a), fastest_of(b, alias, summaries), results, summaries,
                    unsupported)
        for label, a, b in comparisons]
    if profiles:
        report["profiles"] = profiles
        report["profile_input"] = profile_input
    if pipeline_probe:
        report["input_pipeline"] = input_check(results[PIPELINE], summaries, alias,
                                               entrants[0].name)
    report["load"] = monitor.stop()
    return report


def _as_tuple(names):
    return names if isinstance(names, tuple) else (names,)


def fastest_of(names, alias, summaries):
    """The measured contender behind `names` (one entrant name, or a tuple of
    them meaning "the fastest of these") with the highest examples/s.

    Args:
        names: an entrant name or a tuple of entrant names.
        alias: `{entrant name: measured contender name}` (`build_entrants`).
        summaries: `{contender name: figures}` of the measured ones.

    Returns:
        A contender name; the first of `names` when none was measured (the
        comparison then reports it as not measured).

    Example:

    >>> fastest_of(("a", "b"), {"a": "a", "b": "b"},
    ...            {"a": {"examples_per_sec": 9.0}, "b": {"examples_per_sec": 12.0}})
    'b'
    """
    measured = [alias.get(n, n) for n in _as_tuple(names) if alias.get(n, n) in summaries]
    if not measured:
        first = _as_tuple(names)[0]
        return alias.get(first, first)
    return max(measured, key=lambda name: summaries[name]["examples_per_sec"])


def _comparison(label, a, b, results, summaries, unsupported):
    missing = [name for name in (a, b) if name not in summaries]
    if missing:
        return {"label": label, "numerator": a, "denominator": b,
                "error": "; ".join(f"{n}: {unsupported.get(n, 'not measured')}" for n in missing)}
    paired = fig.paired_ratio(results[a].round_throughput(), results[b].round_throughput())
    return dict(label=label, numerator=a, denominator=b,
                numerator_examples_per_sec=summaries[a]["examples_per_sec"],
                denominator_examples_per_sec=summaries[b]["examples_per_sec"], **paired)


def input_check(pipeline_rounds, summaries, alias, training_name):
    """The input-bound check: pipeline alone vs the training rate, same rounds.

    Args:
        pipeline_rounds: the `Rounds` of the `PipelineProbe`.
        summaries: contender figures (`summarise` results).
        alias: entrant name -> measured contender name.
        training_name: the entrant whose training rate is compared.

    Returns:
        `{"pipeline_examples_per_sec", "training_examples_per_sec",
        "headroom", "warning"}` (warning None when the pipeline is at least
        `figures.INPUT_HEADROOM_WARNING` times faster).

    Example:

    >>> input_check(Rounds(64, {"pipeline": [[0.01, 0.01]]}),
    ...             {"fp32": {"examples_per_sec": 1600.0}}, {}, "fp32")["headroom"]
    4.0
    """
    name = alias.get(training_name, training_name)
    pipeline = summarise_times(pipeline_rounds)["examples_per_sec"]
    training = summaries[name]["examples_per_sec"]
    headroom = fig.input_headroom(pipeline, training)
    return {"training": name, "pipeline_examples_per_sec": pipeline,
            "training_examples_per_sec": training, "headroom": headroom,
            "warning": fig.input_bound_advice(headroom)}


def _pct(share):
    return f"{100 * share:.0f}%"


def gap_line(name, figures, width=24):
    """One line of how far a contender is from the hardware limit.

    MFU against the same-run matmul peak of its own precision and against
    the fastest peak of the run (named), then the shares of its step time:
    input wait (`data`) and the compute split by op kind (`step_shares`),
    or only the wait when the compute was not profiled.

    Args:
        name: the contender's name.
        figures: its figures in a `run_comparison` report (`mfu`,
            `precision`, `mfu_vs_fastest_peak`, `fastest_peak_precision`,
            `fastest_peak_flops_per_sec`, `input_wait_share`, `step_shares`;
            any may be missing).
        width: the name's column width (the longest name of the report).

    Example:

    >>> gap_line("tfdist fp32", {"precision": "float32", "mfu": 0.1,
    ...     "mfu_vs_fastest_peak": 0.05, "fastest_peak_precision": "mixed_bfloat16",
    ...     "fastest_peak_flops_per_sec": 4.1e11, "input_wait_share": 0.25,
    ...     "step_shares": {"data": 0.25, "matmul": 0.375, "softmax/loss": 0.1875,
    ...                     "elementwise": 0.1875}})
    '  tfdist fp32              MFU 10.0% vs float32 peak, 5.0% vs fastest peak \
(mixed_bfloat16 410.0 GFLOP/s) | step: data 25%, matmul 38%, softmax/loss 19%, elementwise 19%'
    """
    parts = []
    if "mfu" in figures:
        parts.append(f"MFU {100 * figures['mfu']:.1f}% vs {figures['precision']} peak")
    if "mfu_vs_fastest_peak" in figures:
        parts.append(f"{100 * figures['mfu_vs_fastest_peak']:.1f}% vs fastest peak "
                     f"({figures['fastest_peak_precision']} "
                     f"{figures['fastest_peak_flops_per_sec'] / 1e9:.1f} GFLOP/s)")
    line = f"  {name:<{width}} " + (", ".join(parts) if parts else "MFU not measured")
    shares = figures.get("step_shares")
    if shares:
        line += " | step: " + ", ".join(f"{part} {_pct(shares[part])}" for part in fig.STEP_SHARES)
    elif figures.get("input_wait_share") is not None:
        wait = figures["input_wait_share"]
        line += f" | step: data {_pct(wait)}, compute {_pct(1 - wait)} (not profiled)"
    return line


def format_comparison(report, title):
    """Human-readable lines of a `run_comparison` report.

    Args:
        report: the dict `run_comparison` returns.
        title: the first line's title.

    Example:

    >>> print(format_comparison(report, "Settings"))
    """
    lines = [f"{title}: {report['workload_label']}, global batch {report['global_batch_size']}, "
             f"{report['rounds']} alternating rounds x {report['steps']} steps"]
    for policy, peak in report["peaks"].items():
        lines.append(f"  matmul peak {policy}: {peak / 1e9:.1f} GFLOP/s "
                     f"({report['peak_matmul_size']}x{report['peak_matmul_size']}, same run)")
    width = max([24] + [len(name) for name in [*report["contenders"], *report["unsupported"]]])
    for name, s in report["contenders"].items():
        tokens = f", {s['tokens_per_sec']:,.0f} tokens/s" if "tokens_per_sec" in s else ""
        mfu = f", MFU {100 * s['mfu']:.1f}%" if "mfu" in s else ""
        lines.append(f"  {name:<{width}} {s['examples_per_sec']:8.1f} examples/s{tokens}, step p50 "
                     f"{s['step_time_p50_ms']:.0f} ms{mfu}  [{s['strategy']}, {s['precision']}, "
                     f"XLA {'on' if s['xla'] else 'off'}: {s['xla_reason']}]")
    for name, error in report["unsupported"].items():
        lines.append(f"  {name:<{width}} unsupported: {error[:160]}")
    for c in report["comparisons"]:
        if "error" in c:
            lines.append(f"  {c['label']}: not measured ({c['error'][:160]})")
            continue
        lines.append(f"  {c['label']}: {c['ratio']:.2f}x (per-round {c['low']:.2f}..{c['high']:.2f};"
                     f" {c['numerator']} {c['numerator_examples_per_sec']:.1f} vs "
                     f"{c['denominator']} {c['denominator_examples_per_sec']:.1f} examples/s)")
    check = report.get("input_pipeline")
    if check:
        lines.append(f"  input pipeline alone: {check['pipeline_examples_per_sec']:.0f} examples/s"
                     f" = {check['headroom']:.1f}x the training rate of {check['training']}")
        if check["warning"]:
            lines.append(f"  WARNING: {check['warning']}")
    if report.get("profiles"):
        from tfdist.bench.profile import format_profile

        lines.append("  where the time goes (self time of ops on the compute threads):")
        lines += [format_profile(name, summary) for name, summary in report["profiles"].items()]
    if report.get("fastest_peak") or any("input_wait_share" in s
                                         for s in report["contenders"].values()):
        split = (f"; compute split by the op kinds of the profile (input: "
                 f"{report['profile_input']})" if report.get("profiles") else "")
        lines.append("  gap to the hardware limit (MFU vs the same-run matmul peak of its own "
                     f"precision and of the fastest one; shares of the step time{split}):")
        lines += [gap_line(name, s, width) for name, s in report["contenders"].items()]
    load = report.get("load") or {}
    if load:
        lines.append(f"  machine load: other processes used {100 * load['others_share']:.0f}% of "
                     f"the {load['cores']} CPUs during this comparison")
    return "\n".join(lines)
