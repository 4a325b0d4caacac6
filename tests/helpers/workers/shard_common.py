"""What the exactly-once shard workers share: start a 2-worker strategy,
read one epoch of each source and record the example ids each worker saw,
with the shard mode the pipeline announced, into `OUT/worker-RANK.json`."""

import argparse
import json
import logging
import os
import threading

threading.Timer(200, lambda: os._exit(98)).start()  # never outlive the test

from tfdist.data import distribute_dataset  # noqa: E402
from tfdist.distribute.strategy_factory import create_strategy  # noqa: E402


def shard_arguments(**int_options):
    """The worker's command line: --data-dir, --out, --global-batch-size (default 4)
    and an integer option for each keyword, with its value as the default.

    Example: `shard_arguments(memory_examples=19)` also reads `--memory-examples N`.
    """
    parser = argparse.ArgumentParser()
    parser.add_argument("--data-dir", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--global-batch-size", type=int, default=4)
    for name, default in int_options.items():
        parser.add_argument("--" + name.replace("_", "-"), type=int, default=default)
    return parser.parse_args()


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


def run(sources, batch_ids, out, global_batch_size):
    """Reads one epoch of each source on this worker and writes what it saw.

    Args:
        sources: a function `() -> {name: Source}`, called once the strategy
            is up (sources must be made after TensorFlow is configured).
        batch_ids: `(name, source, per_replica_element) -> list of ids`.
        out: the folder for `worker-RANK.json`.
        global_batch_size: the global batch.
    """
    strategy = create_strategy("multi_worker_mirrored")  # also signals the launcher
    rank = strategy.cluster_resolver.task_id
    recorder = ModeRecorder()
    logger = logging.getLogger("tfdist.data")
    logger.setLevel(logging.INFO)
    logger.addHandler(recorder)
    results = {"rank": rank, "replicas": strategy.num_replicas_in_sync, "sources": {}}
    for name, source in sources().items():
        recorder.modes.clear()
        dataset = distribute_dataset(strategy, source, global_batch_size, training=True,
                                     seed=rank + 1, repeat=False, drop_remainder=False)
        ids, steps = [], 0
        for element in dataset:
            steps += 1
            local = [strategy.experimental_local_results(part) for part in element]
            for replica_element in zip(*local, strict=True):
                ids.extend(batch_ids(name, source, replica_element))
        results["sources"][name] = {"ids": ids, "modes": list(recorder.modes), "steps": steps}
        print(f"worker {rank}: {name}: {len(ids)} examples in {steps} steps, "
              f"modes {recorder.modes}", flush=True)
    path = os.path.join(out, f"worker-{rank}.json")
    with open(path + ".tmp", "w") as handle:
        json.dump(results, handle)
    os.replace(path + ".tmp", path)
    os._exit(0)
