"""tfdist.schedules: exact values, warmup continuity, monotonicity, config
round trips, XLA, and use inside Keras optimizers (also under MirroredStrategy)."""

import json
import math

import keras
import numpy as np
import pytest
import tensorflow as tf

from tfdist.schedules import SCHEDULE_NAMES
from tfdist.schedules import ConstantLearningRate
from tfdist.schedules import InverseSqrtDecay
from tfdist.schedules import OptimizerStepSchedule
from tfdist.schedules import WarmUp
from tfdist.schedules import make_schedule
from tfdist.schedules import scale_learning_rate
from tfdist.distribute.strategy_factory import create_strategy

BASE = 0.1
WARMUP = 1000
TOTAL = 20000

# One configuration per schedule name, all with the same warmup and length.
FORMS = {
    "constant": {},
    "step": {"boundaries": [5000, 10000]},
    "exponential": {},
    "polynomial": {"power": 2.0},
    "cosine": {"alpha": 0.1},
    "cosine_restarts": {"first_decay_steps": 2000},
    "inverse_sqrt": {},
}
# Forms whose rate never increases after warmup.
DECREASING = ("constant", "step", "exponential", "polynomial", "cosine", "inverse_sqrt")


def values(schedule, steps):
    """The schedule at each step (scalar calls, as an optimizer makes them)."""
    return np.array([float(schedule(int(s))) for s in steps], dtype=np.float64)


def values_vectorised(schedule, steps):
    """The schedule on a vector of int64 steps in one call (elementwise ops)."""
    return np.asarray(schedule(tf.constant(np.asarray(steps), tf.int64)), dtype=np.float64)


def form(name, warmup_mode="linear", initial=0.0):
    return make_schedule(
        name,
        BASE,
        warmup_steps=WARMUP,
        total_steps=TOTAL,
        warmup_mode=warmup_mode,
        warmup_initial_learning_rate=initial,
        **FORMS[name],
    )


def test_every_name_has_a_form_under_test():
    assert tuple(FORMS) == SCHEDULE_NAMES


# ---------------------------------------------------------------- exact values


def test_linear_warmup_exact_values():
    schedule = WarmUp(0.4, warmup_steps=100, initial_learning_rate=0.1)
    got = values(schedule, [0, 25, 50, 99, 100, 101, 10**6])
    np.testing.assert_allclose(got, [0.1, 0.175, 0.25, 0.397, 0.4, 0.4, 0.4], rtol=1e-6)


def test_exponential_warmup_exact_values():
    schedule = WarmUp(0.1, warmup_steps=100, initial_learning_rate=1e-3, mode="exponential")
    got = values(schedule, [0, 25, 50, 100, 200])
    # Geometric: initial * (target / initial) ** (step / warmup_steps).
    np.testing.assert_allclose(got, [1e-3, 1e-3 * 100**0.25, 1e-2, 0.1, 0.1], rtol=1e-5)


def test_warmup_offsets_the_wrapped_schedule():
    cosine = keras.optimizers.schedules.CosineDecay(0.1, decay_steps=900)
    schedule = WarmUp(cosine, warmup_steps=100)
    got = values(schedule, [0, 50, 100, 550, 1000, 5000])
    np.testing.assert_allclose(got, [0.0, 0.05, 0.1, 0.05, 0.0, 0.0], atol=1e-7)


def test_warmup_steps_zero_is_the_wrapped_schedule():
    cosine = keras.optimizers.schedules.CosineDecay(0.1, decay_steps=100)
    schedule = WarmUp(cosine, warmup_steps=0)
    np.testing.assert_allclose(values(schedule, [0, 50, 100]), [0.1, 0.05, 0.0], atol=1e-7)


def test_cosine_exact_values():
    schedule = make_schedule("cosine", 0.1, warmup_steps=100, total_steps=1100, alpha=0.1)
    got = values(schedule, [0, 50, 100, 600, 1100, 2000])
    # Half-way through the decay: base * ((1 - alpha) * 0.5 + alpha).
    np.testing.assert_allclose(got, [0.0, 0.05, 0.1, 0.055, 0.01, 0.01], rtol=1e-5)


def test_cosine_end_learning_rate_is_alpha_times_base():
    by_end = make_schedule("cosine", 0.2, warmup_steps=10, total_steps=110, end_learning_rate=0.02)
    by_alpha = make_schedule("cosine", 0.2, warmup_steps=10, total_steps=110, alpha=0.1)
    steps = [0, 10, 60, 110]
    np.testing.assert_allclose(values(by_end, steps), values(by_alpha, steps), rtol=1e-6)
    assert float(by_end(110)) == pytest.approx(0.02, rel=1e-6)


EXACT_VALUES = {
    # (base - end) * (1 - 500/1000) ** 2 + end = 0.0325 half-way.
    "polynomial": (("polynomial", 0.1), dict(warmup_steps=100, total_steps=1100,
                                             end_learning_rate=0.01, power=2.0),
                   [100, 600, 1100, 5000], [0.1, 0.0325, 0.01, 0.01], 1e-5),
    "step decay switches at the boundary steps": (
        ("step", 0.1), dict(warmup_steps=100, boundaries=[300, 600], decay_rate=0.1),
        [100, 299, 300, 301, 599, 600, 10**5], [0.1, 0.1, 0.01, 0.01, 0.01, 0.001, 0.001], 1e-5),
    "step decay without warmup": (("step", 0.5), dict(boundaries=[1, 3], decay_rate=0.5),
                                  [0, 1, 2, 3], [0.5, 0.25, 0.25, 0.125], 1e-6),
    "exponential, smooth": (("exponential", 0.1), dict(warmup_steps=100, total_steps=1100),
                            [100, 600, 1100], [0.1, 0.1 * 0.1**0.5, 0.01], 1e-5),
    "exponential, stairs": (("exponential", 0.1), dict(warmup_steps=100, decay_steps=250,
                                                       decay_rate=0.5, staircase=True),
                            [349, 350, 600], [0.1, 0.05, 0.025], 1e-6),
    # Half of the first cycle, then a restart at half the height (m_mul).
    "cosine restarts": (("cosine_restarts", 0.1), dict(warmup_steps=100, first_decay_steps=200,
                                                       t_mul=1.0, m_mul=0.5),
                        [100, 200, 300, 400], [0.1, 0.05, 0.05, 0.025], 1e-5),
}


@pytest.mark.parametrize("case", sorted(EXACT_VALUES))
def test_schedule_exact_values(case):
    args, options, steps, expected, rtol = EXACT_VALUES[case]
    np.testing.assert_allclose(values(make_schedule(*args, **options), steps), expected, rtol=rtol)


def test_inverse_sqrt_transformer_values():
    schedule = InverseSqrtDecay(warmup_steps=4000, d_model=512)
    peak = 512**-0.5 * 4000**-0.5
    got = values(schedule, [0, 2000, 4000, 16000])
    np.testing.assert_allclose(got, [0.0, peak / 2, peak, peak / 2], rtol=1e-5)
    scaled = InverseSqrtDecay(warmup_steps=4000, d_model=512, scale=2.0)
    assert float(scaled(4000)) == pytest.approx(2 * peak, rel=1e-5)


def test_inverse_sqrt_from_make_schedule_peaks_at_base():
    schedule = make_schedule("inverse_sqrt", 1e-3, warmup_steps=100)
    got = values(schedule, [0, 50, 100, 400, 10000])
    np.testing.assert_allclose(got, [0.0, 5e-4, 1e-3, 5e-4, 1e-4], rtol=1e-5)


def test_constant_with_and_without_warmup():
    assert isinstance(make_schedule("constant", 0.3), ConstantLearningRate)
    np.testing.assert_allclose(values(make_schedule("constant", 0.3), [0, 7, 10**6]), [0.3] * 3,
                               rtol=1e-6)
    warm = make_schedule("constant", 0.3, warmup_steps=10)
    np.testing.assert_allclose(values(warm, [0, 5, 10, 10**6]), [0.0, 0.15, 0.3, 0.3], rtol=1e-6)


# ------------------------------------------------- continuity and monotonicity


@pytest.mark.parametrize("warmup_mode,initial", [("linear", 0.0), ("exponential", 1e-4)])
@pytest.mark.parametrize("name", [n for n in SCHEDULE_NAMES if n != "inverse_sqrt"])
def test_no_jump_at_the_end_of_warmup(name, warmup_mode, initial):
    schedule = form(name, warmup_mode, initial)
    before, at, after = values(schedule, [WARMUP - 1, WARMUP, WARMUP + 1])
    # At warmup_steps the post-warmup schedule starts at its own step 0.
    assert abs(at - BASE) / BASE < 1e-6
    # The last warmup step is an ordinary warmup increment, not a jump.
    if warmup_mode == "linear":
        largest_warmup_increment = 1.0 / WARMUP
    else:
        largest_warmup_increment = math.log(BASE / initial) / WARMUP
    assert abs(at - before) / BASE <= largest_warmup_increment * 1.001
    # The first decay step changes the rate by far less than a warmup step.
    assert abs(after - at) / BASE < 2e-4


def test_no_jump_at_the_peak_of_inverse_sqrt():
    before, at, after = values(form("inverse_sqrt"), [WARMUP - 1, WARMUP, WARMUP + 1])
    assert abs(at - BASE) / BASE < 1e-6
    assert abs(at - before) / BASE <= 1.001 / WARMUP
    assert abs(after - at) / BASE <= 0.5001 / WARMUP  # 1 - sqrt(w / (w + 1))


@pytest.mark.parametrize("warmup_mode,initial", [("linear", 0.0), ("exponential", 1e-4)])
@pytest.mark.parametrize("name", [n for n in SCHEDULE_NAMES if n != "inverse_sqrt"])
def test_warmup_increases_strictly(name, warmup_mode, initial):
    warm = values_vectorised(form(name, warmup_mode, initial), np.arange(0, WARMUP + 1))
    assert warm[0] == pytest.approx(initial, abs=1e-9)
    assert np.all(np.diff(warm) > 0)


@pytest.mark.parametrize("name", DECREASING)
def test_rate_never_increases_after_warmup(name):
    steps = np.arange(WARMUP, TOTAL + 2000, 7)
    after = values_vectorised(form(name), steps)
    assert np.all(np.diff(after) <= 1e-9)
    if name != "constant":
        assert after[-1] < 0.5 * BASE  # and it does decay


def test_vectorised_and_scalar_calls_agree():
    steps = [0, 1, 999, 1000, 1001, 4999, 5000, 12345, 19999, 20000, 30000]
    for name in SCHEDULE_NAMES:
        schedule = form(name)
        np.testing.assert_allclose(
            values_vectorised(schedule, steps), values(schedule, steps), rtol=1e-6, err_msg=name
        )


# ----------------------------------------------------- graph, XLA, config


@pytest.mark.parametrize("name", SCHEDULE_NAMES)
def test_same_values_under_xla_with_a_variable_step(name):
    schedule = form(name, "exponential" if name != "inverse_sqrt" else "linear",
                    1e-4 if name != "inverse_sqrt" else 0.0)
    step = tf.Variable(0, dtype=tf.int64)
    compiled = tf.function(lambda: schedule(step), jit_compile=True)
    for s in (0, 500, 1000, 1001, 5000, 19999, 25000):
        step.assign(s)
        got = compiled()
        assert got.dtype == tf.float32
        assert float(got) == pytest.approx(float(schedule(s)), rel=1e-6, abs=1e-12)


def _round_trip(schedule):
    config = json.loads(json.dumps(keras.optimizers.schedules.serialize(schedule)))
    return keras.optimizers.schedules.deserialize(config)


@pytest.mark.parametrize("name", SCHEDULE_NAMES)
def test_config_round_trip_gives_equal_values(name):
    schedule = form(name, "exponential" if name != "inverse_sqrt" else "linear",
                    1e-4 if name != "inverse_sqrt" else 0.0)
    restored = _round_trip(schedule)
    assert type(restored) is type(schedule)
    assert restored.get_config() == schedule.get_config()
    steps = [0, 1, 500, 1000, 1001, 5000, 12345, 20000, 25000]
    np.testing.assert_array_equal(values(restored, steps), values(schedule, steps))


def test_config_round_trip_of_the_other_schedules():
    schedules = [
        WarmUp(0.25, warmup_steps=10, initial_learning_rate=0.05),
        InverseSqrtDecay(warmup_steps=40, d_model=64, scale=3.0),
        ConstantLearningRate(0.125),
        OptimizerStepSchedule(WarmUp(0.25, warmup_steps=10), gradient_accumulation_steps=4),
    ]
    for schedule in schedules:
        restored = _round_trip(schedule)
        assert type(restored) is type(schedule)
        np.testing.assert_array_equal(values(restored, range(0, 100, 3)),
                                      values(schedule, range(0, 100, 3)))


def test_schedule_travels_with_the_optimizer_config():
    schedule = form("cosine", "linear", 0.01)
    optimizer = keras.optimizers.SGD(learning_rate=schedule, momentum=0.9)
    restored = keras.optimizers.SGD.from_config(
        json.loads(json.dumps(optimizer.get_config()))
    )
    assert isinstance(restored.learning_rate, tf.Tensor)  # evaluated at step 0
    assert float(restored.learning_rate) == pytest.approx(0.01, rel=1e-6)
    restored.iterations.assign(WARMUP + (TOTAL - WARMUP) // 2)
    assert float(restored.learning_rate) == pytest.approx(BASE * 0.55, rel=1e-5)


# --------------------------------------------------------- inside optimizers


def _ones_model():
    """y = w * x with w = 0: with x = y = 1 and MSE, each SGD step is
    w <- w - lr * 2 * (w - 1), so the weight records every rate used."""
    model = keras.Sequential(
        [keras.Input((1,)), keras.layers.Dense(1, use_bias=False, kernel_initializer="zeros")]
    )
    return model


def _expected_weight(rates):
    w = 0.0
    for rate in rates:
        w -= rate * 2.0 * (w - 1.0)
    return w


def test_schedule_in_sgd_under_two_replica_mirrored_strategy():
    strategy = create_strategy("mirrored", devices=["/cpu:0", "/cpu:1"])
    assert strategy.num_replicas_in_sync == 2
    schedule = make_schedule(
        "cosine", 0.2, warmup_steps=4, total_steps=12, warmup_initial_learning_rate=0.02
    )
    with strategy.scope():
        model = _ones_model()
        model.compile(optimizer=keras.optimizers.SGD(learning_rate=schedule), loss="mse")
    x = np.ones((16, 1), "float32")
    model.fit(x, x, batch_size=4, epochs=2, shuffle=False, verbose=0)

    optimizer = model.optimizer
    # int(optimizer.iterations) fails on a MirroredVariable; read a copy.
    assert int(keras.ops.copy(optimizer.iterations)) == 8
    assert float(optimizer.learning_rate) == pytest.approx(
        float(schedule(8)), rel=1e-6
    )
    # The weight shows that update n used schedule(n), n = 0..7.
    rates = [float(schedule(n)) for n in range(8)]
    assert model.get_weights()[0][0, 0] == pytest.approx(_expected_weight(rates), rel=1e-5)


def test_optimizer_step_schedule_counts_updates_under_keras_accumulation():
    warm = WarmUp(0.4, warmup_steps=4, initial_learning_rate=0.0)  # 0, .1, .2, .3, .4
    model = _ones_model()
    optimizer = keras.optimizers.SGD(
        learning_rate=OptimizerStepSchedule(warm, 2), gradient_accumulation_steps=2
    )
    model.compile(optimizer=optimizer, loss="mse")
    x = np.ones((10, 1), "float32")
    model.fit(x, x, batch_size=1, epochs=1, shuffle=False, verbose=0)
    assert int(optimizer.iterations) == 5
    # Updates 0..4 used warm(0..4), not warm(1, 3, 5, 7, 9) (micro-batches).
    expected = _expected_weight([0.0, 0.1, 0.2, 0.3, 0.4])
    assert model.get_weights()[0][0, 0] == pytest.approx(expected, rel=1e-5)
    assert expected != pytest.approx(_expected_weight([0.1, 0.3, 0.4, 0.4, 0.4]), rel=1e-3)


# ------------------------------------------------------------------ errors


def test_unknown_name_lists_the_valid_ones():
    with pytest.raises(ValueError, match="unknown schedule name 'cosin'") as info:
        make_schedule("cosin", 0.1)
    for name in SCHEDULE_NAMES:
        assert name in str(info.value)


def test_names_are_case_and_dash_insensitive():
    schedule = make_schedule("Inverse-Sqrt", 0.1, warmup_steps=10)
    assert isinstance(schedule, InverseSqrtDecay)


@pytest.mark.parametrize("name", ["polynomial", "cosine", "exponential"])
def test_missing_total_steps_is_a_clear_error(name):
    with pytest.raises(ValueError, match=f"schedule '{name}' needs `total_steps`"):
        make_schedule(name, 0.1, warmup_steps=10)


@pytest.mark.parametrize(
    "call,message",
    [
        (lambda: make_schedule("cosine", 0.1, warmup_steps=10, total_steps=10), "greater than"),
        (lambda: make_schedule("cosine", 0.1, total_steps=100, boundaries=[5]),
         "'cosine' does not take option.*boundaries"),
        (lambda: make_schedule("step", 0.1), "needs `boundaries`"),
        (lambda: make_schedule("step", 0.1, warmup_steps=10, boundaries=[10, 20]),
         "> warmup_steps"),
        (lambda: make_schedule("step", 0.1, boundaries=[20, 10]), "strictly increasing"),
        (lambda: make_schedule("cosine_restarts", 0.1), "needs `first_decay_steps`"),
        (lambda: make_schedule("inverse_sqrt", 0.1), "warmup_steps >= 1"),
        (lambda: make_schedule("cosine", 0.1, total_steps=100, alpha=0.1, end_learning_rate=0.01),
         "not both"),
        (lambda: make_schedule("cosine", -0.1, total_steps=100), "base_learning_rate=-0.1"),
        (lambda: make_schedule("constant", 0.1, warmup_mode="cubic"), "'linear', 'exponential'"),
        (lambda: make_schedule("constant", 0.1, warmup_steps=5, warmup_mode="exponential"),
         "initial_learning_rate"),
        (lambda: WarmUp("0.1", warmup_steps=10), "after_warmup='0.1'"),
        (lambda: WarmUp(0.1, warmup_steps=-1), "warmup_steps=-1"),
        (lambda: WarmUp(0.1, warmup_steps=2.5), "warmup_steps=2.5"),
        (lambda: InverseSqrtDecay(100), "exactly one of `d_model`"),
        (lambda: InverseSqrtDecay(100, d_model=512, peak_learning_rate=0.1), "exactly one"),
        (lambda: OptimizerStepSchedule(0.1, 2), "schedule=0.1"),
        (lambda: OptimizerStepSchedule(ConstantLearningRate(0.1), 0),
         "gradient_accumulation_steps=0"),
    ],
)
def test_bad_arguments_name_the_value(call, message):
    with pytest.raises(ValueError, match=message):
        call()


# -------------------------------------------------------- linear scaling rule


@pytest.mark.parametrize(
    "args,expected",
    [
        ((0.1, 256), 0.1),
        ((0.1, 8192), 3.2),
        ((0.1, 64), 0.025),
        ((0.5, 96, 32), 1.5),
        ((1e-3, np.int64(512)), 2e-3),
    ],
)
def test_scale_learning_rate_values(args, expected):
    assert scale_learning_rate(*args) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize(
    "args,message",
    [
        ((0.0, 256), "base_learning_rate=0.0"),
        ((float("nan"), 256), "base_learning_rate=nan"),
        (("0.1", 256), "base_learning_rate='0.1'"),
        ((0.1, 0), "global_batch_size=0"),
        ((0.1, 256.0), "global_batch_size=256.0"),
        ((0.1, True), "global_batch_size=True"),
        ((0.1, 256, -8), "reference_batch_size=-8"),
    ],
)
def test_scale_learning_rate_rejects_bad_input(args, message):
    with pytest.raises(ValueError, match=message):
        scale_learning_rate(*args)
