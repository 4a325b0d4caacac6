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


@pytest.mark.parametrize("name", ["adam", "adamw", "lamb", "lion"])
def test_moment_settings_reach_the_optimizer_and_none_keeps_keras_defaults(name):
    epsilon = None if name == "lion" else 1e-9
    optimizer = build_optimizer(name, 0.1, beta_1=0.8, beta_2=0.98, epsilon=epsilon)
    assert (optimizer.beta_1, optimizer.beta_2) == (pytest.approx(0.8), pytest.approx(0.98))
    if epsilon is not None:
        assert optimizer.epsilon == pytest.approx(1e-9)
    default = build_optimizer(name, 0.1)
    keras_default = getattr(keras.optimizers, {"adam": "Adam", "adamw": "AdamW", "lamb": "Lamb",
                                               "lion": "Lion"}[name])(0.1)
    assert default.beta_2 == pytest.approx(keras_default.beta_2)


@pytest.mark.parametrize("name, settings, message", [
    ("sgd", {"beta_2": 0.98}, "Optimizer 'sgd' has no beta_2 (got 0.98); adam, adamw, lamb, lion"),
    ("lion", {"epsilon": 1e-9}, "Optimizer 'lion' has no epsilon (got 1e-09); adam, adamw, lamb"),
    ("adam", {"beta_1": 1.0}, "beta_1 must be in [0, 1), got 1."),
])
def test_a_moment_setting_the_optimizer_lacks_is_refused(name, settings, message):
    with pytest.raises(ValueError) as error:
        build_optimizer(name, 0.1, **settings)
    assert message in str(error.value)
