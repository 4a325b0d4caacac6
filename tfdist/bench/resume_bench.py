"""`tfdist bench resume`: how long a resumed run waits for its first batch.

For each kind of source the recipes read (embedded shapes, an image folder,
ImageNet-style TFRecords, embedded tokens, text files, token TFRecords of one
example each, text TFRecords packed into windows), written to a temporary
folder, the recipes' training pipeline
(`make_dataset_fn(..., seed=S)`) is built three ways, in alternating rounds:

* `start`: at batch 0, as a fresh run builds it;
* `positioned`: at batch N (`DatasetFn.positioned(N)`), as `Trainer.fit`
  builds it when it resumes from a backup taken N batches in;
* `replay`: at batch 0, then R batches drawn and discarded, as a resume
  that can only replay does (R is small; the table extrapolates to N).

The figure is the time from building the pipeline to its first batch. The
goal: `positioned - start` stays small (<= 2 s) at any N, where replay
grows with N.

Example:

    report = run_resume_bench(position=5000, rounds=3)
    print(format_report(report))
"""

import argparse
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time

from tfdist.bench.report import print_report

SOURCE_KINDS = ("shapes", "image_folder", "imagenet_tfrecord", "embedded", "text", "tfrecord",
                "tfrecord_text")
"""The sources measured, in the table's order."""

QUICK = dict(position=40, replay_batches=5, rounds=1, examples=96, batch=8)
"""What `--quick` presets: flags given with it win (`tfdist.bench.flags.parse_quick`)."""


def _write_sources(kinds, folder, examples, sequence_length):
    """Writes each kind's data under `folder`; returns `{kind: (spec, options)}`."""
    import numpy as np
    import tensorflow as tf

    from tfdist.data.images import generate_shapes, write_image_tfrecords
    from tfdist.data.tfrecord import write_text_tfrecords, write_token_tfrecords

    images, labels = generate_shapes(examples, 32, seed=3)
    made = {}
    for kind in kinds:
        if kind == "shapes":
            made[kind] = ("shapes", dict(num_examples=examples))
        elif kind == "embedded":
            made[kind] = ("embedded:reverse", dict(num_examples=examples))
        elif kind == "imagenet_tfrecord":
            prefix = os.path.join(folder, "images", "train")
            write_image_tfrecords(images, labels, prefix, num_files=4, image_format="png")
            made[kind] = (f"imagenet_tfrecord:{prefix}-*", dict(num_classes=8, image_size=32))
        elif kind == "image_folder":
            root = os.path.join(folder, "folder")
            for index, (image, label) in enumerate(zip(images, labels, strict=True)):
                path = os.path.join(root, f"class_{int(label)}", f"{index:06d}.png")
                tf.io.gfile.makedirs(os.path.dirname(path))
                tf.io.write_file(path, tf.io.encode_png(image))
            made[kind] = (f"image_folder:{root}", dict(image_size=32))
        elif kind == "text":
            rng = np.random.default_rng(5)
            words = ["alpha", "beta", "gamma", "delta", "sigma", "omega", "tau", "rho"]
            for number in range(4):
                lines = [" ".join(rng.choice(words, size=12)) for _ in range(examples // 4)]
                path = os.path.join(folder, "text", f"part-{number}.txt")
                tf.io.gfile.makedirs(os.path.dirname(path))
                with open(path, "w", encoding="utf-8") as handle:
                    handle.write("\n".join(lines) + "\n")
            made[kind] = (f"text:{os.path.join(folder, 'text', '*.txt')}",
                          dict(sequence_length=sequence_length))
        elif kind == "tfrecord":
            rng = np.random.default_rng(6)
            rows = [list(rng.integers(4, 500, size=sequence_length + 1)) for _ in range(examples)]
            prefix = os.path.join(folder, "tokens", "train")
            write_token_tfrecords(rows, prefix, num_files=4)
            made[kind] = (f"tfrecord:{prefix}-*", dict(sequence_length=sequence_length,
                                                       vocab_size=512))
        elif kind == "tfrecord_text":
            rng = np.random.default_rng(7)
            words = ["alpha", "beta", "gamma", "delta", "sigma", "omega", "tau", "rho"]
            texts = [" ".join(rng.choice(words, size=12)) for _ in range(examples)]
            prefix = os.path.join(folder, "texts", "train")
            write_text_tfrecords(texts, prefix, num_files=4)
            made[kind] = (f"tfrecord:{prefix}-*", dict(sequence_length=sequence_length,
                                                       format="text"))
        else:
            raise ValueError(f"unknown source kind {kind!r}; choose from "
                             f"{', '.join(SOURCE_KINDS)}")
    return made


def _first_batch_seconds(build, drawn=0):
    """Seconds from building a dataset (`build()`) to its first batch after `drawn` discarded ones.

    The build is timed too: a positioned pipeline does part of its work there
    (it counts a pass of the source to skip whole passes)."""
    start = time.perf_counter()
    iterator = iter(build())
    for _ in range(drawn + 1):
        next(iterator)
    return time.perf_counter() - start


def run_resume_bench(*, kinds=SOURCE_KINDS, position=5000, replay_batches=200, rounds=3,
                     examples=4096, batch=64, sequence_length=64, seed=1, log=None):
    """Measures the first-batch time at the start, positioned at `position`, and replayed.

    Args:
        kinds: source kinds (`SOURCE_KINDS`).
        position: the global batch a resume starts at.
        replay_batches: batches the replay setting draws (extrapolated to
            `position`).
        rounds: alternating rounds; the table gives medians.
        examples: examples written per source.
        batch: global batch of the pipeline (one pipeline, one replica).
        sequence_length: tokens per example of the token sources.
        seed: the pipeline's seed.
        log: None, or `print`-like for progress lines.

    Returns:
        A dict: machine and settings, and one row per kind with the medians
        (`start s`, `positioned s`, `replay s`, `replay per batch ms`,
        `replay at N s` extrapolated, `positioned - start s`) and whether
        the batch positioned at R equals the R+1-th batch replayed
        (`same batch`).

    Example:

        report = run_resume_bench(kinds=("shapes",), position=1000, rounds=1)
    """
    import numpy as np
    import tensorflow as tf

    from tfdist.data import make_dataset_fn, make_source

    folder = tempfile.mkdtemp(prefix="tfdist-resume-bench-")
    rows = []
    try:
        made = _write_sources(kinds, folder, examples, sequence_length)
        for kind in kinds:
            spec, options = made[kind]
            fn = make_dataset_fn(make_source(spec, **options), batch, seed=seed)
            if not fn.can_position:
                raise ValueError(f"the {kind} pipeline cannot be positioned")
            times = {"start": [], "positioned": [], "replay": []}
            for round_index in range(rounds):
                times["start"].append(_first_batch_seconds(lambda: fn(None)))
                times["positioned"].append(
                    _first_batch_seconds(lambda: fn.positioned(position)(None)))
                times["replay"].append(_first_batch_seconds(lambda: fn(None), replay_batches))
                if log:
                    log(f"{kind} round {round_index + 1}/{rounds}: "
                        + ", ".join(f"{name} {values[-1]:.2f} s"
                                    for name, values in times.items()))
            # The positioned pipeline gives the replayed batch (checked at R: replaying
            # to N would cost what the table extrapolates).
            replayed = next(iter(fn(None).skip(replay_batches)))
            positioned = next(iter(fn.positioned(replay_batches)(None)))
            same = all(np.array_equal(a, b) for a, b in zip(
                tf.nest.flatten(replayed), tf.nest.flatten(positioned), strict=True))
            start, at, replay = (statistics.median(times[name])
                                 for name in ("start", "positioned", "replay"))
            per_batch = max(replay - start, 0.0) / replay_batches
            rows.append({"source": kind, "spec": spec.split(":")[0], "start s": start,
                         "positioned s": at, "positioned - start s": at - start,
                         "replay s": replay, "replay per batch ms": 1000 * per_batch,
                         "replay at N s": start + per_batch * position, "same batch": same})
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return {"machine": platform.processor() or platform.machine(),
            "tensorflow": tf.__version__, "position": position,
            "replay_batches": replay_batches, "rounds": rounds, "examples": examples,
            "batch": batch, "rows": rows}


def format_report(report):
    """The report as a table (one line per source).

    Example:

        print(format_report(run_resume_bench(rounds=1)))
    """
    n = report["position"]
    lines = [f"First batch of a resumed run at batch N={n} (global batch {report['batch']}, "
             f"{report['examples']} examples per source, median of {report['rounds']} "
             f"round(s); replay drawn for {report['replay_batches']} batches and extrapolated):",
             f"{'source':<19}{'start s':>9}{'positioned s':>14}{'extra s':>9}"
             f"{'replay ms/batch':>17}{'replay at N s':>15}{'same at R':>11}"]
    for row in report["rows"]:
        lines.append(f"{row['source']:<19}{row['start s']:>9.2f}{row['positioned s']:>14.2f}"
                     f"{row['positioned - start s']:>9.2f}{row['replay per batch ms']:>17.1f}"
                     f"{row['replay at N s']:>15.1f}{'yes' if row['same batch'] else 'NO':>11}")
    lines.append("extra = positioned - start: what resuming at batch N adds to a fresh start.")
    return "\n".join(lines)


def parser():
    """Flags of `tfdist bench resume` (see `--help`).

    Example:

    >>> parser().parse_args(["--position", "100"]).position
    100
    """
    from tfdist.runtime.argtypes import int_at_least
    from tfdist.runtime.tf_logging import add_tf_log_level_flag

    positive = int_at_least(1)
    result = argparse.ArgumentParser(
        prog="tfdist bench resume",
        description="Time to the first batch of the recipes' training pipelines at batch 0, "
                    "positioned at batch N (how a resume builds them) and replayed, for every "
                    "kind of source, in alternating rounds.")
    result.add_argument("--position", type=positive, default=5000,
                        help="the batch a resume starts at (default %(default)s)")
    result.add_argument("--replay-batches", type=positive, default=200,
                        help="batches the replay setting draws (default %(default)s)")
    result.add_argument("--rounds", type=positive, default=3,
                        help="alternating rounds (default %(default)s)")
    result.add_argument("--examples", type=positive, default=4096,
                        help="examples per source (default %(default)s)")
    result.add_argument("--batch", type=positive, default=64,
                        help="global batch (default %(default)s)")
    result.add_argument("--sources", default=",".join(SOURCE_KINDS),
                        help="comma-separated, of: " + ", ".join(SOURCE_KINDS))
    result.add_argument("--json-out", default=None, help="also write the report as JSON here")
    result.add_argument("--quick", action="store_true",
                        help="tiny data, position 40, batch 8, one round (for tests); flags "
                             "given with it win")
    add_tf_log_level_flag(result)
    return result


def main(argv=None):
    """`tfdist bench resume [FLAGS]`: runs the benchmark, prints the table; exit code.

    Example:

    >>> main(["--quick"])  # doctest: +SKIP
    0
    """
    from tfdist.bench.flags import parse_quick
    from tfdist.runtime.tf_logging import import_tensorflow

    args = parse_quick(parser(), sys.argv[1:] if argv is None else argv, QUICK)
    kinds = tuple(kind.strip() for kind in args.sources.split(",") if kind.strip())
    bad = [kind for kind in kinds if kind not in SOURCE_KINDS]
    if bad or not kinds:
        raise ValueError(f"--sources {args.sources!r}: choose from {', '.join(SOURCE_KINDS)}")
    import_tensorflow(args.tf_log_level)
    options = dict(position=args.position, replay_batches=args.replay_batches,
                   rounds=args.rounds, examples=args.examples, batch=args.batch)
    report = run_resume_bench(kinds=kinds, **options, log=print)
    print_report(format_report(report), report, args.json_out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
