"""--divergence-factor end to end: a run that diverges to a huge finite loss exits
non-zero, keeps its last good backup, and a saner rerun resumes from it."""

import math
import re

import pytest

from helpers.mw import launch
from helpers.recipe_util import run_recipe
from tfdist.callbacks.backup import latest_backup, list_backups, read_backup
from tfdist.recipes.record import history_entries

# 24 steps per epoch, a backup every 2 steps, 2 kept; pinned float32 (same
# numbers on every CPU) without XLA (its 2-3 s of compilation per process buy
# nothing here), no learning-rate warmup (the guard judges from step 21).
COMMON = ["--precision", "float32", "--xla", "off", "--warmup-steps", "0",
          "--steps-per-epoch", "24", "--validation-steps", "1", "--backup-every", "2",
          "--backup-keep", "2", "--verbose", "2"]


@pytest.mark.slow
def test_a_diverged_run_exits_2_keeps_the_good_backup_and_a_sane_rerun_resumes(tmp_path):
    model_dir = tmp_path / "run"
    backup_dir = model_dir / "backup"
    args = [*COMMON, "--model-dir", str(model_dir)]

    first = run_recipe("transformer", [*args, "--epochs", "1"])
    assert first.returncode == 0, first.stdout[-3000:]
    assert latest_backup(backup_dir).global_step == 24
    record = (model_dir / "config.yaml").read_bytes()

    # AdamW at 1e6 (the issue): the first update from the backup sends the loss to
    # ~1e12, finite. Without the guard this run exited 0 and rotated the good backups out.
    diverged = run_recipe("transformer", [*args, "--epochs", "2", "--learning-rate", "1e6"])
    out = diverged.stdout
    assert diverged.returncode == 2, out[-3000:]
    assert "Traceback" not in out
    match = re.search(r"error: DivergenceError: DivergenceGuard: training diverged at global "
                      r"step (\d+) .*?: loss is ([0-9.e+]+), above 10 x its recent level "
                      r"([0-9.]+)", out)
    assert match, out[-3000:]
    step, loss, level = int(match.group(1)), float(match.group(2)), float(match.group(3))
    # Step 25 still ran on the backup's weights; 26, 27, 28 are three checks in a row.
    assert step == 28
    assert math.isfinite(loss) and loss > 1e9 and 0.5 < level < 5
    good = str(backup_dir / "ckpt-12")
    assert f"the last good backup is {good} (global step 24)" in out
    assert "lower --learning-rate" in out
    # The backup of step 26 (diverged weights) is gone; the one from before is the newest.
    assert [read_backup(p).global_step for p in list_backups(backup_dir)] == [24]
    # The record stays the one of the run that wrote the backup left; the diverged
    # run is kept in the history.
    assert (model_dir / "config.yaml").read_bytes() == record
    diverged_entry = history_entries(str(model_dir))[-1]
    assert diverged_entry["options"]["learning_rate"] == 1e6 and diverged_entry["exit_code"] == 2
    assert "DivergenceError" in diverged_entry["outcome"]

    rerun = run_recipe("transformer", [*args, "--epochs", "2", "--learning-rate", "3e-4"])
    assert rerun.returncode == 0, rerun.stdout[-3000:]
    assert "learning_rate: 0.003 -> 0.0003" in rerun.stdout  # against the backup's writer
    assert (f"resuming from {good} at epoch 1 step 0 (global step 24, optimizer iteration 24)"
            in rerun.stdout)
    final_loss = re.search(r"^\s*loss\s+([0-9.]+)\s", rerun.stdout, re.MULTILINE)
    assert final_loss and float(final_loss.group(1)) < 3.0  # from the good weights (chance 2.46)
    assert latest_backup(backup_dir).global_step == 48


@pytest.mark.slow
@pytest.mark.multiworker
def test_two_workers_stop_at_the_same_step_and_keep_the_good_backup(tmp_path):
    backup_dir = tmp_path / "run" / "backup"
    args = ["-m", "tfdist.recipes.transformer", "--strategy", "multi_worker_mirrored", *COMMON,
            "--model-dir", str(tmp_path / "run")]
    model_dir = tmp_path / "run"
    first = launch([*args, "--epochs", "1"], workers=2, timeout=300)
    assert first.returncode == 0, first.stdout[-3000:]
    record = (model_dir / "config.yaml").read_bytes()
    # The chief writes how the run ended after its peer has exited: the launcher's
    # grace period must let it (the helper's 2 s ran out on a loaded machine).
    diverged = launch([*args, "--epochs", "2", "--learning-rate", "1e6"], workers=2,
                      timeout=300, grace_period=30)
    assert diverged.returncode != 0, diverged.stdout[-3000:]
    # The loss is global: both workers judge the same values and stop at the same step
    # (they then meet in a barrier while the chief deletes the suspect backup: a worker
    # stopping at another step would hang there). The launcher stops the job as soon
    # as one worker exits, which may cut off the other's last line.
    stops = re.findall(r"^\[worker \d\] .*error: DivergenceError: DivergenceGuard: training "
                       r"diverged at (global step \d+ .*?: loss is [0-9.e+]+)",
                       diverged.stdout, re.MULTILINE)
    assert stops and set(stops) == {stops[0]}, diverged.stdout[-3000:]
    assert stops[0].startswith("global step 28 ")
    assert re.search(r"worker \d failed with exit code 2", diverged.stdout)
    assert [read_backup(p).global_step for p in list_backups(backup_dir)] == [24]
    # The record stays the one of the run that wrote the backup left; the diverged
    # run is kept in the history.
    assert (model_dir / "config.yaml").read_bytes() == record
    diverged_entry = history_entries(str(model_dir))[-1]
    assert diverged_entry["options"]["learning_rate"] == 1e6 and diverged_entry["exit_code"] == 2
    assert "DivergenceError" in diverged_entry["outcome"]


def test_a_bad_divergence_factor_exits_2_before_tensorflow_naming_it():
    result = run_recipe("transformer", ["--divergence-factor", "0.5"], timeout=60)
    assert result.returncode == 2
    assert "divergence_factor must be 0 (off) or a number > 1" in result.stdout
    assert "got 0.5" in result.stdout and "Traceback" not in result.stdout


def test_help_documents_the_flag():
    result = run_recipe("transformer", ["--help"], timeout=60)
    assert result.returncode == 0
    text = " ".join(result.stdout.split())
    assert "--divergence-factor FLOAT" in text and "0 turns the check off" in text
