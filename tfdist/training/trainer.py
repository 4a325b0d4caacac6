"""`Trainer`: fit / evaluate / predict a Keras 3 model under any tf.distribute strategy.

The loop (epochs, steps, callbacks, validation) lives here, built from the
pieces it shares with the parameter-server loop (`tfdist.training.loop`,
`tfdist.training.ps_loop`); what runs in one step lives in the step kinds
(`tfdist.training.step_kinds`, `tfdist.training.step`); the resume protocol
that callbacks use is `tfdist.training.resume`.
"""

import collections
import contextlib
import warnings

import keras
import tensorflow as tf

from tfdist.seam import (default_strategy, join_predicted_batches, metrics_in_keras_order,
                         model_compile_config, model_compile_loss, model_initial_epoch,
                         model_strategy, optimizer_trainable_variables, set_optimizer_strategy,
                         symbolic_build)
from tfdist.training.callback_list import make_callback_list, telling_callbacks_if_fit_fails
from tfdist.training.compiled import check_hooks, compile_model
from tfdist.training.inputs import (distribute, evaluation_inputs, per_replica_spec,
                                    training_inputs, unpack)
from tfdist.training.loop import end_epoch, pythonify, run_batches, run_evaluation
from tfdist.training.loss import GlobalCompileLoss
from tfdist.training.one_batch import batch_rows, run_one_batch
from tfdist.training.model_hooks import own_hooks
from tfdist.training.optimizer import (check_optimizer, optimizer_chain,
                                      variables_outside_scope)
from tfdist.training.own_step import OWN_STEP_HOOKS, StepFunctionsWithOwnSteps
from tfdist.training.model_parallel.gpipe import (PipelineStepFunctions, check_model_parallel_arguments,
                                      check_pipeline_settings)
from tfdist.training.model_parallel.placement import (deferred_build, outside_strategy_scopes,
                                                      place_metric_variables, place_stages,
                                                      plain_variables, stage_devices,
                                                      updates_on_variable_devices)
from tfdist.training.model_parallel.stages import plan_stages, split_model
from tfdist.training.tensor_parallel import layout as tensor_layout
from tfdist.training.tensor_parallel import split as tensor_split
from tfdist.training.tensor_parallel.whole import save_as_whole
from tfdist.training.tensor_parallel.steps import WorkerReplicaStepFunctions
from tfdist.training import ps_loop as parameter_server
from tfdist.training.resume import FIT_POSITION_ATTRIBUTE, FitPosition
from tfdist.training.step import StepFunctions
from tfdist.runtime.argtypes import check_int_at_least, check_number, shown


class Trainer:
    """Trains a compiled Keras 3 model with a distributed step that tfdist owns.

    The model's `compile()` is the source of truth: its optimizer, loss (one,
    or one per output as a list, dict or nested structure, with
    `loss_weights`), `metrics` and `weighted_metrics` per output,
    `steps_per_execution`, `jit_compile` and `run_eagerly` are all honoured,
    and `fit`, `evaluate` and `predict` take Keras's arguments (numpy arrays
    with `batch_size`, `validation_split`, `class_weight`, `sample_weight`,
    or datasets). Moving a Keras program onto tfdist is one line:
    `model.fit(...)` becomes `Trainer(model).fit(...)`.

    Works the same under the default strategy, `OneDeviceStrategy`,
    `MirroredStrategy` (N devices) and `MultiWorkerMirroredStrategy` (N
    processes), where Keras 3's own `fit` fails or silently differs:

    * each compiled loss is reduced over the *global* batch exactly as one
      device would (masks, sample weights, short last batches included) and
      regularisation losses count once;
    * gradients are summed across replicas exactly once, then clipped by their
      global norm (`clip_norm`), then applied;
    * `jit_compile=True` compiles the per-replica forward/loss/backward with
      XLA, keeping the all-reduce and the update outside it;
    * `mixed_float16` models get a dynamic `LossScaleOptimizer` (through
      `model.compile`), `mixed_bfloat16` none;
    * `grad_accum_steps=K` takes one optimizer step per K batches, equal to
      one step on the K-times larger batch; `optimizer.iterations` (and so any
      learning-rate schedule) counts optimizer steps;
    * `steps_per_execution=S` runs S steps per compiled call;
    * `model_parallel=K` splits the model's layers into K stages on K
      devices of each worker and trains them as a GPipe pipeline over
      `micro_batches` micro-batches, with the same global-batch loss and
      update as one device (`tfdist.training.model_parallel.gpipe`);
    * metrics and logged losses (also each output's `<name>_loss`) are global
      on every worker; standard Keras callbacks work (made chief-safe under
      several workers); only the chief shows a progress bar.

    A model's own `compute_loss` is used by the engine, and a model's own
    `train_step` / `test_step` / `predict_step` runs under the strategy as
    in Keras's `fit` (see `tfdist.training.model_hooks`).

    Under `ParameterServerStrategy` (on the chief) `fit` trains
    asynchronously: it schedules steps on the workers through a
    `ClusterCoordinator`, each on its worker's own dataset shard, and
    evaluates and predicts on the chief (see
    `tfdist.training.ps_loop` for what that changes and refuses).

    The model (and its optimizer) must be created and compiled inside
    `strategy.scope()`. Arguments given here override the matching
    `compile()` argument (the model is compiled again with them, inside the
    scope); the others keep their compiled value. Like Keras's `fit`, each
    `fit` / `evaluate` / `predict` follows the model's latest `compile()` and
    trainable variables (fine-tuning: `base.trainable = True` and a new
    `model.compile(...)` between two `fit` calls of one trainer), building its
    step functions again only when one of them changed; the arguments given
    here keep overriding. A model that was never
    compiled needs at least `optimizer` (and `loss`, unless it overrides
    `compute_loss` or `train_step`).

    Args:
        model: a `keras.Model` created inside `strategy.scope()`, usually
            compiled (it may be unbuilt; it is then built inside the scope
            from the data).
        optimizer, loss, metrics, loss_weights, weighted_metrics: as in
            `keras.Model.compile`; None keeps the compiled value. The
            optimizer's `clipnorm` / `global_clipnorm` / `clipvalue` act on
            the global gradient; its `gradient_accumulation_steps` is refused
            (use `grad_accum_steps`). Loss reductions: `"sum_over_batch_size"`,
            `"mean"`, `"mean_with_sample_weight"` or `"sum"`.
        strategy: the `tf.distribute.Strategy`; default: the strategy the
            model was created under (else the active one, else the default).
        jit_compile: compile the per-replica computation with XLA (True /
            False); None keeps the compiled value.
        grad_accum_steps: batches per optimizer step, an integer >= 1.
        clip_norm: clip the summed gradient to this global norm (float > 0),
            or None.
        steps_per_execution: steps per compiled call, an integer >= 1; None
            keeps the compiled value.
        model_parallel: K, the number of devices one model replica is split
            over (an integer >= 1; 1: no split). K > 1 splits the model's
            layers into K consecutive stages on K devices of each worker and
            trains them as a GPipe pipeline (`tfdist.training.model_parallel.gpipe`,
            split rule in `tfdist.training.model_parallel.stages`); the strategy must have
            one replica per worker (default strategy, or
            MultiWorkerMirroredStrategy with one device per worker).
        micro_batches: micro-batches per step with K > 1 (an integer >= 1;
            default `2 * K`).
        stage_boundaries: with K > 1, the names of the K-1 layers where
            stages 1..K-1 begin (default: the split rule chooses).
        tensor_parallel: K, the number of devices of this worker the layers
            that `layout_map` names are split over (an integer >= 1; 1: no
            split). K > 1 trains a copy of the model whose named Dense
            layers are split by channels (`tfdist.training.tensor_parallel`),
            `trainer.model`, starting from the model's weights; after each
            `fit` the trained weights are gathered back into `model`. Runs
            under the default strategy, or MultiWorkerMirroredStrategy with
            one device per worker (one split copy per worker, data parallel
            across workers; `tfdist.training.tensor_parallel.steps`), float32
            or a mixed policy, with or without gradient accumulation, without
            XLA so far (the rest is refused by name).
        layout_map: with tensor_parallel > 1, a `keras.distribution.LayoutMap`
            (variable path pattern -> which axis is sharded over the mesh's
            model axis).

    Example:

    >>> strategy = tf.distribute.MirroredStrategy()
    >>> with strategy.scope():
    ...     model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    ...     model.compile(keras.optimizers.SGD(0.1), "mse", metrics=["mae"])
    >>> history = Trainer(model).fit(x, y, batch_size=64, epochs=2, validation_split=0.1)
    """

    def __init__(self, model, optimizer=None, loss=None, metrics=None, *, loss_weights=None,
                 weighted_metrics=None, strategy=None, jit_compile=None, grad_accum_steps=1,
                 clip_norm=None, steps_per_execution=None, model_parallel=1, micro_batches=None,
                 stage_boundaries=None, tensor_parallel=1, layout_map=None):
        if not isinstance(model, keras.Model):
            raise TypeError(f"model must be a keras.Model, got {type(model).__name__}.")
        self.strategy = strategy if strategy is not None else _model_strategy(model)
        if not isinstance(self.strategy, tf.distribute.Strategy):
            raise TypeError(
                f"strategy must be a tf.distribute.Strategy (e.g. MirroredStrategy, "
                f"MultiWorkerMirroredStrategy, OneDeviceStrategy) or None, got "
                f"{strategy!r}.")
        _check_positive_int("grad_accum_steps", grad_accum_steps)
        if steps_per_execution is not None:
            _check_positive_int("steps_per_execution", steps_per_execution)
        check_number("clip_norm", clip_norm, above=0, none_means="no clipping")
        if jit_compile is not None and not isinstance(jit_compile, bool):
            raise ValueError(f"jit_compile must be True, False or None, got {jit_compile!r}.")
        _check_model_in_scope(model, self.strategy)
        self._compile_overrides = {
            name: value for name, value in dict(
                optimizer=optimizer, loss=loss, metrics=metrics, loss_weights=loss_weights,
                weighted_metrics=weighted_metrics).items() if value is not None}
        self._jit_compile_override = jit_compile
        self._steps_per_execution_override = steps_per_execution
        self.model = model
        self.hooks = own_hooks(model)
        self.grad_accum_steps = grad_accum_steps
        self.clip_norm = None if clip_norm is None else float(clip_norm)
        self._use_compiled_settings(
            compile_model(model, self.strategy, **self._compile_overrides))
        self._followed = ModelState.of(model)
        self.model_parallel, self.micro_batches, self.stage_boundaries = (
            check_model_parallel_arguments(model_parallel, micro_batches, stage_boundaries))
        self._stages = None
        self.stage_plan = None
        """The `StagePlan` (stages, devices, layers, parameters) with model_parallel > 1."""
        if self.model_parallel > 1:
            check_pipeline_settings(model, self.hooks, self.strategy,
                                    model_parallel=self.model_parallel,
                                    jit_compile=self.jit_compile, grad_accum_steps=grad_accum_steps)
            if model.built:
                self.stage_plan = self._plan_stages()
        self.source_model = model
        """The model given to the Trainer (with tensor_parallel > 1, `model` is its split copy)."""
        self.tensor_parallel = tensor_split.check_tensor_parallel_arguments(tensor_parallel,
                                                                            layout_map)
        self.shard_plan = None
        """The `ShardPlan` (split layers, devices) with tensor_parallel > 1."""
        if self.tensor_parallel > 1:
            self._split_layers(layout_map)
        self._steps = None
        self._predict_steps = None

    def _split_layers(self, layout_map):
        """Replaces `self.model` by its tensor-parallel split copy (tensor_parallel > 1)."""
        model = self.model
        tensor_split.check_tensor_parallel_settings(
            model, self.strategy, tensor_parallel=self.tensor_parallel,
            model_parallel=self.model_parallel, jit_compile=self.jit_compile,
            grad_accum_steps=self.grad_accum_steps, hooks=self.hooks)
        plan = tensor_layout.plan_shards(model, layout_map, self.tensor_parallel)
        self.shard_plan = plan.with_devices(tensor_split.shard_devices(self.tensor_parallel))
        with self._variable_scope():
            split = tensor_split.split_model(model, self.shard_plan)
            tensor_split.compile_like(split, model)
        # The shards are plain variables: the optimizer updates them with the default
        # strategy; what crosses workers is WorkerReplicaStepFunctions' own all-reduce.
        for opt in optimizer_chain(split.optimizer):
            set_optimizer_strategy(opt, default_strategy())
        self.model = split
        save_as_whole(split, model, build_optimizer=self._build_split_optimizer)
        self.hooks = own_hooks(split)
        self._use_compiled_settings(compile_model(split, self.strategy))
        self._followed = ModelState.of(split)

    def _build_split_optimizer(self):
        """Builds the split copy's optimizer, each slot next to its shard (tensor_parallel > 1)."""
        with self._variable_scope():
            self.optimizer.build(self.model.trainable_variables)

    def _variable_scope(self):
        """Where the model's variables (metrics, optimizer slots) are created: the
        strategy's scope, or, for a tensor-parallel split copy, outside every
        strategy scope as plain variables (each shard on its device)."""
        if self.tensor_parallel > 1:
            scope = contextlib.ExitStack()
            scope.enter_context(outside_strategy_scopes())
            scope.enter_context(plain_variables())
            return scope
        return self.strategy.scope()

    def _use_compiled_settings(self, settings):
        """Takes the execution settings of the model's compile() (the trainer's own
        jit_compile / steps_per_execution arguments win) and checks them."""
        jit_compile = self._jit_compile_override
        steps_per_execution = self._steps_per_execution_override
        self.jit_compile = settings.jit_compile if jit_compile is None else jit_compile
        self.steps_per_execution = (settings.steps_per_execution if steps_per_execution is None
                                    else steps_per_execution)
        self.run_eagerly = settings.run_eagerly
        check_hooks(self.model, self.hooks, self.strategy, jit_compile=self.jit_compile,
                    run_eagerly=self.run_eagerly, grad_accum_steps=self.grad_accum_steps,
                    clip_norm=self.clip_norm)
        if "train_step" not in self.hooks:
            check_optimizer(self.model.optimizer, self.strategy, self.clip_norm)

    def _follow_model(self):
        """Follows the model as Keras's `fit` does: after a new `model.compile()`
        (optimizer, loss, loss weights, metrics, jit_compile, steps_per_execution),
        a new `model.optimizer` or a change of its trainable variables (a layer's
        `trainable` set), the step functions are built again for the model as it
        is now; an unchanged model keeps them. The trainer's own arguments still
        override the compiled ones."""
        state = ModelState.of(self.model)
        if state.same_as(self._followed):
            return
        if self.model_parallel > 1 or self.tensor_parallel > 1:
            raise ValueError(
                f"The model {self.model.name!r} was compiled again or its trainable "
                "variables changed after its Trainer(model_parallel="
                f"{self.model_parallel}, tensor_parallel={self.tensor_parallel}) split it, "
                "which cannot follow the change. Create a new Trainer for the changed model.")
        if state.compile_config is not self._followed.compile_config:
            self._use_compiled_settings(
                compile_model(self.model, self.strategy, **self._compile_overrides))
            state = ModelState.of(self.model)
        elif state.optimizer is not self._followed.optimizer and "train_step" not in self.hooks:
            check_optimizer(self.model.optimizer, self.strategy, self.clip_norm)
        if "train_step" not in self.hooks:
            _check_optimizer_knows(self.model, self.optimizer)
        self._steps = None
        self._predict_steps = None
        self._followed = state

    @property
    def optimizer(self):
        """The optimizer that applies the updates (`model.optimizer`; a
        `LossScaleOptimizer` wrapping yours under `mixed_float16`)."""
        return self.model.optimizer

    @property
    def step_functions(self):
        """The step functions `fit` and `evaluate` run (a step kind, see
        `tfdist.training.step_kinds`), or None before they are built (or after
        the model changed, until the next `fit` / `evaluate` builds them again).

        Example:

        >>> trainer.fit(dataset, epochs=1)
        >>> ran, logs = trainer.step_functions.train_function(iterator, tf.constant(1))
        """
        return self._steps

    # ------------------------------------------------------------------ API
    def fit(self, x=None, y=None, batch_size=None, epochs=1, verbose="auto", callbacks=None,
            validation_split=0.0, validation_data=None, shuffle=True, class_weight=None,
            sample_weight=None, initial_epoch=0, steps_per_epoch=None, validation_steps=None,
            validation_batch_size=None, validation_freq=1):
        """Trains the model; the arguments are those of `keras.Model.fit`.

        Args:
            x: training data: numpy arrays (or a list / dict of them, like
                the model's inputs) with `y`; a `tf.data.Dataset` batched
                with the global batch size; a function
                `input_context -> tf.data.Dataset` batched per replica; or a
                `tf.distribute.DistributedDataset`. Dataset elements are
                `(x, y)` or `(x, y, sample_weight)`.
            y: targets for array `x` (arrays, or a list / dict per output).
            batch_size: the *global* batch size for array inputs (default
                32, as in Keras); each replica of each worker gets its share
                of every batch, so every example is used once per epoch
                across the cluster. Not allowed with datasets.
            epochs: train until this epoch index (exclusive).
            verbose: `"auto"`, 0, 1 or 2 (progress bar on the chief only).
            callbacks: list of `keras.callbacks.Callback`.
            validation_split: fraction (0 <= f < 1) of the array rows, taken
                from the end before shuffling, held out for validation.
            validation_data: `(x_val, y_val)` / `(x_val, y_val, sw_val)`
                arrays, or a dataset (same forms as `x`), evaluated at epoch
                ends; results are logged as `val_<name>`.
            shuffle: for array inputs: True (a new order every epoch, the
                same on every worker), False, or `"batch"`. Datasets keep
                their own order (shuffle them in the pipeline), as in Keras.
            class_weight: `{class index: weight}`, applied as per-example
                weights (arrays or a `tf.data.Dataset`; single output).
            sample_weight: per-example weights for array inputs.
            initial_epoch: epoch index to start from (a `BackupAndRestore`
                callback may move it forward). A callback can also start
                training mid-epoch through the `FitPosition` published on
                the model during `fit` (see `FitPosition`;
                `tfdist.callbacks.backup.BackupAndResume` does this).
            steps_per_epoch: batches per epoch (micro-batches when
                accumulating). None: until the data is exhausted (a fresh pass
                every epoch). Set it for repeated (infinite) datasets; the
                iterator then continues across epochs.
            validation_steps: batches of validation data per evaluation
                (None: all).
            validation_batch_size: global batch size of array
                `validation_data` (default: `batch_size`).
            validation_freq: validate every this many epochs (an int >= 1).

        Returns:
            The `keras.callbacks.History` of the run (also `model.history`).

        Example:

        >>> history = trainer.fit(x, y, batch_size=64, epochs=3, validation_split=0.2,
        ...                       class_weight={0: 1.0, 1: 3.0})
        >>> history.history["loss"], history.history["val_loss"]
        """
        _check_positive_int("epochs", epochs, allow_zero=True)
        _check_positive_int("initial_epoch", initial_epoch, allow_zero=True)
        if initial_epoch > epochs:
            raise ValueError(
                f"initial_epoch={initial_epoch} is past epochs={epochs}, so fit would train "
                f"nothing: epochs is the index of the last epoch (as in Keras), not a count. "
                f"To train {epochs} more epochs from epoch {initial_epoch}, pass "
                f"epochs={initial_epoch + epochs}.")
        self._follow_model()
        if steps_per_epoch is not None:
            _check_positive_int("steps_per_epoch", steps_per_epoch)
        if validation_steps is not None:
            _check_positive_int("validation_steps", validation_steps)
        _check_positive_int("validation_freq", validation_freq)
        if _is_parameter_server(self.strategy):
            _refuse_array_arguments("fit", y=y, batch_size=batch_size,
                                    validation_split=validation_split, shuffle=shuffle,
                                    class_weight=class_weight, sample_weight=sample_weight,
                                    validation_batch_size=validation_batch_size)
            ps_fit = parameter_server.ParameterServerFit(self)
            self.worker_steps = ps_fit.steps_by_worker
            return ps_fit.fit(
                x, epochs=epochs, verbose=verbose, callbacks=callbacks,
                steps_per_epoch=steps_per_epoch, validation_data=validation_data,
                validation_steps=validation_steps, validation_freq=validation_freq,
                initial_epoch=initial_epoch)
        train, validation = training_inputs(
            self.strategy, x, y, batch_size=batch_size, sample_weight=sample_weight,
            class_weight=class_weight, shuffle=shuffle, validation_split=validation_split,
            validation_data=validation_data, validation_batch_size=validation_batch_size)
        if validation is None:
            _warn_unused_validation_arguments(validation_steps=validation_steps,
                                              validation_batch_size=validation_batch_size)
        data = distribute(self.strategy, train, "x")
        val_data = (None if validation is None
                    else distribute(self.strategy, validation, "validation_data"))
        steps = self.prepare(data, mode="train")
        if val_data is not None:
            self.prepare(val_data, mode="test")
        callback_list = make_callback_list(
            callbacks, self.model, self.strategy, verbose=verbose, epochs=epochs,
            steps=steps_per_epoch, add_history=True)
        self.model.stop_training = False
        positionable = train if _can_position(train) else None
        position = FitPosition(steps_per_epoch, self.grad_accum_steps,
                               self._update_boundary if self.grad_accum_steps > 1 else None,
                               replays_consumed_batches=positionable is None,
                               starts_input_at_position=positionable is not None)
        setattr(self.model, FIT_POSITION_ATTRIBUTE, position)
        try:
            with telling_callbacks_if_fit_fails(callback_list), self._updates_placed():
                training_logs, initial_epoch = self._fit_epochs(
                    data, val_data, steps, epochs, steps_per_epoch, validation_steps,
                    validation_freq, callback_list, initial_epoch, position, positionable)
        finally:
            setattr(self.model, FIT_POSITION_ATTRIBUTE, None)
        if epochs > initial_epoch and self.optimizer is not None:
            # Copies moving averages into the model when the optimizer keeps them.
            self.optimizer.finalize_variable_values(self.model.trainable_variables)
        if not self._update_boundary():
            warnings.warn(
                f"fit ended between two optimizer updates (grad_accum_steps="
                f"{self.grad_accum_steps}): the gradients of the micro-batches since the last "
                "update are held, not applied; a next fit of this Trainer adds to them. To end "
                f"on an update, train a multiple of {self.grad_accum_steps} batches "
                "(steps_per_epoch x epochs).", UserWarning, stacklevel=2)
        callback_list.on_train_end(logs=training_logs)
        self.gathered_model()
        return getattr(self.model, "history", None)

    def gathered_model(self):
        """The model given to the Trainer, holding the trained weights: with
        tensor_parallel > 1 the split copy's weights are gathered into it
        first (each split kernel from its shards); otherwise it is the model
        trained. A per-epoch weights checkpoint of a split run saves this one,
        so that it loads into the model as built.

        Example:

        >>> trainer = Trainer(model, tensor_parallel=2, layout_map=layout_map)
        >>> trainer.fit(data, epochs=1)
        >>> trainer.gathered_model().save_weights("model.weights.h5")
        """
        if self.tensor_parallel > 1:
            tensor_split.gather_weights(self.model, self.source_model)
        return self.source_model

    def evaluate(self, x=None, y=None, batch_size=None, verbose="auto", sample_weight=None,
                 steps=None, callbacks=None, return_dict=False):
        """Computes the loss and metrics on `x`, identical to one device.

        Args:
            x: evaluation data, same forms as `fit`'s `x`.
            y: targets for array `x`.
            batch_size: global batch size for array inputs (default 32).
            verbose: `"auto"`, 0, 1 or 2 (progress bar on the chief only).
            sample_weight: per-example weights for array inputs.
            steps: number of batches (None: until the data is exhausted).
            callbacks: list of `keras.callbacks.Callback`.
            return_dict: return `{name: value}` instead of a list.

        Returns:
            The loss (a float) when there are no metrics, else a list in
            Keras's order (`model.metrics_names`: the loss, each output's
            loss, then the compiled metrics), or a dict with
            `return_dict=True`.

        Example:

        >>> trainer.evaluate(x_test, y_test, batch_size=128, return_dict=True)
        {'loss': 0.31, 'accuracy': 0.9}
        """
        if steps is not None:
            _check_positive_int("steps", steps)
        self._follow_model()
        if _is_parameter_server(self.strategy):
            _refuse_array_arguments("evaluate", y=y, batch_size=batch_size,
                                    sample_weight=sample_weight)
            logs = parameter_server.evaluate(self, x, verbose=verbose, steps=steps,
                                             callbacks=callbacks)
        else:
            data = distribute(self.strategy, evaluation_inputs(
                x, y, batch_size=batch_size, sample_weight=sample_weight), "x")
            self.prepare(data, mode="test")
            callback_list = make_callback_list(callbacks, self.model, self.strategy,
                                               verbose=verbose, epochs=1, steps=steps,
                                               add_history=False)
            logs = run_evaluation(self.model, self._steps.test_function, data, steps,
                                  callback_list, steps_per_execution=self.steps_per_execution)
        if return_dict:
            return logs
        return metrics_in_keras_order(self.model, logs)

    def predict(self, x, batch_size=None, verbose="auto", steps=None, callbacks=None):
        """Runs the model in inference mode and returns numpy outputs in input order.

        Outputs of all replicas and workers are gathered, so every worker
        receives the full result. With a `tf.data.Dataset` of global batches
        the rows come back in the dataset's order, also when the last batch
        does not split evenly across replicas.

        Args:
            x: input data: arrays (like the model's inputs) or the same forms
                as `fit`'s `x`; dataset elements `x`, `(x,)`, `(x, y)` or
                `(x, y, sample_weight)` (targets are ignored).
            batch_size: global batch size for array inputs (default 32).
            verbose: `"auto"`, 0, 1 or 2 (progress bar on the chief only).
            steps: number of batches (None: until the data is exhausted).
            callbacks: list of `keras.callbacks.Callback`.

        Returns:
            A numpy array (or a structure of them, like the model's outputs);
            as in Keras, a `tf.RaggedTensor` for a ragged output (or one whose
            non-batch shape differs between batches).

        Example:

        >>> predictions = trainer.predict(x_test, batch_size=256)
        """
        if getattr(batch_size, "shape", None) is not None:
            raise ValueError(
                f"predict takes no targets: its second argument is batch_size (as in Keras), "
                f"got {shown(batch_size)}. Call predict(x) or predict(x, batch_size=N); "
                "evaluate(x, y) compares the predictions with targets.")
        if steps is not None:
            _check_positive_int("steps", steps)
        self._follow_model()
        if _is_parameter_server(self.strategy):
            _refuse_array_arguments("predict", batch_size=batch_size)
            predict_function, data = parameter_server.predict_batches(self, x)
        else:
            data = distribute(self.strategy, evaluation_inputs(x, None, batch_size=batch_size,
                                                               sample_weight=None), "x")
            predict_function = self.prepare(data, mode="predict").predict_function
        callback_list = make_callback_list(callbacks, self.model, self.strategy,
                                           verbose=verbose, epochs=1, steps=steps,
                                           add_history=False)
        callback_list.on_predict_begin()
        outputs = []
        for index, batch in enumerate(data):
            if steps is not None and index >= steps:
                break
            callback_list.on_predict_batch_begin(index)
            batch_outputs = predict_function(batch)
            outputs.append(batch_outputs)
            callback_list.on_predict_batch_end(index, {"outputs": batch_outputs})
        callback_list.on_predict_end()
        if not outputs:
            raise ValueError("predict() received no batches: the input is empty.")
        return join_predicted_batches(outputs)

    def train_on_batch(self, x, y=None, sample_weight=None, class_weight=None,
                       return_dict=False):
        """Trains on one global batch, as `keras.Model.train_on_batch`, identical to one device.

        The metrics are reset first, so the figures are this batch's; no
        callbacks run. Each replica gets its share of the batch (as in `fit`,
        also when its rows do not split evenly). With `grad_accum_steps=K` each
        call is one micro-batch: every K-th call applies the update.

        Args:
            x: one batch: arrays or tensors (or a list / dict of them, like the
                model's inputs).
            y: its targets.
            sample_weight: per-example weights.
            class_weight: `{class index: weight}`, applied as per-example weights.
            return_dict: return `{name: value}` instead of a list.

        Returns:
            As `evaluate`: the loss, a list in Keras's order, or a dict.

        Example:

        >>> for x_batch, y_batch in batches:
        ...     loss = trainer.train_on_batch(x_batch, y_batch)
        """
        logs = self._one_batch("train", x, y, sample_weight, class_weight)
        return logs if return_dict else metrics_in_keras_order(self.model, logs)

    def test_on_batch(self, x, y=None, sample_weight=None, return_dict=False):
        """The loss and metrics of one global batch, as `keras.Model.test_on_batch`.

        The metrics are reset first; no callbacks run. Arguments and result as
        `train_on_batch`.

        Example:

        >>> trainer.test_on_batch(x_batch, y_batch, return_dict=True)
        {'loss': 0.31, 'accuracy': 0.9}
        """
        logs = self._one_batch("test", x, y, sample_weight)
        return logs if return_dict else metrics_in_keras_order(self.model, logs)

    def predict_on_batch(self, x):
        """The model's outputs for one batch, as `keras.Model.predict_on_batch`:
        `predict` over `x` as one global batch.

        Example:

        >>> probabilities = trainer.predict_on_batch(x_batch)
        """
        return self.predict(x, batch_size=batch_rows(x, "predict_on_batch"), verbose=0)

    def _one_batch(self, mode, x, y, sample_weight, class_weight=None):
        if _is_parameter_server(self.strategy):
            raise ValueError(f"{mode}_on_batch is not supported under parameter_server, where "
                             "every worker reads its own dataset: use fit / evaluate with a "
                             "dataset.")
        self._follow_model()
        if mode != "train":
            return run_one_batch(self, mode, x, y, sample_weight)
        with self._updates_placed():
            logs = run_one_batch(self, mode, x, y, sample_weight, class_weight)
        self.gathered_model()
        return logs

    def _updates_placed(self):
        """With tensor_parallel > 1, each shard's update is computed on its device
        (traced in this context); otherwise nothing."""
        if self.tensor_parallel > 1:
            return updates_on_variable_devices(self.optimizer)
        return contextlib.nullcontext()

    # ------------------------------------------------------------- the loop
    def _fit_epochs(self, data, val_data, steps, epochs, steps_per_epoch, validation_steps,
                    validation_freq, callback_list, initial_epoch, position, positionable=None):
        """The epoch loop of `fit`; returns `(last epoch logs, first epoch run)`.

        `positionable`: the training input when it can start at a data position
        itself (a `DatasetFn` of `tfdist.data`: `positioned(batches)`); a resume
        then builds the input at that position instead of replaying it."""
        callback_list.on_train_begin()
        requested = position.start()
        if requested is not None:
            initial_epoch = requested.epoch
            self._reset_accumulation()
        else:
            initial_epoch = model_initial_epoch(self.model) or initial_epoch
        iterator = None
        training_logs = None
        for epoch in range(initial_epoch, epochs):
            self.model.reset_metrics()
            position.epoch, position.step, position.epoch_finished = epoch, 0, False
            callback_list.on_epoch_begin(epoch)
            resuming = requested is not None and epoch == requested.epoch
            if iterator is None or steps_per_epoch is None:
                if resuming:  # replays iter() calls: reshuffling datasets move on
                    for _ in range(requested.iterator_index - position.iterator_index - 1):
                        iter(data)
                    position.iterator_index = requested.iterator_index - 1
                consumed = 0
                if resuming and positionable is not None and requested.iterator_index == 0:
                    consumed = requested.iterator_batches
                iterator = iter(data if not consumed else distribute(
                    self.strategy, positionable.positioned(consumed), "x"))
                position.iterator_index += 1
                position.iterator_batches = consumed
            first_step = 0
            if resuming:
                first_step = requested.step
                self._skip_batches(steps.skip_function, iterator,
                                   requested.iterator_batches - position.iterator_batches)
                position.step = first_step
                position.iterator_batches = requested.iterator_batches
            logs, exhausted = run_batches(steps.train_function, iterator, steps_per_epoch,
                                          callback_list, "train", model=self.model,
                                          steps_per_execution=self.steps_per_execution,
                                          first_step=first_step, position=position)
            if exhausted:
                iterator = None  # the next epoch starts a new pass over the data
            position.epoch_finished = True
            position.iterator_continues = iterator is not None and steps_per_epoch is not None
            if logs is not None:
                epoch_logs = dict(logs)
            elif first_step == 0:  # no batch in this epoch: no training figures, as in Keras
                epoch_logs = {}
            else:  # resumed at the epoch's end: the figures its backup restored
                epoch_logs = pythonify(self.model.get_metrics_result())
            evaluate = None if val_data is None else (
                lambda: run_evaluation(self.model, self._steps.test_function, val_data,
                                       validation_steps, callback_list,
                                       steps_per_execution=self.steps_per_execution))
            training_logs = end_epoch(epoch, epoch_logs, evaluate, validation_freq,
                                      callback_list, self.optimizer)
            if self.model.stop_training:
                break
        return training_logs, initial_epoch


    def _skip_batches(self, skip_function, iterator, count):
        """Draws and discards `count` batches (resuming at a data position)."""
        if count == 0:
            return
        skipped = int(skip_function(iterator, tf.constant(count, tf.int64)))
        if skipped < count:
            raise ValueError(
                f"Resuming training needs to skip the {count} batches that were already "
                f"consumed, but the input ran out after {skipped}. The input pipeline must "
                "be the same (same data, batch size and order) as in the run that wrote "
                "the backup.")

    def _update_boundary(self):
        return self._steps is None or self._steps.at_update_boundary()

    def _reset_accumulation(self):
        """Drops a partial gradient accumulation (left by an interrupted fit)."""
        if self._update_boundary():
            return
        self._steps.reset_accumulation()

    def _needs_targets(self, mode):
        """Whether `mode`'s batches must carry `y`: only for a compiled loss that
        tfdist's own step computes (Keras's `fit` lets a model's own step or
        `compute_loss`, or `add_loss` terms alone, train on `x` only)."""
        if mode == "predict" or f"{mode}_step" in self.hooks or "compute_loss" in self.hooks:
            return False
        return model_compile_loss(self.model) is not None

    def prepare(self, data, mode):
        """Builds the model, its metrics and optimizer in the strategy's scope from
        `data`'s element spec, then returns the step functions for `mode`.

        The loops call it before running batches (`fit`, `evaluate` and
        `predict` here, and the parameter-server loop); the step functions are
        built once and kept until the model changes (see `fit`).

        Args:
            data: what will be iterated (anything with an `element_spec`:
                a dataset or distributed dataset of batches).
            mode: `"train"`, `"test"` or `"predict"`.

        Returns:
            The step functions (a step kind, see
            `tfdist.training.step_kinds`).

        Example:

        >>> steps = trainer.prepare(dist_dataset, mode="train")
        >>> ran, logs = steps.train_function(iter(dist_dataset), tf.constant(1))
        """
        spec = per_replica_spec(data.element_spec)
        unpack(spec, need_targets=self._needs_targets(mode))
        with self._variable_scope():
            if mode != "predict":
                # With model_parallel > 1 the optimizer is built once the stages are placed.
                with deferred_build(self.optimizer if self.model_parallel > 1 else None):
                    self._symbolic_build(spec, own_step=f"{mode}_step" in self.hooks)
            elif not self.model.built or not self.model.variables:
                x_spec = keras.utils.unpack_x_y_sample_weight(spec)[0]
                self.model(tf.nest.map_structure(
                    lambda s: keras.KerasTensor(s.shape, s.dtype.name), x_spec))
            if self.model_parallel > 1:
                self._place_stages()  # builds the optimizer on the stages' devices
            elif self.optimizer is not None and not self.optimizer.built:
                self.optimizer.build(self.model.trainable_variables)
        if self.model_parallel == 1 and self.tensor_parallel == 1:
            _check_model_in_scope(self.model, self.strategy)
        if mode == "train" and "train_step" in self.hooks:
            _check_own_optimizers_built(self.model, self.strategy)
        # Building the model above is no change to follow (see _follow_model).
        self._followed = ModelState.of(self.model)
        compile_loss = model_compile_loss(self.model)
        if self._steps is None and compile_loss is not None and not compile_loss.built:
            # predict() before any fit/evaluate: the compiled loss is only
            # built from targets, and prediction does not need it.
            if self._predict_steps is None:
                self._predict_steps = self._step_functions(with_loss=False)
            return self._predict_steps
        if self._steps is None:
            self._steps = self._step_functions()
        return self._steps

    def _symbolic_build(self, spec, own_step):
        """Builds the model, compiled metrics and loss from the data's spec, as
        Keras's `fit` does under a strategy. A model with its own step that
        cannot be called on the data (a GAN, whose `call` is not defined) is
        left as its own step expects it: built from its sub-models."""
        try:
            symbolic_build(self.model, data_batch=spec)
        except (RuntimeError, NotImplementedError):
            if not own_step or not self.model.variables:
                raise

    def _plan_stages(self):
        """The model's `StagePlan` on this worker's stage devices (model_parallel > 1)."""
        plan = plan_stages(self.model, self.model_parallel, self.stage_boundaries)
        return plan.with_devices(stage_devices(self.strategy, self.model_parallel))

    def _place_stages(self):
        """Splits the model into its stages and puts each on its device (model_parallel > 1);
        later, puts metric variables built since then on the last stage's device."""
        if self._stages is not None:
            place_metric_variables(self.model, self._stages[-1].device)
            return
        self.stage_plan = self._plan_stages()
        stages = split_model(self.model, self.stage_plan)
        place_stages(stages, self.model, self.optimizer)
        self._stages = stages

    def _step_functions(self, with_loss=True):
        """The engine's step functions, with the model's own steps where it has them."""
        compile_loss = model_compile_loss(self.model) if with_loss else None
        if self.model_parallel > 1:
            return PipelineStepFunctions(
                self.model, self.optimizer,
                GlobalCompileLoss(compile_loss) if compile_loss is not None else None,
                self.strategy, self._stages, micro_batches=self.micro_batches,
                clip_norm=self.clip_norm, run_eagerly=self.run_eagerly)
        loss = GlobalCompileLoss(compile_loss) if compile_loss is not None else None
        settings = dict(jit_compile=self.jit_compile, grad_accum_steps=self.grad_accum_steps,
                        clip_norm=self.clip_norm, custom_loss="compute_loss" in self.hooks,
                        run_eagerly=self.run_eagerly)
        if self.tensor_parallel > 1:
            return WorkerReplicaStepFunctions(self.model, self.optimizer, loss, self.strategy,
                                              **settings)
        own = [hook for hook in OWN_STEP_HOOKS if hook in self.hooks]
        if own:
            return StepFunctionsWithOwnSteps(self.model, self.optimizer, loss, self.strategy,
                                             own_steps=own, **settings)
        return StepFunctions(self.model, self.optimizer, loss, self.strategy, **settings)


class ModelState(collections.namedtuple(
        "ModelState", ["compile_config", "optimizer", "trainable_variables"])):
    """What a `Trainer`'s step functions were built for: the model's compile
    (Keras makes a new compile configuration at every `compile()`), its optimizer
    and its trainable variables. Compared by identity, so checking costs no
    more than listing the variables.

    Example:

    >>> state = ModelState.of(model)
    >>> model.compile(keras.optimizers.SGD(0.01), "mse")
    >>> state.same_as(ModelState.of(model))
    False
    """

    @classmethod
    def of(cls, model):
        """The model's current state.

        Example:

        >>> ModelState.of(model).optimizer is model.optimizer
        True
        """
        return cls(model_compile_config(model), getattr(model, "optimizer", None),
                   tuple(model.trainable_variables))

    def same_as(self, other):
        """True when both states hold the very same objects.

        Example:

        >>> ModelState.of(model).same_as(ModelState.of(model))
        True
        """
        return (self.compile_config is other.compile_config
                and self.optimizer is other.optimizer
                and len(self.trainable_variables) == len(other.trainable_variables)
                and all(a is b for a, b in zip(self.trainable_variables,
                                               other.trainable_variables)))


def _check_optimizer_knows(model, optimizer):
    """A built optimizer updates only the variables it was built for; a layer
    made trainable after that (fine-tuning) needs a new optimizer, as in Keras."""
    if optimizer is None or not optimizer.built:
        return
    known = {id(v) for opt in optimizer_chain(optimizer)
             for v in optimizer_trainable_variables(opt)}
    if not known:
        return
    unknown = [v.path for v in model.trainable_variables if id(v) not in known]
    if unknown:
        raise ValueError(
            f"The model {model.name!r} has trainable variables that its optimizer "
            f"{optimizer.name!r} was not built for ({', '.join(unknown[:3])}"
            f"{' ...' if len(unknown) > 3 else ''}): a layer was made trainable after the "
            "optimizer started. Compile the model again with a new optimizer inside "
            "strategy.scope() (e.g. model.compile(optimizer=keras.optimizers.SGD(0.01), "
            "loss=..., metrics=...), as Keras's fine-tuning guide does), then call fit "
            "again.")


def _can_position(train):
    """Whether the training input can start at a data position itself (duck-typed:
    `tfdist.data`'s `DatasetFn` has `can_position` and `positioned`)."""
    return bool(getattr(train, "can_position", False)) and callable(
        getattr(train, "positioned", None))


def _is_parameter_server(strategy):
    return isinstance(strategy, tf.distribute.experimental.ParameterServerStrategy)


_ARRAY_DEFAULTS = {"y": None, "batch_size": None, "validation_split": 0.0, "shuffle": True,
                   "class_weight": None, "sample_weight": None, "validation_batch_size": None}


def _refuse_array_arguments(method, **given):
    """Under parameter_server the inputs are datasets: array-only arguments are refused."""
    def is_default(value, default):
        return value is default or (default is not None and isinstance(value, (bool, float))
                                    and value == default)

    used = [name for name, value in given.items() if not is_default(value, _ARRAY_DEFAULTS[name])]
    if used:
        raise ValueError(
            f"{method}({', '.join(f'{name}=...' for name in used)}) is not supported under "
            "parameter_server, where every worker reads its own dataset: pass x as a "
            "tf.data.Dataset of batches (or a function input_context -> dataset) that "
            "carries targets, weights and shuffling itself, with steps_per_epoch for fit.")


def _warn_unused_validation_arguments(**arguments):
    """Warns about validation arguments given to a `fit` without validation data
    (Keras's `fit` ignores them silently)."""
    given = [f"{name}={value!r}" for name, value in arguments.items() if value is not None]
    if given:
        warnings.warn(
            f"{', '.join(given)} has no effect: this fit has no validation data. Pass "
            "validation_data= (or validation_split= with arrays), or drop the argument.",
            UserWarning, stacklevel=3)


def _check_positive_int(name, value, allow_zero=False):
    check_int_at_least(name, value, 0 if allow_zero else 1)


def _check_model_in_scope(model, strategy):
    outside = variables_outside_scope(model.variables, strategy)
    if outside:
        raise ValueError(
            f"The model {model.name!r} was built outside the scope of the trainer's "
            f"strategy ({type(strategy).__name__}): its variables {outside[:5]}"
            f"{' ...' if len(outside) > 5 else ''} are not distributed by it. Create "
            "and build the model inside `with strategy.scope():` (the same strategy "
            "you give the Trainer), or pass strategy= the strategy it was built under.")


def _check_own_optimizers_built(model, strategy):
    """Optimizers a model keeps in its own attributes (a GAN's `d_optimizer`)
    create their variables at their first `apply`, inside the step; under
    several replicas TensorFlow cannot do that inside a replica, so they must
    be built first."""
    if strategy.num_replicas_in_sync == 1:
        return
    unbuilt = [name for name, value in vars(model).items()
               if isinstance(value, keras.optimizers.Optimizer) and not value.built
               and value is not model.optimizer]
    if unbuilt:
        owner = type(model).__name__
        calls = "; ".join(f"model.{name}.build(<the variables it updates>)" for name in unbuilt)
        raise ValueError(
            f"{owner}.train_step uses the optimizer(s) {', '.join(unbuilt)}, which are not "
            f"built yet. Under {strategy.num_replicas_in_sync} replicas an optimizer cannot "
            "create its variables inside the replicated step; build it first, inside "
            f"strategy.scope(): {calls} (e.g. model.d_optimizer.build("
            "model.discriminator.trainable_variables)).")


def _model_strategy(model):
    """The strategy the model was created under, else the active one."""
    strategy = model_strategy(model)
    return strategy if strategy is not None else tf.distribute.get_strategy()
