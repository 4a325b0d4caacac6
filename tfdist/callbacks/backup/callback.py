"""`BackupAndResume`: step-level backups that survive a lost worker, resumed at the exact step."""

import os
import warnings

import keras
import numpy as np
import tensorflow as tf

from tfdist.callbacks.backup.good import GoodBackups
from tfdist.callbacks.backup.errors import summarize_error
from tfdist.callbacks.backup.index import survey_backups
from tfdist.callbacks.backup.random_state import random_seed_states
from tfdist.callbacks.backup.store import BackupInfo, read_backup
from tfdist.callbacks.backup.writer import BackupWriter
from tfdist.callbacks.chief import model_strategy, task_info
from tfdist.runtime.argtypes import check_bool, check_callable
from tfdist.callbacks.loss_health import loss_health
from tfdist.distribute.collectives import agree
from tfdist.distribute.introspection import describe_strategy
from tfdist.seam import set_model_initial_epoch

# The attribute tfdist's Trainer publishes its FitPosition under during fit
# (tfdist.training.resume.FIT_POSITION_ATTRIBUTE; duck-typed so that this
# callback does not depend on the trainer).
_FIT_POSITION_ATTRIBUTE = "_tfdist_fit_position"


class ResumeWarning(UserWarning):
    """Training resumes, but not exactly as the backup would allow (or a
    backup is skipped): e.g. plain `keras.Model.fit` redoes a partial epoch.

    Example:

    >>> with warnings.catch_warnings():
    ...     warnings.simplefilter("error", ResumeWarning)  # make it fatal
    ...     model.fit(dataset, epochs=5, callbacks=[BackupAndResume("backup")])
    """


class BackupAndResume(keras.callbacks.Callback):
    """Backs up the training state every N steps and resumes at that exact step.

    Like `keras.callbacks.BackupAndRestore`, for jobs that lose a worker:
    restart the same command after a crash (or a preemption, or a SIGKILL)
    and training continues from the last backup. Differences:

    * **Step-level, exact resume.** Backups are taken every `save_freq`
      training batches and at every epoch end, and hold the model, the
      optimizer (its slots, `iterations`, the learning rate and a
      `LossScaleOptimizer`'s dynamic scale), the epoch, the step in the
      epoch, the global step, the data position (which data iterator, and
      the batches drawn from it), the epoch's metric totals and the model's
      seed generators (each `Dropout`'s: `random_seed_states`). With
      tfdist's `Trainer` the restarted `fit` starts at that epoch *and
      step*: it re-creates the earlier epochs' iterators (so a seeded
      `shuffle` that reshuffles every epoch is at the same order) and draws
      and discards the batches already consumed, which reproduces the data
      position of a deterministic input pipeline; an interrupted and resumed
      run then ends with the same weights and logs as an uninterrupted one.
      (TF 2.21's distributed iterators cannot be checkpointed:
      `tf.train.Checkpoint` refuses `DistributedIterator`, so the position
      is replayed, at the cost of reading the skipped batches.)
    * **Multi-worker.** Only the chief writes into `backup_dir`; every other
      worker takes part in each save (TensorFlow requires it) writing into a
      temporary folder of its own, deleted right after, so nothing of theirs
      lands in `backup_dir`. After each save the workers wait for each other,
      so once any worker has passed a backup point the backup is committed.
      Every worker restores from `backup_dir`, which must therefore be on
      storage all workers see (a shared file system or a bucket); at start
      the workers check that they restored the same backup and raise a
      `ValueError` otherwise.
    * **Atomic, keeps the last K.** Each backup is a `tf.train.Checkpoint`
      written as `tf.train.CheckpointManager` does: the data is written first
      and the `checkpoint` index file is replaced (write + rename) only after,
      then backups beyond `max_to_keep` are deleted; a crash mid-write leaves
      the previous backup in the index and loadable. The leftovers of an
      interrupted write are removed at the next start; nothing else is
      deleted on a guess: a damaged or missing index is rebuilt from the
      readable backups present, and a folder with backups none of which can
      be read is refused (`BackupIndexError`). An unreadable newest backup
      makes the callback fall back to the previous one (saying why). A write
      that fails, e.g. on a full disk, removes its partial files and raises
      `BackupWriteError`; the earlier backups are kept.
    * **Keeps the last good one.** With a `tfdist.callbacks.DivergenceGuard`
      in the callbacks (before this one), its loss record is saved in every
      backup and restored with it; a backup is *good* once the guard judged
      the loss of its weights healthy at a later check, and the newest good
      backup (at start: the one training resumed from) is never deleted by
      the rotation, so `max_to_keep` + 1 backups may be on disk. When a guard
      stops training (`DivergenceGuard` or `NanGuard`) the backups this run
      wrote after the good one are deleted as suspect: rerunning resumes from
      the good one, the newest left.
    * **Kept after failures.** A backup is never written when the logged loss
      is NaN or Inf (e.g. the epoch end that follows
      `keras.callbacks.TerminateOnNaN`), and the folder is only deleted
      (`delete_checkpoint=True`) when training ended normally with a finite
      loss. With `tfdist.callbacks.NanGuard` placed before this callback,
      the last good backup is what the next run resumes from.

    With plain `keras.Model.fit` the callback restores the same state, but
    Keras always starts an epoch at its first batch: training resumes at the
    right epoch, and when the newest backup is mid-epoch the partial epoch
    is redone. The callback then restores the backup taken at the start of
    that epoch when it is still kept (so nothing is trained twice), else the
    newest one (the batches already done are trained again); either way it
    warns with a `ResumeWarning`. Under `MultiWorkerMirroredStrategy` Keras 3's
    own `fit` does not work (keras-team/keras#20585); use the `Trainer`.

    Not restored: the state of other callbacks (`EarlyStopping`'s patience,
    `ReduceLROnPlateau`'s counters), random generators outside the model,
    and a partial gradient accumulation (with `Trainer(grad_accum_steps=K)`
    a backup due between two optimizer updates is taken at the next one).
    The model, optimizer, loss and input pipeline must be the same as in the
    run that wrote the backup.

    Attributes:
        restored: the `BackupInfo` training resumed from in the last
            `on_train_begin`, or None.
        last_backup: the `BackupInfo` of the last backup written by this
            process's run (on non-chief workers `path` is "").
        good_backup: with a `DivergenceGuard`: the prefix of the newest
            backup it confirmed healthy (or the one training resumed from),
            else None.
        discarded: the prefixes deleted as suspect when a guard stopped
            training (chief only).
        backups_written: backups written since the last `on_train_begin`.
        exact: after `on_train_begin`, True when training resumes exactly at
            the backup's step (tfdist's `Trainer`, or a backup at an epoch
            start), False when a partial epoch is redone.

    Args:
        backup_dir: folder for the backups (a str or path-like); use it for
            nothing else. Created by the chief when the first backup is
            written.
        save_freq: back up every this many training batches (an int >= 1,
            counted across epochs; with `steps_per_execution` at the first
            batch end at or after each multiple), or `"epoch"` for epoch
            ends only. A backup is always taken at every epoch end.
        max_to_keep: number of backups kept (an int >= 1; older ones are
            deleted after each new one is committed).
        delete_checkpoint: delete `backup_dir` when training ends normally
            (all epochs run or stopped by a callback, finite loss). Default
            False: the final backup makes a relaunch of a finished job a
            no-op.
        verbose: 0 silent; 1 prints (chief only) where training resumes
            (and, when `Trainer` reaches the data position by replaying
            the batches already consumed, how many it replays);
            2 also prints every backup.
        strategy: the `tf.distribute.Strategy` that decides who is chief,
            or None for the model's.
        on_discard: a function called (with no arguments) on the chief
            after a guard stopped training and the suspect backups were
            deleted, before the workers agree on it: a program settles
            there whatever it keeps about the newest backup (the recipes'
            `config.yaml`), while no worker has exited yet to get the job
            stopped. None for nothing.

    Example:

    >>> backup = BackupAndResume("gs://bucket/run1/backup", save_freq=500)
    >>> trainer = Trainer(model, optimizer, "sparse_categorical_crossentropy",
    ...                   strategy=strategy)
    >>> trainer.fit(train_ds, epochs=10, callbacks=[NanGuard(), backup])
    >>> # killed at step 2,730 and restarted: resumes at step 2,500, batch 2,500
    >>> backup.restored.global_step
    2500
    """

    def __init__(self, backup_dir, save_freq="epoch", max_to_keep=2, delete_checkpoint=False,
                 verbose=1, strategy=None, on_discard=None):
        super().__init__()
        if not isinstance(backup_dir, (str, os.PathLike)) or not os.fspath(backup_dir):
            raise ValueError(f"backup_dir must be a non-empty path, got {backup_dir!r}.")
        if save_freq != "epoch" and not _is_int(save_freq, minimum=1):
            raise ValueError(
                f"save_freq must be an integer >= 1 (training batches) or 'epoch', got "
                f"{save_freq!r}.")
        if not _is_int(max_to_keep, minimum=1):
            raise ValueError(f"max_to_keep must be an integer >= 1, got {max_to_keep!r}.")
        check_bool("delete_checkpoint", delete_checkpoint)
        check_callable("on_discard", on_discard, "a function of no arguments", allow_none=True)
        if verbose not in (0, 1, 2):
            raise ValueError(f"verbose must be 0, 1 or 2, got {verbose!r}.")
        if strategy is not None and not isinstance(strategy, tf.distribute.Strategy):
            raise ValueError(
                f"strategy must be a tf.distribute.Strategy or None, got {strategy!r}.")
        self.backup_dir = os.fspath(backup_dir)
        self.save_freq = save_freq
        self.max_to_keep = int(max_to_keep)
        self.delete_checkpoint = delete_checkpoint
        self.verbose = verbose
        self.strategy = strategy
        self.on_discard = on_discard
        self.restored = None
        self.last_backup = None
        self.good_backup = None
        self.discarded = []
        self.backups_written = 0
        self.exact = None
        self._state = None
        self._reset_run()

    def _reset_run(self):
        self._fit_position = None
        self._chief = True
        self._num_workers = 1
        self._distribution = None
        self._writer = None
        self._next_number = 1
        self._epoch = 0
        self._epoch_step = 0
        self._epoch_base = 0
        self._global_step = 0
        self._resume_epoch = None
        self._pending = False
        self._restore_metrics_from = None
        self._warned_non_finite = False
        self._last_logs = None
        self._set_initial_epoch = False
        self._health = None
        self._good = None

    # ------------------------------------------------------------ restoring
    def on_train_begin(self, logs=None):
        model = self.model
        if model is None or not model.built:
            raise ValueError(
                "BackupAndResume needs a built model when training begins (tfdist's Trainer "
                f"and Keras's fit build it from the data); got {model!r}.")
        optimizer = getattr(model, "optimizer", None)
        if optimizer is None:
            raise ValueError("BackupAndResume needs a compiled model with an optimizer "
                             "(model.compile(optimizer=...), or tfdist's Trainer).")
        self._reset_run()
        self.restored, self.last_backup, self.backups_written, self.exact = None, None, 0, True
        self.good_backup, self.discarded = None, []
        self._health = loss_health(model)  # a DivergenceGuard's record, saved in the backups
        strategy = self.strategy or model_strategy(model) or tf.distribute.get_strategy()
        self._distribution = strategy
        task_type, task_id, self._chief = task_info(strategy)
        self._num_workers = describe_strategy(strategy).num_workers
        self._fit_position = getattr(model, _FIT_POSITION_ATTRIBUTE, None)
        if not optimizer.built:
            with strategy.scope():
                optimizer.build(model.trainable_variables)
        if self._state is None:
            self._state = _Position()
        guarded = {} if self._health is None else {"loss_health": self._health.trackable()}
        checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer,
                                         metrics=list(model.metrics_variables),
                                         random_seeds=random_seed_states(model),
                                         position=self._state, **guarded)
        self._writer = BackupWriter(checkpoint, self.backup_dir, self.max_to_keep,
                                    is_chief=self._chief,
                                    worker_name=f"{task_type or 'worker'}{task_id}")
        # Read once, before anyone changes the folder: the chief repairs the
        # index and removes debris only after every worker has restored.
        survey = survey_backups(self.backup_dir)
        info = self._restore(survey.paths)
        self._agree("restored backup", [info.number if info else 0,
                                         info.global_step if info else -1])
        self._next_number = survey.next_number
        self._writer.clean_uncommitted(survey)
        if self._health is not None:
            self._start_guarded(info)
        if info is None:
            return
        self.restored = info
        self._global_step = info.global_step
        self._resume_epoch = info.epoch
        self._epoch_step = info.step
        if self._fit_position is not None:
            consumed, index = info.iterator_batches, info.iterator_index
            if consumed < 0 or index < 0:  # written by keras fit: one pass per epoch assumed
                consumed, index = info.step, info.epoch
                if info.step:
                    warnings.warn(
                        f"BackupAndResume: the backup {info.path} was written by keras "
                        "Model.fit, which does not record the data position; resuming at "
                        f"step {info.step} assumes a new pass over the data every epoch.",
                        ResumeWarning, stacklevel=2)
            if self._fit_position.steps_per_epoch is None:
                consumed = info.step
            try:
                self._fit_position.resume_at(info.epoch, info.step, consumed, index)
            except ValueError as error:
                raise ValueError(
                    f"BackupAndResume: cannot resume from {info.path} (epoch {info.epoch}, "
                    f"step {info.step}, {consumed} batches drawn from the data): {error} "
                    "Resume with the same steps_per_epoch as the run that wrote it.") from error
            if info.step:
                self._restore_metrics_from = info.path
        else:
            set_model_initial_epoch(model, info.epoch)
            self._set_initial_epoch = True
            self.exact = not info.mid_epoch
        self._print(1, f"BackupAndResume: resuming from {info.path} at epoch {info.epoch} "
                       f"step {info.step} (global step {info.global_step}, optimizer "
                       f"iteration {info.iterations})"
                    + ("" if self.exact else "; the partial epoch is redone")
                    + ("" if self._fit_position is None
                       else self._fit_position.data_position_note()))

    def _restore(self, committed):
        """Restores the model and optimizer from the best usable backup."""
        infos, reasons = [], {}
        for path in reversed(committed):
            try:
                infos.append(read_backup(path))
            except ValueError as error:
                reasons[path] = getattr(error, "reason", str(error))
                warnings.warn(f"BackupAndResume: skipping backup {path}: it could not be read "
                              f"({reasons[path]}).", ResumeWarning, stacklevel=3)
        if not infos:
            if committed:
                raise ValueError(self._none_restored(reasons))
            return None
        candidates = infos
        keras_fit = self._fit_position is None
        if keras_fit and infos[0].mid_epoch:
            start = [i for i in infos if i.epoch == infos[0].epoch and not i.mid_epoch]
            candidates = start + [i for i in infos if i not in start]
            newest = infos[0]
            if start:
                message = (
                    f"keras Model.fit cannot start mid-epoch: the newest backup "
                    f"{newest.path} is at step {newest.step} of epoch {newest.epoch}, so "
                    f"training resumes from {start[0].path} at the start of epoch "
                    f"{newest.epoch} and the partial epoch ({newest.step} steps) is redone. "
                    "tfdist's Trainer resumes at the exact step.")
            else:
                message = (
                    f"keras Model.fit cannot start mid-epoch: resuming from {newest.path} "
                    f"(step {newest.step} of epoch {newest.epoch}) at the start of epoch "
                    f"{newest.epoch}, so the partial epoch is redone and its first "
                    f"{newest.step} batches are trained a second time. Use tfdist's Trainer "
                    "to resume at the exact step (or save_freq='epoch').")
            warnings.warn("BackupAndResume: " + message, ResumeWarning, stacklevel=3)
        root = tf.train.Checkpoint(model=self.model, optimizer=self.model.optimizer)
        for info in candidates:
            try:
                status = root.read(info.path)
                status.expect_partial()  # metrics and position are read separately
                status.assert_existing_objects_matched()
            except (AssertionError, ValueError) as error:  # unmatched objects, shapes, dtypes
                raise ValueError(
                    f"BackupAndResume: the backup {info.path} does not match this model and "
                    f"optimizer ({summarize_error(error, limit=300)}). Resume with the "
                    "same model, optimizer and loss scaling as the run that wrote it, or use "
                    "a new backup_dir.") from error
            except (tf.errors.OpError, IndexError) as error:  # missing or damaged files
                reasons[info.path] = summarize_error(error)
                warnings.warn(f"BackupAndResume: backup {info.path} could not be restored "
                              f"({reasons[info.path]}); trying an older backup.",
                              ResumeWarning, stacklevel=3)
                continue
            self._restore_random_seeds(info.path)
            return info
        raise ValueError(self._none_restored(reasons))

    def _restore_random_seeds(self, path):
        """Restores the model's random seed generators (dropout's, for one) from the
        backup at `path`, so that the draws after resuming are the uninterrupted
        run's; warns when the backup holds none that match."""
        seeds = random_seed_states(self.model)
        if not seeds:
            return
        error = _read_part(path, random_seeds=seeds)
        if error is not None:
            warnings.warn(
                f"BackupAndResume: the model's {len(seeds)} random seed generator(s) (dropout's, "
                f"for one) were not restored from {path} ({summarize_error(error)}: a backup "
                "written before tfdist saved them, or by another model); their random draws "
                "from here on differ from the uninterrupted run's.", ResumeWarning, stacklevel=4)

    def _none_restored(self, reasons):
        """The one-line refusal when no backup of the folder can be restored."""
        why = "; ".join(f"{os.path.basename(path)}: {reason}" for path, reason in reasons.items())
        return (f"BackupAndResume: none of the backups in {self.backup_dir} could be restored "
                f"({why}); nothing was deleted. Restore the files, or move the folder away (or "
                "use another backup_dir) to start over.")

    def _start_guarded(self, info):
        """With a DivergenceGuard: restores its record from the backup resumed
        from, and starts tracking which backup is good."""
        if info is not None and not self._health.restore(info.path):
            warnings.warn(
                f"BackupAndResume: the backup {info.path} holds no DivergenceGuard record of "
                f"this shape (written without a guard, or with another window); the guard "
                "records its recent values again before it judges.", ResumeWarning, stacklevel=3)
            self._health.start_at(info.global_step, info.epoch,
                                  info.step if self._fit_position is not None else 0)
        self._good = GoodBackups(self._health, self.backup_dir, self.max_to_keep, restored=info)
        self.good_backup = self._good.good_path()
        self._health.add_listener(self._on_guard_stop)

    def _on_guard_stop(self):
        """A guard stops training: deletes (chief) the backups this run wrote
        after the good one; returns a note for the guard's error."""
        if self._good is None or self.model is None:
            return None
        suspects = self._good.pending()  # decided in memory: the same on every worker
        good = self._good.good_path()
        self.good_backup = good
        if good is None:
            if not suspects:  # nothing resumed from, nothing written
                return None
            return (f"BackupAndResume: no backup in {self.backup_dir} was confirmed healthy yet; "
                    "its backups are left as they are (the newest may hold diverged weights).")
        failed = None
        if self._chief:
            try:
                self.discarded = self._writer.discard(suspects)
            except (OSError, tf.errors.OpError) as error:
                failed = error
            if failed is None and self.on_discard is not None:
                self.on_discard()
        # Multi-worker: no worker exits (and gets the job stopped) before the chief
        # has deleted the suspects; every worker made the same decision.
        self._agree("backups kept after the guard stopped training",
                    [self._good.good.number, len(suspects)])
        names = ", ".join(f"ckpt-{n}" for n in suspects)
        if failed is not None:
            return (f"BackupAndResume: the last good backup is {good} (global step "
                    f"{self._good.good.global_step}), but deleting the backups taken since then "
                    f"({names}) failed ({failed}); delete them by hand so that a rerun resumes "
                    "from the good one.")
        dropped = (f"deleted the backup(s) taken since then ({names}); " if suspects else "")
        return (f"BackupAndResume: the last good backup is {good} (global step "
                f"{self._good.good.global_step}), taken before the divergence; {dropped}it is "
                "the newest backup, so rerunning resumes from it.")

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch
        resumed = self._resume_epoch is not None and epoch == self._resume_epoch
        self._epoch_base = self._global_step - (self._epoch_step if resumed else 0)
        self._epoch_step = self._epoch_step if resumed and self._fit_position is not None else 0
        self._resume_epoch = None
        if self._restore_metrics_from is not None:
            path, self._restore_metrics_from = self._restore_metrics_from, None
            error = _read_part(path, metrics=list(self.model.metrics_variables))
            if error is not None:
                warnings.warn(
                    f"BackupAndResume: the epoch's metric totals were not restored from {path} "
                    f"({summarize_error(error)}); the logs of epoch {epoch} "
                    "cover only the batches run after resuming.", ResumeWarning, stacklevel=2)

    # -------------------------------------------------------------- backing up
    def on_train_batch_end(self, batch, logs=None):
        previous = self._global_step
        self._epoch_step = batch + 1
        self._global_step = self._epoch_base + batch + 1
        if self.save_freq != "epoch" and (
                self._global_step // self.save_freq > previous // self.save_freq):
            self._pending = True
        steps = (self.params or {}).get("steps")
        last_of_epoch = steps is not None and self._epoch_step >= steps
        if self._pending and not last_of_epoch and self._at_update_boundary():
            self._backup(logs)  # at the epoch's last batch, the epoch-end backup follows

    def on_epoch_end(self, epoch, logs=None):
        self._last_logs = logs
        self._pending = True
        if self._at_update_boundary():
            self._backup(logs, epoch_end=True)

    def on_train_end(self, logs=None):
        logs = logs if logs is not None else self._last_logs
        if self._set_initial_epoch:
            set_model_initial_epoch(self.model, None)
        if (self.delete_checkpoint and self._chief and _finite_loss(logs)
                and tf.io.gfile.isdir(self.backup_dir)):
            tf.io.gfile.rmtree(self.backup_dir)
            self._print(1, f"BackupAndResume: training ended normally; deleted "
                           f"{self.backup_dir}.")

    def on_fit_error(self, error):
        """Takes back the start epoch this callback gave Keras's `fit` on
        resuming (`model._initial_epoch`, plain `model.fit` only), when `fit`
        raised `error`: otherwise a later `model.fit` of the same model
        without this callback would start at that epoch, skipping the ones
        before. The backups stay, for the rerun. tfdist's `Trainer` calls it
        (Keras calls no callback when `fit` raises); after Keras's own `fit`
        raised, call it yourself.

        Example:

        >>> try:
        ...     model.fit(x, y, epochs=4, callbacks=[backup])
        ... except Exception as error:
        ...     backup.on_fit_error(error)
        ...     raise
        """
        del error
        if self._set_initial_epoch:
            set_model_initial_epoch(self.model, None)
            self._set_initial_epoch = False

    def _at_update_boundary(self):
        return self._fit_position is None or self._fit_position.at_update_boundary()

    def at_update_boundary(self):
        """Whether training stands at an optimizer update (always so without
        gradient accumulation); a backup can be taken only there.

        Example:

        >>> backup.at_update_boundary()
        True
        """
        return self._at_update_boundary()

    def backup_now(self, logs=None):
        """Writes a backup at the current step, now (from a batch-end hook).

        For `PreemptionGuard`: every worker must call it at the same step,
        as every worker takes part in a backup. Like the scheduled backups,
        none is written while the logged loss is not finite.

        Args:
            logs: the batch's logs (their loss is checked), or None.

        Returns:
            The `BackupInfo` written, or None when none was.

        Raises:
            ValueError: called between two optimizer updates of a gradient
                accumulation (see `at_update_boundary`).

        Example:

        >>> info = backup.backup_now(logs)
        >>> info.global_step
        117
        """
        if not self._at_update_boundary():
            raise ValueError("BackupAndResume.backup_now() between two optimizer updates of a "
                             "gradient accumulation: call it where at_update_boundary() is True.")
        written = self.backups_written
        self._backup(logs)
        return self.last_backup if self.backups_written > written else None

    def _backup(self, logs, epoch_end=False):
        self._pending = False
        if not _finite_loss(logs):
            if not self._warned_non_finite:
                self._warned_non_finite = True
                warnings.warn(
                    f"BackupAndResume: the loss is not finite ({_loss_entries(logs)}); no "
                    "backup is written while it stays so, and the previous backups are kept.",
                    ResumeWarning, stacklevel=3)
            return
        if self._fit_position is not None:
            epoch, step, consumed, index = self._fit_position.resume_point()
        elif epoch_end:
            epoch, step, consumed, index = self._epoch + 1, 0, -1, -1
        else:
            epoch, step, consumed, index = self._epoch, self._epoch_step, -1, -1
        iterations = int(keras.ops.convert_to_numpy(self.model.optimizer.iterations))
        values = dict(epoch=epoch, step=step, global_step=self._global_step,
                      iterator_batches=consumed, iterator_index=index, iterations=iterations)
        self._state.set(values)
        keep = ()
        if self._good is not None:  # a DivergenceGuard watches: save its record, keep the good one
            self._health.store()
            good = self._good.update()
            keep = () if good is None else (good,)
        number = self._next_number
        path = self._writer.write(number, keep=keep)
        self._next_number += 1
        if self._good is not None:
            self._good.written(number, self._global_step)
            self.good_backup = self._good.good_path()
        self._agree("backup written", [number, self._global_step])  # a barrier too
        self.last_backup = BackupInfo(path=path or "", number=number, **values)
        self.backups_written += 1
        self._print(2, f"BackupAndResume: backup {number} at epoch {epoch} step {step} "
                       f"(global step {self._global_step}) written to {path}")

    # ---------------------------------------------------------------- helpers
    def _agree(self, what, values):
        """Multi-worker: every worker gets every worker's `values` (an
        all-gather, which is also a barrier); raises if they differ."""
        if self._num_workers <= 1:
            return
        agree(self._distribution, values, lambda table: (
            f"BackupAndResume: the workers disagree on the {what}: (number, global step) "
            f"per replica {sorted({tuple(int(v) for v in row) for row in table})}. Every "
            f"worker must see the same backup_dir ({self.backup_dir!r}): put it on a shared "
            "file system or a bucket, not on each machine's local disk."))

    def _print(self, level, message):
        if self.verbose >= level and self._chief:
            print(message, flush=True)

    def get_config(self):
        return {"backup_dir": self.backup_dir, "save_freq": self.save_freq,
                "max_to_keep": self.max_to_keep, "delete_checkpoint": self.delete_checkpoint,
                "verbose": self.verbose}


class _Position(tf.Module):
    """The training position, saved in every backup as `position/<name>`."""

    def __init__(self):
        super().__init__(name="backup_position")
        with tf.init_scope():
            self.epoch = tf.Variable(0, dtype=tf.int64, trainable=False, name="epoch")
            self.step = tf.Variable(0, dtype=tf.int64, trainable=False, name="step")
            self.global_step = tf.Variable(0, dtype=tf.int64, trainable=False, name="global_step")
            self.iterator_batches = tf.Variable(-1, dtype=tf.int64, trainable=False,
                                                name="iterator_batches")
            self.iterator_index = tf.Variable(-1, dtype=tf.int64, trainable=False,
                                              name="iterator_index")
            self.iterations = tf.Variable(0, dtype=tf.int64, trainable=False, name="iterations")

    def set(self, values):
        for name, value in values.items():
            getattr(self, name).assign(value)


def _read_part(path, **parts):
    """Restores `parts` (name -> variables, as saved beside the model) from the backup
    at `path`; returns None, or the error that says why they were not all restored
    (the backup lacks them, or their shapes differ).

    Example:

    >>> _read_part("backup/ckpt-3", metrics=list(model.metrics_variables)) is None
    True
    """
    try:
        status = tf.train.Checkpoint(**parts).read(path)
        status.expect_partial()
        status.assert_existing_objects_matched()
    except (AssertionError, tf.errors.OpError, ValueError) as error:
        return error
    return None


def _is_int(value, minimum):
    return (not isinstance(value, bool) and isinstance(value, (int, np.integer))
            and value >= minimum)


def _loss_entries(logs):
    return {k: v for k, v in (logs or {}).items() if "loss" in k}


def _finite_loss(logs):
    for value in _loss_entries(logs).values():
        try:
            if not np.all(np.isfinite(np.asarray(value, dtype=np.float64))):
                return False
        except (TypeError, ValueError):
            continue
    return True
