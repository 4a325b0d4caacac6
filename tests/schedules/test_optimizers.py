import keras
import pytest

from tfdist.schedules.optimizers import OPTIMIZER_NAMES, build_optimizer


@pytest.mark.parametrize("name", OPTIMIZER_NAMES)
def test_every_optimizer_name_builds_with_a_warmup_schedule(name):
    optimizer = build_optimizer(name, 0.1, schedule="cosine", warmup_steps=10, total_steps=100)
    schedule = optimizer._learning_rate
    assert float(schedule(0)) == pytest.approx(0.0)
    assert float(schedule(10)) == pytest.approx(0.1)
    assert float(schedule(100)) < 0.01


def test_step_schedule_decays_tenfold_at_half_and_three_quarters():
    schedule = build_optimizer("momentum", 0.4, schedule="step", warmup_steps=20,
                               total_steps=100)._learning_rate
    assert float(schedule(59)) == pytest.approx(0.4)
    assert float(schedule(60)) == pytest.approx(0.04)
    assert float(schedule(80)) == pytest.approx(0.004)


def test_momentum_is_nesterov_sgd_and_weight_decay_is_passed():
    optimizer = build_optimizer("momentum", 0.1, weight_decay=1e-4)
    assert isinstance(optimizer, keras.optimizers.SGD)
    assert optimizer.nesterov and optimizer.momentum == pytest.approx(0.9)
    assert optimizer.weight_decay == pytest.approx(1e-4)


def test_unknown_optimizer_lists_the_valid_ones():
    with pytest.raises(ValueError) as error:
        build_optimizer("adagrad", 0.1)
    assert "'adagrad'" in str(error.value) and "adamw" in str(error.value)


def test_adam_refuses_weight_decay_and_points_to_adamw():
    with pytest.raises(ValueError, match="adamw"):
        build_optimizer("adam", 0.1, weight_decay=0.01)


def test_too_short_step_schedule_is_a_clear_error():
    with pytest.raises(ValueError, match="warmup"):
        build_optimizer("sgd", 0.1, schedule="step", warmup_steps=10, total_steps=12)
