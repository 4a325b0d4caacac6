"""One worker of the multi-worker tensor-parallel test (run under tfdist.launch).

Each worker splits its CPU into 2 logical devices, joins a
MultiWorkerMirroredStrategy with one replica (one device) per worker, and
trains the tiny Transformer with its attention and MLPs split over those 2
devices (`tensor_parallel=2`, tfdist's decoder-LM layout): 2 workers x 2
shards. Two trainers: a plain one (fit, evaluate, predict) and one with 2
accumulated micro-batches and global-norm clipping (fit). It writes
`<out>/rank<R>_<name>.npz` (predictions if any, then the final weights) and
`<out>/rank<R>.json` (histories, evaluation, shard devices, replicas).

Usage: python tests/helpers/workers/tensor_parallel_worker.py --out DIR
"""

import argparse
import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from tfdist.distribute.devices import split_cpu_into_logical_devices  # noqa: E402

split_cpu_into_logical_devices(2)  # the shard devices, before TensorFlow starts

import keras  # noqa: E402
import numpy as np  # noqa: E402

import model_parallel_common as common  # noqa: E402
from tfdist.distribute.strategy_factory import create_strategy  # noqa: E402
from tfdist.models import decoder_lm_layout_map  # noqa: E402
from tfdist.training import Trainer  # noqa: E402

GLOBAL_BATCH = 12
ROWS = 46  # 4 steps, the last on 10 rows (5 per worker)
SETTINGS = {"plain": {}, "accumulated": {"grad_accum_steps": 2, "clip_norm": 0.05}}
"""Each trainer's extra arguments, shared with the test's one-device runs."""


def layout():
    mesh = keras.distribution.DeviceMesh((2,), ["model"], devices=["cpu:0", "cpu:1"])
    return decoder_lm_layout_map(mesh)


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    strategy = create_strategy("multi_worker_mirrored", devices=1)
    rank = int(os.environ.get("TFDIST_RANK", "0"))
    data = common.dataset(common.token_arrays(n=ROWS), GLOBAL_BATCH)
    log = {"replicas": strategy.num_replicas_in_sync}
    for name, settings in SETTINGS.items():
        model = common.transformer(strategy)
        trainer = Trainer(model, strategy=strategy, tensor_parallel=2, layout_map=layout(),
                          **settings)
        log[name] = {"history": trainer.fit(data, epochs=1, verbose=0).history}
        arrays = []
        if name == "plain":
            log[name]["evaluate"] = trainer.evaluate(data, return_dict=True, verbose=0)
            arrays.append(trainer.predict(data, verbose=0))
            log["devices"] = sorted({v.value.device for v in trainer.model.trainable_variables})
        np.savez(os.path.join(args.out, f"rank{rank}_{name}.npz"), *arrays,
                 *common.weights_of(model))
    with open(os.path.join(args.out, f"rank{rank}.json"), "w") as stream:
        json.dump(log, stream)
    print(f"worker {rank} done", flush=True)


if __name__ == "__main__":
    from tfdist.runtime.quick_exit import skip_exit_garbage_collection

    skip_exit_garbage_collection()  # the test waits for this process to end
    main()
