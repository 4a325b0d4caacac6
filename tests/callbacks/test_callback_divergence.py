"""DivergenceGuard: the rule on fixed loss sequences, and with BackupAndResume in real fits.

The rule tests feed the guard the logs Keras and tfdist's Trainer write: the
running mean of the epoch's loss (float32), reset at every epoch. The fit
tests train a small model with tfdist's Trainer, make it diverge by shifting
its output bias at a fixed step (a huge but finite loss, as a learning rate
far too high does), and read the backups on disk.
"""

import os
import pickle
import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf

from tfdist.callbacks import (BackupAndResume, DivergenceError, DivergenceGuard, NanGuard,
                              NonFiniteLossError, ResumeWarning, latest_backup, list_backups,
                              read_backup)
from tfdist.callbacks.backup import BackupWriter
from tfdist.callbacks.loss_health import HEALTH_ATTRIBUTE, LossHealth
from tfdist.recipes.config import COMMON_OPTIONS, ConfigError, parse_config
from tfdist.recipes.recipe_runner import divergence_guard
from tfdist.training import Trainer
from helpers.interrupt import Interrupted, InterruptAfterSteps
from helpers.workers import train_common as common


# ------------------------------------------------------------- the rule
def feed(guard, epochs):
    """Runs `guard` over per-batch losses (a list per epoch) as a fit logs them.

    Returns the DivergenceError raised, or None."""
    guard.on_train_begin()
    try:
        for epoch, losses in enumerate(epochs):
            guard.on_epoch_begin(epoch)
            total = 0.0
            for batch, loss in enumerate(losses):
                total += loss
                guard.on_train_batch_end(batch, {"loss": np.float32(total / (batch + 1))})
    except DivergenceError as error:
        return error
    return None


def noisy_decreasing(steps, seed=0, start=3.0, floor=0.05):
    """A training curve: exponential decay to a floor, with multiplicative noise."""
    rs = np.random.RandomState(seed)
    t = np.arange(steps)
    return list((floor + (start - floor) * np.exp(-t / 60.0)) * rs.lognormal(0.0, 0.3, steps))


def test_fires_at_the_third_check_above_factor_x_the_median_naming_step_and_loss():
    healthy = noisy_decreasing(40)
    error = feed(DivergenceGuard(), [healthy + [5e12] * 10])
    assert error is not None
    assert (error.rule, error.step, error.epoch, error.batch) == ("ratio", 43, 0, 42)
    assert error.value == pytest.approx(5e12, rel=1e-3)  # the batch's loss, not the running mean
    assert error.level == pytest.approx(np.median(healthy[-20:]), rel=1e-4)
    message = str(error)
    assert "global step 43" in message and "loss is 5e+12" in message
    assert "above 10 x its recent level" in message and "3 check(s) in a row" in message


def test_a_noisy_decreasing_curve_with_single_outliers_never_fires():
    epochs = [noisy_decreasing(500, seed=s)[100 * s:100 * s + 100] for s in range(5)]
    epochs[2][50] *= 40  # one bad batch: above the threshold once, then back to normal
    epochs[3][10] *= 40
    epochs[3][12] *= 40  # two, not in a row
    guard = DivergenceGuard()
    assert feed(guard, epochs) is None
    assert guard.health.steps == 500 and guard.health.healthy_through == 500
    assert max(guard.health.values) < 1.0  # the outliers never entered the level


def test_a_loss_high_at_the_start_or_jumping_during_the_warmup_does_not_fire():
    # Merely high at the start, then falling fast.
    assert feed(DivergenceGuard(), [[1e4, 3e3, 500, 80, 10] + noisy_decreasing(60)]) is None
    # A 1000x jump inside the warmup is not judged, and sets the level after it.
    guard = DivergenceGuard()
    assert feed(guard, [[1.0] * 10 + [1000.0] * 40]) is None
    assert guard.health.healthy_through == 50
    # A learning-rate warmup given as warmup= is honoured: a spike inside it is not
    # judged, and a jump inside it that stays is judged from the end of the warmup on.
    assert feed(DivergenceGuard(warmup=30), [[1.0] * 21 + [1000.0] * 5 + [1.0] * 30]) is None
    error = feed(DivergenceGuard(warmup=30), [[1.0] * 24 + [1000.0] * 30])
    assert error is not None and error.step == 32  # checks 30, 31, 32
    error = feed(DivergenceGuard(warmup=20), [[1.0] * 24 + [1000.0] * 30])
    assert error is not None and error.step == 27  # checks 25, 26, 27


def test_the_level_carries_across_epochs_and_a_late_jump_is_not_averaged_away():
    # The running mean resets at the epoch start: the jump at batch 1 of epoch 1 is
    # measured against the level of epoch 0.
    error = feed(DivergenceGuard(), [[2.0] * 30, [2.1, 40.0, 40.0, 40.0, 40.0]])
    assert error is not None and (error.epoch, error.batch, error.step) == (1, 3, 34)
    # A 50x jump after 300 batches of an epoch moves the running mean by a sixth of
    # it at first: the guard still sees the batches' own loss.
    error = feed(DivergenceGuard(), [[1.0] * 300 + [50.0] * 10])
    assert error is not None and error.step == 303
    assert error.value == pytest.approx(50.0, rel=1e-3)


def test_check_freq_judges_the_mean_of_the_batches_since_the_previous_check():
    guard = DivergenceGuard(check_freq=5, window=4, warmup=20, patience=1)
    error = feed(guard, [[1.0] * 40 + [1.0, 1.0, 1.0, 1.0, 56.0]])
    assert error is not None and error.step == 45
    assert error.value == pytest.approx(12.0, rel=1e-4)  # (4 + 56) / 5
    assert "the mean of the 5 batches since the previous check" in str(error)


def test_a_non_finite_loss_fires_at_once_even_in_the_warmup():
    error = feed(DivergenceGuard(), [[3.0, 2.5, float("inf"), 2.0]])
    assert error is not None and (error.rule, error.step) == ("non-finite", 3)
    assert "not finite" in str(error)


def test_a_non_positive_level_is_not_judged_and_warned_about_once():
    with pytest.warns(UserWarning, match="needs a positive loss") as caught:
        assert feed(DivergenceGuard(), [[-1.0] * 30 + [100.0] * 5]) is None
    assert len([w for w in caught if "positive loss" in str(w.message)]) == 1


def test_factor_zero_turns_the_guard_off():
    guard = DivergenceGuard(factor=0)
    assert not guard.enabled
    assert getattr(guard.on_train_batch_end, "_is_default", False)  # no per-batch sync
    assert feed(guard, [[1.0] * 30 + [1e12] * 10]) is None
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    guard.set_model(model)
    assert getattr(model, HEALTH_ATTRIBUTE, None) is None  # nothing for backups to use


@pytest.mark.parametrize("kwargs,match", [
    (dict(factor=1.0), "factor must be a number > 1.*got 1.0"),
    (dict(factor=-3), "got -3"),
    (dict(factor=float("nan")), "got nan"),
    (dict(window=0), "window must be an integer >= 1, got 0"),
    (dict(warmup=-1), "warmup must be an integer >= 0, got -1"),
    (dict(patience=0), "patience must be an integer >= 1, got 0"),
    (dict(check_freq="epoch"), "check_freq must be an integer >= 1, got 'epoch'"),
    (dict(monitor=""), "monitor must be a log name"),
])
def test_bad_arguments_are_refused_naming_the_value(kwargs, match):
    with pytest.raises(ValueError, match=match):
        DivergenceGuard(**kwargs)


def test_the_error_pickles_with_its_fields():
    error = feed(DivergenceGuard(), [[1.0] * 30 + [1e9] * 5])
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is DivergenceError and str(copy) == str(error)
    assert (copy.step, copy.value, copy.level, copy.rule) == (error.step, error.value,
                                                              error.level, "ratio")


def test_the_recipe_guard_waits_for_the_learning_rate_warmup_in_batches(tmp_path):
    def guard(*flags):
        return divergence_guard(parse_config(list(flags), COMMON_OPTIONS, "demo"), "run/backup")

    assert guard().warmup == 20 and guard().factor == 10.0
    assert guard("--warmup-steps", "30", "--grad-accum-steps", "2").warmup == 60
    made = guard("--divergence-factor", "4")
    assert made.factor == 4.0 and "lower --learning-rate" in made.hint and "run/backup" in made.hint
    # The YAML key, checked like the flag.
    config_file = tmp_path / "run.yaml"
    config_file.write_text("divergence_factor: 25\n")
    assert guard("--config", str(config_file)).factor == 25.0
    config_file.write_text("divergence_factor: 1\n")
    with pytest.raises(ConfigError, match="divergence_factor must be 0 .off. or a number > 1"):
        guard("--config", str(config_file))


# ---------------------------------------------- with BackupAndResume in fits
BATCH = 8
STEPS = 8  # batches per epoch
EPOCHS = 4
SHIFT = 1000.0


class ShiftAt(keras.callbacks.Callback):
    """Adds SHIFT to the output bias just before global batch `step` (1-based,
    counted by the optimizer, so also in a resumed run): the loss jumps to
    ~1e6 and stays finite, as when an update diverged."""

    def __init__(self, step, value=SHIFT):
        super().__init__()
        self.step, self.value = step, value

    def on_train_batch_begin(self, batch, logs=None):
        if int(self.model.optimizer.iterations.numpy()) + 1 == self.step:
            bias = self.model.layers[-1].bias
            bias.assign(bias.numpy() + self.value)


def train(callbacks):
    strategy = tf.distribute.get_strategy()
    model = common.dense_model(strategy)
    trainer = Trainer(model, keras.optimizers.SGD(0.05), "mse", strategy=strategy)
    data = common.dataset(common.regression_arrays(n=BATCH * STEPS), BATCH).repeat()
    history = trainer.fit(data, epochs=EPOCHS, steps_per_epoch=STEPS, callbacks=callbacks,
                          verbose=0)
    return model, history.history


def output_bias(path):
    """The largest |output bias| in a backup (the model's 4th variable)."""
    tensor = tf.train.load_checkpoint(path).get_tensor(
        "optimizer/_trainable_variables/3/.ATTRIBUTES/VARIABLE_VALUE")
    assert tensor.shape == (common.TARGETS,)
    return float(np.max(np.abs(tensor)))


def steps_on_disk(backup_dir):
    return [read_backup(p).global_step for p in list_backups(backup_dir)]


def test_a_fit_the_guard_stopped_leaves_no_record_on_the_model():
    """The guard publishes its record on the model for the length of a fit. When its
    own error ends the fit (Keras calls no callback then), tfdist's Trainer calls its
    on_fit_error, and the record goes: a later fit of the same model without a guard
    gives its backups no record of a guard that no longer runs."""
    strategy = tf.distribute.get_strategy()
    model = common.dense_model(strategy)
    trainer = Trainer(model, keras.optimizers.SGD(0.05), "mse", strategy=strategy)
    data = common.dataset(common.regression_arrays(n=BATCH * STEPS), BATCH).repeat()
    with pytest.raises(DivergenceError):
        trainer.fit(data, epochs=EPOCHS, steps_per_epoch=STEPS,
                    callbacks=[ShiftAt(25), DivergenceGuard()], verbose=0)
    assert getattr(model, HEALTH_ATTRIBUTE, None) is None


def test_without_a_guard_diverged_backups_rotate_the_good_ones_out(tmp_path):
    # The problem: a finite but huge loss stops nothing, and every kept backup is diverged.
    backup_dir = tmp_path / "backup"
    _, history = train([ShiftAt(25), NanGuard(),
                        BackupAndResume(backup_dir, save_freq=2, max_to_keep=2, verbose=0)])
    assert np.isfinite(history["loss"]).all() and history["loss"][3] > 1e4
    assert steps_on_disk(backup_dir) == [30, 32]
    assert all(output_bias(p) > SHIFT / 10 for p in list_backups(backup_dir))


def test_a_diverged_run_keeps_the_last_good_backup_and_a_rerun_resumes_from_it(tmp_path):
    backup_dir = tmp_path / "backup"
    backup = BackupAndResume(backup_dir, save_freq=2, max_to_keep=2, verbose=0)
    # Judged from step 21 (warmup 20 steps, 20 values); the weights diverge before
    # step 25. With patience 6 the loss is above the threshold at steps 25..30, so
    # the backups of steps 26 and 28 are written with the diverged weights first.
    guard = DivergenceGuard(patience=6)
    with pytest.raises(DivergenceError) as caught:
        train([ShiftAt(25), NanGuard(), guard, backup])
    error = caught.value
    assert (error.step, error.epoch, error.batch, error.rule) == (30, 3, 5, "ratio")
    assert 1e4 < error.value < 1e8 and error.level < 1.0
    # The good backup (step 22, the last one whose weights a later check saw healthy)
    # survived the rotation of max_to_keep=2; the suspects of steps 26 and 28 are
    # deleted (24, never confirmed either, was rotated out), so it is the newest one.
    assert steps_on_disk(backup_dir) == [22]
    assert backup.good_backup == list_backups(backup_dir)[0]
    assert [os.path.basename(p) for p in backup.discarded] == ["ckpt-13", "ckpt-14"]
    assert output_bias(backup.good_backup) < 10
    assert sorted(os.listdir(backup_dir)) == ["checkpoint", "ckpt-11.data-00000-of-00001",
                                              "ckpt-11.index"]
    message = str(error)
    assert f"the last good backup is {backup.good_backup} (global step 22)" in message
    assert "deleted the backup(s) taken since then (ckpt-13, ckpt-14)" in message

    # Rerun without the cause: resumes from the good backup and trains to the end.
    resumed = BackupAndResume(backup_dir, save_freq=2, max_to_keep=2, verbose=0)
    model, history = train([NanGuard(), DivergenceGuard(), resumed])
    assert resumed.restored.global_step == 22
    assert np.isfinite(history["loss"]).all() and history["loss"][-1] < 1.0
    assert latest_backup(backup_dir).global_step == EPOCHS * STEPS


def test_a_resumed_guard_continues_its_record_and_fires_at_the_same_step(tmp_path):
    uninterrupted = tmp_path / "uninterrupted"
    with pytest.raises(DivergenceError) as expected:
        train([ShiftAt(25), DivergenceGuard(),
               BackupAndResume(uninterrupted, save_freq=4, verbose=0)])
    assert expected.value.step == 27

    backup_dir = tmp_path / "backup"
    with pytest.raises(Interrupted):
        train([ShiftAt(25), DivergenceGuard(), BackupAndResume(backup_dir, save_freq=4,
                                                               verbose=0), InterruptAfterSteps(14)])
    assert latest_backup(backup_dir).global_step == 12
    guard = DivergenceGuard()
    with pytest.raises(DivergenceError) as caught:
        train([ShiftAt(25), guard, BackupAndResume(backup_dir, save_freq=4, verbose=0)])
    # Restarted at step 12, before the warmup of 20 steps ended: without the restored
    # record the guard would judge nothing before step 32, the end of the run.
    assert caught.value.step == 27
    assert caught.value.value == pytest.approx(expected.value.value, rel=1e-4)
    assert caught.value.level == pytest.approx(expected.value.level, rel=1e-5)


def test_a_backup_without_a_guard_record_restarts_the_warmup_with_a_warning(tmp_path):
    backup_dir = tmp_path / "backup"
    with pytest.raises(Interrupted):
        train([BackupAndResume(backup_dir, save_freq=4, verbose=0), InterruptAfterSteps(14)])
    guard = DivergenceGuard()
    with pytest.warns(ResumeWarning, match="holds no DivergenceGuard record"):
        train([guard, BackupAndResume(backup_dir, save_freq=4, verbose=0)])
    # Steps still count from the start of training, but no value was judged: the 20
    # values of the level are recorded again, from step 13 to 32.
    assert guard.health.steps == EPOCHS * STEPS
    assert len(guard.health.values) == 20 and guard.health.healthy_through == 0


def test_nan_guard_with_a_divergence_guard_also_drops_the_unconfirmed_backups(tmp_path):
    backup_dir = tmp_path / "backup"
    backup = BackupAndResume(backup_dir, save_freq=2, max_to_keep=2, verbose=0)
    with pytest.raises(NonFiniteLossError) as caught:
        train([ShiftAt(25, value=np.nan), NanGuard(), DivergenceGuard(), backup])
    # NaN at step 25: the backup of step 24 holds weights no check has seen: deleted.
    assert caught.value.step == 24  # NanGuard counts from 0
    assert steps_on_disk(backup_dir) == [22]
    assert "the last good backup is" in str(caught.value) and "(ckpt-12)" in str(caught.value)


def test_keras_fit_logs_work_the_same():
    model = common.dense_model(tf.distribute.get_strategy())
    model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
    x, y = common.regression_arrays(n=BATCH * STEPS)
    with pytest.raises(DivergenceError) as caught:
        model.fit(x, y, batch_size=BATCH, epochs=EPOCHS, shuffle=False, verbose=0,
                  callbacks=[ShiftAt(25), DivergenceGuard()])
    assert (caught.value.step, caught.value.epoch, caught.value.batch) == (27, 3, 2)
    assert caught.value.value > 1e4 and caught.value.iterations == 27


def test_the_writer_keeps_protected_backups_and_discards_index_first(tmp_path):
    backup_dir = tmp_path / "backup"
    writer = BackupWriter(tf.train.Checkpoint(v=tf.Variable([1.0, 2.0])), backup_dir, 2,
                          is_chief=True)
    for number in range(1, 6):
        writer.write(number, keep=[2])
    assert [os.path.basename(p) for p in list_backups(backup_dir)] == ["ckpt-2", "ckpt-4",
                                                                      "ckpt-5"]
    assert len([n for n in os.listdir(backup_dir) if n.endswith(".index")]) == 3
    # The index is the one TensorFlow writes: its own readers see the same backups.
    assert tf.train.latest_checkpoint(str(backup_dir)) == str(backup_dir / "ckpt-5")
    manager = tf.train.CheckpointManager(tf.train.Checkpoint(), str(backup_dir), max_to_keep=5)
    assert [os.path.basename(p) for p in manager.checkpoints] == ["ckpt-2", "ckpt-4", "ckpt-5"]
    # Without keep, the rotation drops it.
    writer.write(6)
    assert [os.path.basename(p) for p in list_backups(backup_dir)] == ["ckpt-5", "ckpt-6"]
    assert writer.discard([6, 99]) == [str(backup_dir / "ckpt-6")]
    assert [os.path.basename(p) for p in list_backups(backup_dir)] == ["ckpt-5"]
    assert sorted(os.listdir(backup_dir)) == ["checkpoint", "ckpt-5.data-00000-of-00001",
                                              "ckpt-5.index"]
    other = BackupWriter(tf.train.Checkpoint(v=tf.Variable([1.0])), backup_dir, 2,
                         is_chief=False)
    assert other.discard([5]) == [] and len(list_backups(backup_dir)) == 1


def test_the_loss_record_survives_a_checkpoint_round_trip(tmp_path):
    health = LossHealth(window=4)
    health.steps, health.epoch, health.epoch_batches = 30, 3, 6
    health.checked_batches, health.checked_mean = 6, 0.75
    health.values, health.streak, health.healthy_through, health.flagged_at = (
        [0.5, 0.25, 1.5], 1, 29, 30)
    health.store()
    path = tf.train.Checkpoint(loss_health=health.trackable()).write(str(tmp_path / "c"))
    restored = LossHealth(window=4)
    assert restored.restore(path)
    assert vars(restored) | {"_variables": None} == vars(health) | {"_variables": None}
    assert not LossHealth(window=5).restore(path)  # another shape: refused, not half-read
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert not LossHealth(window=4).restore(str(tmp_path / "missing"))
