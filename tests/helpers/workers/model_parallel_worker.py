"""One worker of the multi-worker model-parallel test (run under tfdist.launch).

Each worker splits its CPU into 2 logical devices, joins a
MultiWorkerMirroredStrategy with one replica (one device) per worker, and
trains the tiny Transformer split into 2 stages (2 micro-batches per step):
2 workers x 2 stage devices, with SGD and again with Adam. It writes
`<out>/rank<R>.npz` (final weights, predictions), `<out>/rank<R>_adam.npz`
(Adam's final weights) and `<out>/rank<R>.json` (histories, evaluation,
stage devices).

Usage: python tests/helpers/workers/model_parallel_worker.py --out DIR
"""

import argparse
import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from tfdist.distribute.devices import split_cpu_into_logical_devices  # noqa: E402

split_cpu_into_logical_devices(2)  # the stage devices, before TensorFlow starts

import numpy as np  # noqa: E402

import model_parallel_common as common  # noqa: E402
from tfdist.distribute.strategy_factory import create_strategy  # noqa: E402
from tfdist.training import Trainer  # noqa: E402

GLOBAL_BATCH = 12
ROWS = 46  # 4 steps, the last on 10 rows (5 per worker)


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    strategy = create_strategy("multi_worker_mirrored", devices=1)
    rank = int(os.environ.get("TFDIST_RANK", "0"))
    data = common.dataset(common.token_arrays(n=ROWS), GLOBAL_BATCH)
    model = common.transformer(strategy)
    trainer = Trainer(model, strategy=strategy, model_parallel=2, micro_batches=2)
    history = trainer.fit(data, epochs=1, verbose=0)
    evaluation = trainer.evaluate(data, return_dict=True, verbose=0)
    predictions = trainer.predict(data, verbose=0)
    devices = {stage.index: sorted({v.value.device for name in stage.layers
                                    for v in model.get_layer(name).variables})
               for stage in trainer.stage_plan.stages}
    np.savez(os.path.join(args.out, f"rank{rank}.npz"), predictions, *common.weights_of(model))
    # Adam too: an embedding's gradient crosses the workers as slices, which Adam squares.
    adam_model = common.transformer_with_adam(strategy)
    adam_history = Trainer(adam_model, strategy=strategy, model_parallel=2,
                           micro_batches=2).fit(data, epochs=1, verbose=0)
    np.savez(os.path.join(args.out, f"rank{rank}_adam.npz"), *common.weights_of(adam_model))
    with open(os.path.join(args.out, f"rank{rank}.json"), "w") as stream:
        json.dump({"history": history.history, "evaluate": evaluation, "devices": devices,
                   "replicas": strategy.num_replicas_in_sync,
                   "adam_history": adam_history.history}, stream)
    print(f"worker {rank} done", flush=True)


if __name__ == "__main__":
    from tfdist.runtime.quick_exit import skip_exit_garbage_collection

    skip_exit_garbage_collection()  # the test waits for this process to end
    main()
