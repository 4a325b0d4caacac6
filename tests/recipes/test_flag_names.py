"""The recipe flags offer exactly the names the factories build: one list each."""

import pytest

from tfdist.recipes.config import COMMON_OPTIONS, ConfigError
from tfdist.schedules.choices import OPTIMIZER_NAMES, SCHEDULE_NAMES

OPTIONS = {option.name: option for option in COMMON_OPTIONS}


def test_optimizer_flag_offers_every_name_build_optimizer_builds():
    from tfdist.schedules.optimizers import build_optimizer

    assert OPTIONS["optimizer"].choices == OPTIMIZER_NAMES
    built = [type(build_optimizer(name, 1e-3)).__name__ for name in OPTIONS["optimizer"].choices]
    assert len(built) == len(OPTIMIZER_NAMES)
    with pytest.raises(ValueError, match="Unknown optimizer 'adagrad'"):
        build_optimizer("adagrad", 1e-3)
    with pytest.raises(ConfigError, match="adagrad"):
        OPTIONS["optimizer"].convert("adagrad", "flag --optimizer")


def test_schedule_flag_offers_every_name_make_schedule_builds():
    from tfdist.schedules import make_schedule
    from tfdist.schedules.optimizers import build_optimizer

    assert OPTIONS["schedule"].choices == SCHEDULE_NAMES
    for name in OPTIONS["schedule"].choices:  # as a recipe builds it
        optimizer = build_optimizer("adamw", 0.1, schedule=name, warmup_steps=2, total_steps=100)
        optimizer.iterations.assign(10)  # after the warmup
        assert float(optimizer.learning_rate) > 0, name
    with pytest.raises(ValueError, match="unknown schedule name 'linear'"):
        make_schedule("linear", 0.1, total_steps=100)


def test_strategy_flag_accepts_exactly_the_factory_names():
    from tfdist.distribute.strategy_names import STRATEGY_NAMES, UNSUPPORTED_STRATEGIES

    option = OPTIONS["strategy"]
    assert option.choices is None  # checked by the factory's own check_strategy_name
    assert [option.convert(name, "flag --strategy") for name in STRATEGY_NAMES] == list(STRATEGY_NAMES)
    for name in UNSUPPORTED_STRATEGIES:
        with pytest.raises(ConfigError, match=name):
            option.convert(name, "flag --strategy")
    assert all(name in option.help for name in STRATEGY_NAMES)
