"""Warmup in front of any learning-rate schedule."""

import numbers

import keras
from keras import ops

from tfdist.schedules._checks import check_choice
from tfdist.schedules._checks import check_float
from tfdist.schedules._checks import check_int

WARMUP_MODES = ("linear", "exponential")


@keras.saving.register_keras_serializable(package="tfdist")
class WarmUp(keras.optimizers.schedules.LearningRateSchedule):
    """Warms the learning rate up, then hands over to another schedule.

    For `step < warmup_steps` the rate climbs from `initial_learning_rate` to
    the target `after_warmup(0)` (or `after_warmup` itself when it is a
    number):

    ```python
    fraction = step / warmup_steps
    # mode="linear":
    lr = initial + (target - initial) * fraction
    # mode="exponential" (geometric, needs initial > 0 and target > 0):
    lr = initial * (target / initial) ** fraction
    ```

    From `step >= warmup_steps` on the rate is
    `after_warmup(step - warmup_steps)`: the wrapped schedule starts at its
    own step 0 when warmup ends, so it runs its full course after warmup and
    the rate is continuous at the boundary (`lr(warmup_steps) == target`).
    Pass decay lengths to the wrapped schedule in post-warmup steps (e.g.
    `CosineDecay(decay_steps=total_steps - warmup_steps)`), or use
    `tfdist.schedules.make_schedule`, which does that for you.

    `step` is the optimizer's step count. Keras optimizers call their schedule
    with the number of `apply` calls, which under
    `gradient_accumulation_steps=K` counts micro-batches; wrap the schedule
    in `OptimizerStepSchedule(schedule, K)` to count updates instead.

    The computation uses only `keras.ops` on the step, in float32, with no
    Python branching on its value, so it runs eagerly, in `tf.function`, under
    XLA and under any `tf.distribute` strategy; every replica and worker gets
    the same value for the same step.

    Args:
        after_warmup: a `keras.optimizers.schedules.LearningRateSchedule`, or a
            number for a constant rate after warmup.
        warmup_steps: integer >= 0, the number of warmup steps. 0 means no
            warmup (the wrapped schedule is used from step 0).
        initial_learning_rate: the rate at step 0, >= 0 (> 0 for
            exponential warmup). Defaults to 0.0.
        mode: `"linear"` (default) or `"exponential"`.
        name: name scope of the operations. Defaults to `"WarmUp"`.

    Example:

    >>> cosine = keras.optimizers.schedules.CosineDecay(0.1, decay_steps=900)
    >>> schedule = WarmUp(cosine, warmup_steps=100)
    >>> [round(float(schedule(s)), 4) for s in (0, 50, 100, 550, 1000)]
    [0.0, 0.05, 0.1, 0.05, 0.0]
    >>> optimizer = keras.optimizers.SGD(learning_rate=schedule)
    """

    def __init__(
        self,
        after_warmup,
        warmup_steps,
        initial_learning_rate=0.0,
        mode="linear",
        name="WarmUp",
    ):
        super().__init__()
        owner = type(self).__name__
        if isinstance(after_warmup, keras.optimizers.schedules.LearningRateSchedule):
            self.after_warmup = after_warmup
        elif isinstance(after_warmup, numbers.Real) and not isinstance(after_warmup, bool):
            self.after_warmup = check_float(owner, "after_warmup", after_warmup)
        else:
            raise ValueError(
                f"{owner}: `after_warmup` must be a keras.optimizers.schedules."
                "LearningRateSchedule or a number >= 0. Received: "
                f"after_warmup={after_warmup!r} (type {type(after_warmup).__name__})."
            )
        self.warmup_steps = check_int(owner, "warmup_steps", warmup_steps, 0)
        self.mode = check_choice(owner, "mode", mode, WARMUP_MODES)
        exponential = self.mode == "exponential"
        self.initial_learning_rate = check_float(
            owner, "initial_learning_rate", initial_learning_rate, strict=exponential
        )
        if exponential and self.warmup_steps > 0 and self.after_warmup == 0.0:
            raise ValueError(
                f"{owner}: exponential warmup needs a target > 0. "
                f"Received: after_warmup={after_warmup!r}."
            )
        self.name = name

    def _after(self, step):
        if isinstance(self.after_warmup, float):
            return ops.convert_to_tensor(self.after_warmup, "float32")
        return ops.cast(self.after_warmup(step), "float32")

    def __call__(self, step):
        with keras.name_scope(self.name):
            step = ops.convert_to_tensor(step)
            if self.warmup_steps == 0:
                return self._after(step)
            # The wrapped schedule sees a step in the caller's dtype (int for
            # an optimizer), clamped at 0 so both branches stay finite.
            after_step = ops.maximum(
                ops.subtract(step, ops.cast(self.warmup_steps, step.dtype)),
                ops.cast(0, step.dtype),
            )
            target = self._after(ops.cast(0, step.dtype))
            after_value = self._after(after_step)

            step_f = ops.cast(step, "float32")
            warmup_steps = ops.cast(self.warmup_steps, "float32")
            fraction = ops.clip(ops.divide(step_f, warmup_steps), 0.0, 1.0)
            initial = ops.cast(self.initial_learning_rate, "float32")
            if self.mode == "linear":
                warm_value = initial + (target - initial) * fraction
            else:
                warm_value = initial * ops.power(ops.divide(target, initial), fraction)
            return ops.where(step_f < warmup_steps, warm_value, after_value)

    def get_config(self):
        after_warmup = self.after_warmup
        if not isinstance(after_warmup, float):
            after_warmup = keras.optimizers.schedules.serialize(after_warmup)
        return {
            "after_warmup": after_warmup,
            "warmup_steps": self.warmup_steps,
            "initial_learning_rate": self.initial_learning_rate,
            "mode": self.mode,
            "name": self.name,
        }

    @classmethod
    def from_config(cls, config):
        """Instantiates a `WarmUp` from the output of `get_config()`.

        Args:
            config: dict from `get_config()`; `after_warmup` may be a
                serialised schedule or a number.

        Returns:
            A `WarmUp` instance.
        """
        config = dict(config)
        if isinstance(config["after_warmup"], dict):
            config["after_warmup"] = keras.optimizers.schedules.deserialize(
                config["after_warmup"]
            )
        return cls(**config)
