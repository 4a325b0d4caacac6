"""Tensor parallelism combined with data parallelism across workers, for real.

Two localhost worker processes (MultiWorkerMirroredStrategy, one replica per
worker), each holding the tiny Transformer with its attention and MLPs split
over its 2 logical CPUs: each worker computes its half of the global batch
shard by shard, the gradients are all-reduced across the workers once per
step, and the result must equal one device training on the same global
batches (SGD, float32), plain and with accumulation and clipping.
"""

import json
import os

import numpy as np
import pytest
import tensorflow as tf

from helpers.mw import launch
from helpers.paths import WORKERS_DIR
from helpers.workers import model_parallel_common as common
from helpers.workers import tensor_parallel_worker as worker
from tfdist.training import Trainer

pytestmark = pytest.mark.multiworker

WORKER = os.path.join(WORKERS_DIR, "tensor_parallel_worker.py")


def saved_arrays(path):
    with np.load(path) as saved:
        return [saved[f"arr_{i}"] for i in range(len(saved.files))]


def test_two_workers_of_two_shards_match_one_device(tmp_path):
    result = launch([WORKER, "--out", str(tmp_path)], workers=2, timeout=300,
                    startup_timeout=180)
    assert result.returncode == 0, result.stdout[-5000:]
    assert "worker 0 done" in result.stdout and "worker 1 done" in result.stdout

    data = common.dataset(common.token_arrays(n=worker.ROWS), worker.GLOBAL_BATCH)
    references = {}
    for name, settings in worker.SETTINGS.items():
        model = common.transformer(tf.distribute.get_strategy())
        trainer = Trainer(model, **settings)
        references[name] = {"history": trainer.fit(data, epochs=1, verbose=0).history,
                            "weights": common.weights_of(model)}
        if name == "plain":
            references[name]["evaluate"] = trainer.evaluate(data, return_dict=True, verbose=0)
            references[name]["predictions"] = trainer.predict(data, verbose=0)

    for rank in (0, 1):
        with open(tmp_path / f"rank{rank}.json") as stream:
            log = json.load(stream)
        assert log["replicas"] == 2  # data parallel across the 2 workers
        assert log["devices"] == [f"/job:worker/replica:0/task:{rank}/device:CPU:{i}"
                                  for i in (0, 1)], log["devices"]
        for name, reference in references.items():
            for key in ("loss", "accuracy"):
                np.testing.assert_allclose(log[name]["history"][key],
                                           reference["history"][key], rtol=1e-5)
            arrays = saved_arrays(tmp_path / f"rank{rank}_{name}.npz")
            if name == "plain":
                np.testing.assert_allclose(log[name]["evaluate"]["loss"],
                                           reference["evaluate"]["loss"], rtol=1e-5)
                predictions, arrays = arrays[0], arrays[1:]
                np.testing.assert_allclose(predictions, reference["predictions"],
                                           rtol=1e-4, atol=1e-5)
            for ours, theirs in zip(arrays, reference["weights"], strict=True):
                np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-5)
