"""Model parallelism (`Trainer(model_parallel=K)`) on the session's 2 logical CPUs.

A model split into 2 stages and trained as a GPipe pipeline must train
exactly like one device (plain Trainer, default strategy): loss, metrics and
weights after several SGD steps, with uneven masks split over micro-batches.
Each stage's variables, optimizer slots and ops must be on its device.
"""

import collections
import re

import keras
import numpy as np
import pytest
import tensorflow as tf

from tfdist.training import Trainer
from tfdist.training.model_parallel.placement import StagePlacementError, variable_bytes_by_device
from tfdist.training.model_parallel.stages import StageSplitError, plan_stages
from helpers.workers import model_parallel_common as common
from helpers.workers import train_common

RTOL, ATOL = 1e-5, 1e-5
DEFAULT = tf.distribute.get_strategy()


def fit(make_model, data, epochs=1, strategy=DEFAULT, **trainer_kwargs):
    model = make_model(strategy)
    trainer = Trainer(model, strategy=strategy, **trainer_kwargs)
    history = trainer.fit(data, epochs=epochs, verbose=0)
    return common.weights_of(model), history.history, trainer


def assert_same(ours, reference, metrics=("loss",)):
    for name in metrics:
        np.testing.assert_allclose(ours[1][name], reference[1][name], rtol=RTOL, err_msg=name)
    for a, b in zip(ours[0], reference[0], strict=True):
        np.testing.assert_allclose(a, b, rtol=RTOL, atol=ATOL)


def device_index(variable):
    return tf.DeviceSpec.from_string(variable.value.device).device_index


# ------------------------------------------------------------------ models
def functional_with_skip(strategy):
    """Embedding(mask_zero) -> Dense(L2) -> Dense -> Add(skip from the embedding) -> Dense:
    the Keras mask and the skip tensor both cross the stage boundary."""
    with strategy.scope():
        tokens = keras.Input((common.SEQ,), dtype="int32", name="tokens")
        embedded = keras.layers.Embedding(common.VOCAB, 16, mask_zero=True, name="embed")(tokens)
        hidden = keras.layers.Dense(32, activation="tanh", name="hidden",
                                    kernel_regularizer=keras.regularizers.L2(0.01))(embedded)
        back = keras.layers.Dense(16, name="back")(hidden)
        mixed = keras.layers.Add(name="skip")([back, embedded])
        logits = keras.layers.Dense(common.VOCAB, name="head")(mixed)
        model = keras.Model(tokens, logits, name="skip_net")
        model.compile(keras.optimizers.SGD(0.5),
                      keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=["accuracy"])
    return common.seeded_weights(model, scale=0.3)


def sequential_regression(strategy):
    with strategy.scope():
        model = keras.Sequential([keras.Input((train_common.FEATURES,)),
                                  keras.layers.Dense(24, activation="tanh", name="d1"),
                                  keras.layers.Dense(24, activation="tanh", name="d2"),
                                  keras.layers.Dense(train_common.TARGETS, name="out")],
                                 name="mlp")
        model.compile(keras.optimizers.SGD(0.005),
                      keras.losses.MeanSquaredError(reduction="sum"), metrics=["mae"])
    return common.seeded_weights(model, scale=0.5)


# ------------------------------------------------------------ equivalence
def test_transformer_pipeline_matches_one_device():
    # 46 rows in batches of 12: 4 SGD steps, the last on 10 rows; 3 micro-batches
    # of 4 (last step 3, 3, 4) with different numbers of real tokens each.
    tokens, targets = common.token_arrays(n=46)
    counts = (tokens[:12] != 0).reshape(3, 4, -1).sum(axis=(1, 2))
    assert len(set(counts.tolist())) == 3  # uneven mask over the micro-batches
    data = common.dataset((tokens, targets), 12)
    one = fit(common.transformer, data)
    two = fit(common.transformer, data, model_parallel=2, micro_batches=3)
    assert int(two[2].optimizer.iterations.numpy()) == 4
    assert_same(two, one, metrics=("loss", "accuracy"))
    assert two[2].stage_plan.rule == "repeated blocks"
    # evaluate and predict through the pipeline equal one device too.
    np.testing.assert_allclose(two[2].evaluate(data, return_dict=True, verbose=0)["loss"],
                               one[2].evaluate(data, return_dict=True, verbose=0)["loss"],
                               rtol=RTOL)
    np.testing.assert_allclose(two[2].predict(data, verbose=0), one[2].predict(data, verbose=0),
                               rtol=1e-4, atol=1e-5)


def test_adam_on_the_token_embedding_matches_one_device():
    # One device gives Keras's Adam one slice per looked-up token, and Adam squares
    # each slice for its second moment; the micro-batches' slices must stay apart too
    # (added into one dense gradient first, rows of repeated tokens moved by up to the
    # learning rate differently).
    tokens, targets = common.token_arrays(n=48)
    data = common.dataset((tokens, targets), 12)
    one = fit(common.transformer_with_adam, data)
    two = fit(common.transformer_with_adam, data, model_parallel=2, micro_batches=3)
    assert int(two[2].optimizer.iterations.numpy()) == 4
    assert_same(two, one, metrics=("loss", "accuracy"))


def test_functional_with_skip_mask_and_regularizer_matches_one_device_even_in_scope():
    tokens, targets = common.token_arrays(n=36, seed=5)
    data = common.dataset((tokens, targets), 12)
    one = fit(functional_with_skip, data)
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    model = functional_with_skip(strategy)
    with strategy.scope():  # fit inside the scope, as Keras programs often do
        trainer = Trainer(model, model_parallel=2, micro_batches=4)
        history = trainer.fit(data, epochs=1, verbose=0)
    assert trainer.stage_plan.rule == "parameter balance"
    assert trainer.stage_plan.boundaries == ["back"]
    assert_same((common.weights_of(model), history.history), one, metrics=("loss", "accuracy"))


def test_sequential_sum_loss_with_boundaries_and_clipping_matches_one_device():
    x, y = train_common.regression_arrays(n=50)
    data = common.dataset((x, y), 16)  # 4 steps, the last on 2 rows (micro-batches 0, 1, 0, 1)
    one = fit(sequential_regression, data, epochs=2, clip_norm=0.5)
    two = fit(sequential_regression, data, epochs=2, clip_norm=0.5, model_parallel=2,
              micro_batches=4, stage_boundaries=["out"])
    assert two[2].stage_plan.boundaries == ["out"]
    assert_same(two, one, metrics=("loss", "mae"))
    # The clipping binds: without it the weights end elsewhere.
    unclipped = fit(sequential_regression, data, epochs=2)
    assert max(np.max(np.abs(a - b)) for a, b in zip(unclipped[0], one[0], strict=True)) > 1e-3


# ---------------------------------------------------------------- placement
def stage_ops(trainer):
    """`{stage: Counter(device index)}` of every op created under a stage's name scope in
    the traced training step (variable reads, and constants TensorFlow colocates with
    them, follow their variable instead)."""
    dataset = common.dataset(common.token_arrays(n=12), 12)
    iterator = iter(trainer.strategy.experimental_distribute_dataset(dataset))
    graph = trainer.step_functions.train_function.get_concrete_function(
        iterator, tf.constant(1)).graph.as_graph_def()
    found = collections.defaultdict(collections.Counter)
    for function in graph.library.function:
        for node in function.node_def:
            match = re.search(r"stage_(\d+)/(forward|backward|sum|scale)", node.name)
            if match and node.op != "ReadVariableOp" and "_class" not in node.attr:
                index = tf.DeviceSpec.from_string(node.device).device_index if node.device else None
                found[int(match.group(1))][index] += 1
    return found


def test_variables_slots_and_ops_live_on_their_stage_device_and_split_the_bytes():
    tokens, targets = common.token_arrays(n=24)
    model = common.transformer(DEFAULT, num_layers=4)
    with DEFAULT.scope():
        optimizer = keras.optimizers.Adam(0.01)
    trainer = Trainer(model, optimizer, model_parallel=2, micro_batches=2)
    trainer.fit(common.dataset((tokens, targets), 12), epochs=1, verbose=0)
    plan = trainer.stage_plan
    assert plan.boundaries == ["block_2"]
    for stage in plan.stages:
        for name in stage.layers:
            for variable in model.get_layer(name).variables:
                assert device_index(variable) == stage.index, (variable.path, stage.index)
    # Adam's two moments of every variable sit on that variable's device.
    slots = {v.path: v for v in optimizer.variables}
    for variable in model.trainable_variables:
        key = variable.path.replace("/", "_")
        moments = [v for path, v in slots.items() if key in path]
        assert len(moments) == 2, (variable.path, list(slots)[:4])
        assert {device_index(v) for v in moments} == {device_index(variable)}
    # Metric totals are updated where the outputs are: the last stage.
    assert {device_index(v) for v in model.metrics_variables} == {1}
    # Forward, backward, summing and scaling ops of a stage are on its device.
    ops = stage_ops(trainer)
    assert set(ops) == {0, 1}
    for stage, devices in ops.items():
        assert set(devices) == {stage}, (stage, devices)
        assert devices[stage] > 100
    # Each device holds about 1/K of the weights (tolerance: 10% of 1/K; the
    # embedding and the head differ a little), and of the optimizer state.
    for variables in (model.trainable_variables, optimizer.variables):
        by_device = variable_bytes_by_device(variables)
        shares = [size / sum(by_device.values()) for size in by_device.values()]
        assert len(shares) == 2 and all(abs(share - 0.5) < 0.05 for share in shares), shares
    assert sorted(stage.weight_bytes for stage in plan.stages) == sorted(
        variable_bytes_by_device(model.trainable_variables).values())


# ----------------------------------------------------------------- the rule
def test_split_rules():
    model = common.transformer(DEFAULT, num_layers=5)
    plan = plan_stages(model, 3)
    assert plan.rule == "repeated blocks"
    assert [stage.layers for stage in plan.stages] == [
        ("embedding", "padding_mask", "block_0", "block_1"),
        ("block_2", "block_3"), ("block_4", "final_norm", "lm_head", "logits")]
    assert plan_stages(model, 2, stage_boundaries=["block_4"]).boundaries == ["block_4"]
    # Parameter balance: 4*100+100, 100*10+10, 10*10+10, 10*400+400 -> [500, 1010+110], [4400].
    mlp = keras.Sequential([keras.Input((4,)), keras.layers.Dense(100, name="a"),
                            keras.layers.ReLU(name="act"), keras.layers.Dense(10, name="b"),
                            keras.layers.Dense(10, name="c"), keras.layers.Dense(400, name="d")])
    plan = plan_stages(mlp, 2)
    assert plan.rule == "parameter balance"
    assert [stage.layers for stage in plan.stages] == [("a", "act", "b", "c"), ("d",)]
    assert [stage.parameters for stage in plan.stages] == [1620, 4400]
    assert plan_stages(mlp, 3).boundaries == ["b", "d"]
    described = plan.with_devices(["/device:CPU:0", "/device:CPU:1"]).describe()
    assert "stage 1  /device:CPU:1  d (1 layer)  4,400 params" in described
    # Keras ops (x + y) in a Functional model have no weights and ride along.
    inputs = keras.Input((4,))
    first = keras.layers.Dense(8, name="first")(inputs)
    second = keras.layers.Dense(8, name="second")(first)
    summed = keras.layers.Dense(2, name="third")(keras.ops.add(first, second))
    plan = plan_stages(keras.Model(inputs, summed), 2)
    assert plan.boundaries == ["second"] and len(plan.stages[1].layers) == 3


class Subclassed(keras.Model):
    def __init__(self):
        super().__init__()
        self.one, self.two = keras.layers.Dense(4), keras.layers.Dense(2)

    def call(self, x):
        return self.two(self.one(x))


def tied(strategy=DEFAULT):
    with strategy.scope():
        inputs = keras.Input((4,))
        shared = keras.layers.Dense(4, name="shared")
        middle = keras.layers.Dense(4, name="middle")(shared(inputs))
        return keras.Model(inputs, keras.layers.Dense(1, name="out")(shared(middle)))


@pytest.mark.parametrize("case,error,words", [
    ("too_many_stages", StageSplitError, ["3 layer(s) with weights", "model_parallel <= 3"]),
    ("subclassed", StageSplitError, ["subclassed", "Subclassed", "Functional"]),
    ("unknown_boundary", StageSplitError, ["'nope'", "d1, d2, out"]),
    ("boundary_order", StageSplitError, ["not in layer order", "'d1'"]),
    ("boundary_count", StageSplitError, ["needs 2"]),
    ("weightless_stage", StageSplitError, ["Stage 1", "no weights", "act"]),
    ("shared_layer", StageSplitError, ["'shared'", "stage_boundaries"]),
])
def test_split_errors_name_the_model_and_the_way_out(case, error, words):
    mlp = sequential_regression(DEFAULT)
    calls = {
        "too_many_stages": lambda: plan_stages(mlp, 4),
        "subclassed": lambda: plan_stages(Subclassed(), 2),
        "unknown_boundary": lambda: plan_stages(mlp, 2, stage_boundaries=["nope"]),
        "boundary_order": lambda: plan_stages(mlp, 3, stage_boundaries=["d2", "d1"]),
        "boundary_count": lambda: plan_stages(mlp, 3, stage_boundaries=["d2"]),
        "weightless_stage": lambda: plan_stages(keras.Sequential(
            [keras.Input((4,)), keras.layers.Dense(3, name="x"), keras.layers.ReLU(name="act"),
             keras.layers.Dense(2, name="y")]), 3, stage_boundaries=["act", "y"]),
        "shared_layer": lambda: Trainer(tied(), keras.optimizers.SGD(), "mse",
                                        model_parallel=2).fit(
            np.zeros((4, 4), "float32"), np.zeros((4, 1), "float32"), verbose=0),
    }
    with pytest.raises(error) as raised:
        calls[case]()
    for word in words:
        assert word in str(raised.value), str(raised.value)


class OwnStep(keras.Model):
    def train_step(self, data):
        return {}


@pytest.mark.parametrize("case,words", [
    ("xla", ["jit_compile=True", "jit_compile=False"]),
    ("accumulation", ["grad_accum_steps=2", "micro-batches"]),
    ("own_step", ["OwnStep.train_step", "model_parallel=1"]),
    ("mirrored", ["2 replicas on each worker", "MultiWorkerMirroredStrategy with one device"]),
    ("micro_batches_alone", ["micro_batches=4", "grad_accum_steps"]),
    ("devices", ["needs 3 CPU devices", "split_cpu_into_logical_devices"]),
])
def test_settings_the_pipeline_cannot_honour_are_refused(case, words):
    def own_step_model():
        inputs = keras.Input((4,))
        return OwnStep(inputs, keras.layers.Dense(1)(keras.layers.Dense(2)(inputs)))

    strategy = train_common.mirrored(2) if case == "mirrored" else DEFAULT
    model = own_step_model() if case == "own_step" else sequential_regression(strategy)
    kwargs = {"xla": dict(model_parallel=2, jit_compile=True),
              "accumulation": dict(model_parallel=2, grad_accum_steps=2),
              "own_step": dict(model_parallel=2, optimizer="sgd"),
              "mirrored": dict(model_parallel=2, strategy=strategy),
              "micro_batches_alone": dict(micro_batches=4),
              "devices": dict(model_parallel=3)}[case]
    with pytest.raises((ValueError, StagePlacementError)) as raised:
        Trainer(model, **kwargs)
    for word in words:
        assert word in str(raised.value), str(raised.value)


def test_mixed_float16_loss_scaling_matches_one_device(mixed_float16):
    # The gradients between the stages carry one replica's magnitudes: the
    # dynamic loss scale makes the same decisions as on one device.
    data = common.dataset(common.token_arrays(n=48), 12)
    one = fit(common.transformer, data)
    two = fit(common.transformer, data, model_parallel=2, micro_batches=3)
    assert type(two[2].optimizer).__name__ == "LossScaleOptimizer"
    assert float(two[2].optimizer.dynamic_scale.numpy()) == float(
        one[2].optimizer.dynamic_scale.numpy())
    np.testing.assert_allclose(two[1]["loss"], one[1]["loss"], rtol=1e-3)
    for a, b in zip(two[0], one[0], strict=True):
        np.testing.assert_allclose(a, b, atol=2e-3)


class StopAfter(keras.callbacks.Callback):
    def __init__(self, batches):
        super().__init__()
        self.batches, self.seen = batches, 0

    def on_train_batch_end(self, batch, logs=None):
        self.seen += 1
        if self.seen == self.batches:
            raise KeyboardInterrupt


def test_backup_and_resume_continue_a_pipelined_run_exactly(tmp_path):
    from tfdist.callbacks import BackupAndResume

    data = common.dataset(common.token_arrays(n=36), 12)

    def trainer():
        model = common.transformer(DEFAULT)
        with DEFAULT.scope():
            optimizer = keras.optimizers.Adam(0.01)  # slots to back up and restore
        return model, Trainer(model, optimizer, model_parallel=2, micro_batches=2)

    model, whole = trainer()
    whole.fit(data, epochs=2, verbose=0)
    model_a, interrupted = trainer()
    with pytest.raises(KeyboardInterrupt):
        interrupted.fit(data, epochs=2, verbose=0, callbacks=[
            BackupAndResume(str(tmp_path), save_freq=1), StopAfter(4)])
    model_b, resumed = trainer()
    resumed.fit(data, epochs=2, verbose=0, callbacks=[BackupAndResume(str(tmp_path), save_freq=1)])
    assert int(resumed.optimizer.iterations.numpy()) == 6
    for a, b in zip(common.weights_of(model_b), common.weights_of(model), strict=True):
        np.testing.assert_allclose(a, b, rtol=RTOL, atol=ATOL)
