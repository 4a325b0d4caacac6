"""Optimizer and learning-rate schedule names, without TensorFlow.

The one list of each: the recipes' `--optimizer` and `--schedule` flags offer
these choices before TensorFlow starts, and the factories
(`tfdist.schedules.optimizers.build_optimizer`,
`tfdist.schedules.make_schedule`) accept exactly these. A new optimizer or
schedule is added here and in its factory; a test keeps the flags, these
names and the factories equal.

Example:

    from tfdist.schedules.choices import OPTIMIZER_NAMES, SCHEDULE_NAMES

    "adamw" in OPTIMIZER_NAMES   # True
"""

OPTIMIZER_NAMES = ("adam", "adamw", "sgd", "momentum", "lamb", "lion")
"""Names `build_optimizer` accepts (`momentum` is SGD with Nesterov momentum)."""

MOMENT_SETTINGS = {"beta_1": ("adam", "adamw", "lamb", "lion"),
                   "beta_2": ("adam", "adamw", "lamb", "lion"),
                   "epsilon": ("adam", "adamw", "lamb")}
"""The Adam-style moment settings of `build_optimizer` and the optimizers that have them."""


def moment_setting_fault(optimizer, setting, value):
    """What is wrong with `value` for the moment `setting` of `optimizer`:
    `"missing"` (the optimizer has no such setting), `"range"` (a beta outside
    [0, 1)), or None (fine, or None: Keras's default). The one rule behind the
    recipes' flag check and `build_optimizer`'s; each words its own message.

    Example:

    >>> moment_setting_fault("sgd", "beta_2", 0.98), moment_setting_fault("adam", "beta_1", 1.0)
    ('missing', 'range')
    """
    if value is None:
        return None
    if optimizer not in MOMENT_SETTINGS[setting]:
        return "missing"
    if setting.startswith("beta") and not 0.0 <= value < 1.0:
        return "range"
    return None

SCHEDULE_NAMES = (
    "constant",
    "step",
    "exponential",
    "polynomial",
    "cosine",
    "cosine_restarts",
    "inverse_sqrt",
)
"""Names `make_schedule` accepts (case-insensitive, "-" or "_")."""

SCHEDULES_SHAPED_BY_THE_RUN = ("step", "cosine_restarts")
"""Schedules whose boundaries `build_optimizer` places from the run's length:
`step` decays at 50% and 75% of the steps after the warmup, `cosine_restarts`
restarts after a quarter of them."""

SCHEDULES_NEEDING_WARMUP = ("inverse_sqrt",)
"""Schedules that peak at the end of the warmup and so need `warmup_steps >= 1`
(`make_schedule` refuses 0), hence a run of at least 2 optimizer steps."""

MIN_STEPS_AFTER_WARMUP = 4
"""Optimizer steps after the warmup that a `SCHEDULES_SHAPED_BY_THE_RUN`
schedule needs (`build_optimizer` refuses a shorter run)."""
