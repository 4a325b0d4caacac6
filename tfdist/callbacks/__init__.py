"""tfdist.callbacks: Keras callbacks for distributed training.

Each is a plain `keras.callbacks.Callback`, so it works in tfdist's `Trainer`
and in any app's own `model.fit`.

    from tfdist.callbacks import ThroughputMeter, LearningRateLogger
"""

from tfdist.callbacks.learning_rate import LearningRateLogger, LearningRateScheduleCallback
from tfdist.callbacks.throughput import ThroughputMeter, format_summary

__all__ = ["LearningRateLogger", "LearningRateScheduleCallback", "ThroughputMeter", "format_summary"]
