"""One task of a SLURM job step, for tests/test_slurm.py.

Started by the test with the variables `srun` sets (SLURM_PROCID,
SLURM_STEP_NODELIST, ...) and no TF_CONFIG. Creates the strategy with
`create_strategy("multi_worker_mirrored", cluster_resolver="slurm")`, fits a
tiny regression model with tfdist's `Trainer` (SGD, global batch 16, 2
epochs, no shuffling) and prints one line

    SLURM_RESULT {"rank": ..., "task": [...], "weights": [...], ...}

Usage: python tests/helpers/workers/slurm_worker.py
"""

import json
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402

from tfdist.distribute.strategy_factory import create_strategy  # noqa: E402
from tfdist.distribute.introspection import describe_strategy, num_workers, task_info  # noqa: E402
from tfdist.training import Trainer  # noqa: E402

FEATURES, TARGETS, EXAMPLES = 4, 2, 64


def data():
    """The same arrays in every process (and in the test's reference fit)."""
    rs = np.random.RandomState(0)
    x = rs.standard_normal((EXAMPLES, FEATURES)).astype("float32")
    y = np.tanh(x @ rs.standard_normal((FEATURES, TARGETS))).astype("float32")
    return x, y


def build_model():
    """A Dense model with fixed initial weights; call inside a strategy scope."""
    model = keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(8, activation="tanh"),
                              keras.layers.Dense(TARGETS)])
    rs = np.random.RandomState(1)
    model.set_weights([(0.5 * rs.standard_normal(w.shape)).astype("float32")
                       for w in model.get_weights()])
    model.compile(keras.optimizers.SGD(0.1), "mse")
    return model


def main():
    strategy = create_strategy("multi_worker_mirrored", cluster_resolver="slurm")
    info = describe_strategy(strategy)
    with strategy.scope():
        model = build_model()
    x, y = data()
    history = Trainer(model).fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0)
    resolver = strategy.cluster_resolver
    print("SLURM_RESULT " + json.dumps({
        "rank": int(os.environ["SLURM_PROCID"]),
        "resolver": type(resolver).__name__,
        "cluster": resolver.cluster_spec().as_dict(),
        "task": list(task_info(strategy)),
        "num_workers": num_workers(strategy),
        "num_replicas": info.num_replicas,
        "worker_index": info.worker_index,
        "is_chief": info.is_chief,
        "loss": [float(v) for v in history.history["loss"]],
        "weights": [w.tolist() for w in model.get_weights()],
    }), flush=True)


if __name__ == "__main__":
    from tfdist.runtime.quick_exit import skip_exit_garbage_collection

    skip_exit_garbage_collection()  # the test waits for this process to end
    main()
