"""`tfdist bench tensor-parallel`: one device against the layers split over K devices.

Two settings of the same Transformer and global batch, in one process, in
alternating rounds (these machines are noisy):

* `K=1`: the whole model on one device (plain `Trainer`);
* `K`: attention split by heads, the MLP by channels, the token embedding
  and the output projection by vocabulary over K devices (`Trainer(tensor_parallel=K)`
  with `tfdist.models.decoder_lm_layout_map`).

For each: the median step time, examples/s and tokens/s, and for the split
the communication it needs, two ways:

* by formula (Megatron's pattern): every block sums K partial products
  twice forward (after the attention, after the MLP) and twice backward (the
  gradients of their inputs), the token embedding split by vocabulary once
  forward (its partial lookups), and the output projection split by
  vocabulary once backward (the gradient of its input; its loss sends only
  4 numbers per token and shard), so a step makes `4 L + 2` all-reduces of a
  `B x T x d` activation (`all_reduce_volume`). On one worker tfdist sums on
  the first device: each sum moves `K-1` partials there and its result back
  to the K-1 others, `2 (K-1) B T d` values.
* measured from a profiler trace of one step: the number of tensors sent
  between devices (TensorFlow's `_Send` ops) and the share of the step's op
  time spent in those transfers (`_Send`/`_Recv`) and in the partial-product
  sums (`AddN`).

Without GPUs the K devices are logical CPUs that share the machine's cores
(and memory: a tensor "sent" between them is not copied), so the split adds
synchronisation and no compute: on CPUs the figures show the mechanism and
its cost, not the speed-up or the memory relief K GPUs give.

Example:

    report = run_tensor_parallel_bench(size="tiny", batch=32, steps=10)
    print(format_report(report))
"""

import os
import shutil
import statistics
import sys
import tempfile
import time

from tfdist.bench.pipeline_bench import (bench_decoder_lm, run_split_bench, split_bench_args,
                                         token_dataset)
from tfdist.precision import cpu_model_name


def all_reduce_volume(num_layers, batch, sequence_length, d_model, shards, bytes_per_value=4,
                      vocabulary_split=True):
    """The communication of one training step of the split decoder LM, by formula.

    Returns:
        `{"all_reduces": n, "values_each": B T d, "all_reduce_bytes": n B T d s,
        "moved_bytes": n x 2 (K-1) B T d s}` with `n = 4 L` (+ 2 when the token
        embedding and the output projection are split by vocabulary):
        `moved_bytes` is what tfdist's sum on the first device moves between
        devices (the K-1 partials in, the sum back out).

    Example:

    >>> all_reduce_volume(2, 32, 64, 128, 2, vocabulary_split=False)["moved_bytes"] / 2 ** 20
    16.0
    """
    values = batch * sequence_length * d_model
    all_reduces = 4 * num_layers + (2 if vocabulary_split else 0)
    return {"all_reduces": all_reduces, "values_each": values,
            "all_reduce_bytes": all_reduces * values * bytes_per_value,
            "moved_bytes": all_reduces * 2 * (shards - 1) * values * bytes_per_value}


def communication_activity(lines):
    """Cross-device sends and the time share of transfers and partial sums in a trace.

    Args:
        lines: `{thread name: [(op name, start, duration), ...]}`
            (`tfdist.bench.profile.read_xspace`).

    Returns:
        `{"sends": n, "share": (transfer + sum time) / all op time}`, or None
        without op events.

    Example:

    >>> communication_activity({"tf_Compute/1": [("a/MatMul", 0, 6), ("x/_1:_Send", 6, 1),
    ...                                          ("block_0/AddN", 7, 1)]})
    {'sends': 1, 'share': 0.25}
    """
    total = communication = sends = 0
    for thread, events in lines.items():
        if not thread.startswith("tf_Compute"):
            continue
        for name, _, duration in events:
            total += duration
            kind = name.rsplit(":", 1)[-1] if ":" in name else name.rsplit("/", 1)[-1]
            if kind in ("_Send", "_Recv", "_HostSend", "_HostRecv"):
                communication += duration
                sends += kind in ("_Send", "_HostSend")
            elif kind.startswith("AddN"):
                communication += duration
    if not total:
        return None
    return {"sends": sends, "share": communication / total}


def _make_trainer(size, num_layers, sequence_length, vocab_size, shards, seed):
    import keras

    from tfdist.models import decoder_lm_layout_map
    from tfdist.training import Trainer
    from tfdist.training.tensor_parallel.split import shard_devices

    model, config = bench_decoder_lm(size, num_layers, sequence_length, vocab_size, seed)
    if shards == 1:
        return Trainer(model), config
    mesh = keras.distribution.DeviceMesh((shards,), ["model"], devices=shard_devices(shards))
    return Trainer(model, tensor_parallel=shards,
                   layout_map=decoder_lm_layout_map(mesh)), config


def _profile_one_step(trainer, iterator):
    import tensorflow as tf

    from tfdist.bench.profile import find_xspace, read_xspace

    folder = tempfile.mkdtemp(prefix="tfdist-tensor-parallel-")
    try:
        tf.profiler.experimental.start(folder)
        try:
            trainer.step_functions.train_function(iterator, tf.constant(1, tf.int32))
        finally:
            tf.profiler.experimental.stop()
        return communication_activity(read_xspace(find_xspace(folder)))
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def run_tensor_parallel_bench(size="tiny", batch=32, shards=2, steps=10, rounds=3,
                              sequence_length=64, vocab_size=512, num_layers=None,
                              warmup_steps=2, seed=0, log=None):
    """Measures one device against `shards` devices; returns the report (a dict).

    Needs `shards` devices of one kind (GPUs, or the CPU split into logical
    devices before TensorFlow started; `main` does that).

    Args:
        size: the Transformer size (tiny, small, base, large).
        batch: the global batch (examples per step), the same for both.
        shards: K of the split setting (>= 2).
        steps: timed steps per setting and round.
        rounds: alternating rounds (each setting once per round).
        sequence_length, vocab_size: of the synthetic token data.
        num_layers: override the size's number of blocks (None: keep).
        warmup_steps: untimed steps of each setting before the rounds.
        seed: weights and data.
        log: a `print`-like function for progress, or None.

    Returns:
        `{"rows": [...], "volume": all_reduce_volume(...), "cpu": ..., "settings": {...}}`.

    Example:

    >>> report = run_tensor_parallel_bench(steps=4, rounds=2)
    >>> [row["setting"] for row in report["rows"]]
    ['one device', 'split over 2 devices']
    """
    import tensorflow as tf

    say = log or (lambda *args, **kwargs: None)
    contenders = []
    config = None
    for label, k in (("one device", 1), (f"split over {shards} devices", shards)):
        trainer, config = _make_trainer(size, num_layers, sequence_length, vocab_size, k, seed)
        data = token_dataset(batch, sequence_length, vocab_size, seed)
        trainer.fit(data, epochs=1, steps_per_epoch=warmup_steps, verbose=0)  # traces, builds
        iterator = iter(trainer.strategy.experimental_distribute_dataset(data))
        trainer.step_functions.train_function(iterator, tf.constant(1, tf.int32))
        contenders.append({"label": label, "k": k, "trainer": trainer, "iterator": iterator,
                           "times": []})
        say(f"  built {label}")
    for round_index in range(rounds):
        order = contenders if round_index % 2 == 0 else contenders[::-1]
        for contender in order:
            function = contender["trainer"].step_functions.train_function
            for _ in range(steps):
                start = time.perf_counter()
                function(contender["iterator"], tf.constant(1, tf.int32))
                contender["times"].append(time.perf_counter() - start)
        say(f"  round {round_index + 1}/{rounds} done")
    rows, reference = [], None
    for contender in contenders:
        step = statistics.median(contender["times"])
        examples = batch / step
        reference = reference or examples
        activity = _profile_one_step(contender["trainer"], contender["iterator"])
        rows.append({"setting": contender["label"], "K": contender["k"], "step ms": 1000 * step,
                     "examples/s": examples, "tokens/s": examples * sequence_length,
                     "vs K=1": examples / reference,
                     "sends": activity["sends"] if activity else None,
                     "communication share": activity["share"] if activity else None,
                     "step times s": contender["times"]})
    device_type = "GPU" if len(tf.config.list_physical_devices("GPU")) >= shards else "CPU"
    return {"rows": rows, "cpu": cpu_model_name(), "cores": os.cpu_count(),
            "devices": [d.name for d in tf.config.list_logical_devices(device_type)],
            "versions": {"tensorflow": tf.__version__, "keras": _keras_version()},
            "volume": all_reduce_volume(
                config.num_layers, batch, sequence_length, config.d_model, shards,
                vocabulary_split=contenders[1]["trainer"].shard_plan.shard_of("lm_head")
                is not None),
            "settings": {"size": size, "batch": batch, "shards": shards, "steps": steps,
                         "rounds": rounds, "sequence_length": sequence_length,
                         "vocab_size": vocab_size, "num_layers": config.num_layers,
                         "d_model": config.d_model}}


def _keras_version():
    import keras

    return keras.__version__


def format_report(report):
    """The report as a text table, with the machine, the settings and the formula below it.

    Example:

    >>> print(format_report(report))
    Tensor parallelism: Transformer tiny (2 blocks, d 128), batch 32, seq 64, ...
    setting                  K  step ms  examples/s  tokens/s  vs K=1  sends  comm. share
    """
    s, volume = report["settings"], report["volume"]
    lines = [f"Tensor parallelism: Transformer {s['size']} ({s['num_layers']} blocks, d "
             f"{s['d_model']}), batch {s['batch']}, seq {s['sequence_length']}, vocab "
             f"{s['vocab_size']}, median of {s['rounds']} rounds x {s['steps']} steps",
             f"Devices: {', '.join(report['devices'])} on {report['cpu']} "
             f"({report['cores']} cores); TensorFlow {report['versions']['tensorflow']}, "
             f"Keras {report['versions']['keras']}"]
    header = (f"{'setting':<24}{'K':>2}{'step ms':>9}{'examples/s':>12}{'tokens/s':>10}"
              f"{'vs K=1':>8}{'sends':>7}{'comm. share':>13}")
    lines += [header, "-" * len(header)]
    for row in report["rows"]:
        sends = "-" if row["sends"] is None else str(row["sends"])
        share = "-" if row["communication share"] is None else f"{row['communication share']:.0%}"
        lines.append(f"{row['setting']:<24}{row['K']:>2}{row['step ms']:>9.1f}"
                     f"{row['examples/s']:>12.1f}{row['tokens/s']:>10.0f}{row['vs K=1']:>8.2f}"
                     f"{sends:>7}{share:>13}")
    mib = 2 ** 20
    lines.append(
        f"Per step, by formula: {volume['all_reduces']} all-reduces (4 per block, 2 for the "
        f"embedding and output projection split by vocabulary) of "
        f"{volume['values_each']:,} values (B x T x d) = {volume['all_reduce_bytes'] / mib:.1f} "
        f"MiB in float32; summed on the first device they move "
        f"{volume['moved_bytes'] / mib:.1f} MiB between devices.")
    lines.append("sends: tensors sent between devices in one step (profiler _Send ops); comm. "
                 "share: time in those transfers and in the partial-product sums (AddN) over "
                 "all op time. Logical CPUs share cores and memory: cost, not speed-up.")
    return "\n".join(lines)


def parser():
    """Flags of `tfdist bench tensor-parallel` (see `--help`).

    Example:

    >>> parser().parse_args(["--quick"]).quick
    True
    """
    from tfdist.bench.flags import split_transformer_parser

    return split_transformer_parser(
        "tfdist bench tensor-parallel",
        "Tensor parallelism: the Transformer on one device vs its attention, MLPs, embedding "
        "and output projection split over K devices (K GPUs, or K logical CPUs), same global "
        "batch, alternating rounds: step time, throughput, the all-reduce volume per step "
        "(formula) and the transfers and communication share (profiler).",
        "--shards", 2, "K devices of the split setting (default 2)")


def main(argv=None):
    """`tfdist bench tensor-parallel [FLAGS]`: runs the benchmark, prints the table; exit code.

    Example:

    >>> main(["--quick"])  # doctest: +SKIP
    0
    """
    args = split_bench_args(parser(), sys.argv[1:] if argv is None else argv)
    return run_split_bench(args, args.shards, run_tensor_parallel_bench, format_report,
                           shards=args.shards)


if __name__ == "__main__":
    sys.exit(main())
