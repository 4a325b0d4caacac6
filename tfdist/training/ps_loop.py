"""Parameter-server training: the chief's loop over asynchronous worker steps.

Under `tf.distribute.ParameterServerStrategy` only the chief runs the
program. `Trainer.fit` hands over to `ParameterServerFit`, which

1. builds each worker's input pipeline there
   (`ClusterCoordinator.create_per_worker_dataset`; a tfdist dataset function
   reads only that worker's shard of the records),
2. schedules `steps_per_epoch` steps per epoch on whichever worker is free
   (`ClusterCoordinator.schedule`), keeping a few in flight per worker, and
3. fetches each step's result in order to drive the callbacks, then
   evaluates on the chief and calls `on_epoch_end`.

One scheduled step, on a worker: the forward pass, the loss of its batch
(`global_batch_size` examples; the same global-batch reduction as every
other strategy, so masks and sample weights count exactly), the gradient,
and `optimizer.apply` to the variables on the ps tasks, without waiting for
the other workers. The step also returns what it adds to the loss and
metric totals (computed from zero in a `keras.StatelessScope`); the chief
sums those, so every trained batch counts exactly once in the logged loss
and metrics however the workers interleave (Keras's own metric update is a
read-then-write that would lose updates when workers race).

What asynchronous training changes, and how tfdist handles it:

* Updates interleave: a run equals neither one device nor another run.
  Tests check that it learns, not equivalence.
* `optimizer.iterations` (hence learning-rate schedules and warmup) counts
  every step: tfdist makes its increment one atomic add on the ps task.
* A worker that is lost: TensorFlow's coordinator runs its steps again on
  the other workers (the batches it had drawn are not replayed); training
  goes on, and a worker that comes back is used again.
* A ps task that is lost: its variables are gone, so training stops with
  `ParameterServerLostError` naming the ps tasks (the recipes exit 141, a
  cluster manager restarts the job, and it resumes from the last backup).
* Evaluation (`validation_data`, `evaluate`, `predict`) runs on the chief,
  reading the variables from the ps tasks.
* Refused, each with its reason: array/generator inputs (pass a dataset or
  a dataset function), `steps_per_epoch=None` (workers read repeated
  datasets), gradient accumulation, `mixed_float16` (dynamic loss scaling
  needs every replica to agree), a model's own `train_step`, `run_eagerly`.
"""

import collections
import logging
import weakref

import keras
import numpy as np
import tensorflow as tf

from tfdist.seam import (default_strategy, model_compile_loss, model_initial_epoch,
                         optimizer_iterations_variable, strategy_cluster_resolver)
from tfdist.training.callback_list import make_callback_list, telling_callbacks_if_fit_fails
from tfdist.training.inputs import unpack
from tfdist.training.loop import end_epoch, run_evaluation
from tfdist.training.loss import GlobalCompileLoss
from tfdist.training.optimizer import gradients_already_summed, optimizer_chain
from tfdist.training.resume import FIT_POSITION_ATTRIBUTE, FitPosition
from tfdist.training.step import StepFunctions

logger = logging.getLogger("tfdist")

STEPS_IN_FLIGHT_PER_WORKER = 2
"""Scheduled steps kept queued per worker, so none waits for the chief."""

_LOST_ERRORS = (tf.errors.UnavailableError, tf.errors.AbortedError, tf.errors.CancelledError,
                tf.errors.DeadlineExceededError)
_COORDINATORS = {}
_CHIEF_STEPS = weakref.WeakKeyDictionary()
"""The step functions each `Trainer` runs on the chief alone, by trainer and mode."""


class ParameterServerLostError(RuntimeError):
    """A parameter server (or the chief's link to the cluster) was lost during training.

    Example:

        try:
            trainer.fit(data, epochs=3)   # under ParameterServerStrategy
        except ParameterServerLostError as error:
            print(error)  # names the lost task; rerun to resume from the backup
    """


def check_parameter_server_trainer(trainer):
    """Refuses `Trainer` settings that asynchronous parameter-server training cannot honour.

    Args:
        trainer: a `tfdist.training.Trainer` under `ParameterServerStrategy`.

    Raises:
        ValueError: naming the setting, why, and the way out.

    Example:

    >>> check_parameter_server_trainer(Trainer(model))  # model built in a PS strategy scope
    """
    if trainer.grad_accum_steps > 1:
        raise ValueError(
            f"grad_accum_steps={trainer.grad_accum_steps} is not supported under "
            "parameter_server: accumulation buffers on the ps tasks would be shared by every "
            "worker. Raise the global batch size instead (each worker step uses the whole "
            "global batch), or use multi_worker_mirrored.")
    if trainer.run_eagerly:
        raise ValueError("run_eagerly=True is not supported under parameter_server: the chief "
                         "schedules compiled functions on the workers. Compile with "
                         "run_eagerly=False.")
    if "train_step" in trainer.hooks:
        raise ValueError(
            f"The model {trainer.model.name!r} overrides train_step, which tfdist cannot "
            "schedule under parameter_server (its metric updates would race between "
            "workers). Put the custom loss in compute_loss (supported), or use "
            "multi_worker_mirrored.")
    for opt in optimizer_chain(trainer.optimizer):
        if isinstance(opt, keras.optimizers.LossScaleOptimizer):
            raise ValueError(
                "mixed_float16 (a LossScaleOptimizer) is not supported under parameter_server: "
                "dynamic loss scaling needs every replica to agree on each step's scale. Use "
                "mixed_bfloat16 (no loss scaling) or float32.")


def coordinator_for(strategy):
    """The one `ClusterCoordinator` of `strategy` (TensorFlow allows one per strategy).

    Example:

    >>> coordinator = coordinator_for(strategy)
    """
    coordinator = _COORDINATORS.get(id(strategy))
    if coordinator is None or coordinator.strategy is not strategy:
        coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
        _COORDINATORS[id(strategy)] = coordinator
    return coordinator


def explain_lost(error, strategy):
    """A `ParameterServerLostError` for a TensorFlow error raised while training.

    Example:

    >>> raise explain_lost(error, strategy) from error
    """
    spec = cluster_spec(strategy)
    ps = ", ".join(f"ps {i} at {address}" for i, address in enumerate(spec.get("ps", ())))
    detail = next((line.strip() for line in str(getattr(error, "message", error)).splitlines()
                   if line.strip() and "Graph execution error" not in line), "")
    return ParameterServerLostError(
        f"Parameter-server training stopped: a ps task ({ps}) or the chief's link to the "
        f"cluster was lost ({type(error).__name__}: {detail[:200]}). The variables a lost ps "
        "task held are gone, so training cannot go on; restart the job (all tasks) and it "
        "resumes from the last backup. (A lost worker does not stop training: its steps run "
        "on the other workers.)")


def cluster_spec(strategy):
    """The cluster of a `ParameterServerStrategy` as a dict `{task type: [addresses]}`.

    Example:

    >>> cluster_spec(strategy)["ps"]
    ['127.0.0.1:2224']
    """
    resolver = strategy_cluster_resolver(strategy)
    return resolver.cluster_spec().as_dict()


def variable_bytes_by_ps_task(model, optimizer=None):
    """Bytes of `model`'s (and `optimizer`'s) variables held by each ps task.

    Args:
        model: a model built under `ParameterServerStrategy`.
        optimizer: its optimizer, if built (its slots count too).

    Returns:
        A dict `{"ps 0": bytes, ...}` in task order.

    Example:

    >>> variable_bytes_by_ps_task(model)
    {'ps 0': 812032, 'ps 1': 790528}
    """
    totals = collections.Counter()
    variables = list(model.variables) + (list(optimizer.variables) if optimizer else [])
    for variable in variables:
        device = getattr(variable.value, "device", "") or ""
        task = tf.DeviceSpec.from_string(device)
        label = f"{task.job} {task.task}" if task.job == "ps" else "elsewhere"
        totals[label] += int(np.prod(variable.shape)) * tf.as_dtype(variable.dtype).size
    return dict(sorted(totals.items()))


class _SpecOnly:
    """What `Trainer.prepare` reads of a dataset: its element spec."""

    def __init__(self, element_spec):
        self.element_spec = element_spec


class WorkerSteps:
    """The function the chief schedules on workers: `num_steps` training steps.

    It returns `(metric_deltas, worker_index)`: what the steps add to each of
    the model's metric variables (loss trackers included), and which worker
    ran them.

    The parameter-server step kind (a `tfdist.training.step_kinds.StepKind`),
    built from the replica parts of the trainer's step functions.

    Args:
        engine: the Trainer's step functions (built under the strategy), a
            `tfdist.training.step_kinds.ReplicaSteps` (`StepFunctions`).
        strategy: the `ParameterServerStrategy`.

    Attributes:
        train_function: `f(iterator, num_steps) -> (metric_deltas,
            worker_index)`, the `tf.function` to schedule.

    Raises:
        ValueError: a metric whose state does not add up over batches.

    Example:

    >>> steps = WorkerSteps(trainer.step_functions, strategy)
    >>> remote = coordinator.schedule(steps.train_function, args=(iterator, tf.constant(1)))
    """

    def __init__(self, engine, strategy):
        self.engine = engine
        self.model = engine.model
        self.strategy = strategy
        self.metric_variables = list(engine.model.metrics_variables)
        for metric in engine.model.metrics:
            bad = [v.path for v in metric.variables
                   if v.aggregation != "sum" or "float" not in str(v.dtype)]
            if bad:
                raise ValueError(
                    f"The metric {metric.name!r} keeps state that does not add up over "
                    f"batches ({', '.join(bad)}), so the chief cannot combine what "
                    "asynchronous workers computed. Under parameter_server use metrics whose "
                    "variables are sums (Mean, accuracy, Precision/Recall, AUC, ...).")
        self.train_function = tf.function(self._steps, autograph=False, reduce_retracing=True)

    def _replica(self, data):
        engine = self.engine
        x, y, sample_weight = unpack(data, need_targets=False)
        grads, stats, y_pred, mask = engine.compute_gradients(x, y, sample_weight)
        totals = engine.reduce_and_apply(grads, stats, record=False)
        zeros = [tf.zeros(v.shape, v.dtype) for v in self.metric_variables]
        with keras.StatelessScope(state_mapping=list(zip(self.metric_variables, zeros))) as scope:
            engine.update_metrics(x, y, y_pred, mask, sample_weight)
            engine.record_loss(totals, engine.loss_stats.examples(stats))
        return [tf.convert_to_tensor(scope.get_current_value(v)) for v in self.metric_variables]

    def _one_step(self, iterator):
        per_replica = self.strategy.run(self._replica, args=(next(iterator),))
        if self.strategy.num_replicas_in_sync == 1:
            return list(self.strategy.experimental_local_results(per_replica)[0])
        return list(self.strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None))

    def _steps(self, iterator, num_steps):
        with gradients_already_summed(self.engine.optimizer), \
                atomic_iterations(self.engine.optimizer):
            first = self._one_step(iterator)

            def body(done, totals):
                return done + 1, [a + b for a, b in zip(totals, self._one_step(iterator))]

            _, totals = tf.while_loop(lambda done, totals: done < num_steps, body,
                                      [tf.constant(1), first])
        return totals, tf.distribute.coordinator.experimental_get_current_worker_index()


class atomic_iterations:  # noqa: N801 (a context manager, named like one)
    """Context in which `optimizer.iterations` grows by one atomic add per step.

    Keras increments it as `assign(iterations + 1)`, a read and a write that
    lose steps when asynchronous workers interleave; inside this context (use
    it while *tracing* the step) the increment is one `assign_add` on the
    variable's ps task.

    Example:

    >>> with atomic_iterations(optimizer):
    ...     concrete = tf.function(step).get_concrete_function(...)
    """

    def __init__(self, optimizer):
        self.variables = [optimizer_iterations_variable(opt) for opt in optimizer_chain(optimizer)
                          if optimizer_iterations_variable(opt) is not None]

    def __enter__(self):
        for variable in self.variables:
            object.__setattr__(variable, "assign_add", _atomic_add(variable))
        return self

    def __exit__(self, *exc):
        for variable in self.variables:
            object.__delattr__(variable, "assign_add")


def _atomic_add(variable):
    def assign_add(value):
        return variable.value.assign_add(tf.cast(value, variable.dtype))
    return assign_add


class ParameterServerFit:
    """`Trainer.fit` under `ParameterServerStrategy` (see the module docstring).

    Args:
        trainer: the `tfdist.training.Trainer`.

    Example:

    >>> history = ParameterServerFit(trainer).fit(dataset_fn, epochs=3, steps_per_epoch=100)
    """

    def __init__(self, trainer):
        check_parameter_server_trainer(trainer)
        self.trainer = trainer
        self.strategy = trainer.strategy
        self.coordinator = coordinator_for(self.strategy)
        spec = cluster_spec(self.strategy)
        self.num_workers = len(spec.get("worker", ()))
        self.steps_by_worker = collections.Counter()
        """Training steps each worker ran in this `fit`, by worker index."""

    # ------------------------------------------------------------------ API
    def fit(self, x, *, epochs, verbose, callbacks, steps_per_epoch, validation_data,
            validation_steps, validation_freq, initial_epoch):
        """Trains; the arguments are `Trainer.fit`'s (the others are refused there).

        Returns:
            The `keras.callbacks.History` of the run.
        """
        trainer, model = self.trainer, self.trainer.model
        if steps_per_epoch is None:
            raise ValueError(
                "steps_per_epoch is required under parameter_server: every worker reads its "
                "own repeated dataset, so an epoch is a number of steps, not a pass over the "
                "data. Pass steps_per_epoch= (e.g. examples // global batch size).")
        per_worker_fn, spec = _per_worker_input(x, self.num_workers, "x")
        engine = trainer.prepare(_SpecOnly(spec), mode="train")
        worker_steps = WorkerSteps(engine, self.strategy)
        evaluation = None
        if validation_data is not None:
            evaluation = _chief_input(validation_data, "validation_data")
        per_worker = self.coordinator.create_per_worker_dataset(per_worker_fn)
        iterator = iter(per_worker)
        callback_list = make_callback_list(callbacks, model, self.strategy, verbose=verbose,
                                           epochs=epochs, steps=steps_per_epoch,
                                           add_history=True)
        model.stop_training = False
        position = FitPosition(steps_per_epoch, replays_consumed_batches=False)
        setattr(model, FIT_POSITION_ATTRIBUTE, position)
        try:
            with telling_callbacks_if_fit_fails(callback_list):
                logs = self._epochs(worker_steps, iterator, evaluation, epochs, steps_per_epoch,
                                    validation_steps, validation_freq, callback_list,
                                    initial_epoch, position)
        except _LOST_ERRORS as error:
            raise explain_lost(error, self.strategy) from error
        except tf.errors.OutOfRangeError as error:
            raise ValueError(
                "A worker's dataset ran out of data under parameter_server. Repeat it "
                "(`.repeat()`; tfdist's dataset functions repeat when training): the epoch "
                f"length is steps_per_epoch={steps_per_epoch}.") from error
        finally:
            setattr(model, FIT_POSITION_ATTRIBUTE, None)
        callback_list.on_train_end(logs=logs)
        logger.debug("parameter_server: steps per worker %s",
                    dict(sorted(self.steps_by_worker.items())))
        return getattr(model, "history", None)

    # ------------------------------------------------------------- the loop
    def _epochs(self, worker_steps, iterator, evaluation, epochs, steps_per_epoch,
                validation_steps, validation_freq, callback_list, initial_epoch, position):
        trainer, model = self.trainer, self.trainer.model
        callback_list.on_train_begin()
        requested = position.start()
        first_step = 0
        if requested is not None:
            initial_epoch, first_step = requested.epoch, requested.step
        else:
            initial_epoch = model_initial_epoch(model) or initial_epoch
        logs = None
        for epoch in range(initial_epoch, epochs):
            model.reset_metrics()
            position.epoch, position.step, position.epoch_finished = epoch, first_step, False
            callback_list.on_epoch_begin(epoch)
            totals = self._run_epoch(worker_steps, iterator, first_step, steps_per_epoch,
                                     callback_list, position)
            first_step = 0
            self.coordinator.join()
            _assign(worker_steps.metric_variables, totals)
            position.epoch_finished = True
            position.iterator_continues = True
            evaluate = None if evaluation is None else (
                lambda: evaluate_on_chief(trainer, evaluation, validation_steps, callback_list))
            logs = end_epoch(
                epoch, _results(model, worker_steps.metric_variables, totals), evaluate,
                validation_freq, callback_list, trainer.optimizer)
            if model.stop_training:
                break
        return logs

    def _run_epoch(self, worker_steps, iterator, first_step, steps_per_epoch, callback_list,
                   position):
        """Schedules and collects one epoch's steps; returns the metric totals."""
        model = self.trainer.model
        chunk = self.trainer.steps_per_execution
        window = max(2, STEPS_IN_FLIGHT_PER_WORKER * self.num_workers)
        totals = [np.zeros(v.shape, np.float64) for v in worker_steps.metric_variables]
        in_flight = collections.deque()
        scheduled = step = first_step
        while step < steps_per_epoch:
            while (len(in_flight) < window and scheduled < steps_per_epoch
                   and not model.stop_training):
                count = min(chunk, steps_per_epoch - scheduled)
                in_flight.append((count, self.coordinator.schedule(
                    worker_steps.train_function, args=(iterator, tf.constant(count)))))
                scheduled += count
            if not in_flight:
                break
            callback_list.on_train_batch_begin(step)
            count, remote = in_flight.popleft()
            deltas, worker = remote.fetch()
            for total, delta in zip(totals, deltas):
                total += delta
            self.steps_by_worker[int(worker)] += count
            step += count
            position.step = step
            position.iterator_batches += count
            callback_list.on_train_batch_end(
                step - 1, _results(model, worker_steps.metric_variables, totals))
        return totals


def evaluate_on_chief(trainer, data, steps, callback_list):
    """Evaluates `trainer.model` on the chief (variables read from the ps tasks).

    Args:
        trainer: the `Trainer`.
        data: a `tf.data.Dataset` of global batches (see `_chief_input`).
        steps: batches to evaluate, or None for all.
        callback_list: the run's `CallbackList` (test hooks are called).

    Returns:
        `{name: float}` logs.

    Example:

    >>> evaluate_on_chief(trainer, validation, None, callback_list)
    {'loss': 1.9, 'accuracy': 0.41}
    """
    functions = _chief_steps(trainer, data, mode="test")
    return run_evaluation(trainer.model, functions.test_function, data, steps, callback_list,
                          steps_per_execution=trainer.steps_per_execution)


def evaluate(trainer, x, *, verbose, steps, callbacks):
    """`Trainer.evaluate` under parameter_server: on the chief. Returns the logs dict.

    Example:

    >>> evaluate(trainer, dataset, verbose=0, steps=None, callbacks=None)
    """
    data = _chief_input(x, "x")
    callback_list = make_callback_list(callbacks, trainer.model, trainer.strategy,
                                       verbose=verbose, epochs=1, steps=steps, add_history=False)
    return evaluate_on_chief(trainer, data, steps, callback_list)


def predict_batches(trainer, x):
    """`(function, dataset)` for `Trainer.predict` under parameter_server, on the chief.

    Example:

    >>> function, data = predict_batches(trainer, dataset)
    """
    data = _chief_input(x, "x")
    return _chief_steps(trainer, data, mode="predict").predict_function, data


def _chief_steps(trainer, data, mode):
    """Step functions that run on the chief alone (the default strategy)."""
    key = "predict" if mode == "predict" else "test"
    by_mode = _CHIEF_STEPS.setdefault(trainer, {})
    functions = by_mode.get(key)
    if functions is None:
        trainer.prepare(_SpecOnly(data.element_spec), mode=mode)
        compile_loss = model_compile_loss(trainer.model) if mode != "predict" else None
        functions = StepFunctions(
            trainer.model, trainer.optimizer,
            GlobalCompileLoss(compile_loss) if compile_loss is not None else None,
            default_strategy(), jit_compile=trainer.jit_compile,
            grad_accum_steps=1, clip_norm=None, custom_loss="compute_loss" in trainer.hooks)
        by_mode[key] = functions
    return functions


def _per_worker_input(x, num_workers, argument):
    """`(per-worker dataset function, per-replica element spec)` for the coordinator."""
    from tfdist.data.input_pipeline import DatasetFn

    if isinstance(x, DatasetFn):
        spec = x(tf.distribute.InputContext()).element_spec
        sharded = x.for_parameter_server(num_workers)
        return _distributed(sharded), spec
    if isinstance(x, tf.data.Dataset):
        return _distributed(lambda context: x), x.element_spec
    if callable(x) and not isinstance(x, tf.distribute.DistributedDataset):
        spec = x(tf.distribute.InputContext()).element_spec
        return _distributed(x), spec
    raise TypeError(
        f"Under parameter_server, {argument} must be a function input_context -> "
        "tf.data.Dataset (called on every worker; shard it with "
        "tf.distribute.coordinator.experimental_get_current_worker_index(), as tfdist's "
        "make_dataset_fn does) or a tf.data.Dataset (every worker iterates its own copy), "
        f"repeated and batched per worker step; got {type(x).__name__}. Arrays, generators "
        "and distributed datasets are not supported: build a tf.data.Dataset from them.")


def _distributed(dataset_fn):
    strategy = tf.distribute.get_strategy()

    def per_worker():
        return strategy.distribute_datasets_from_function(dataset_fn)
    return per_worker


def _chief_input(data, argument):
    """A plain dataset of global batches for evaluation on the chief."""
    from tfdist.data.input_pipeline import DatasetFn

    if isinstance(data, tf.data.Dataset):
        return data
    if isinstance(data, DatasetFn) or (callable(data) and not isinstance(
            data, tf.distribute.DistributedDataset)):
        return data(tf.distribute.InputContext())
    raise TypeError(
        f"Under parameter_server, {argument} is evaluated on the chief and must be a "
        "tf.data.Dataset of batches or a function input_context -> tf.data.Dataset; got "
        f"{type(data).__name__}.")


def _results(model, variables, totals):
    mapping = [(v, tf.constant(t, dtype=v.dtype)) for v, t in zip(variables, totals)]
    with keras.StatelessScope(state_mapping=mapping):
        results = model.get_metrics_result()
    return {name: float(np.asarray(value)) if np.ndim(value) == 0 else np.asarray(value)
            for name, value in results.items()}


def _assign(variables, totals):
    for variable, total in zip(variables, totals):
        variable.assign(total.astype(variable.dtype))
