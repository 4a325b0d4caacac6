"""Multi-worker test worker for tfdist.data sharding.

Builds MultiWorkerMirroredStrategy with tfdist.distribute.strategy_factory.create_strategy (which
signals the launcher), then for each source iterates one epoch of
`distribute_dataset` (training order, no repeat, partial last batch kept) and
records the example ids this worker's replicas received, plus the shard mode
the pipeline logged. Writes `{out}/worker-{rank}.json`.

Example ids: every example's inputs are `[BOS, 4 + id, 4 + id, ...]`, so
`id = inputs[:, 1] - 4`.

Usage: data_shard_worker.py --data-dir DIR --out DIR --global-batch-size 4
"""

import os

import numpy as np

from shard_common import run, shard_arguments
from tfdist.data import ArraySource, TFRecordSource
from tfdist.data.tokens import NUM_RESERVED


def id_rows(ids):
    """`[BOS, 4 + id, 4 + id, EOS]` rows, the layout the test writes to files."""
    ids = np.asarray(ids)
    return np.stack([np.ones_like(ids), ids + NUM_RESERVED, ids + NUM_RESERVED,
                     np.full_like(ids, 3)], axis=1)


def main():
    args = shard_arguments(memory_examples=19, vocab_size=1000)

    def sources():
        return {
            "many_files": TFRecordSource(os.path.join(args.data_dir, "many-*.tfrecord"),
                                         sequence_length=3, vocab_size=args.vocab_size),
            "one_file": TFRecordSource(os.path.join(args.data_dir, "one-*.tfrecord"),
                                       sequence_length=3, vocab_size=args.vocab_size),
            "memory": ArraySource.from_token_rows(id_rows(np.arange(args.memory_examples)),
                                                  args.vocab_size),
        }

    def batch_ids(name, source, element):
        inputs, _ = element
        return [int(i) - NUM_RESERVED for i in inputs.numpy()[:, 1]]

    run(sources, batch_ids, args.out, args.global_batch_size)


if __name__ == "__main__":
    from tfdist.runtime.quick_exit import skip_exit_garbage_collection

    skip_exit_garbage_collection()  # the test waits for this process to end
    main()
