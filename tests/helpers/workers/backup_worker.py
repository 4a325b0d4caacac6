"""One worker of the multi-worker backup tests (run under tfdist.launch).

Trains the deterministic dense model with tfdist's `Trainer` under
`MultiWorkerMirroredStrategy` (SGD with momentum, so the optimizer state
matters; data shuffled with a seed, reshuffled every epoch) with
`BackupAndResume`, and writes what it saw to
`<out>/rank<R>.json` / `.npz`: where it resumed, the batches it ran, the
history, the last backup and the final weights.

`--kill-at-step S --kill-rank R`: worker R SIGKILLs itself right after the
backup at global step S is written (the callback's barrier guarantees the
chief has committed it by then). Relaunching the same command resumes.

`--second-fit`: after training, call `fit` again with a new callback on the
same folder and report (instead of raising) a `ValueError` from it; with a
backup folder per rank (`--backup` containing `{rank}`) the workers then
disagree on the backup they restore.

Usage: python tests/helpers/workers/backup_worker.py --out DIR --backup DIR [options]
"""

import argparse
import dataclasses
import json
import os
import signal
import sys
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# tests/ too (run as a script, only this folder is): the shared helpers.
sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import train_common as common  # noqa: E402
from tfdist.callbacks.backup import BackupAndResume  # noqa: E402
from tfdist.distribute.strategy_factory import create_strategy  # noqa: E402
from tfdist.training import Trainer  # noqa: E402
from helpers.recorders import BatchRecorder  # noqa: E402

GLOBAL_BATCH = 8
EXAMPLES = 80  # 10 batches per epoch
EPOCHS = 3
SAVE_FREQ = 4
MAX_TO_KEEP = 3


def make_trainer(strategy):
    """The model and trainer of these tests (also built by the test for its reference)."""
    model = common.dense_model(strategy)
    with strategy.scope():
        optimizer = keras.optimizers.SGD(0.1, momentum=0.9)
    return model, Trainer(model, optimizer, "mse", metrics=["mae"], strategy=strategy)


def data():
    """Global batches of a seeded shuffle that reshuffles every epoch."""
    arrays = common.regression_arrays(n=EXAMPLES)
    return tf.data.Dataset.from_tensor_slices(arrays).shuffle(EXAMPLES, seed=7).batch(
        GLOBAL_BATCH)


class KillAfterBackup(keras.callbacks.Callback):
    """SIGKILLs this process once `backup` has written its backup at `step`."""

    def __init__(self, backup, step):
        super().__init__()
        self.backup, self.step = backup, step

    def on_train_batch_end(self, batch, logs=None):
        last = self.backup.last_backup
        if last is not None and last.global_step == self.step:
            print(f"killing myself after the backup at global step {self.step}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)


def info_dict(info):
    return None if info is None else dataclasses.asdict(info)


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", required=True)
    parser.add_argument("--backup", required=True, help="may contain {rank}")
    parser.add_argument("--kill-at-step", type=int, default=None)
    parser.add_argument("--kill-rank", type=int, default=1)
    parser.add_argument("--second-fit", action="store_true")
    args = parser.parse_args()
    strategy = create_strategy("multi_worker_mirrored")
    rank = int(os.environ["TFDIST_RANK"])
    print(f"temporary folder {tempfile.gettempdir()}", flush=True)
    backup_dir = args.backup.format(rank=rank)
    model, trainer = make_trainer(strategy)
    backup = BackupAndResume(backup_dir, save_freq=SAVE_FREQ, max_to_keep=MAX_TO_KEEP, verbose=2)
    recorder = BatchRecorder()
    callbacks = [backup, recorder]
    if args.kill_at_step is not None and rank == args.kill_rank:
        callbacks.append(KillAfterBackup(backup, args.kill_at_step))
    history = trainer.fit(data(), epochs=EPOCHS, callbacks=callbacks, verbose=0)
    result = {"restored": info_dict(backup.restored), "last_backup": info_dict(backup.last_backup),
              "backups_written": backup.backups_written, "batches": recorder.batches,
              "history": history.history}
    if args.second_fit:
        try:
            trainer.fit(data(), epochs=EPOCHS, verbose=0,
                        callbacks=[BackupAndResume(backup_dir, verbose=0)])
            result["second_fit"] = "no error"
        except ValueError as error:
            result["second_fit"] = str(error)
            print(f"second fit refused: {error}", flush=True)
    with open(os.path.join(args.out, f"rank{rank}.json"), "w") as f:
        json.dump(result, f)
    np.savez(os.path.join(args.out, f"rank{rank}.npz"), *common.weights_of(model))
    print(f"worker {rank} done", flush=True)


if __name__ == "__main__":
    from tfdist.runtime.quick_exit import skip_exit_garbage_collection

    skip_exit_garbage_collection()  # the test waits for this process to end
    main()
