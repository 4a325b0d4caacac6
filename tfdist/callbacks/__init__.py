"""tfdist.callbacks: Keras callbacks for distributed training.

Each is a plain `keras.callbacks.Callback`, so it works in tfdist's `Trainer`
and in any app's own `model.fit`; each is multi-worker safe (only the chief
writes, every worker computes the same values).

    from tfdist.callbacks import ThroughputMeter, NanGuard, DivergenceGuard, BackupAndResume
"""

from tfdist.callbacks.backup import (BackupAndResume, BackupInfo, ResumeWarning, describe_backup,
                                     latest_backup, list_backups, read_backup)
from tfdist.callbacks.chief import is_chief, task_info
from tfdist.callbacks.chief_logging import ChiefOnly, make_logging_callbacks
from tfdist.callbacks.divergence import DivergenceError, DivergenceGuard
from tfdist.callbacks.learning_rate import LearningRateLogger, LearningRateScheduleCallback
from tfdist.callbacks.loss_health import LossHealth
from tfdist.callbacks.memory import DeviceMemoryMonitor, MemoryUsageWarning
from tfdist.callbacks.nan_guard import NanGuard, NonFiniteLossError
from tfdist.callbacks.preemption import Preempted, PreemptionGuard
from tfdist.runtime.stop_signals import PREEMPTED_EXIT_CODE
from tfdist.callbacks.profiler import ProfilerWindow
from tfdist.callbacks.progress import ProgressLogger
from tfdist.callbacks.throughput import ThroughputMeter, format_summary
from tfdist.callbacks.worker_safe import make_worker_safe
from tfdist.callbacks.worker_safe_backup import WorkerSafeBackupAndRestore

__all__ = [
    "BackupAndResume", "BackupInfo", "ChiefOnly", "DeviceMemoryMonitor", "DivergenceError",
    "DivergenceGuard", "LearningRateLogger", "LearningRateScheduleCallback", "LossHealth",
    "MemoryUsageWarning", "NanGuard", "NonFiniteLossError", "PREEMPTED_EXIT_CODE", "Preempted",
    "PreemptionGuard", "ProfilerWindow", "ProgressLogger", "ResumeWarning", "ThroughputMeter",
    "WorkerSafeBackupAndRestore", "describe_backup", "format_summary", "is_chief", "latest_backup",
    "list_backups", "make_logging_callbacks", "make_worker_safe", "read_backup", "task_info",
]
