"""`tfdist bench model-parallel`: layer-wise model parallelism, with and without pipelining.

Three settings of the same Transformer and batch, in one process, in
alternating rounds (these machines are noisy):

* `K=1`: the whole model on one device (plain `Trainer`);
* `K=2, M=1`: split into 2 stages on 2 devices, no pipelining (one
  micro-batch: stage 1 waits for stage 0, then stage 0 for stage 1);
* `K=2, M=4`: split and pipelined over M micro-batches (GPipe).

For each: the median step time, examples/s and tokens/s, and for the split
settings the pipeline *bubble*, the share of device time idle, two ways:
GPipe's formula `(K-1)/(M+K-1)` (equal stages, no overhead) and a measured
figure from a profiler trace of one step: each stage's busy time is the
union of the run intervals of the ops in its name scope (`stage_<s>/...`),
the span runs from the first stage op to the last, and

    measured bubble = 1 - sum_s busy_s / (K * span)

`overlap` is the share of the span in which both stages run an op at once:
it shows that stage s of micro-batch m+1 really runs beside stage s+1 of
micro-batch m. Without GPUs the K devices are logical CPUs that share the
machine's cores (and TensorFlow's thread pools), so overlap does not add
compute: on CPUs the figures show the mechanism and its overhead, not the
speed-up K GPUs give.

Example:

    report = run_model_parallel_bench(size="tiny", batch=32, micro_batches=4, steps=10)
    print(format_report(report))
"""

import os
import re
import shutil
import statistics
import sys
import tempfile
import time

from tfdist.bench.report import print_report
from tfdist.precision import cpu_model_name

COLUMNS = ("setting", "K", "M", "step ms", "examples/s", "tokens/s", "vs K=1",
           "bubble GPipe", "bubble measured", "overlap")
"""The columns of the printed table."""

QUICK = dict(batch=8, sequence_length=16, vocab_size=64, steps=2, rounds=1, warmup_steps=1)
"""What `--quick` presets: flags given with it win (`split_bench_args`)."""


def settings(micro_batches):
    """The `(label, K, M)` settings compared.

    Example:

    >>> settings(4)
    [('one device', 1, 1), ('2 stages, no pipelining', 2, 1), ('2 stages, pipelined', 2, 4)]
    """
    return [("one device", 1, 1), ("2 stages, no pipelining", 2, 1),
            ("2 stages, pipelined", 2, micro_batches)]


def gpipe_bubble(stages, micro_batches):
    """GPipe's bubble fraction `(K-1)/(M+K-1)` (0 for one stage).

    Example:

    >>> gpipe_bubble(2, 4)
    0.2
    """
    return (stages - 1) / (micro_batches + stages - 1)


def union_length(intervals):
    """Total length covered by `(start, end)` intervals (overlaps counted once).

    Example:

    >>> union_length([(0, 4), (2, 6), (8, 9)])
    7
    """
    return sum(end - start for start, end in _union(intervals))


def _union(intervals):
    merged = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return merged


def overlap_length(a, b):
    """Length of time in which both interval sets are active.

    Example:

    >>> overlap_length([(0, 4)], [(2, 6), (3, 5)])
    2
    """
    a, b = _union(a), _union(b)
    i = j = total = 0
    while i < len(a) and j < len(b):
        total += max(0, min(a[i][1], b[j][1]) - max(a[i][0], b[j][0]))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def stage_activity(lines, num_stages):
    """Busy time per stage, span, and two-stage overlap from profiler timelines.

    Args:
        lines: `{thread name: [(op name, start, duration), ...]}`
            (`tfdist.bench.profile.read_xspace`).
        num_stages: K.

    Returns:
        `{"busy": [per stage], "span": ..., "overlap": ..., "bubble": ...}`
        (times in the timelines' unit; overlap between stages 0 and 1),
        or None when no stage op was found.

    Example:

    >>> stage_activity({"tf_Compute/1": [("stage_0/forward_0/MatMul", 0, 4)],
    ...                 "tf_Compute/2": [("stage_1/forward_0/MatMul", 2, 4)]}, 2)
    {'busy': [4, 4], 'span': 6, 'overlap': 2, 'bubble': 0.333...}
    """
    pattern = re.compile(r"stage_(\d+)/")
    per_stage = [[] for _ in range(num_stages)]
    for events in lines.values():
        for name, start, duration in events:
            match = pattern.search(name)
            if match and int(match.group(1)) < num_stages:
                per_stage[int(match.group(1))].append((start, start + duration))
    found = [intervals for intervals in per_stage if intervals]
    if not found:
        return None
    span = (max(end for intervals in found for _, end in intervals)
            - min(start for intervals in found for start, _ in intervals))
    busy = [union_length(intervals) for intervals in per_stage]
    overlap = overlap_length(per_stage[0], per_stage[1]) if num_stages > 1 else 0
    return {"busy": busy, "span": span, "overlap": overlap,
            "bubble": 1.0 - sum(busy) / (num_stages * span) if span else 0.0}


def bench_decoder_lm(size, num_layers, sequence_length, vocab_size, seed):
    """The model the model- and tensor-parallel benches train: the decoder LM of `size`
    (`num_layers` blocks if given) without dropout, seeded, compiled with Adam and the masked
    loss. Returns `(model, its TransformerConfig)`.

    Example:

    >>> model, config = bench_decoder_lm("tiny", None, 64, 512, seed=0)
    >>> config.d_model
    128
    """
    import keras

    from tfdist.models import MaskedSparseCategoricalCrossentropy, build_decoder_lm
    from tfdist.models import transformer_config

    keras.utils.set_random_seed(seed)
    overrides = {"dropout": 0.0}
    if num_layers:
        overrides["num_layers"] = num_layers
    config = transformer_config(size, vocab_size, sequence_length, **overrides)
    model = build_decoder_lm(config)
    model.compile(keras.optimizers.Adam(1e-3), MaskedSparseCategoricalCrossentropy())
    return model, config


def _make_trainer(size, num_layers, sequence_length, vocab_size, model_parallel, micro_batches,
                  seed):
    from tfdist.training import Trainer

    model, _ = bench_decoder_lm(size, num_layers, sequence_length, vocab_size, seed)
    if model_parallel == 1:
        return Trainer(model)
    return Trainer(model, model_parallel=model_parallel, micro_batches=micro_batches)


def token_dataset(batch, sequence_length, vocab_size, seed):
    """Endless batches of random next-token pairs `(tokens, tokens shifted by one)`.

    Example:

    >>> next(iter(token_dataset(8, 16, 64, seed=0)))[0].shape
    TensorShape([8, 16])
    """
    import numpy as np
    import tensorflow as tf

    rng = np.random.default_rng(seed)
    tokens = rng.integers(1, vocab_size, size=(batch * 8, sequence_length + 1), dtype=np.int32)
    return (tf.data.Dataset.from_tensor_slices((tokens[:, :-1], tokens[:, 1:]))
            .batch(batch, drop_remainder=True).repeat().prefetch(2))


def _profile_one_step(trainer, iterator, num_stages):
    import tensorflow as tf

    from tfdist.bench.profile import find_xspace, read_xspace

    folder = tempfile.mkdtemp(prefix="tfdist-model-parallel-")
    try:
        tf.profiler.experimental.start(folder)
        try:
            trainer.step_functions.train_function(iterator, tf.constant(1, tf.int32))
        finally:
            tf.profiler.experimental.stop()
        return stage_activity(read_xspace(find_xspace(folder)), num_stages)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def run_model_parallel_bench(size="tiny", batch=32, micro_batches=4, steps=10, rounds=3,
                             sequence_length=64, vocab_size=512, num_layers=None,
                             warmup_steps=2, seed=0, log=None):
    """Measures K=1, K=2 without and with pipelining; returns the report (a dict).

    Needs at least 2 devices of one kind (2 GPUs, or the CPU split into 2
    logical devices before TensorFlow started; `main` does that).

    Args:
        size: the Transformer size (tiny, small, base, large).
        batch: the global batch (examples per step).
        micro_batches: M of the pipelined setting (>= 2).
        steps: timed steps per setting and round.
        rounds: alternating rounds (each setting once per round).
        sequence_length, vocab_size: of the synthetic token data.
        num_layers: override the size's number of blocks (None: keep).
        warmup_steps: untimed steps of each setting before the rounds.
        seed: weights and data.
        log: a `print`-like function for progress, or None.

    Returns:
        `{"rows": [...], "cpu": ..., "settings": {...}}`; each row has the
        `COLUMNS` figures.

    Example:

    >>> report = run_model_parallel_bench(steps=4, rounds=2)
    >>> [row["setting"] for row in report["rows"]]
    ['one device', '2 stages, no pipelining', '2 stages, pipelined']
    """
    import tensorflow as tf

    say = log or (lambda *args, **kwargs: None)
    contenders = []
    for label, k, m in settings(micro_batches):
        trainer = _make_trainer(size, num_layers, sequence_length, vocab_size, k, m, seed)
        data = token_dataset(batch, sequence_length, vocab_size, seed)
        trainer.fit(data, epochs=1, steps_per_epoch=warmup_steps, verbose=0)  # traces, builds
        iterator = iter(trainer.strategy.experimental_distribute_dataset(data))
        trainer.step_functions.train_function(iterator, tf.constant(1, tf.int32))
        contenders.append({"label": label, "k": k, "m": m, "trainer": trainer,
                           "iterator": iterator, "times": []})
        say(f"  built {label} (K={k}, M={m})")
    for round_index in range(rounds):
        order = contenders if round_index % 2 == 0 else contenders[::-1]
        for contender in order:
            function = contender["trainer"].step_functions.train_function
            iterator = contender["iterator"]
            for _ in range(steps):
                start = time.perf_counter()
                function(iterator, tf.constant(1, tf.int32))
                contender["times"].append(time.perf_counter() - start)
        say(f"  round {round_index + 1}/{rounds} done")
    rows = []
    reference = None
    for contender in contenders:
        step = statistics.median(contender["times"])
        examples = batch / step
        reference = reference or examples
        activity = None
        if contender["k"] > 1:
            activity = _profile_one_step(contender["trainer"], contender["iterator"],
                                         contender["k"])
        plan = contender["trainer"].stage_plan
        rows.append({
            "setting": contender["label"], "K": contender["k"], "M": contender["m"],
            "step ms": 1000 * step, "examples/s": examples,
            "tokens/s": examples * sequence_length, "vs K=1": examples / reference,
            "bubble GPipe": gpipe_bubble(contender["k"], contender["m"]),
            "bubble measured": activity["bubble"] if activity else None,
            "overlap": activity["overlap"] / activity["span"] if activity and activity["span"]
            else None,
            "stage busy ms": [busy / 1e9 for busy in activity["busy"]] if activity else None,
            "step times s": contender["times"],
            "stages": plan.describe() if plan is not None else None,
        })
    return {"rows": rows, "cpu": cpu_model_name(), "cores": os.cpu_count(),
            "devices": [d.name for d in tf.config.list_logical_devices(_device_type())],
            "settings": {"size": size, "batch": batch, "micro_batches": micro_batches,
                         "steps": steps, "rounds": rounds, "sequence_length": sequence_length,
                         "vocab_size": vocab_size, "num_layers": num_layers}}


def _device_type():
    import tensorflow as tf

    return "GPU" if len(tf.config.list_physical_devices("GPU")) >= 2 else "CPU"


def format_report(report):
    """The report as a text table, with the machine and the settings above it.

    Example:

    >>> print(format_report(report))
    Model parallelism (Transformer tiny, batch 32, seq 64), CPU: ..., 2 cores
    setting                  K  M  step ms  examples/s  tokens/s  vs K=1  bubble GPipe ...
    """
    s = report["settings"]
    lines = [f"Model parallelism: Transformer {s['size']}"
             + (f" ({s['num_layers']} blocks)" if s["num_layers"] else "")
             + f", batch {s['batch']}, seq {s['sequence_length']}, vocab {s['vocab_size']}, "
             f"median of {s['rounds']} rounds x {s['steps']} steps",
             f"Devices: {', '.join(report['devices'])} on {report['cpu']} "
             f"({report['cores']} cores)"]

    def cell(value, width):
        return f"{'-':>{width}}" if value is None else f"{value:>{width}.0%}"

    header = (f"{'setting':<26}{'K':>2}{'M':>3}{'step ms':>9}{'examples/s':>12}{'tokens/s':>10}"
              f"{'vs K=1':>8}{'bubble GPipe':>14}{'bubble measured':>17}{'overlap':>9}")
    lines += [header, "-" * len(header)]
    for row in report["rows"]:
        lines.append(
            f"{row['setting']:<26}{row['K']:>2}{row['M']:>3}{row['step ms']:>9.1f}"
            f"{row['examples/s']:>12.1f}{row['tokens/s']:>10.0f}{row['vs K=1']:>8.2f}"
            f"{cell(row['bubble GPipe'], 14)}{cell(row['bubble measured'], 17)}"
            f"{cell(row['overlap'], 9)}")
    stages = next((row["stages"] for row in report["rows"] if row["stages"]), None)
    if stages:
        lines.append(stages)
    lines.append("bubble measured = 1 - (sum of stage busy time) / (K x step span) from a "
                 "profiler trace; overlap = share of the span with both stages running ops.")
    return "\n".join(lines)


def parser():
    """Flags of `tfdist bench model-parallel` (see `--help`).

    Example:

    >>> parser().parse_args(["--quick"]).quick
    True
    """
    from tfdist.bench.flags import split_transformer_parser

    return split_transformer_parser(
        "tfdist bench model-parallel",
        "Layer-wise model parallelism on 2 devices (2 GPUs, or 2 logical CPUs): one device vs "
        "2 stages without pipelining (1 micro-batch) vs 2 pipelined stages (GPipe), "
        "alternating rounds: step time, throughput and the bubble fraction (GPipe's formula "
        "and measured from a profiler trace).",
        "--micro-batches", 4, "micro-batches of the pipelined setting (default 4)")


def split_bench_args(parser, argv):
    """The flags of a benchmark that splits the Transformer (`split_transformer_parser`'s)
    parsed, `--quick` presetting `QUICK`: flags given with it win.

    Args:
        parser: the benchmark's parser.
        argv: its arguments.

    Example:

    >>> args = split_bench_args(parser(), ["--quick", "--batch", "16"])
    >>> args.batch, args.steps, args.warmup_steps
    (16, 2, 1)
    """
    from tfdist.bench.flags import parse_quick

    return parse_quick(parser, argv, QUICK)


def run_split_bench(args, devices, run, format_report, **options):
    """Runs a benchmark that splits the Transformer over `devices` devices from its
    parsed flags (`split_transformer_parser`'s), on logical CPUs where there are
    fewer GPUs, and prints its table (and writes its JSON with `--json-out`).

    Args:
        args: the parsed flags (`split_bench_args`).
        devices: how many devices the split setting needs.
        run: the benchmark, `run(size=..., batch=..., ..., log=print) -> report`.
        format_report: `format_report(report) -> str`.
        **options: the benchmark's own arguments (e.g. `shards=2`).

    Returns:
        The exit code, 0.

    Example:

    >>> run_split_bench(args, 2, run_model_parallel_bench, format_report,
    ...                 micro_batches=4)  # doctest: +SKIP
    0
    """
    from tfdist.runtime.tf_logging import import_tensorflow

    tf = import_tensorflow(args.tf_log_level)
    if len(tf.config.list_physical_devices("GPU")) < devices:
        from tfdist.distribute.devices import split_cpu_into_logical_devices

        split_cpu_into_logical_devices(devices)
    options.update(size=args.size, batch=args.batch, steps=args.steps, rounds=args.rounds,
                   sequence_length=args.sequence_length, vocab_size=args.vocab_size,
                   num_layers=args.layers)
    if args.quick:
        options.update(warmup_steps=args.warmup_steps)
    report = run(**options, log=print)
    print_report(format_report(report), report, args.json_out)
    return 0


def main(argv=None):
    """`tfdist bench model-parallel [FLAGS]`: runs the benchmark, prints the table; exit code.

    Example:

    >>> main(["--quick"])  # doctest: +SKIP
    0
    """
    args = split_bench_args(parser(), sys.argv[1:] if argv is None else argv)
    return run_split_bench(args, 2, run_model_parallel_bench, format_report,
                           micro_batches=args.micro_batches)


if __name__ == "__main__":
    sys.exit(main())
