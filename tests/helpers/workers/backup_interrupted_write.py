"""Kill a process while it writes a backup (for the atomic-write test).

Trains a model with one large weight matrix (so that writing a backup takes
a while) with tfdist's `Trainer` and `BackupAndResume(save_freq=1)`, one
epoch of `STEPS` batches. With `--kill-during-backup N` a watcher thread
SIGKILLs the process as soon as the saver's temporary folder of backup N
(`<backup>/ckpt-N_temp`) appears, i.e. in the middle of writing it.
Run again without the flag, it resumes from the last committed backup.

Prints `resumed at epoch E step S` (or `started fresh`) and `done`.

Usage: python tests/helpers/workers/backup_interrupted_write.py --backup DIR [--kill-during-backup N]
"""

import argparse
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# tests/ on the path (run as a script, only this folder is): the shared helpers.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from tfdist.callbacks.backup import BackupAndResume  # noqa: E402
from tfdist.training import Trainer  # noqa: E402
from helpers.sigkill import sigkill_self_when_exists  # noqa: E402

FEATURES = 4096
UNITS = 2048  # 8.4 M weights + momentum: about 67 MB per backup
STEPS = 3
BATCH = 4


def build():
    model = keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(UNITS)])
    rs = np.random.RandomState(0)
    model.set_weights([(0.01 * rs.standard_normal(w.shape)).astype("float32")
                       for w in model.get_weights()])
    trainer = Trainer(model, keras.optimizers.SGD(0.01, momentum=0.9), "mse")
    return model, trainer


def data():
    rs = np.random.RandomState(1)
    x = rs.standard_normal((STEPS * BATCH, FEATURES)).astype("float32")
    y = rs.standard_normal((STEPS * BATCH, UNITS)).astype("float32")
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH)


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--backup", required=True)
    parser.add_argument("--kill-during-backup", type=int, default=None)
    args = parser.parse_args()
    model, trainer = build()
    if args.kill_during_backup is not None:
        sigkill_self_when_exists(os.path.join(args.backup, f"ckpt-{args.kill_during_backup}_temp"),
                                 poll_seconds=0.0005)
    backup = BackupAndResume(args.backup, save_freq=1, max_to_keep=2, verbose=2)
    trainer.fit(data(), epochs=1, steps_per_epoch=STEPS, callbacks=[backup], verbose=0)
    info = backup.restored
    print("started fresh" if info is None else f"resumed at epoch {info.epoch} step {info.step}",
          flush=True)
    np.save(os.path.join(args.backup, os.pardir, "final_bias.npy"), model.layers[0].bias.numpy())
    print("done", flush=True)


if __name__ == "__main__":
    from tfdist.runtime.quick_exit import skip_exit_garbage_collection

    skip_exit_garbage_collection()  # the test waits for this process to end
    sys.exit(main())
