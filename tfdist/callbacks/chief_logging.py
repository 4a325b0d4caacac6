"""Make logging and checkpoint callbacks write once per multi-worker job."""

import importlib.util
import logging
import os
import shutil
import tempfile
import weakref

import keras
import tensorflow as tf

from tfdist.callbacks.chief import model_strategy, task_info
from tfdist.seam import callback_model

logger = logging.getLogger(__name__)

_HOOKS = (
    "on_batch_begin", "on_batch_end", "on_epoch_begin", "on_epoch_end",
    "on_train_batch_begin", "on_train_batch_end", "on_test_batch_begin", "on_test_batch_end",
    "on_predict_batch_begin", "on_predict_batch_end", "on_test_begin", "on_predict_begin",
)
_NON_CHIEF_MODES = ("auto", "skip", "redirect")


class ChiefOnly(keras.callbacks.Callback):
    """Runs a callback on the chief only, so that its files are written once.

    Keras 3's `CSVLogger`, `TensorBoard` and `ModelCheckpoint` have no
    multi-worker logic: under `MultiWorkerMirroredStrategy` every worker
    writes the same files (and fights over them on a shared disk).
    `ChiefOnly(callback)` forwards every hook (and `set_model`) to `callback`
    on the chief (see `tfdist.callbacks.chief.is_chief`; decided when the
    model is set, from the model's strategy, or `strategy`, or `TF_CONFIG`),
    and on the other workers, depending on `non_chief`:

    * `"skip"`: nothing; the callback never runs there.
    * `"redirect"`: the callback runs too, with its output path moved to
      `fallback_dir/worker_<index>/` (kept), or to a temporary folder that
      is deleted when training ends.
    * `"auto"` (default): `"redirect"` when `fallback_dir` is given, or when
      the callback reads the model's weights (`ModelCheckpoint`;
      `TensorBoard` with `histogram_freq` or `embeddings_freq`) and the
      model has `ON_READ` variables. Reading an `ON_READ` variable
      (metric-like state a layer keeps) outside a replica is an all-reduce
      that every worker must join: when only the chief saves, the job
      fails with mismatched collectives (seen on TF 2.21 with
      `save_weights`). Plain weights (mirrored variables) are read locally,
      so otherwise `"skip"`: Keras 3.15 saving needs no other worker.

    Single-worker runs (no `TF_CONFIG`, `MirroredStrategy`, ...) are the
    chief: the callback runs unchanged. The wrapper only overrides the batch
    hooks the wrapped callback implements, so Keras's asynchronous batch-end
    dispatch stays on when it can.

    The path attribute moved for `"redirect"` is known for `ModelCheckpoint`
    (`filepath`), `CSVLogger` (`filename`) and `TensorBoard` (`log_dir`);
    name it with `path_attribute` for other callbacks. The folder of that
    path is created before the callback runs. `BackupAndRestore` is refused:
    every worker has to restore from the backup, so it must not be wrapped.

    Attributes `mode` (`"chief"`, `"skip"` or `"redirect"`, set with the
    model; back to None once a redirected run has cleaned up) and `task`
    (`(task_type, task_id)`) say what the wrapper decided in this process.

    Args:
        callback: the `keras.callbacks.Callback` to run on the chief.
        non_chief: `"auto"`, `"skip"` or `"redirect"`, see above.
        fallback_dir: folder under which each non-chief worker writes its
            own copy (`worker_<index>/`) when redirected, or None for a
            temporary folder deleted at the end of training.
        path_attribute: name of the callback's attribute holding its output
            path, for callbacks other than the three above.
        strategy: the `tf.distribute.Strategy` that decides who is chief,
            or None for the model's.

    Example:

    >>> callbacks = [ChiefOnly(keras.callbacks.CSVLogger("logs/train.csv")),
    ...              ChiefOnly(keras.callbacks.ModelCheckpoint("ckpt/best.keras"))]
    >>> trainer.fit(dataset, epochs=3, callbacks=callbacks)  # one CSV per job
    """

    def __init__(self, callback, non_chief="auto", fallback_dir=None, path_attribute=None,
                 strategy=None):
        super().__init__()
        if not isinstance(callback, keras.callbacks.Callback):
            raise TypeError(
                f"ChiefOnly wraps a keras.callbacks.Callback, got {type(callback).__name__}: "
                f"{callback!r}.")
        from tfdist.callbacks.backup import BackupAndResume

        if isinstance(callback, (keras.callbacks.BackupAndRestore, BackupAndResume)):
            raise ValueError(
                f"ChiefOnly cannot wrap {type(callback).__name__}: every worker restores the "
                "model from the backup when training starts and takes part in every save, so "
                "it has to run on every worker (it already writes on the chief only). Pass it "
                "to fit unwrapped.")
        if non_chief not in _NON_CHIEF_MODES:
            raise ValueError(f"non_chief must be one of {_NON_CHIEF_MODES}, got {non_chief!r}.")
        if path_attribute is not None and not hasattr(callback, path_attribute):
            raise ValueError(
                f"path_attribute={path_attribute!r}: {type(callback).__name__} has no such "
                "attribute.")
        if fallback_dir is not None and not (
                isinstance(fallback_dir, (str, os.PathLike)) and os.fspath(fallback_dir)):
            raise ValueError(
                f"fallback_dir must be a non-empty path or None, got {fallback_dir!r}.")
        self.callback = callback
        self.non_chief = non_chief
        self.fallback_dir = None if fallback_dir is None else os.fspath(fallback_dir)
        self.path_attribute = path_attribute or _known_path_attribute(callback)
        if self.path_attribute is None and (non_chief == "redirect" or fallback_dir is not None):
            which = "non_chief='redirect'" if non_chief == "redirect" else "fallback_dir"
            raise ValueError(
                f"{which} needs to know where {type(callback).__name__} writes: pass "
                "path_attribute='<name of its attribute holding the output path>'.")
        self.strategy = strategy
        self.async_safe = getattr(callback, "async_safe", False)
        self.mode = None  # "chief", "skip" or "redirect", decided in set_model
        self.task = None  # (task_type, task_id) of this process
        self._original_path = None
        self._temp_dir = None
        self._cleanup = None
        self._training = False
        for hook in _HOOKS:
            if not getattr(getattr(callback, hook, None), "_is_default", False):
                setattr(self, hook, self._forwarder(hook))

    @property
    def runs_here(self):
        """True when the wrapped callback runs in this process (chief or
        redirected); None before the model is set.

        Example:

        >>> wrapped = ChiefOnly(keras.callbacks.CSVLogger("log.csv"))
        >>> model.fit(x, y, callbacks=[wrapped]); wrapped.runs_here
        True
        """
        return None if self.mode is None else self.mode != "skip"

    @property
    def output_path(self):
        """Where the wrapped callback writes in this process (its path
        attribute), or None when it does not run here.

        Example:

        >>> ChiefOnly(keras.callbacks.CSVLogger("log.csv")).output_path  # before fit
        """
        if not self.runs_here or self.path_attribute is None:
            return None
        return getattr(self.callback, self.path_attribute)

    def _forwarder(self, hook):
        def forward(*args, **kwargs):
            if self._runs():
                return getattr(self.callback, hook)(*args, **kwargs)
            return None
        return forward

    def set_params(self, params):
        super().set_params(params)
        self.callback.set_params(params)

    def set_model(self, model):
        super().set_model(model)
        strategy = self.strategy if self.strategy is not None else model_strategy(model)
        task_type, task_id, chief = task_info(strategy)
        self.task = (task_type, task_id)
        if chief:
            self.mode = "chief"
        elif self.non_chief == "redirect" or (self.non_chief == "auto" and (
                self.fallback_dir is not None or self._must_run_everywhere(model))):
            self.mode = "redirect"
            self._redirect(task_type, task_id)
        else:
            self.mode = "skip"
        if self._runs():
            self._make_output_folder()
            self.callback.set_model(model)

    def on_train_begin(self, logs=None):
        self._training = True
        if self.mode is None:  # a loop that never called set_model: decide now
            self.set_model(callback_model(self))
        if self._runs():
            self.callback.on_train_begin(logs)

    def on_train_end(self, logs=None):
        self._training = False
        try:
            if self._runs():
                self.callback.on_train_end(logs)
        finally:
            self._finish()

    def on_fit_error(self, error):
        """Ends a `fit` that raised `error` as `on_train_end` would, without the
        wrapped callback's `on_train_end`: passes `on_fit_error(error)` on to
        the wrapped callback when it has one and runs here, then gives the
        callback its own output path back and deletes a redirected run's
        temporary folder (else both would stay until this wrapper is
        collected). tfdist's `Trainer` calls it (Keras calls no callback
        when `fit` raises); after Keras's own `fit` raised, call it yourself.

        Example:

        >>> try:
        ...     model.fit(x, y, callbacks=[wrapped])
        ... except Exception as error:
        ...     wrapped.on_fit_error(error)
        ...     raise
        """
        self._training = False
        try:
            hook = getattr(self.callback, "on_fit_error", None)
            if self._runs() and callable(hook):
                hook(error)
        finally:
            self._finish()

    def on_test_end(self, logs=None):
        if self._runs():
            self.callback.on_test_end(logs)
        if not self._training:
            self._finish()

    def on_predict_end(self, logs=None):
        if self._runs():
            self.callback.on_predict_end(logs)
        if not self._training:
            self._finish()

    def _runs(self):
        return self.mode in ("chief", "redirect")

    def _must_run_everywhere(self, model):
        callback = self.callback
        reads_weights = isinstance(callback, keras.callbacks.ModelCheckpoint) or (
            isinstance(callback, keras.callbacks.TensorBoard)
            and (callback.histogram_freq or callback.embeddings_freq))
        return bool(reads_weights) and _has_on_read_variables(model)

    def _redirect(self, task_type, task_id):
        if self._original_path is None:
            self._original_path = getattr(self.callback, self.path_attribute)
        name = os.path.basename(os.path.normpath(os.fspath(self._original_path))) or "output"
        worker = f"{task_type or 'worker'}_{task_id}"
        if self.fallback_dir is not None:
            folder = os.path.join(self.fallback_dir, worker)
        else:
            if self._temp_dir is None:
                self._temp_dir = tempfile.mkdtemp(prefix=f"tfdist-{worker}-")
                self._cleanup = weakref.finalize(self, shutil.rmtree, self._temp_dir,
                                                 ignore_errors=True)
            folder = self._temp_dir
        setattr(self.callback, self.path_attribute, os.path.join(folder, name))
        logger.info("ChiefOnly: %s on %s writes to %s", type(self.callback).__name__, worker,
                    folder)

    def _make_output_folder(self):
        if self.path_attribute is None:
            return
        path = os.fspath(getattr(self.callback, self.path_attribute))
        folder = path if isinstance(self.callback, keras.callbacks.TensorBoard) \
            else os.path.dirname(path)
        if folder and "{" not in folder:
            os.makedirs(folder, exist_ok=True)

    def _finish(self):
        if self.mode != "redirect":
            return
        setattr(self.callback, self.path_attribute, self._original_path)
        self._original_path = None
        if self._cleanup is not None:
            self._cleanup()  # deletes the temporary folder
            self._cleanup = self._temp_dir = None
        self.mode = None


def make_logging_callbacks(log_dir, csv=True, tensorboard="auto", checkpoint=False,
                           strategy=None, fallback_dir=None, append=False, update_freq="epoch",
                           checkpoint_model=None):
    """The standard logging callbacks of a run, each writing once per job.

    Returns `ChiefOnly`-wrapped Keras callbacks writing under `log_dir`:

    * `csv`: `CSVLogger(log_dir/"training_log.csv")`, one row per epoch;
    * `tensorboard`: `TensorBoard(log_dir/"tensorboard")`; `"auto"` adds it
      only when the `tensorboard` package is installed (TensorFlow 2.21 does
      not install it, and without it `TensorBoard` fails at the first
      epoch end);
    * `checkpoint`: `ModelCheckpoint(log_dir/"checkpoints/epoch_{epoch:03d}.weights.h5",
      save_weights_only=True)`.

    Every process gets the same list; whether each callback writes here is
    decided when training starts (the chief writes, the others do not; see
    `ChiefOnly`), so the list can be built before the strategy exists.
    Nothing is created under `log_dir` by a non-chief worker.

    Args:
        log_dir: the run's log folder (a str or path-like).
        csv: add the CSV logger.
        tensorboard: True, False or `"auto"`, see above.
        checkpoint: add a per-epoch weights checkpoint.
        strategy: decides who is chief, or None for the model's strategy.
        fallback_dir: passed to each `ChiefOnly`: where non-chief workers
            write their own copies, or None for no copies.
        append: append to an existing CSV log (a resumed run) instead of
            starting it anew.
        update_freq: TensorBoard's `update_freq`: `"epoch"`, or N to also
            write the training scalars every N steps (`batch_loss`, ...,
            against the global step).
        checkpoint_model: a function returning the model whose weights the
            checkpoint saves at each epoch end, or None for the model
            trained (a tensor-parallel run passes `trainer.gathered_model`,
            so that its checkpoints load into the model as built).

    Returns:
        A list of `ChiefOnly` callbacks (possibly empty).

    Raises:
        ValueError: `log_dir` is empty, or `tensorboard` is not True, False
            or "auto".
        ImportError: `tensorboard=True` without the `tensorboard` package.

    Example:

    >>> callbacks = make_logging_callbacks("logs/run1", checkpoint=True)
    >>> trainer.fit(dataset, epochs=3, callbacks=callbacks)
    """
    if not isinstance(log_dir, (str, os.PathLike)) or not os.fspath(log_dir):
        raise ValueError(f"log_dir must be a non-empty path, got {log_dir!r}.")
    if tensorboard not in (True, False, "auto"):
        raise ValueError(f"tensorboard must be True, False or 'auto', got {tensorboard!r}.")
    log_dir = os.fspath(log_dir)
    has_tensorboard = importlib.util.find_spec("tensorboard") is not None
    if tensorboard is True and not has_tensorboard:
        raise ImportError(
            "tensorboard=True needs the tensorboard package, which TensorFlow "
            f"{tf.__version__} does not install: `pip install tensorboard`, or pass "
            "tensorboard='auto' (skips it when missing) or False.")
    callbacks = []
    if csv:
        callbacks.append(keras.callbacks.CSVLogger(os.path.join(log_dir, "training_log.csv"),
                                                   append=append))
    if tensorboard is True or (tensorboard == "auto" and has_tensorboard):
        callbacks.append(keras.callbacks.TensorBoard(os.path.join(log_dir, "tensorboard"),
                                                     update_freq=update_freq))
    elif tensorboard == "auto":
        logger.info("make_logging_callbacks: no TensorBoard logs (the tensorboard package is "
                    "not installed).")
    if checkpoint:
        path = os.path.join(log_dir, "checkpoints", "epoch_{epoch:03d}.weights.h5")
        callbacks.append(keras.callbacks.ModelCheckpoint(path, save_weights_only=True)
                         if checkpoint_model is None else
                         CheckpointOf(checkpoint_model, path, save_weights_only=True))
    return [ChiefOnly(c, fallback_dir=fallback_dir, strategy=strategy) for c in callbacks]


class CheckpointOf(keras.callbacks.ModelCheckpoint):
    """`keras.callbacks.ModelCheckpoint` (per epoch) that saves the model `model_of()` returns
    at that moment instead of the model trained.

    Args:
        model_of: a function returning the model to save.
        *args, **kwargs: `keras.callbacks.ModelCheckpoint`'s (its `save_freq`
            must be `"epoch"`).

    Example:

    >>> CheckpointOf(trainer.gathered_model, "checkpoints/epoch_{epoch:03d}.weights.h5",
    ...              save_weights_only=True)
    """

    def __init__(self, model_of, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if self.save_freq != "epoch":
            raise ValueError(f"CheckpointOf saves at epoch ends; got save_freq={self.save_freq!r}.")
        self.model_of = model_of

    def on_epoch_end(self, epoch, logs=None):
        trained = self.model
        self.set_model(self.model_of())
        try:
            super().on_epoch_end(epoch, logs)
        finally:
            self.set_model(trained)


def _known_path_attribute(callback):
    for cls, attribute in ((keras.callbacks.ModelCheckpoint, "filepath"),
                           (keras.callbacks.CSVLogger, "filename"),
                           (keras.callbacks.TensorBoard, "log_dir")):
        if isinstance(callback, cls):
            return attribute
    return None


def _has_on_read_variables(model):
    variables = list(getattr(model, "variables", []))
    optimizer = getattr(model, "optimizer", None)
    if optimizer is not None:
        variables += list(getattr(optimizer, "variables", []))
    for variable in variables:
        sync = getattr(variable, "synchronization", None)
        if sync == "on_read" or sync == tf.VariableSynchronization.ON_READ:
            return True
    return False
