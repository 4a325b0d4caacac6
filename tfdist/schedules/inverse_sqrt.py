"""The inverse-square-root ("Noam", Transformer) schedule."""

import math

import keras
from keras import ops

from tfdist.schedules._checks import check_float
from tfdist.schedules._checks import check_int


@keras.saving.register_keras_serializable(package="tfdist")
class InverseSqrtDecay(keras.optimizers.schedules.LearningRateSchedule):
    """Linear warmup, then decay with the inverse square root of the step.

    The schedule of "Attention Is All You Need" (Vaswani et al., 2017):

    ```python
    lr = scale * d_model ** -0.5 * min(step ** -0.5, step * warmup_steps ** -1.5)
    ```

    It rises linearly from 0 at step 0 to its peak at `step == warmup_steps`
    and then falls as `1 / sqrt(step)`: at `4 * warmup_steps` it is half the
    peak. Give either `d_model` (the paper's form; peak
    `scale * (d_model * warmup_steps) ** -0.5`) or `peak_learning_rate` (the
    rate at `warmup_steps`, times `scale`), not both.

    Step 0 gives 0.0, as in the paper's formula, so the first update of an
    optimizer that starts counting at 0 changes nothing. The warmup is part
    of the formula: do not wrap this schedule in `WarmUp`.

    Args:
        warmup_steps: integer >= 1, the step with the highest rate.
        d_model: model width (integer >= 1) for the paper's form, or None.
        peak_learning_rate: the rate at `warmup_steps` (> 0), or None.
        scale: a factor (> 0) on the whole schedule. Defaults to 1.0.
        name: name scope of the operations. Defaults to `"InverseSqrtDecay"`.

    Example:

    >>> schedule = InverseSqrtDecay(warmup_steps=4000, d_model=512)
    >>> round(float(schedule(4000)), 7)  # 512**-0.5 * 4000**-0.5
    0.0006988
    >>> schedule = InverseSqrtDecay(warmup_steps=100, peak_learning_rate=1e-3)
    >>> [round(float(schedule(s)), 6) for s in (0, 50, 100, 400)]
    [0.0, 0.0005, 0.001, 0.0005]
    """

    def __init__(
        self,
        warmup_steps,
        d_model=None,
        peak_learning_rate=None,
        scale=1.0,
        name="InverseSqrtDecay",
    ):
        super().__init__()
        owner = type(self).__name__
        self.warmup_steps = check_int(owner, "warmup_steps", warmup_steps, 1)
        if (d_model is None) == (peak_learning_rate is None):
            raise ValueError(
                f"{owner}: give exactly one of `d_model` (the Transformer form) "
                "and `peak_learning_rate` (the rate at warmup_steps). Received: "
                f"d_model={d_model!r}, peak_learning_rate={peak_learning_rate!r}."
            )
        self.d_model = None if d_model is None else check_int(owner, "d_model", d_model, 1)
        self.peak_learning_rate = (
            None
            if peak_learning_rate is None
            else check_float(owner, "peak_learning_rate", peak_learning_rate, strict=True)
        )
        self.scale = check_float(owner, "scale", scale, strict=True)
        self.name = name

    @property
    def factor(self):
        """The constant in front of `min(step**-0.5, step * warmup_steps**-1.5)`."""
        if self.d_model is not None:
            return self.scale * self.d_model**-0.5
        return self.scale * self.peak_learning_rate * math.sqrt(self.warmup_steps)

    def __call__(self, step):
        with keras.name_scope(self.name):
            step = ops.cast(step, "float32")
            # rsqrt(0) is inf and min(inf, 0) is 0: finite at every step >= 0.
            decay = ops.rsqrt(step)
            warmup = step * ops.cast(self.warmup_steps**-1.5, "float32")
            return ops.cast(self.factor, "float32") * ops.minimum(decay, warmup)

    def get_config(self):
        return {
            "warmup_steps": self.warmup_steps,
            "d_model": self.d_model,
            "peak_learning_rate": self.peak_learning_rate,
            "scale": self.scale,
            "name": self.name,
        }
