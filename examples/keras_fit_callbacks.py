"""Example app: tfdist's callbacks in a plain Keras `model.fit` (no tfdist Trainer).

An app that keeps its own `model.compile` / `model.fit` loop can still use
tfdist's callbacks; this one trains a small classifier on generated data
(no download) in a few seconds, on one device or under `MirroredStrategy`:

    python examples/keras_fit_callbacks.py --out /tmp/run
    python examples/keras_fit_callbacks.py --out /tmp/run --strategy mirrored --devices 2

The task is fixed: every example is labelled by one linear map
(`labelling_matrix()`); the training and validation sets are features drawn
with different seeds and labelled by that same map, so `val_accuracy`
measures how well the model learnt the task on examples it never saw.

It uses:

* a warmup + cosine learning-rate schedule (`tfdist.schedules.make_schedule`)
  and `LearningRateLogger`, which puts `learning_rate` into the logs;
* `ThroughputMeter` (examples/s, step time) and `DeviceMemoryMonitor`
  (host / GPU memory) into the same logs;
* `NanGuard`, which stops on a NaN/Inf loss and keeps the last good backup;
* `BackupAndResume`, which backs up every `--save-freq` steps and at every
  epoch end: run the same command again (after a crash, or with more
  `--epochs`) and training resumes from the backup. With `model.fit` it
  resumes at the right epoch (Keras cannot start mid-epoch; it warns when
  the partial epoch is redone); tfdist's `Trainer` resumes at the exact step;
* `make_logging_callbacks`: a CSV log (and TensorBoard when installed),
  written once per job.

Outputs under `--out`:

    logs/training_log.csv   one row per epoch: loss, accuracy, val_loss, val_accuracy,
                            learning_rate, examples_per_sec, step_time_ms, host memory, ...
    logs/tensorboard/       when the tensorboard package is installed
    backup/                 the backups (ckpt-N.*, checkpoint)
    summary.json            final logs, throughput summary, where training resumed
"""

import argparse
import json
import os
import sys

from tfdist.runtime.tf_logging import import_tensorflow

tf = import_tensorflow()  # before anything imports TensorFlow: a quiet start-up

import keras  # noqa: E402
import numpy as np  # noqa: E402

from tfdist.callbacks import (DeviceMemoryMonitor, LearningRateLogger, NanGuard,  # noqa: E402
                              ThroughputMeter, make_logging_callbacks)
from tfdist.callbacks.backup import BackupAndResume, latest_backup  # noqa: E402
from tfdist.schedules import make_schedule  # noqa: E402
from tfdist.distribute.strategy_factory import create_strategy  # noqa: E402
from tfdist.distribute.introspection import describe_strategy  # noqa: E402

FEATURES = 16
CLASSES = 4
# The task: one labelling map for training and validation alike. Its seed is
# its own, apart from the seeds of the features (0 training, 1 validation).
LABELLING_SEED = 1234
TRAINING_SEED = 0
VALIDATION_SEED = 1


def labelling_matrix():
    """The fixed (FEATURES, CLASSES) linear map that labels every example of the task."""
    return np.random.RandomState(LABELLING_SEED).standard_normal(
        (FEATURES, CLASSES)).astype("float32")


def generated_data(examples, seed=TRAINING_SEED):
    """`examples` examples of the task: features from N(0, 1) drawn with `seed`,
    labelled by the argmax of `labelling_matrix()`, which is the same whatever
    the seed; training and validation data differ only in their features.

    Returns:
        (x, y): float32 features (examples, FEATURES), int32 labels (examples,).
    """
    x = np.random.RandomState(seed).standard_normal((examples, FEATURES)).astype("float32")
    y = np.argmax(x @ labelling_matrix(), axis=1).astype("int32")
    return x, y


def build_model(learning_rate):
    """A compiled MLP classifier (logits) trained by SGD with `learning_rate` (a schedule)."""
    model = keras.Sequential([
        keras.Input((FEATURES,)),
        keras.layers.Dense(64, activation="relu"),
        keras.layers.Dense(CLASSES),
    ])
    model.compile(optimizer=keras.optimizers.SGD(learning_rate, momentum=0.9),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    return model


def parse_args(argv=None):
    """The command-line flags (`argv`, default `sys.argv[1:]`), checked."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="output folder")
    parser.add_argument("--strategy", choices=("none", "mirrored"), default="none",
                        help="'mirrored': tf.distribute.MirroredStrategy over --devices")
    parser.add_argument("--devices", type=int, default=2,
                        help="devices for --strategy mirrored (CPUs are split into "
                             "logical devices when there is no GPU)")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--examples", type=int, default=2048, help="training examples")
    parser.add_argument("--validation-examples", type=int, default=512)
    parser.add_argument("--batch-size", type=int, default=64, help="global batch size")
    parser.add_argument("--learning-rate", type=float, default=0.05)
    parser.add_argument("--warmup-steps", type=int, default=8)
    parser.add_argument("--save-freq", type=int, default=10, help="backup every N steps")
    args = parser.parse_args(argv)
    for name in ("epochs", "examples", "validation_examples", "batch_size", "save_freq",
                 "devices"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.examples < args.batch_size:
        parser.error(f"--examples ({args.examples}) must be at least --batch-size "
                     f"({args.batch_size}): the last partial batch is dropped.")
    return args


def main(argv=None):
    """Trains (or resumes) with the callbacks and writes the outputs under `--out`; returns 0."""
    args = parse_args(argv)
    if args.strategy == "mirrored":
        strategy = create_strategy("mirrored", devices=args.devices)
    else:
        strategy = tf.distribute.get_strategy()
    info = describe_strategy(strategy)
    print(f"strategy: {info.name}, {info.num_replicas} replica(s)", flush=True)

    x, y = generated_data(args.examples, seed=TRAINING_SEED)
    dataset = (tf.data.Dataset.from_tensor_slices((x, y))
               .batch(args.batch_size, drop_remainder=True).prefetch(2))
    # Held-out features of the same task (same labelling map, other seed).
    x_val, y_val = generated_data(args.validation_examples, seed=VALIDATION_SEED)
    validation = tf.data.Dataset.from_tensor_slices((x_val, y_val)).batch(args.batch_size)
    steps_per_epoch = args.examples // args.batch_size
    schedule = make_schedule("cosine", args.learning_rate, warmup_steps=args.warmup_steps,
                             total_steps=args.epochs * steps_per_epoch)
    with strategy.scope():
        model = build_model(schedule)

    backup_dir = os.path.join(args.out, "backup")
    resuming = latest_backup(backup_dir) is not None
    # A resumed run keeps the CSV rows of the interrupted one.
    logging_callbacks = make_logging_callbacks(os.path.join(args.out, "logs"), append=resuming)
    meter = ThroughputMeter(global_batch_size=args.batch_size,
                            num_replicas=info.num_replicas)
    backup = BackupAndResume(backup_dir, save_freq=args.save_freq, max_to_keep=2)
    callbacks = [
        LearningRateLogger(),    # producers first: the loggers after them see the values
        meter,
        DeviceMemoryMonitor(),
        NanGuard(),              # before the backup: a NaN step is never backed up
        backup,
        *logging_callbacks,
    ]
    history = model.fit(dataset, epochs=args.epochs, validation_data=validation,
                        callbacks=callbacks, verbose=2)

    final = {k: float(v[-1]) for k, v in history.history.items() if v}
    summary = {
        "strategy": info.name,
        "num_replicas": info.num_replicas,
        "epochs_run": len(history.history.get("loss", [])),
        "final_logs": final,
        "throughput": meter.summary,
        "resumed_from": None if backup.restored is None else {
            "epoch": backup.restored.epoch, "step": backup.restored.step,
            "global_step": backup.restored.global_step},
        "last_backup": None if backup.last_backup is None else backup.last_backup.path,
    }
    with open(os.path.join(args.out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2)
    print(f"summary written to {os.path.join(args.out, 'summary.json')}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
