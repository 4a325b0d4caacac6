"""A callback given a value it cannot use says so when it is made, naming the argument
and what it takes, instead of failing (or quietly doing nothing) at some step of `fit`."""

import re

import pytest

from tfdist.callbacks import (BackupAndResume, DeviceMemoryMonitor, LearningRateLogger, NanGuard,
                              PreemptionGuard, ProgressLogger, ThroughputMeter,
                              WorkerSafeBackupAndRestore)
from tfdist.callbacks.loss_health import LossHealth
from tfdist.runtime.stop_signals import HandlerStopSignals


@pytest.mark.parametrize("make, error, message", [
    (lambda: ThroughputMeter("32"), ValueError, "global_batch_size must be an integer >= 1, got '32'."),
    (lambda: ThroughputMeter(32, num_replicas=2.0), ValueError,
     "num_replicas must be an integer >= 1, got 2.0."),
    (lambda: ThroughputMeter(32, tokens_per_example=-3), ValueError,
     "tokens_per_example must be a finite number > 0 or None (not measured), got -3."),
    (lambda: ThroughputMeter(32, flops_per_example="6e9"), ValueError,
     "flops_per_example must be a finite number > 0 or None (not measured), got '6e9'."),
    (lambda: ThroughputMeter(32, peak_flops=0), ValueError,
     "peak_flops must be a finite number > 0 or None (not measured), got 0."),
    (lambda: ThroughputMeter(32, peak_flops=float("inf")), ValueError,
     "peak_flops must be a finite number > 0 or None (not measured), got inf."),
    (lambda: NanGuard(monitor=""), ValueError, "monitor must be a log name such as 'loss'"),
    (lambda: LossHealth(window=0), ValueError, "window must be an integer >= 1, got 0."),
    (lambda: PreemptionGuard(ack_timeout=0), ValueError,
     "ack_timeout must be a finite number of seconds > 0, got 0."),
    (lambda: PreemptionGuard(ack_timeout=float("nan")), ValueError,
     "ack_timeout must be a finite number of seconds > 0, got nan."),
    (lambda: PreemptionGuard(backup="run/backup"), TypeError,
     "backup must be the BackupAndResume that writes the run's backups, or None to stop without "
     "one; got 'run/backup'."),
    (lambda: PreemptionGuard(signals=["SIGTERM"]), TypeError,
     "signals must be a source of stop signals with pending() and training_started()"),
    (lambda: WorkerSafeBackupAndRestore("run/backup", save_freq=0), ValueError,
     "save_freq must be an integer >= 1 (training batches) or 'epoch', got 0."),
    (lambda: WorkerSafeBackupAndRestore("run/backup", save_freq="batch"), ValueError,
     "save_freq must be an integer >= 1 (training batches) or 'epoch', got 'batch'."),
    # Keras's BackupAndRestore takes these by their truth: "no" kept two checkpoints
    (lambda: WorkerSafeBackupAndRestore("run/backup", double_checkpoint="no"), ValueError,
     "double_checkpoint must be True or False, got 'no'."),
    # called only when a backup is discarded, as a TypeError then
    (lambda: BackupAndResume("run/backup", on_discard="log"), ValueError,
     "on_discard must be a function of no arguments or None, got 'log'."),
    (lambda: LearningRateLogger(log_batches="no"), ValueError,
     "log_batches must be True or False, got 'no'."),
    (lambda: ProgressLogger(print_fn=None), ValueError,
     "print_fn must be a function of one string (print), got None."),
    (lambda: ThroughputMeter(32, print_fn="stdout"), ValueError,
     "print_fn must be a function of one string (print) or None, got 'stdout'."),
    (lambda: DeviceMemoryMonitor(gpus="all"), ValueError,
     "gpus must be a list of GPU indices (integers >= 0) or None (all), got 'all'."),
    (lambda: DeviceMemoryMonitor(gpu_utilization="off"), ValueError,
     "gpu_utilization must be True or False, got 'off'."),
], ids=["meter-batch-text", "meter-replicas-float", "meter-tokens", "meter-flops-text",
        "meter-peak-zero", "meter-peak-inf", "nan-guard-monitor", "loss-health-window",
        "preemption-timeout-zero", "preemption-timeout-nan", "preemption-backup-path",
        "preemption-signal-names", "worker-safe-save-freq-zero", "worker-safe-save-freq-text",
        "worker-safe-double-text", "backup-on-discard-text", "lr-logger-text",
        "progress-print-none", "meter-print-text", "memory-gpus-text", "memory-utilization-text"])
def test_a_value_the_callback_cannot_use_is_refused_when_it_is_made(make, error, message):
    with pytest.raises(error, match=re.escape(message)):
        make()


def test_the_values_they_take_are_accepted(tmp_path):
    backup = BackupAndResume(str(tmp_path / "backup"), save_freq=10)
    guard = PreemptionGuard(backup, signals=HandlerStopSignals(), ack_timeout=5)
    assert guard.backup is backup and guard.ack_timeout == 5.0
    meter = ThroughputMeter(32, num_replicas=2, tokens_per_example=128, flops_per_example=6e9,
                            peak_flops=2.0e11, warmup_steps=0)
    assert (meter.tokens_per_example, meter.peak_flops) == (128, 2.0e11)
    assert LossHealth(window=1).window == 1
    assert WorkerSafeBackupAndRestore(str(tmp_path / "keras"), save_freq=3).save_freq == 3
    assert NanGuard(monitor="val_loss").monitor == "val_loss"
    assert ThroughputMeter(32, print_fn=None).print_fn is None  # silent
    assert DeviceMemoryMonitor(gpus=(0, 1), print_fn=None).gpus == [0, 1]
    assert LearningRateLogger(log_batches=False).log_batches is False
