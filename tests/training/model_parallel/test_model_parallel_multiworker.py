"""Model parallelism combined with data parallelism across workers, for real.

Two localhost worker processes (MultiWorkerMirroredStrategy, one replica per
worker), each holding the tiny Transformer split into 2 stages on its 2
logical CPUs: the gradients of each stage are summed over micro-batches on
its device, all-reduced across the workers once per step, and the result
must equal one device training on the same global batches, with SGD and with
Adam (whose second moment squares each slice of the embedding's gradient).
"""

import os

import numpy as np
import pytest
import tensorflow as tf

from helpers.mw import launch
from tfdist.training import Trainer
from helpers.workers import model_parallel_common as common
from helpers.workers import model_parallel_worker as worker
from helpers.paths import WORKERS_DIR  # noqa: E402

pytestmark = pytest.mark.multiworker

WORKER = os.path.join(WORKERS_DIR, "model_parallel_worker.py")


def test_two_workers_of_two_stages_match_one_device(tmp_path):
    result = launch([WORKER, "--out", str(tmp_path)], workers=2, timeout=300,
                    startup_timeout=180)
    assert result.returncode == 0, result.stdout[-5000:]
    assert "worker 0 done" in result.stdout and "worker 1 done" in result.stdout

    data = common.dataset(common.token_arrays(n=worker.ROWS), worker.GLOBAL_BATCH)
    model = common.transformer(tf.distribute.get_strategy())
    trainer = Trainer(model)
    history = trainer.fit(data, epochs=1, verbose=0).history
    evaluation = trainer.evaluate(data, return_dict=True, verbose=0)
    predictions = trainer.predict(data, verbose=0)
    reference = common.weights_of(model)
    adam_model = common.transformer_with_adam(tf.distribute.get_strategy())
    adam_history = Trainer(adam_model).fit(data, epochs=1, verbose=0).history
    adam_reference = common.weights_of(adam_model)

    for rank in (0, 1):
        log = common_json(tmp_path / f"rank{rank}.json")
        assert log["replicas"] == 2  # data parallel across the 2 workers
        for stage in ("0", "1"):  # each stage on its own device of this worker
            assert log["devices"][stage] == [
                f"/job:worker/replica:0/task:{rank}/device:CPU:{stage}"], log["devices"]
        np.testing.assert_allclose(log["history"]["loss"], history["loss"], rtol=1e-5)
        np.testing.assert_allclose(log["history"]["accuracy"], history["accuracy"], rtol=1e-5)
        np.testing.assert_allclose(log["evaluate"]["loss"], evaluation["loss"], rtol=1e-5)
        with np.load(tmp_path / f"rank{rank}.npz") as saved:
            arrays = [saved[f"arr_{i}"] for i in range(len(saved.files))]
        np.testing.assert_allclose(arrays[0], predictions, rtol=1e-4, atol=1e-5)
        for ours, theirs in zip(arrays[1:], reference, strict=True):
            np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(log["adam_history"]["loss"], adam_history["loss"], rtol=1e-5)
        with np.load(tmp_path / f"rank{rank}_adam.npz") as saved:
            adam_arrays = [saved[f"arr_{i}"] for i in range(len(saved.files))]
        for ours, theirs in zip(adam_arrays, adam_reference, strict=True):
            np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-5)


def common_json(path):
    import json

    with open(path) as stream:
        return json.load(stream)
