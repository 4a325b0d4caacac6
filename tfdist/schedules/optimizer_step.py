"""Makes a schedule count optimizer updates under Keras gradient accumulation."""

import keras
from keras import ops

from tfdist.schedules._checks import check_int


@keras.saving.register_keras_serializable(package="tfdist")
class OptimizerStepSchedule(keras.optimizers.schedules.LearningRateSchedule):
    """Feeds a schedule the number of optimizer updates, not micro-batches.

    A Keras 3 optimizer built with `gradient_accumulation_steps=K` calls its
    learning-rate schedule with its internal counter of `apply` calls, which
    counts micro-batches: a warmup of 1000 steps would end after 250 updates
    when K is 4. This wrapper divides that counter by K (`step // K`, the
    value of `optimizer.iterations`), so the wrapped schedule sees optimizer
    updates, and update `n` uses `schedule(n)`, exactly as without
    accumulation.

    Use it only with the Keras optimizer's own `gradient_accumulation_steps`.
    Training loops whose `optimizer.iterations` already counts updates (such
    as tfdist's trainer, which accumulates before calling the optimizer) need
    no wrapper.

    Args:
        schedule: the `keras.optimizers.schedules.LearningRateSchedule` to wrap,
            written in optimizer updates.
        gradient_accumulation_steps: integer >= 1, the same value as the
            optimizer's `gradient_accumulation_steps`.
        name: name scope of the operations. Defaults to
            `"OptimizerStepSchedule"`.

    Example:

    >>> warm = WarmUp(0.1, warmup_steps=100)
    >>> optimizer = keras.optimizers.SGD(
    ...     learning_rate=OptimizerStepSchedule(warm, 4),
    ...     gradient_accumulation_steps=4)
    """

    def __init__(self, schedule, gradient_accumulation_steps, name="OptimizerStepSchedule"):
        super().__init__()
        owner = type(self).__name__
        if not isinstance(schedule, keras.optimizers.schedules.LearningRateSchedule):
            raise ValueError(
                f"{owner}: `schedule` must be a keras.optimizers.schedules."
                f"LearningRateSchedule. Received: schedule={schedule!r}."
            )
        self.schedule = schedule
        self.gradient_accumulation_steps = check_int(
            owner, "gradient_accumulation_steps", gradient_accumulation_steps, 1
        )
        self.name = name

    def __call__(self, step):
        with keras.name_scope(self.name):
            step = ops.convert_to_tensor(step)
            if self.gradient_accumulation_steps > 1:
                step = ops.floor_divide(
                    step, ops.cast(self.gradient_accumulation_steps, step.dtype)
                )
            return self.schedule(step)

    def get_config(self):
        return {
            "schedule": keras.optimizers.schedules.serialize(self.schedule),
            "gradient_accumulation_steps": self.gradient_accumulation_steps,
            "name": self.name,
        }

    @classmethod
    def from_config(cls, config):
        """Instantiates an `OptimizerStepSchedule` from `get_config()` output.

        Args:
            config: dict from `get_config()`.

        Returns:
            An `OptimizerStepSchedule` instance.
        """
        config = dict(config)
        config["schedule"] = keras.optimizers.schedules.deserialize(config["schedule"])
        return cls(**config)
