"""The model's forward and backward alone (`tfdist.bench.model_alone`), the
speed goals' ceiling: it computes the real gradients for its fixed upstream
gradient, consumes one batch a step, and is refused where it would measure
something else. Its place in `tfdist bench engine --goals`: test_bench_cli.py."""

import re

import keras
import numpy as np
import pytest
import tensorflow as tf

from tfdist.bench.engines import Contender, Setting
from tfdist.bench.model_alone import UPSTREAM_SCALE, ModelAloneStep
from tfdist.bench.workloads import Workload
from tfdist.distribute.strategy_factory import create_strategy


def _dense_model():
    keras.utils.set_random_seed(3)
    model = keras.Sequential([keras.Input((5,)), keras.layers.Dense(4)])
    return model


def test_the_gradients_are_the_models_for_the_fixed_upstream_gradient():
    model = _dense_model()
    step = ModelAloneStep(model, jit_compile=False)
    inputs = np.random.default_rng(0).standard_normal((6, 5)).astype("float32")
    upstream = step.upstream(inputs).numpy()
    assert upstream.shape == (6, 4) and 0 < np.abs(upstream).max() < 10 * UPSTREAM_SCALE
    kernel_gradient, bias_gradient = (g.numpy() for g in step(inputs))
    # y = x W + b, so dL/dW = x^T U and dL/db = sum of U's rows for upstream U.
    np.testing.assert_allclose(kernel_gradient, inputs.T @ upstream, rtol=1e-5, atol=1e-9)
    np.testing.assert_allclose(bias_gradient, upstream.sum(axis=0), rtol=1e-5, atol=1e-9)
    # The outputs are computed too: their first value comes back with the gradients.
    (first,) = step.output_values
    np.testing.assert_allclose(first.numpy(), model(inputs).numpy()[0, 0], rtol=1e-6)


def test_the_upstream_gradient_is_made_once_per_shape():
    step = ModelAloneStep(_dense_model())
    full = np.ones((6, 5), "float32")
    first = step.upstream(full)
    assert step.upstream(full) is first
    last = step.upstream(np.ones((2, 5), "float32"))  # a smaller last batch
    assert last.shape == (2, 4) and last is not first


@pytest.mark.parametrize("batches, fails", [(4, False), (3, True)])
def test_a_run_takes_one_batch_a_step_and_times_only_the_measured_ones(batches, fails):
    step = ModelAloneStep(_dense_model())
    features = np.ones((batches * 6, 5), "float32")
    dataset = tf.data.Dataset.from_tensor_slices((features, np.zeros(batches * 6))).batch(6)
    if fails:  # 1 warm-up + 3 measured steps need 4 batches
        with pytest.raises(StopIteration):
            step.run(dataset, steps=3, warmup_steps=1)
        return
    times = step.run(dataset, steps=3, warmup_steps=1)
    assert len(times) == 3 and all(t > 0 for t in times)


def test_the_model_alone_runs_no_loss_and_only_without_a_strategy():
    with pytest.raises(ValueError, match="loss='keras' would be ignored"):
        Setting("model", "float32", "off", loss="keras")
    assert Setting("model", "float32", "off").label == "model alone, float32, XLA off"
    with pytest.raises(ValueError, match=r"default strategy only.*create_strategy\('default'\)"):
        Contender(Setting("model", "float32", "off"), Workload("transformer", size="tiny"),
                  create_strategy("one_device"), 8)


def test_the_workloads_model_alone_runs_and_is_profiled_around_its_own_loop(tmp_path):
    from tfdist.bench.profile import capture_profile, read_xspace, summarise_profile

    workload = Workload("transformer", size="tiny", sequence_length=16, vocab_size=64)
    contender = Contender(Setting("model", "float32", "off"), workload,
                          create_strategy("default"), 8)
    assert contender.trainer is None and contender.model_alone is not None
    assert contender.describe()["engine"] == "model" and contender.jit_compile is False
    contender.warm_up(steps=1, inputs=("pipeline", "memory"))
    assert len(contender.run(3, input="memory")) == 3
    with pytest.raises(ValueError, match="takes no callbacks"):
        contender.run(1, callbacks=[keras.callbacks.Callback()])
    path = capture_profile(contender, str(tmp_path / "alone"), steps=1)
    assert summarise_profile(path)["kinds"]["matmul"]["time"] > 0
    # Only the model's ops: no loss kernel, no optimizer update.
    names = " ".join(name for events in read_xspace(path).values() for name, _, _ in events)
    assert "MatMul" in names
    assert "SoftmaxCrossEntropyWithLogits" not in names and "ApplyAdam" not in names
    # The forward ops that only make the outputs run too, though the gradients need
    # none of their values: the output layer's matmul, outside the gradient tape's ops.
    forward = [name for events in read_xspace(path).values() for name, _, _ in events
               if re.search(r"lm_head[^/]*/Tensordot/MatMul:", name) and "gradient_tape" not in name]
    assert forward, sorted({n for n in names.split() if "lm_head" in n})
