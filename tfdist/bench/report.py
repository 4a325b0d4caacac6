"""The benchmark's outputs: scaling rows, Markdown tables, JSON and the plot.

`scaling_rows` derives speedup, efficiency and MFU for every sweep point
from the measured throughputs (pure arithmetic from `figures`);
`write_report` writes `report.md`, `results.json` and `scaling.png` into the
output folder (the plot only when matplotlib, the `bench` extra, is
installed).

Example:

    rows = scaling_rows(sweep_results, peak_flops=2.4e11)
    print(scaling_table(rows))
"""

import json
import math
import os

from tfdist.bench import figures as fig

CPU_NOTE = ("CPU figures: logical CPU devices share the same physical cores, so adding "
            "replicas or workers on one machine adds no compute; these numbers show the cost "
            "of the distribution machinery, not GPU scaling.")


def scaling_rows(points, peak_flops=None):
    """Adds speedup, efficiency and MFU to the sweep points of one model.

    The baseline is the point with 1 replica on 1 worker. Speedup is the
    ratio of examples/s to the baseline's; efficiency is speedup / replicas
    (`figures.scaling_efficiency`); MFU is model FLOP/s over `peak_flops`.

    Args:
        points: the dicts of `sweep.run_sweep` (failed points have `error`).
        peak_flops: the same-run matmul peak of the points' precision, or
            None (no MFU).

    Returns:
        A list of row dicts, in the order given.

    Raises:
        ValueError: no successful 1-replica, 1-worker point to compare with
            (when any point succeeded).

    Example:

    >>> rows = scaling_rows([{"replicas": 1, "workers": 1, "examples_per_sec": 100.0},
    ...                      {"replicas": 2, "workers": 1, "examples_per_sec": 150.0}])
    >>> [(r["speedup"], r["efficiency"]) for r in rows]
    [(1.0, 1.0), (1.5, 0.75)]
    """
    good = [p for p in points if "error" not in p]
    baseline = next((p for p in good if p["replicas"] == 1 and p["workers"] == 1), None)
    if good and baseline is None:
        raise ValueError("The sweep has no successful point with 1 replica on 1 worker, the "
                         "baseline of speedup and efficiency; include it (replicas from 1).")
    rows = []
    for point in points:
        row = dict(point)
        if "error" not in point:
            row["speedup"] = fig.speedup(point["examples_per_sec"], baseline["examples_per_sec"])
            row["efficiency"] = fig.scaling_efficiency(row["speedup"], point["replicas"])
            if peak_flops and point.get("model_flops_per_sec"):
                row["peak_flops_per_sec"] = peak_flops
                row["mfu"] = fig.model_flops_utilization(point["model_flops_per_sec"], peak_flops)
        rows.append(row)
    return rows


def _num(value, digits=1, percent=False):
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if percent:
        return f"{100 * value:.{digits}f}%"
    return f"{value:,.{digits}f}"


def markdown_table(header, rows):
    """A GitHub Markdown table.

    Args:
        header: column titles.
        rows: lists of cells (anything printable).

    Example:

    >>> print(markdown_table(["a", "b"], [[1, 2]]))
    | a | b |
    | --- | --- |
    | 1 | 2 |
    """
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


SCALING_HEADER = ["Replicas", "Workers", "Precision", "XLA", "Global batch",
                  "Throughput (examples/s)", "Tokens/s", "Per replica (examples/s)", "Speedup",
                  "Efficiency", "Step p50 / p90 / p99 (ms)", "MFU", "Input wait",
                  "CPU used by others"]


def _utilization_cell(row):
    if row.get("gpu_utilization") is not None:
        return _num(row["gpu_utilization"], 0, percent=True)
    return "n/a: " + (row.get("gpu_utilization_note") or "not measured")[:80]


def scaling_table(rows):
    """The Markdown scaling table of `scaling_rows` (failed points say so).

    A "GPU utilisation" column (NVML, mean over the measured rounds) is
    added when any point measured on GPUs, i.e. has `gpu_utilization`; on
    CPUs there is none.

    Args:
        rows: the result of `scaling_rows`.

    Example:

    >>> print(scaling_table(rows).splitlines()[0])
    | Replicas | Workers | Precision | XLA | Global batch | Throughput (examples/s) | ...
    """
    on_gpus = any("gpu_utilization" in r for r in rows)
    header = SCALING_HEADER + (["GPU utilisation"] if on_gpus else [])
    cells = []
    for r in rows:
        if "error" in r:
            cells.append([r["replicas"], r["workers"], r.get("precision", "-"), "-",
                          r.get("global_batch_size", "-"), "failed: " + r["error"][:80]]
                         + ["-"] * (len(header) - 6))
            continue
        cells.append([
            r["replicas"], r["workers"], r.get("precision", "-"),
            "on" if r.get("xla") else "off", r["global_batch_size"],
            _num(r["examples_per_sec"]), _num(r.get("tokens_per_sec"), 0),
            _num(r["examples_per_sec_per_replica"]), f"{r['speedup']:.2f}x",
            _num(r["efficiency"], 0, percent=True),
            f"{r['step_time_p50_ms']:.0f} / {r['step_time_p90_ms']:.0f} / "
            f"{r['step_time_p99_ms']:.0f}",
            _num(r.get("mfu"), 1, percent=True), _num(r.get("input_wait_share"), 0, percent=True),
            _num((r.get("load") or {}).get("others_share"), 0, percent=True)]
            + ([_utilization_cell(r)] if on_gpus else []))
    return markdown_table(header, cells)


CONTENDER_HEADER = ["Setting", "Precision", "XLA", "Throughput (examples/s)", "Tokens/s",
                    "Step p50 / p90 / p99 (ms)", "Model GFLOP/s", "Matmul peak (GFLOP/s)", "MFU"]


STEP_SHARE_HEADER = ["Input wait", "Matmul", "Softmax/loss", "Elementwise"]
"""Columns of the step-time shares (`figures.STEP_SHARES`, in that order)."""


def fastest_peak_header(report):
    """The title of the MFU-vs-fastest-peak column: names that peak.

    Args:
        report: a `tfdist.bench.compare.run_comparison` report.

    Example:

    >>> fastest_peak_header({"fastest_peak": {"precision": "mixed_bfloat16",
    ...                                       "flops_per_sec": 4.11e11}})
    'MFU vs fastest peak (mixed_bfloat16 411.0 GFLOP/s)'
    """
    fastest = report.get("fastest_peak")
    if not fastest:
        return "MFU vs fastest peak (not measured)"
    return (f"MFU vs fastest peak ({fastest['precision']} "
            f"{fastest['flops_per_sec'] / 1e9:.1f} GFLOP/s)")


def step_share_cells(figures):
    """The step-time share cells of one contender (`STEP_SHARE_HEADER`).

    With `step_shares` (input wait and the profiled compute split) every
    cell; with only `input_wait_share` the wait and "not profiled"; else "-".

    Args:
        figures: a contender's figures in a `run_comparison` report.

    Example:

    >>> step_share_cells({"input_wait_share": 0.05})
    ['5%', 'not profiled', 'not profiled', 'not profiled']
    """
    from tfdist.bench.figures import STEP_SHARES

    shares = figures.get("step_shares")
    if shares:
        return [_num(shares[part], 0, percent=True) for part in STEP_SHARES]
    wait = figures.get("input_wait_share")
    if wait is not None:
        return [_num(wait, 0, percent=True)] + ["not profiled"] * (len(STEP_SHARES) - 1)
    return ["-"] * len(STEP_SHARES)


def contender_table(report):
    """The Markdown table of every contender of a comparison report.

    After the columns of `CONTENDER_HEADER`: MFU against the fastest
    same-run peak (named in the title, see `fastest_peak_header`) and the
    shares of the step time (`STEP_SHARE_HEADER`, see `step_share_cells`).

    Args:
        report: a `tfdist.bench.compare.run_comparison` report.

    Example:

    >>> print(contender_table(report).splitlines()[0])
    | Setting | Precision | XLA | Throughput (examples/s) | ...
    """
    header = CONTENDER_HEADER + [fastest_peak_header(report)] + STEP_SHARE_HEADER
    cells = []
    for name, s in report["contenders"].items():
        cells.append([
            name, s["precision"], "on" if s["xla"] else "off", _num(s["examples_per_sec"]),
            _num(s.get("tokens_per_sec"), 0),
            f"{s['step_time_p50_ms']:.0f} / {s['step_time_p90_ms']:.0f} / "
            f"{s['step_time_p99_ms']:.0f}",
            _num(s.get("model_flops_per_sec", 0) / 1e9 if s.get("model_flops_per_sec") else None),
            _num(s.get("peak_flops_per_sec", 0) / 1e9 if s.get("peak_flops_per_sec") else None),
            _num(s.get("mfu"), 1, percent=True), _num(s.get("mfu_vs_fastest_peak"), 1,
                                                      percent=True)]
            + step_share_cells(s))
    for name, error in report.get("unsupported", {}).items():
        cells.append([name, "-", "-", "unsupported: " + error[:80]] + ["-"] * (len(header) - 4))
    return markdown_table(header, cells)


STEP_SHARE_NOTE = ("MFU is the model's FLOP/s over a large matmul's FLOP/s measured in the same "
                   "run, in the setting's own precision and in the fastest precision measured "
                   "(its gap to the hardware). Step shares: input wait is the extra step time "
                   "of the real input pipeline over one batch replayed from memory; the rest "
                   "(compute) is split by the op kinds' self time in a 2-step profile "
                   "(elementwise: every op but matmuls and softmax/loss, copies and RNG "
                   "included).")


def ratio_table(report):
    """The Markdown table of a comparison report's ratios.

    Args:
        report: a `tfdist.bench.compare.run_comparison` report.

    Example:

    >>> print(ratio_table(report).splitlines()[2])
    | XLA on / off (tfdist, float32) | **1.13x** | 1.05-1.36 | 16.3 / 14.4 |
    """
    cells = []
    for c in report["comparisons"]:
        if "error" in c:
            cells.append([c["label"], "not measured", "-", "-"])
            continue
        cells.append([c["label"], f"**{c['ratio']:.2f}x**", f"{c['low']:.2f}-{c['high']:.2f}",
                      f"{c['numerator_examples_per_sec']:.1f} / "
                      f"{c['denominator_examples_per_sec']:.1f}"])
    return markdown_table(["Comparison", "Ratio (median of rounds)", "Per-round range",
                           "Examples/s (A / B)"], cells)


def render_markdown(result):
    """The whole `report.md` text of a `tfdist bench` result dict.

    Args:
        result: the dict of `tfdist.bench.run.run_report`.

    Example:

    >>> render_markdown(result).startswith("# tfdist benchmark (CPU)")
    True
    """
    meta = result["meta"]
    lines = [f"# tfdist benchmark ({meta['device_kind']})", "",
             f"{meta['machine']}; TensorFlow {meta['tensorflow']}, Keras {meta['keras']}; "
             f"{meta['date']}.", "", f"Command: `{meta['command']}`", ""]
    if meta["device_kind"] == "CPU":
        lines += [f"> {CPU_NOTE}", ""]
    for name, peak in result.get("peaks", {}).items():
        lines.append(f"- Matmul peak, {name}: {peak / 1e9:.1f} GFLOP/s (same run)")
    if result.get("peaks"):
        lines.append("")
    for model, section in result.get("scaling", {}).items():
        lines += [f"## Scaling: {section['workload']} ({section['mode']} scaling, "
                  f"{section['batch_label']})", "", scaling_table(section["rows"]), ""]
    for model, report in result.get("settings", {}).items():
        lines += [f"## Settings: {report['workload_label']} (global batch "
                  f"{report['global_batch_size']}, {report['rounds']} alternating rounds x "
                  f"{report['steps']} steps)", "", ratio_table(report), "",
                  contender_table(report), "", STEP_SHARE_NOTE, ""]
        check = report.get("input_pipeline")
        if check:
            lines.append(f"Input pipeline alone: {check['pipeline_examples_per_sec']:,.0f} "
                         f"examples/s, {check['headroom']:.1f}x the training rate "
                         f"({check['training']}).")
            if check["warning"]:
                lines.append(f"**Warning:** {check['warning']}")
            lines.append("")
    engine = result.get("engine")
    if engine:
        lines += [f"## tfdist engine vs Keras fit: {engine['workload_label']}", "",
                  ratio_table(engine), "", contender_table(engine), "", STEP_SHARE_NOTE, ""]
    load = result.get("load") or {}
    if load:
        lines.append(f"Machine load during the run: other processes used "
                     f"{100 * load['others_share']:.0f}% of the {load['cores']} CPUs.")
    return "\n".join(lines) + "\n"


def print_report(text, report, json_out=None):
    """Prints a benchmark's table `text`; with `json_out`, also writes `report` there as JSON
    and says so.

    Example:

    >>> print_report(format_report(report), report, "/tmp/bench/tp.json")
    """
    print(text)
    if json_out:
        write_json(json_out, report)
        print(f"Wrote {json_out}")


def write_json(path, data):
    """Writes `data` as indented JSON to `path` (its folder created); returns `path`.

    Values JSON cannot hold (e.g. numpy numbers) are written as their text.

    Example:

    >>> write_json("/tmp/bench/engine.json", {"ratio": 1.02})
    '/tmp/bench/engine.json'
    """
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as stream:
        json.dump(data, stream, indent=1, sort_keys=True, default=str)
    return path


def write_report(result, out_dir, log=None):
    """Writes `report.md`, `results.json` and `scaling.png` (when there is a
    sweep and matplotlib is installed) into `out_dir`; returns the paths written.

    Args:
        result: the dict of `tfdist.bench.run.run_report`.
        out_dir: the output folder (created if needed).
        log: called with a line when the plot is skipped for want of
            matplotlib, or None.

    Example:

    >>> write_report(result, "bench-results")
    ['bench-results/report.md', 'bench-results/results.json', 'bench-results/scaling.png']
    """
    from tfdist.bench.plot import matplotlib_available

    os.makedirs(out_dir, exist_ok=True)
    paths = []
    path = os.path.join(out_dir, "report.md")
    with open(path, "w") as stream:
        stream.write(render_markdown(result))
    paths.append(path)
    paths.append(write_json(os.path.join(out_dir, "results.json"), result))
    if result.get("scaling"):
        if matplotlib_available():
            from tfdist.bench.plot import plot_scaling

            path = os.path.join(out_dir, "scaling.png")
            plot_scaling(result["scaling"], path, device_kind=result["meta"]["device_kind"])
            paths.append(path)
        elif log:
            log('scaling.png skipped: matplotlib is not installed (the bench extra: '
                'pip install "tfdist[bench]").')
    return paths
