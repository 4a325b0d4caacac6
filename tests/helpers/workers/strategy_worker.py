"""Test worker for tfdist.distribute.strategy_factory: builds a strategy with `create_strategy`
from the environment the launcher (or the test) set, runs one all-reduce of
(worker index + 1) per replica inside a tf.function, reads back a variable
created in the strategy scope, and prints one line

    STRATEGY_RESULT {"name": ..., "num_workers": ..., "allreduce": ..., ...}

Usage: python tests/helpers/workers/strategy_worker.py [strategy-name [collective-timeout]]
"""

import json
import os
import sys

import tensorflow as tf

from tfdist.distribute.strategy_factory import create_strategy
from tfdist.distribute.introspection import describe_strategy
from tfdist.distribute.collectives import is_chief
from tfdist.distribute.startup import READY_FILE_ENV

name = sys.argv[1] if len(sys.argv) > 1 else "auto"
collective_timeout = float(sys.argv[2]) if len(sys.argv) > 2 else None
strategy = create_strategy(name, collective_timeout=collective_timeout)
info = describe_strategy(strategy)
ready_file = os.environ.get(READY_FILE_ENV)

with strategy.scope():
    # Each worker proposes a different initial value; the strategy broadcasts the chief's.
    variable = tf.Variable(float(100 + info.worker_index))


@tf.function
def all_reduce():
    def replica_fn():
        context = tf.distribute.get_replica_context()
        return context.all_reduce(tf.distribute.ReduceOp.SUM,
                                  tf.constant(float(info.worker_index + 1)))
    return strategy.run(replica_fn)


total = strategy.experimental_local_results(all_reduce())[0]
result = {
    "name": info.name, "num_replicas": info.num_replicas, "num_workers": info.num_workers,
    "worker_index": info.worker_index, "is_chief": info.is_chief,
    "is_chief_fn": is_chief(strategy), "devices": list(info.devices), "note": info.note,
    "allreduce": float(total), "variable": float(variable.numpy()),
    "ready_file": bool(ready_file) and os.path.exists(ready_file),
    # Private, but the only way to see that the option reached TensorFlow.
    "collective_timeout": strategy.extended._communication_options.timeout_seconds,
}
print("STRATEGY_RESULT " + json.dumps(result), flush=True)
