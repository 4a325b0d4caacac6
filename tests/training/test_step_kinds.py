"""The step kinds' declared interface and the loss-statistics layout they share."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from tfdist.seam import model_compile_loss
from tfdist.training import Trainer
from tfdist.training.loss import GlobalCompileLoss
from tfdist.training.own_step import OwnStepFunctions, StepFunctionsWithOwnSteps
from tfdist.training.ps_loop import WorkerSteps
from tfdist.training.step import StepFunctions
from tfdist.training.step_kinds import FitLoopSteps, LossStatsLayout, ReplicaSteps, StepKind

X, Y = np.ones((8, 3), np.float32), np.zeros((8, 2), np.float32)


def compiled_model(model_class=keras.Model):
    inputs = keras.Input((3,))
    hidden = keras.layers.Dense(4, name="hidden")(inputs)
    model = model_class(inputs, keras.layers.Dense(2, name="out")(hidden))
    model.compile(keras.optimizers.SGD(0.1), loss=["mse"], metrics=["mae"])
    return model


def engine_of(model):
    return StepFunctions(model, model.optimizer, GlobalCompileLoss(model_compile_loss(model)),
                         tf.distribute.get_strategy(), jit_compile=False, grad_accum_steps=1,
                         clip_norm=None)


class OwnTrainStep(keras.Model):
    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            loss = self.compute_loss(x=x, y=y, y_pred=self(x, training=True))
        self.optimizer.apply(tape.gradient(loss, self.trainable_variables),
                             self.trainable_variables)
        return {"own_loss": loss}


def test_every_step_kind_satisfies_the_declared_interface():
    model = compiled_model()
    trainer = Trainer(model)
    trainer.fit(X, Y, batch_size=4, epochs=1, verbose=0)
    engine = trainer.step_functions
    assert type(engine) is StepFunctions
    assert isinstance(engine, FitLoopSteps) and isinstance(engine, ReplicaSteps)
    assert isinstance(WorkerSteps(engine, tf.distribute.get_strategy()), StepKind)
    assert isinstance(OwnStepFunctions(model, tf.distribute.get_strategy(), jit_compile=False,
                                       run_eagerly=False), StepKind)

    own_model = compiled_model(OwnTrainStep)
    own_trainer = Trainer(own_model)
    history = own_trainer.fit(X, Y, batch_size=4, epochs=1, verbose=0)
    combined = own_trainer.step_functions
    assert isinstance(combined, StepFunctionsWithOwnSteps) and isinstance(combined, FitLoopSteps)
    assert combined.train_function == combined.own.train_function  # the model's own step ran
    assert "own_loss" in history.history

    pipelined = Trainer(compiled_model(), model_parallel=2, micro_batches=2)
    pipelined.fit(X, Y, batch_size=4, epochs=1, verbose=0)
    assert isinstance(pipelined.step_functions, FitLoopSteps)
    assert pipelined.step_functions.at_update_boundary()


def test_an_object_without_a_member_is_not_a_step_kind():
    class NoSkip:
        model = None

        def train_function(self, iterator, num_steps):
            return 0, {}

        test_function = predict_function = train_function

        def reset_accumulation(self):
            pass

        def at_update_boundary(self):
            return True

    assert isinstance(NoSkip(), StepKind)
    assert not isinstance(NoSkip(), FitLoopSteps)


def test_own_steps_must_name_a_model_step():
    model = compiled_model()
    with pytest.raises(ValueError, match="own_steps must name at least one of train_step"):
        StepFunctionsWithOwnSteps(model, model.optimizer, None, tf.distribute.get_strategy(),
                                  own_steps=["fit_step"], jit_compile=False, grad_accum_steps=1,
                                  clip_norm=None)


@pytest.mark.parametrize("num_losses", [1, 3])
def test_the_loss_statistics_layout_round_trips(num_losses):
    layout = LossStatsLayout(num_losses)
    numerators = [float(10 + i) for i in range(num_losses)]
    counts = [float(4 + i) for i in range(num_losses)]
    stats = layout.build(numerators, counts, 4.0, 0.8, 5.0)
    assert stats.shape == (layout.size,) == (2 * num_losses + 3,)
    for read, wrote in zip(layout.numerators(stats).numpy(), numerators, strict=True):
        assert read == wrote
    for read, wrote in zip(layout.counts(stats).numpy(), counts, strict=True):
        assert read == wrote
    assert float(layout.weight(stats)) == 4.0
    assert float(layout.examples(stats)) == 5.0
    summed = layout.summed(stats)
    assert summed.shape == (layout.summed_size,) == (layout.size - 1,)
    for read, wrote in zip(summed.numpy(), stats.numpy()[:-1], strict=True):
        assert read == wrote


def test_the_global_loss_reads_the_layout():
    layout = LossStatsLayout(2)
    # Two replicas' statistics, summed: numerators 6 and 9, counts 4 and 3, weight 4,
    # weighted regularisation 2 (so regularisation 2 / 4).
    totals = layout.summed(layout.build([2.0, 4.0], [2.0, 1.0], 2.0, 1.0, 2.0)
                           + layout.build([4.0, 5.0], [2.0, 2.0], 2.0, 1.0, 3.0))
    total, per_loss = layout.global_loss(totals, [1.0, 0.5], normalized=True)
    np.testing.assert_allclose([float(v) for v in per_loss], [6 / 4, 9 / 3])
    np.testing.assert_allclose(float(total), 6 / 4 + 0.5 * 9 / 3 + 2 / 4)
    total, per_loss = layout.global_loss(totals, [1.0, 0.5], normalized=False)
    np.testing.assert_allclose([float(v) for v in per_loss], [6.0, 9.0])
    np.testing.assert_allclose(float(total), 6 + 0.5 * 9 + 2 / 4)


def test_the_layout_refuses_a_wrong_number_of_losses():
    with pytest.raises(ValueError, match="needs 2 of each"):
        LossStatsLayout(2).build([1.0], [1.0], 1.0, 0.0, 1.0)
    with pytest.raises(ValueError, match="int >= 1"):
        LossStatsLayout(0)


def test_the_step_functions_build_their_statistics_in_the_layout():
    model = compiled_model()
    Trainer(model).fit(X, Y, batch_size=8, epochs=1, verbose=0)  # builds the compiled loss
    steps = engine_of(model)
    assert steps.loss_stats.num_losses == 1
    _, stats, _, _ = steps.compute_gradients(tf.constant(X[:5]), tf.constant(Y[:5]), None)
    assert stats.shape == (steps.loss_stats.size,)
    assert float(steps.loss_stats.examples(stats)) == 5.0
    assert float(steps.loss_stats.counts(stats)[0]) == 5.0  # mse: one count per example
