"""The step kinds' declared interface and the loss-statistics layout they share."""

import numpy as np
import pytest
import tensorflow as tf

from tfdist.training.step_kinds import LossStatsLayout


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
    import keras

    from tfdist.training.loss import GlobalCompileLoss
    from tfdist.training.step import StepFunctions
    from tfdist.seam import model_compile_loss

    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile(keras.optimizers.SGD(0.1), loss=["mse"], metrics=["mae"])
    x, y = np.ones((5, 3), np.float32), np.zeros((5, 2), np.float32)
    model.fit(x, y, epochs=1, verbose=0)  # builds the compiled loss
    steps = StepFunctions(model, model.optimizer, GlobalCompileLoss(model_compile_loss(model)),
                          tf.distribute.get_strategy(), jit_compile=False, grad_accum_steps=1,
                          clip_norm=None)
    assert steps.loss_stats.num_losses == 1
    loss_stats, _, _ = steps._loss_terms(tf.constant(x), tf.constant(y), None)
    assert loss_stats.shape == (steps.loss_stats.size,)
    assert float(steps.loss_stats.examples(loss_stats)) == 5.0
    assert float(steps.loss_stats.counts(loss_stats)[0]) > 0
