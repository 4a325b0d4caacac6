"""The scaling plot: throughput and efficiency vs replicas, with the ideal line.

Needs matplotlib (the `bench` extra: `pip install "tfdist[bench]"`); it draws
off-screen (Agg), so it works without a display. Without matplotlib the
benchmark still writes report.md and results.json and skips the plot
(`matplotlib_available`, `MISSING_MATPLOTLIB`).
"""

import importlib.util

MISSING_MATPLOTLIB = ('the scaling plot (scaling.png) needs matplotlib, which is not installed: '
                      'install the bench extra, pip install "tfdist[bench]". report.md and '
                      'results.json are still written.')
"""What `tfdist bench` says at start when it cannot draw the plot."""

DEVICES_SERIES = "1 worker, N devices (mirrored)"
WORKERS_SERIES = "N workers, 1 device each (multi-worker)"


def matplotlib_available():
    """Whether matplotlib can be imported (checked without importing it).

    Example:

    >>> matplotlib_available()  # with the bench extra installed
    True
    """
    try:
        return importlib.util.find_spec("matplotlib") is not None
    except (ImportError, ValueError):
        # A finder that refuses the name, or a half-imported module without a spec.
        return False


def series(rows):
    """Splits scaling rows into the two plotted series, sorted by replicas.

    The 1-replica, 1-worker baseline starts both series.

    Args:
        rows: scaling rows (`report.scaling_rows`).

    Returns:
        `{series label: [(replicas, examples/s, efficiency), ...]}` (failed
        points left out; a series with only the baseline is dropped).

    Example:

    >>> series([{"replicas": 1, "workers": 1, "examples_per_sec": 10.0, "efficiency": 1.0},
    ...         {"replicas": 2, "workers": 1, "examples_per_sec": 15.0, "efficiency": 0.75}])
    {'1 worker, N devices (mirrored)': [(1, 10.0, 1.0), (2, 15.0, 0.75)]}
    """
    good = [r for r in rows if "error" not in r]
    devices = sorted((r["replicas"], r["examples_per_sec"], r["efficiency"])
                     for r in good if r["workers"] == 1)
    workers = sorted((r["replicas"], r["examples_per_sec"], r["efficiency"])
                     for r in good if r["workers"] > 1 or (r["workers"] == 1 and r["replicas"] == 1))
    result = {}
    if len(devices) > 1:
        result[DEVICES_SERIES] = devices
    if len(workers) > 1:
        result[WORKERS_SERIES] = workers
    return result


def plot_scaling(sections, path, device_kind="CPU"):
    """Draws one row per model: throughput (examples/s) and efficiency (%) vs replicas.

    Args:
        sections: `{model: {"workload": label, "mode": "weak"|"strong",
            "rows": scaling rows}}`.
        path: the PNG file to write.
        device_kind: "CPU" or "GPU", for the title.

    Example:

    >>> plot_scaling({"transformer": {"workload": "transformer tiny", "mode": "weak",
    ...                               "rows": rows}}, "scaling.png")
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = list(sections)
    figure, axes = plt.subplots(len(models), 2, figsize=(11, 4.2 * len(models)), squeeze=False)
    markers = {DEVICES_SERIES: "o-", WORKERS_SERIES: "s-"}
    for row, model in enumerate(models):
        section = sections[model]
        lines = series(section["rows"])
        throughput_axis, efficiency_axis = axes[row]
        baseline = next((r for r in section["rows"] if "error" not in r and r["replicas"] == 1
                         and r["workers"] == 1), None)
        replicas = sorted({r["replicas"] for r in section["rows"] if "error" not in r})
        if baseline is not None and replicas:
            throughput_axis.plot(replicas, [baseline["examples_per_sec"] * n for n in replicas],
                                 "k--", label="ideal (linear)")
            efficiency_axis.plot(replicas, [100.0] * len(replicas), "k--", label="ideal (100%)")
        for label, points in lines.items():
            xs = [p[0] for p in points]
            throughput_axis.plot(xs, [p[1] for p in points], markers[label], label=label)
            efficiency_axis.plot(xs, [100.0 * p[2] for p in points], markers[label], label=label)
        title = f"{section['workload']} - {section['mode']} scaling ({device_kind})"
        throughput_axis.set_title(f"Throughput: {title}", fontsize=10)
        throughput_axis.set_xlabel("replicas (devices x workers)")
        throughput_axis.set_ylabel("throughput (examples/s)")
        efficiency_axis.set_title(f"Efficiency: {title}", fontsize=10)
        efficiency_axis.set_xlabel("replicas (devices x workers)")
        efficiency_axis.set_ylabel("scaling efficiency (% of ideal)")
        efficiency_axis.set_ylim(bottom=0)
        throughput_axis.set_ylim(bottom=0)
        for axis in (throughput_axis, efficiency_axis):
            axis.set_xticks(replicas or [1])
            axis.grid(True, alpha=0.3)
            axis.legend(fontsize=8, loc="best")
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return path
