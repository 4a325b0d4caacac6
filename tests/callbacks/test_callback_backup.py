"""BackupAndResume: step-level backups, exact resume, atomic chief-only writes.

In-process tests interrupt `fit` with an exception and resume with a new
model, trainer and callback (no strategy, and a real 2-replica
MirroredStrategy); subprocess tests SIGKILL real processes: one in the middle
of writing a backup, and one worker of a 2-worker job right after a backup.
"""

import os
import signal
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf

from helpers.interrupt import (GlobalStepCounter, Interrupted, InterruptAfterSteps,
                               InterruptAtEpochStart)
from helpers.mw import launch
from helpers.recorders import BatchRecorder
from tfdist.callbacks.backup import (BackupAndResume, BackupWriter, ResumeWarning,
                                     latest_backup, list_backups, read_backup)
from tfdist.callbacks.nan_guard import NanGuard, NonFiniteLossError
from tfdist.data import Source, make_dataset_fn
from tfdist.training import Trainer
from tfdist.training.resume import (FIT_POSITION_ATTRIBUTE, FitPosition, position_note,
                                   replay_note)
from helpers.workers import backup_interrupted_write as big
from helpers.workers import backup_worker
from helpers.workers import train_common as common
from helpers.paths import WORKERS_DIR  # noqa: E402

EPOCHS = 3
BATCH = 8
EXAMPLES = 70  # 9 batches per epoch, the last one short


class BatchAndLossScaleRecorder(BatchRecorder):
    """Records (epoch, batch) of batch ends, and the loss scale when training begins."""

    scale_at_begin = None

    def on_train_begin(self, logs=None):
        optimizer = self.model.optimizer
        if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
            self.scale_at_begin = float(optimizer.dynamic_scale.numpy())


def make_trainer(strategy, optimizer=lambda: keras.optimizers.SGD(0.1, momentum=0.9),
                 dtype=None, **trainer_kwargs):
    model = common.dense_model(strategy, dtype=dtype)
    with strategy.scope():
        opt = optimizer()
    return model, Trainer(model, opt, "mse", metrics=["mae"], strategy=strategy,
                          **trainer_kwargs)


def train(strategy, callbacks, trainer=None, repeat=False, steps_per_epoch=None, shuffle=False,
          **kwargs):
    model, trainer = trainer or make_trainer(strategy, **kwargs)
    data = tf.data.Dataset.from_tensor_slices(common.regression_arrays(n=EXAMPLES))
    if shuffle:  # a new order every epoch (every iterator)
        data = data.shuffle(EXAMPLES, seed=5)
    data = data.batch(BATCH)
    if repeat:
        data = data.repeat()
    history = trainer.fit(data, epochs=EPOCHS, steps_per_epoch=steps_per_epoch,
                          callbacks=callbacks, verbose=0)
    return (model, trainer), common.weights_of(model), history.history


def strategy_named(name):
    return tf.distribute.get_strategy() if name == "default" else common.mirrored(2)


def all_finite(path):
    """Reads every float tensor of a checkpoint (fails if one cannot be read)."""
    reader = tf.train.load_checkpoint(path)
    floats = [k for k, dtype in reader.get_variable_to_dtype_map().items() if dtype.is_floating]
    assert floats
    return all(np.all(np.isfinite(reader.get_tensor(k))) for k in floats)


def assert_weights_close(actual, expected, tolerance=1e-5):
    for a, b in zip(actual, expected, strict=True):
        np.testing.assert_allclose(a, b, rtol=tolerance, atol=tolerance)


# ------------------------------------------------- exact resume, in-process
CASES = {
    # name: (strategy, fit/trainer options, interrupt at global step, save_freq)
    "default": ("default", {}, 14, 4),
    "default_reshuffled": ("default", dict(shuffle=True), 23, 4),
    "mirrored_repeat_spe5_exec2": ("mirrored", dict(repeat=True, steps_per_epoch=5,
                                                    steps_per_execution=2), 13, 3),
    "mirrored_accumulate2": ("mirrored", dict(grad_accum_steps=2), 17, 3),
}


@pytest.mark.parametrize("case", list(CASES))
def test_resumes_at_the_exact_step_and_ends_like_an_uninterrupted_run(tmp_path, case):
    name, options, interrupt_at, save_freq = CASES[case]
    backup_dir = tmp_path / "backup"
    fit_options = {k: options[k] for k in ("repeat", "steps_per_epoch", "shuffle")
                   if k in options}
    trainer_options = {k: v for k, v in options.items() if k not in fit_options}
    _, reference, reference_history = train(strategy_named(name), [], **options)

    first = BackupAndResume(backup_dir, save_freq=save_freq, max_to_keep=3, verbose=0)
    strategy = strategy_named(name)
    built = make_trainer(strategy, **trainer_options)
    with pytest.raises(Interrupted):
        train(strategy, [first, InterruptAfterSteps(interrupt_at)], trainer=built, **fit_options)
    saved = first.last_backup
    assert saved is not None and saved.global_step < interrupt_at
    assert latest_backup(backup_dir) == saved
    accumulate = trainer_options.get("grad_accum_steps", 1)
    assert saved.iterations == saved.global_step // accumulate
    assert saved.global_step % accumulate == 0  # only between optimizer updates

    second = BackupAndResume(backup_dir, save_freq=save_freq, verbose=0)
    recorder = BatchAndLossScaleRecorder()
    if accumulate > 1:
        # The same trainer: its half-done accumulation is dropped on resume.
        assert not built[1]._update_boundary()
        _, resumed, history = train(strategy, [second, recorder], trainer=built, **fit_options)
    else:
        _, resumed, history = train(strategy_named(name), [second, recorder], **options)
    assert second.restored == saved
    assert second.exact is True
    assert saved.step > 0  # mid-epoch, so this resume starts inside an epoch
    assert recorder.batches[0][0] == saved.epoch
    first_batch = recorder.batches[0][1]
    execution = trainer_options.get("steps_per_execution", 1)
    assert saved.step <= first_batch < saved.step + execution
    assert_weights_close(resumed, reference)
    # The resumed epoch's logs cover the whole epoch (its metric totals were restored).
    done = len(reference_history["loss"]) - len(history["loss"])
    assert done == saved.epoch
    np.testing.assert_allclose(history["loss"], reference_history["loss"][done:], rtol=1e-5)
    np.testing.assert_allclose(history["mae"], reference_history["mae"][done:], rtol=1e-5)


def test_mixed_float16_resume_restores_the_dynamic_loss_scale(tmp_path):
    def optimizer():
        return keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.1, momentum=0.9),
                                                   initial_scale=2.0 ** 10,
                                                   dynamic_growth_steps=3)

    kwargs = dict(optimizer=optimizer, dtype="mixed_float16")
    _, reference, _ = train(common.mirrored(2), [], **kwargs)
    backup_dir = tmp_path / "backup"
    first = BackupAndResume(backup_dir, save_freq=5, verbose=0)
    with pytest.raises(Interrupted):
        train(common.mirrored(2), [first, InterruptAfterSteps(17)], **kwargs)
    saved = first.last_backup
    assert saved.global_step == 15
    scale = tf.train.load_checkpoint(saved.path).get_tensor(
        "optimizer/dynamic_scale/.ATTRIBUTES/VARIABLE_VALUE")
    assert scale == 2.0 ** 15  # grown 5 times (every 3 steps), not the initial 2 ** 10

    second, recorder = BackupAndResume(backup_dir, verbose=0), BatchAndLossScaleRecorder()
    (model, trainer), resumed, _ = train(common.mirrored(2), [second, recorder], **kwargs)
    assert isinstance(trainer.optimizer, keras.optimizers.LossScaleOptimizer)
    assert model.layers[0].compute_dtype == "float16"
    assert recorder.scale_at_begin == 2.0 ** 15
    assert (second.restored.epoch, second.restored.step) == (1, 6)
    assert_weights_close(resumed, reference)


def dropout_trainer(strategy):
    """A regression MLP with a seeded `Dropout` between its layers (Keras's own layer)."""
    with strategy.scope():
        model = keras.Sequential([
            keras.Input((common.FEATURES,)),
            keras.layers.Dense(8, activation="tanh"),
            keras.layers.Dropout(0.3, seed=4),
            keras.layers.Dense(common.TARGETS),
        ])
        optimizer = keras.optimizers.SGD(0.1, momentum=0.9)
    common.set_deterministic_weights(model)
    return model, Trainer(model, optimizer, "mse", strategy=strategy)


@pytest.mark.parametrize("strategy_name", ["default", "mirrored"])
def test_dropout_draws_on_after_a_resume_as_in_the_uninterrupted_run(tmp_path, strategy_name):
    _, reference, _ = train(strategy_named(strategy_name), [],
                            trainer=dropout_trainer(strategy_named(strategy_name)))
    first = BackupAndResume(tmp_path, save_freq=4, verbose=0)
    strategy = strategy_named(strategy_name)
    with pytest.raises(Interrupted):
        train(strategy, [first, InterruptAfterSteps(14)], trainer=dropout_trainer(strategy))
    assert first.last_backup.global_step == 12
    reader = tf.train.load_checkpoint(first.last_backup.path)
    (saved_seed,) = [k for k in reader.get_variable_to_shape_map() if k.startswith("random_seeds")]
    assert list(reader.get_tensor(saved_seed)) == [4, 12]  # (seed, draws): one draw per step

    second = BackupAndResume(tmp_path, verbose=0)
    strategy = strategy_named(strategy_name)
    _, resumed, _ = train(strategy, [second], trainer=dropout_trainer(strategy))
    assert second.restored.global_step == 12
    assert_weights_close(resumed, reference, tolerance=1e-6)


def test_a_backup_without_the_random_seeds_resumes_and_says_the_draws_differ(tmp_path,
                                                                             monkeypatch):
    import tfdist.callbacks.backup.callback as callback_module

    strategy = tf.distribute.get_strategy()
    _, reference, _ = train(strategy, [], trainer=dropout_trainer(strategy))
    # As a backup written before tfdist saved the seed generators.
    monkeypatch.setattr(callback_module, "random_seed_states", lambda model: [])
    with pytest.raises(Interrupted):
        train(strategy, [BackupAndResume(tmp_path, save_freq=4, verbose=0),
                         InterruptAfterSteps(14)], trainer=dropout_trainer(strategy))
    monkeypatch.undo()
    with pytest.warns(ResumeWarning, match=r"the model's 1 random seed generator\(s\) .*were "
                                           r"not restored from .*ckpt-"):
        _, resumed, _ = train(strategy, [BackupAndResume(tmp_path, verbose=0)],
                              trainer=dropout_trainer(strategy))
    differences = [np.abs(a - b).max() for a, b in zip(resumed, reference, strict=True)]
    assert max(differences) > 1e-4  # the first steps' masks drawn again


# ---------------------------------------------------------- keras Model.fit
def keras_fit(callbacks, strategy=None):
    strategy = strategy or tf.distribute.get_strategy()
    model = common.dense_model(strategy)
    with strategy.scope():
        model.compile(keras.optimizers.SGD(0.1, momentum=0.9), "mse")
    x, y = common.regression_arrays(n=EXAMPLES)
    history = model.fit(x, y, batch_size=BATCH, epochs=EPOCHS, shuffle=False, verbose=0,
                        callbacks=callbacks)
    return common.weights_of(model), history.history


def test_keras_fit_resumes_at_the_epoch_start_and_warns_that_the_partial_epoch_is_redone(
        tmp_path):
    reference, reference_history = keras_fit([])
    backup_dir = tmp_path / "backup"
    with pytest.raises(Interrupted):
        keras_fit([BackupAndResume(backup_dir, save_freq=3, max_to_keep=5, verbose=0),
                   InterruptAfterSteps(16)])
    assert latest_backup(backup_dir).step == 6  # mid-epoch 1 (global step 15)
    backup = BackupAndResume(backup_dir, save_freq=3, verbose=0)
    with pytest.warns(ResumeWarning, match="partial epoch .* is redone"):
        weights, history = keras_fit([backup])
    # The backup at the start of epoch 1 is still kept: nothing is trained twice.
    assert (backup.restored.epoch, backup.restored.step) == (1, 0)
    assert backup.exact is True
    assert len(history["loss"]) == 2
    assert_weights_close(weights, reference)
    np.testing.assert_allclose(history["loss"], reference_history["loss"][1:], rtol=1e-5)


def test_keras_fit_without_the_epoch_start_backup_redoes_batches_and_says_so(tmp_path):
    reference, _ = keras_fit([])
    backup_dir = tmp_path / "backup"
    with pytest.raises(Interrupted):
        keras_fit([BackupAndResume(backup_dir, save_freq=3, max_to_keep=1, verbose=0),
                   InterruptAfterSteps(16)])
    backup = BackupAndResume(backup_dir, verbose=0)
    with pytest.warns(ResumeWarning, match="first 6 batches are trained a second time"):
        weights, history = keras_fit([backup])
    assert (backup.restored.epoch, backup.restored.step) == (1, 6)
    assert backup.exact is False
    assert len(history["loss"]) == 2
    # Six batches trained twice: the result differs from the uninterrupted run.
    assert max(float(np.max(np.abs(a - b))) for a, b in zip(weights, reference, strict=True)) > 1e-3


def test_keras_fit_under_mirrored_resumes(tmp_path):
    backup_dir = tmp_path / "backup"
    keras_fit([BackupAndResume(backup_dir, verbose=0)], strategy=common.mirrored(2))
    assert latest_backup(backup_dir).epoch == EPOCHS
    backup = BackupAndResume(backup_dir, verbose=0)
    weights, history = keras_fit([backup], strategy=common.mirrored(2))
    assert backup.restored.epoch == EPOCHS and history.get("loss", []) == []


def test_after_a_failed_keras_fit_on_fit_error_gives_later_fits_their_first_epoch_back(
        tmp_path):
    """Resuming under keras fit starts it at the backup's epoch (the model's
    `_initial_epoch`); when that fit raises, Keras calls no callback, and the
    user's `on_fit_error` call takes the start back: a later fit of the same
    model without the callback runs every epoch."""
    model = common.dense_model(tf.distribute.get_strategy())
    model.compile(keras.optimizers.SGD(0.1), "mse")
    x, y = common.regression_arrays(n=EXAMPLES)

    def fit(callbacks):
        return model.fit(x, y, batch_size=BATCH, epochs=EPOCHS, shuffle=False, verbose=0,
                         callbacks=callbacks).epoch

    backup_dir = tmp_path / "backup"
    with pytest.raises(Interrupted):
        fit([BackupAndResume(backup_dir, verbose=0), InterruptAtEpochStart(1)])
    backup = BackupAndResume(backup_dir, verbose=0)
    with pytest.raises(Interrupted):
        try:
            fit([backup, InterruptAtEpochStart(2)])
        except Interrupted as error:
            backup.on_fit_error(error)
            raise
    assert backup.restored.epoch == 1
    assert fit([]) == list(range(EPOCHS))


# ------------------------------------------------------- files on disk
def test_keeps_the_last_k_backups_across_restarts(tmp_path):
    backup_dir = tmp_path / "backup"
    callback = BackupAndResume(backup_dir, save_freq=2, max_to_keep=3, verbose=0)
    with pytest.raises(Interrupted):
        train(tf.distribute.get_strategy(), [callback, InterruptAfterSteps(11)])
    # Steps 2, 4, 6, 8, epoch end (9), 10: six backups written, three kept.
    assert callback.backups_written == 6
    names = [os.path.basename(p) for p in list_backups(backup_dir)]
    assert names == ["ckpt-4", "ckpt-5", "ckpt-6"]
    on_disk = sorted(os.listdir(backup_dir))
    assert on_disk == ["checkpoint"] + sorted(
        f"{n}.{suffix}" for n in names for suffix in ("data-00000-of-00001", "index"))
    callback = BackupAndResume(backup_dir, save_freq=2, max_to_keep=3, verbose=0)
    train(tf.distribute.get_strategy(), [callback])
    names = [os.path.basename(p) for p in list_backups(backup_dir)]
    numbers = [int(n.split("-")[1]) for n in names]
    assert len(names) == 3 and numbers == sorted(numbers) and numbers[0] > 6
    assert len([n for n in os.listdir(backup_dir) if n.endswith(".index")]) == 3
    assert read_backup(list_backups(backup_dir)[-1]).epoch == EPOCHS


def test_a_backup_killed_mid_write_leaves_the_previous_one_loadable(tmp_path):
    backup_dir = tmp_path / "backup"
    script = os.path.join(WORKERS_DIR, "backup_interrupted_write.py")
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")

    def run(*extra):
        return subprocess.run([sys.executable, script, "--backup", str(backup_dir), *extra],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, timeout=150)

    killed = run("--kill-during-backup", "2")
    assert killed.returncode == -signal.SIGKILL, killed.stdout[-3000:]
    # The kill came while backup 2 was being written: its temporary folder is there...
    assert (backup_dir / "ckpt-2_temp").is_dir()
    # ...but the index still names backup 1 only, which loads completely.
    assert [os.path.basename(p) for p in list_backups(backup_dir)] == ["ckpt-1"]
    info = latest_backup(backup_dir)
    assert (info.number, info.epoch, info.step, info.iterations) == (1, 0, 1, 1)
    assert all_finite(info.path)

    resumed = run()
    assert resumed.returncode == 0, resumed.stdout[-3000:]
    assert "resumed at epoch 0 step 1" in resumed.stdout
    assert not (backup_dir / "ckpt-2_temp").exists()  # the debris was removed
    assert [os.path.basename(p) for p in list_backups(backup_dir)] == ["ckpt-2", "ckpt-3"]
    # Same result as an uninterrupted run.
    model, trainer = big.build()
    trainer.fit(big.data(), epochs=1, steps_per_epoch=big.STEPS, verbose=0)
    np.testing.assert_allclose(np.load(tmp_path / "final_bias.npy"),
                               model.layers[0].bias.numpy(), rtol=1e-5, atol=1e-6)


def test_clean_uncommitted_removes_only_the_debris_of_interrupted_writes(tmp_path):
    backup_dir = tmp_path / "backup"
    variable = tf.Variable([1.0, 2.0])
    writer = BackupWriter(tf.train.Checkpoint(v=variable), backup_dir, 2, is_chief=True)
    writer.write(1)
    (backup_dir / "ckpt-2_temp").mkdir()
    (backup_dir / "ckpt-2.index").write_text("partial")
    (backup_dir / "ckpt-2.data-00000-of-00001.tempstate123").write_text("partial")
    (backup_dir / "checkpoint.tmp0123456789abcdef0123456789abcdef").write_text("partial")
    (backup_dir / "notes.txt").write_text("not a backup file")
    other = BackupWriter(tf.train.Checkpoint(v=variable), backup_dir, 2, is_chief=False)
    assert other.clean_uncommitted() == []  # only the chief touches the folder
    assert writer.clean_uncommitted() == [
        "checkpoint.tmp0123456789abcdef0123456789abcdef",
        "ckpt-2.data-00000-of-00001.tempstate123", "ckpt-2.index", "ckpt-2_temp"]
    assert sorted(os.listdir(backup_dir)) == [
        "checkpoint", "ckpt-1.data-00000-of-00001", "ckpt-1.index", "notes.txt"]
    # A non-chief writer leaves nothing behind, anywhere in backup_dir.
    assert other.write(2) is None
    assert sorted(os.listdir(backup_dir)) == [
        "checkpoint", "ckpt-1.data-00000-of-00001", "ckpt-1.index", "notes.txt"]


# ------------------------------------------------------------ NaN / Inf
class PoisonAt(GlobalStepCounter):
    """Sets the first kernel to NaN just before global batch `step` runs."""

    def __init__(self, step):
        super().__init__()
        self.step = step

    def on_train_batch_begin(self, batch, logs=None):
        if self.global_step(batch) == self.step:
            kernel = self.model.layers[0].kernel
            kernel.assign(np.full(kernel.shape, np.nan, "float32"))


def test_nan_guard_stops_before_a_nan_backup_and_the_last_good_one_resumes(tmp_path):
    backup_dir = tmp_path / "backup"
    backup = BackupAndResume(backup_dir, save_freq=2, delete_checkpoint=True, verbose=0)
    with pytest.raises(NonFiniteLossError):
        train(tf.distribute.get_strategy(), [PoisonAt(12), NanGuard(), backup])
    info = latest_backup(backup_dir)
    assert info.global_step == 10
    assert all_finite(info.path)
    resumed = BackupAndResume(backup_dir, verbose=0)
    _, weights, _ = train(tf.distribute.get_strategy(), [NanGuard(), resumed])
    assert resumed.restored.global_step == 10
    assert all(np.all(np.isfinite(w)) for w in weights)


def test_a_graceful_stop_on_nan_writes_no_nan_backup_and_deletes_nothing(tmp_path):
    backup_dir = tmp_path / "backup"
    backup = BackupAndResume(backup_dir, save_freq=2, delete_checkpoint=True, verbose=0)
    with pytest.warns(ResumeWarning, match="not finite"):
        train(tf.distribute.get_strategy(),
              [PoisonAt(12), keras.callbacks.TerminateOnNaN(), backup])
    # TerminateOnNaN stops gracefully: the epoch end and on_train_end still run.
    assert backup_dir.is_dir()
    assert latest_backup(backup_dir).global_step == 10


def test_delete_checkpoint_removes_the_folder_after_a_normal_end(tmp_path):
    backup_dir = tmp_path / "backup"
    train(tf.distribute.get_strategy(), [BackupAndResume(backup_dir, delete_checkpoint=True,
                                                         verbose=0)])
    assert not backup_dir.exists()


# ------------------------------------------------------------ errors
@pytest.mark.parametrize("kwargs,match", [
    (dict(backup_dir=""), "backup_dir must be a non-empty path"),
    (dict(backup_dir="b", save_freq=0), "save_freq must be an integer >= 1.*got 0"),
    (dict(backup_dir="b", save_freq="batch"), "or 'epoch', got 'batch'"),
    (dict(backup_dir="b", max_to_keep=0), "max_to_keep must be an integer >= 1, got 0"),
    (dict(backup_dir="b", verbose=3), "verbose must be 0, 1 or 2, got 3"),
    (dict(backup_dir="b", delete_checkpoint="yes"), "delete_checkpoint must be True or False"),
])
def test_bad_arguments_are_refused_naming_the_value(kwargs, match):
    with pytest.raises(ValueError, match=match):
        BackupAndResume(**kwargs)


def test_a_backup_of_another_model_is_refused_clearly(tmp_path):
    backup_dir = tmp_path / "backup"
    train(tf.distribute.get_strategy(), [BackupAndResume(backup_dir, verbose=0)])
    strategy = tf.distribute.get_strategy()
    model = keras.Sequential([keras.Input((common.FEATURES,)), keras.layers.Dense(5),
                              keras.layers.Dense(common.TARGETS)])
    trainer = Trainer(model, keras.optimizers.SGD(0.1, momentum=0.9), "mse", strategy=strategy)
    data = common.dataset(common.regression_arrays(n=EXAMPLES), BATCH)
    with pytest.raises(ValueError, match="does not match this model and optimizer"):
        trainer.fit(data, epochs=EPOCHS, callbacks=[BackupAndResume(backup_dir)], verbose=0)


def test_unreadable_newest_backup_falls_back_to_the_previous_one(tmp_path):
    backup_dir = tmp_path / "backup"
    with pytest.raises(Interrupted):
        train(tf.distribute.get_strategy(),
              [BackupAndResume(backup_dir, save_freq=3, verbose=0), InterruptAfterSteps(7)])
    newest, previous = list_backups(backup_dir)[-1], list_backups(backup_dir)[-2]
    data_file = newest + ".data-00000-of-00001"
    with open(data_file, "r+b") as f:  # a disk error in the newest backup's data
        f.truncate(os.path.getsize(data_file) // 2)
    backup = BackupAndResume(backup_dir, save_freq=3, verbose=0)
    with pytest.warns(ResumeWarning, match="skipping backup|trying an older backup"):
        train(tf.distribute.get_strategy(), [backup])
    assert backup.restored.path == previous


def test_fit_position_resume_at_checks_its_arguments():
    position = FitPosition(steps_per_epoch=5)
    with pytest.raises(ValueError, match="step=6 is beyond steps_per_epoch=5"):
        position.resume_at(0, 6, 6)
    with pytest.raises(ValueError, match="iterator_batches=2 is less than step=3"):
        position.resume_at(0, 3, 2)
    with pytest.raises(ValueError, match="epoch must be an integer >= 0, got -1"):
        position.resume_at(-1, 0, 0)
    with pytest.raises(ValueError, match="without steps_per_epoch"):
        FitPosition(steps_per_epoch=None).resume_at(1, 2, 7)
    with pytest.raises(ValueError, match="iterator_index must be an integer >= 0, got -1"):
        position.resume_at(0, 0, 0, -1)
    position.resume_at(2, 3, 13, 1)
    assert position.requested == (2, 3, 13, 1)


def test_fit_position_says_when_it_replays_the_consumed_batches():
    position = FitPosition(steps_per_epoch=500)
    assert position.data_position_note() == ""  # nothing requested
    position.resume_at(0, 402, 402)
    assert position.data_position_note() == replay_note(402) == (
        "; replaying the 402 batches already consumed from the input pipeline to reach the "
        "data position (a dataset that can only be replayed)")
    assert "replaying the 1 batch already consumed" in replay_note(1)
    assert replay_note(0) == ""
    at_epoch_start = FitPosition(steps_per_epoch=None)
    at_epoch_start.resume_at(2, 0, 0, 2)
    assert at_epoch_start.data_position_note() == ""
    no_replay = FitPosition(steps_per_epoch=500, replays_consumed_batches=False)
    no_replay.resume_at(0, 402, 402)  # the parameter-server loop's workers start anew
    assert no_replay.data_position_note() == ""
    built_there = FitPosition(steps_per_epoch=500, replays_consumed_batches=False,
                              starts_input_at_position=True)
    built_there.resume_at(0, 402, 402)
    assert built_there.data_position_note() == position_note(402) == (
        "; the input pipeline starts at batch 403 without replaying the 402 batches before it")
    assert position_note(0) == ""


def test_the_resume_line_names_the_batches_the_trainer_replays(tmp_path, capsys):
    backup_dir = tmp_path / "backup"
    first = BackupAndResume(backup_dir, save_freq=3, verbose=0)
    with pytest.raises(Interrupted):
        train(tf.distribute.get_strategy(), [first, InterruptAfterSteps(8)], repeat=True,
              steps_per_epoch=5)
    saved = first.last_backup  # epoch 1 step 1, after 6 batches of the one (continued) iterator
    assert (saved.epoch, saved.step, saved.iterator_batches) == (1, 1, 6)
    capsys.readouterr()
    train(tf.distribute.get_strategy(), [BackupAndResume(backup_dir, verbose=1)], repeat=True,
          steps_per_epoch=5)
    lines = [line for line in capsys.readouterr().out.splitlines() if "resuming from" in line]
    assert lines == [
        f"BackupAndResume: resuming from {saved.path} at epoch 1 step 1 (global step 6, "
        "optimizer iteration 6); replaying the 6 batches already consumed from the input "
        "pipeline to reach the data position (a dataset that can only be replayed)"]


class RegressionRows(Source):
    """The regression examples in memory, as a tfdist.data source."""

    def read_all(self):
        return tf.data.Dataset.from_tensor_slices(common.regression_arrays(n=EXAMPLES))


@pytest.mark.parametrize("strategy_name", ["default", "mirrored"])
def test_a_tfdist_pipeline_starts_at_the_data_position_and_the_resume_is_exact(
        tmp_path, capsys, strategy_name):
    """A `make_dataset_fn` input is built at the backup's data position (here 26
    examples into the second pass over the 70) instead of replayed, and the run ends
    with the uninterrupted run's weights, to the bit."""
    pipeline = make_dataset_fn(RegressionRows(), BATCH, seed=3)
    assert pipeline.can_position

    def fit(callbacks):
        model, trainer = make_trainer(strategy_named(strategy_name))
        trainer.fit(pipeline, epochs=EPOCHS, steps_per_epoch=5, callbacks=callbacks, verbose=0)
        return common.weights_of(model)

    uninterrupted = fit([])
    backup_dir = tmp_path / "backup"
    first = BackupAndResume(backup_dir, save_freq=3, verbose=0)
    with pytest.raises(Interrupted):
        fit([first, InterruptAfterSteps(13)])
    saved = first.last_backup
    assert (saved.epoch, saved.step, saved.iterator_batches) == (2, 2, 12)  # 96 examples: pass 2
    capsys.readouterr()
    resumed = fit([BackupAndResume(backup_dir, verbose=1)])
    lines = [line for line in capsys.readouterr().out.splitlines() if "resuming from" in line]
    assert len(lines) == 1 and lines[0].endswith(
        "; the input pipeline starts at batch 13 without replaying the 12 batches before it")
    for a, b in zip(resumed, uninterrupted, strict=True):
        np.testing.assert_array_equal(a, b)


def test_the_resume_line_at_an_epoch_start_with_nothing_to_replay_says_nothing_more(
        tmp_path, capsys):
    backup_dir = tmp_path / "backup"
    first = BackupAndResume(backup_dir, verbose=0)
    with pytest.raises(Interrupted):
        train(tf.distribute.get_strategy(), [first, InterruptAtEpochStart(1)])
    saved = first.last_backup  # the end of epoch 0: a new pass over the data follows
    capsys.readouterr()
    train(tf.distribute.get_strategy(), [BackupAndResume(backup_dir, verbose=1)])
    lines = [line for line in capsys.readouterr().out.splitlines() if "resuming from" in line]
    assert lines == [f"BackupAndResume: resuming from {saved.path} at epoch 1 step 0 "
                     "(global step 9, optimizer iteration 9)"]


def test_trainer_publishes_its_position_only_during_fit():
    seen = []

    class Look(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            seen.append(getattr(self.model, FIT_POSITION_ATTRIBUTE).resume_point())

    (model, _), _, _ = train(tf.distribute.get_strategy(), [Look()], repeat=True,
                             steps_per_epoch=4)
    assert getattr(model, FIT_POSITION_ATTRIBUTE) is None
    assert seen[:5] == [(0, 1, 1, 0), (0, 2, 2, 0), (0, 3, 3, 0), (0, 4, 4, 0), (1, 1, 5, 0)]
    assert seen[-1] == (EPOCHS - 1, 4, 4 * EPOCHS, 0)  # one iterator, continued


def test_the_next_epoch_uses_a_new_iterator_without_steps_per_epoch():
    seen = []

    class Look(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            seen.append(getattr(self.model, FIT_POSITION_ATTRIBUTE).resume_point())

    train(tf.distribute.get_strategy(), [Look()])
    assert seen == [(1, 0, 0, 1), (2, 0, 0, 2), (3, 0, 0, 3)]


def test_resuming_with_fewer_steps_per_epoch_is_a_clear_error(tmp_path):
    backup_dir = tmp_path / "backup"
    with pytest.raises(Interrupted):
        train(tf.distribute.get_strategy(),
              [BackupAndResume(backup_dir, save_freq=4, verbose=0), InterruptAfterSteps(5)],
              repeat=True, steps_per_epoch=6)
    with pytest.raises(ValueError, match=r"cannot resume from .*ckpt-1 \(epoch 0, step 4.*"
                                         r"step=4 is beyond steps_per_epoch=3"):
        train(tf.distribute.get_strategy(), [BackupAndResume(backup_dir, verbose=0)],
              repeat=True, steps_per_epoch=3)


def test_resuming_with_less_data_than_consumed_is_a_clear_error(tmp_path):
    backup_dir = tmp_path / "backup"
    with pytest.raises(Interrupted):
        train(tf.distribute.get_strategy(),
              [BackupAndResume(backup_dir, save_freq=4, verbose=0), InterruptAfterSteps(7)])
    model, trainer = make_trainer(tf.distribute.get_strategy())
    short = common.dataset(common.regression_arrays(n=2 * BATCH), BATCH)
    with pytest.raises(ValueError, match="skip the 4 batches .* ran out after 2"):
        trainer.fit(short, epochs=EPOCHS, callbacks=[BackupAndResume(backup_dir, verbose=0)],
                    verbose=0)


# ------------------------------------------------------- two worker processes
WORKER = os.path.join(WORKERS_DIR, "backup_worker.py")
KILL_AT = 12  # epoch 1, step 2 (10 batches per epoch, backups every 4 steps)


@pytest.fixture(scope="module")
def uninterrupted():
    # The worker processes never set TensorFlow's global seed, which decides
    # the seeded shuffle's order together with its op seed; an earlier test
    # in this process may have set it (keras.utils.set_random_seed).
    tf.random.set_seed(None)
    model, trainer = backup_worker.make_trainer(tf.distribute.get_strategy())
    history = trainer.fit(backup_worker.data(), epochs=backup_worker.EPOCHS, verbose=0)
    return common.weights_of(model), history.history


@pytest.mark.multiworker
def test_two_workers_killed_after_a_backup_resume_at_that_exact_step(tmp_path, uninterrupted):
    backup_dir = tmp_path / "backup"
    command = [WORKER, "--out", str(tmp_path), "--backup", str(backup_dir),
               "--kill-at-step", str(KILL_AT), "--kill-rank", "1"]
    killed = launch(command, workers=2, timeout=200)
    assert killed.returncode == 128 + signal.SIGKILL, killed.stdout[-5000:]
    assert "[worker 1] killing myself after the backup at global step 12" in killed.stdout
    assert "done" not in killed.stdout
    info = latest_backup(backup_dir)
    assert (info.epoch, info.step, info.global_step, info.iterations) == (1, 2, KILL_AT,
                                                                         KILL_AT)

    resumed = launch(command, workers=2, timeout=200)  # the same command again
    assert resumed.returncode == 0, resumed.stdout[-5000:]
    assert "[worker 0] BackupAndResume: resuming from" in resumed.stdout
    assert "at epoch 1 step 2 (global step 12" in resumed.stdout
    reference, reference_history = uninterrupted
    for rank in (0, 1):
        result = common.load_json(tmp_path / f"rank{rank}.json")
        assert result["restored"]["global_step"] == KILL_AT
        assert (result["restored"]["epoch"], result["restored"]["step"]) == (1, 2)
        assert result["batches"][0] == [1, 2]  # the first batch run is the one after step 12
        assert len(result["batches"]) == backup_worker.EPOCHS * 10 - KILL_AT
        assert_weights_close(common.load_weights(tmp_path / f"rank{rank}.npz"), reference)
        np.testing.assert_allclose(result["history"]["loss"], reference_history["loss"][1:],
                                   rtol=1e-5)
    # Keep-last-K over both runs, and only committed backups in the folder.
    names = [os.path.basename(p) for p in list_backups(backup_dir)]
    assert names == ["ckpt-8", "ckpt-9", "ckpt-10"]
    assert sorted(os.listdir(backup_dir)) == ["checkpoint"] + sorted(
        f"{n}.{s}" for n in names for s in ("data-00000-of-00001", "index"))


@pytest.mark.multiworker
def test_only_the_chief_writes_and_workers_that_see_different_backups_refuse(tmp_path):
    # A backup folder per rank, as if each machine used its local disk.
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    run = launch([WORKER, "--out", str(tmp_path), "--backup", str(tmp_path / "backup{rank}"),
                  "--second-fit"], workers=2, timeout=200, env={"TMPDIR": str(temporary)})
    assert run.returncode == 0, run.stdout[-5000:]
    assert "worker 0 done" in run.stdout and "worker 1 done" in run.stdout
    assert not (tmp_path / "backup1").exists()  # the non-chief wrote nothing there
    assert len(list_backups(tmp_path / "backup0")) == backup_worker.MAX_TO_KEEP
    # Its temporary copies are gone too (TensorFlow's autograph leaves the
    # bytecode of the modules it generates there, unless PYTHONDONTWRITEBYTECODE).
    assert [name for name in os.listdir(temporary) if name != "__pycache__"] == []
    for rank in (0, 1):
        result = common.load_json(tmp_path / f"rank{rank}.json")
        assert result["backups_written"] == 10
        # Restarting: the chief finds a backup, the other worker none: both refuse.
        assert "the workers disagree on the restored backup" in result["second_fit"]
        assert "shared file system" in result["second_fit"]
