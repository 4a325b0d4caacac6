"""A constant learning rate as a schedule."""

import keras
from keras import ops

from tfdist.schedules._checks import check_float


@keras.saving.register_keras_serializable(package="tfdist")
class ConstantLearningRate(keras.optimizers.schedules.LearningRateSchedule):
    """A `LearningRateSchedule` that returns the same rate at every step.

    Useful where a schedule object is required (e.g. `make_schedule("constant")`
    without warmup, or `LearningRateScheduleCallback`) and the rate is fixed.
    An optimizer built with a plain float instead keeps its rate in a
    variable that callbacks may set; an optimizer built with this schedule
    does not.

    Args:
        learning_rate: the rate, a finite number >= 0.
        name: name scope of the operation. Defaults to `"Constant"`.

    Example:

    >>> schedule = ConstantLearningRate(0.01)
    >>> float(schedule(0)) == float(schedule(10_000))
    True
    """

    def __init__(self, learning_rate, name="Constant"):
        super().__init__()
        self.learning_rate = check_float(type(self).__name__, "learning_rate", learning_rate)
        self.name = name

    def __call__(self, step):
        with keras.name_scope(self.name):
            del step  # The rate does not depend on the step.
            return ops.convert_to_tensor(self.learning_rate, "float32")

    def get_config(self):
        return {"learning_rate": self.learning_rate, "name": self.name}
