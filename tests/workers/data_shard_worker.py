"""Multi-worker test worker for tfdist.data sharding.

Builds MultiWorkerMirroredStrategy from TF_CONFIG, creates TFDIST_READY_FILE,
then for each source named on the command line iterates one epoch of
`distribute_dataset` (training order, no repeat, partial last batch kept) and
records the example ids this worker's replicas received, plus the shard mode
the pipeline logged. Writes `{out}/worker-{rank}.json`.

Example ids: every example's inputs are `[BOS, 4 + id, 4 + id, ...]`, so
`id = inputs[:, 1] - 4`.

Usage: data_shard_worker.py --data-dir DIR --out DIR --global-batch-size 4
"""

import argparse
import json
import logging
import os
import threading

threading.Timer(200, lambda: os._exit(98)).start()  # never outlive the test

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from tfdist.data import ArraySource, TFRecordSource, distribute_dataset  # noqa: E402
from tfdist.data.tokens import NUM_RESERVED  # noqa: E402


class ModeRecorder(logging.Handler):
    """Keeps the shard modes announced on the tfdist.data logger."""

    def __init__(self):
        super().__init__(logging.INFO)
        self.modes = []

    def emit(self, record):
        message = record.getMessage()
        for mode in ("FILE", "RECORD"):
            if f"sharding by {mode}" in message:
                self.modes.append(mode.lower())


def id_rows(ids):
    """`[BOS, 4 + id, 4 + id, EOS]` rows, the layout the test writes to files."""
    ids = np.asarray(ids)
    return np.stack([np.ones_like(ids), ids + NUM_RESERVED, ids + NUM_RESERVED,
                     np.full_like(ids, 3)], axis=1)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--data-dir", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--global-batch-size", type=int, default=4)
    parser.add_argument("--memory-examples", type=int, default=19)
    parser.add_argument("--vocab-size", type=int, default=1000)
    args = parser.parse_args()

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    if os.environ.get("TFDIST_READY_FILE"):
        open(os.environ["TFDIST_READY_FILE"], "w").close()
    rank = strategy.cluster_resolver.task_id

    recorder = ModeRecorder()
    logger = logging.getLogger("tfdist.data")
    logger.setLevel(logging.INFO)
    logger.addHandler(recorder)

    sources = {
        "many_files": TFRecordSource(os.path.join(args.data_dir, "many-*.tfrecord"),
                                     sequence_length=3, vocab_size=args.vocab_size),
        "one_file": TFRecordSource(os.path.join(args.data_dir, "one-*.tfrecord"),
                                   sequence_length=3, vocab_size=args.vocab_size),
        "memory": ArraySource.from_token_rows(id_rows(np.arange(args.memory_examples)),
                                                      args.vocab_size),
    }
    results = {"rank": rank, "replicas": strategy.num_replicas_in_sync, "sources": {}}
    for name, source in sources.items():
        recorder.modes.clear()
        dataset = distribute_dataset(strategy, source, args.global_batch_size, training=True,
                                     seed=rank + 1, repeat=False, drop_remainder=False)
        ids, steps = [], 0
        for inputs, _ in dataset:
            steps += 1
            for local in strategy.experimental_local_results(inputs):
                ids.extend(int(i) - NUM_RESERVED for i in local.numpy()[:, 1])
        results["sources"][name] = {"ids": ids, "modes": list(recorder.modes), "steps": steps}
        print(f"worker {rank}: {name}: {len(ids)} examples in {steps} steps, "
              f"modes {recorder.modes}", flush=True)

    path = os.path.join(args.out, f"worker-{rank}.json")
    with open(path + ".tmp", "w") as handle:
        json.dump(results, handle)
    os.replace(path + ".tmp", path)
    os._exit(0)


if __name__ == "__main__":
    main()
