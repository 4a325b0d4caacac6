"""Learning-rate schedules with warmup, for any Keras 3 optimizer.

Every schedule here is a `keras.optimizers.schedules.LearningRateSchedule`
that computes its value from the step alone with `keras.ops` (float32), so it
works eagerly, in `tf.function`, under XLA and under every `tf.distribute`
strategy, and serialises with the optimizer (`get_config` / `from_config`,
registered under the package name "tfdist").

    from tfdist.schedules import make_schedule, scale_learning_rate

    lr = scale_learning_rate(0.1, global_batch_size=1024)     # 0.4
    schedule = make_schedule("cosine", lr, warmup_steps=500, total_steps=10_000)
    optimizer = keras.optimizers.SGD(learning_rate=schedule, momentum=0.9)

Under a Keras optimizer's `gradient_accumulation_steps=K`, wrap the schedule
in `OptimizerStepSchedule(schedule, K)` so it counts updates, not
micro-batches. To drive an optimizer that holds a float rate from a
schedule, use `tfdist.callbacks.learning_rate.LearningRateScheduleCallback`.

`FusedAdam` and `FusedAdamW` are Keras's `Adam` and `AdamW` with each
variable's update run as one TensorFlow kernel (what the recipes build):

    optimizer = tfdist.schedules.FusedAdamW(schedule, weight_decay=0.01)
"""

from tfdist.runtime.lazy_exports import lazy_exports

# Names load on first use, so `import tfdist.schedules.choices` (the
# TensorFlow-free names the recipe flags offer) stays light.
_EXPORTS = {
    "SCHEDULE_NAMES": "tfdist.schedules.choices",
    "WARMUP_MODES": "tfdist.schedules.warmup",
    "ConstantLearningRate": "tfdist.schedules.constant",
    "FusedAdam": "tfdist.schedules.fused_adam",
    "FusedAdamW": "tfdist.schedules.fused_adam",
    "InverseSqrtDecay": "tfdist.schedules.inverse_sqrt",
    "OptimizerStepSchedule": "tfdist.schedules.optimizer_step",
    "WarmUp": "tfdist.schedules.warmup",
    "make_schedule": "tfdist.schedules.schedule_factory",
    "scale_learning_rate": "tfdist.schedules.scaling",
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

__all__ = [
    "SCHEDULE_NAMES",
    "WARMUP_MODES",
    "ConstantLearningRate",
    "FusedAdam",
    "FusedAdamW",
    "InverseSqrtDecay",
    "OptimizerStepSchedule",
    "WarmUp",
    "make_schedule",
    "scale_learning_rate",
]
