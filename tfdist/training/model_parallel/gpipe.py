"""Pipelined (GPipe) train / test / predict steps for a model split into stages.

The model's layers are split into K stages on K devices of one worker
(`tfdist.training.model_parallel.stages`, `tfdist.training.model_parallel.placement`). One training step:

1. The worker's batch is cut into M micro-batches (sizes differ by at most
   one row; a short last batch is cut the same way).
2. **Forward**: micro-batch m runs through stage 0, 1, ..., K-1, each stage's
   ops under `tf.device(<stage device>)` and recorded by a tape of its own
   (one per micro-batch and stage). The last stage also computes the
   micro-batch's loss terms (numerator `n_m` and count `c_m` of each compiled
   loss, see `GlobalCompileLoss`) and updates the metrics.
3. **Backward**: for every micro-batch, from stage K-1 down to 0, the stage's
   tape gives the gradients of its variables and of its inputs, given the
   gradients of its outputs that the later stages sent back (under the
   stage's device: the backward of a stage runs where its forward ran).
   What is differentiated is the micro-batch's mean loss plus its
   regularisation, `J_m = sum_k w_k n_k / c_k + R_m`, weighted by
   `c_m / C` (`C = sum_m c_m` on this worker): the magnitudes that flow
   between the stages are those of one replica's gradient, which matters
   for float16 loss scaling.
4. Each stage sums its micro-batches' gradients on its device and
   multiplies the sum by `C`, which makes it `sum_m (dn_m + c_m dR_m)`;
   with several workers these sums (and the loss statistics) are
   all-reduced once per step (`MultiWorkerMirroredStrategy`, one replica
   per worker); they are divided once by `D = sum c` over all micro-batches
   and workers, which gives exactly the gradient of the loss one device
   computes on the whole batch: a sum of numerators over a sum of counts,
   not a mean of micro-batch means, with the regularisation weighted by
   `c_m / D`, which adds up to 1: counted once. The result is clipped by
   its global norm if asked (each stage's squared norm computed on its
   device) and applied by the optimizer once, each variable's update on
   that variable's device (`placement.updates_on_variable_devices`).

**Schedule: GPipe** (all forwards, then all backwards, gradients summed over
micro-batches, one synchronous optimizer step), not 1F1B. Both compute the
same update; they differ in the order of the work and in memory: GPipe keeps
the activations of all M micro-batches (together one batch, as much as
training without a pipeline keeps), 1F1B interleaves each stage's forwards
and backwards to keep at most K micro-batches alive. GPipe is the simpler
order and needs no more memory than the model without a split, so it is the
one here. In a TensorFlow graph, ops on different devices that do not depend
on each other run at the same time, but the executor starts *any* ready op:
on CPUs, where the logical devices share one thread pool, it filled the pool
with several micro-batches of one stage and the stages barely overlapped
(measured on 2 cores: 7% of the step with both stages busy, a bubble of 48%
where GPipe's formula says 20%). So each stage's units of work are chained
in the order a device stream runs them (`_after`): forward of micro-batch
0, 1, ..., M-1, then the backwards from M-1 down to 0, GPipe's per-device
order. What runs at the same time is then different stages, stage s on
micro-batch m+1 beside stage s+1 on micro-batch m (measured: 60% overlap,
bubble 22%). `tfdist bench model-parallel` measures both.

Because every worker holds one copy of every stage (plain variables on its
own devices), data parallelism combines across workers only:
`MultiWorkerMirroredStrategy` with one device per worker. Data parallelism
across devices *of one worker* (say 4 devices = 2 replicas x 2 stages) is
refused: `MirroredStrategy` runs each replica under one device and mirrors
every variable over exactly its replica devices, so a replica cannot own a
stage on another device (see `check_pipeline_settings`).

Example:

    steps = PipelineStepFunctions(model, model.optimizer, loss, strategy, stages,
                                  micro_batches=4, clip_norm=None)
    ran, logs = steps.train_function(iter(dataset), tf.constant(10))
"""

import contextlib
import warnings

import tensorflow as tf

from tfdist.seam import get_keras_mask, model_loss_tracker, set_keras_mask
from tfdist.training.across_workers import gather_across_workers, sum_across_workers, this_workers
from tfdist.training.inputs import unpack
from tfdist.training.metrics_sync import global_metric_results
from tfdist.training.optimizer import (divide_gradient, gradients_already_summed,
                                       learning_rate_evaluated_once, loss_scale, scale_gradient,
                                       sum_gradient_parts)
from tfdist.training.model_parallel.placement import outside_strategy_scopes, updates_on_variable_devices
from tfdist.training.model_parallel.stages import flat_inputs, model_input_keys, model_output_keys, pack_outputs
from tfdist.training.step import compile_step_functions, run_steps
from tfdist.training.step_kinds import FitLoopSteps, LossStatsLayout
from tfdist.runtime.argtypes import check_int_at_least

MICRO_BATCHES_PER_STAGE = 2
"""Default micro-batches per step: `2 * model_parallel` (see `default_micro_batches`)."""


def default_micro_batches(model_parallel):
    """The default number of micro-batches: `2 * model_parallel`.

    GPipe's bubble, the share of device time idle while the pipeline fills
    and drains, is `(K - 1) / (M + K - 1)`: 20% at K=2, M=4. More
    micro-batches shrink it but make each matmul smaller (less efficient per
    row on CPUs and GPUs alike) and add per-op overhead, so 2K is a middle
    ground; raise it with large batches.

    Example:

    >>> default_micro_batches(2)
    4
    """
    return MICRO_BATCHES_PER_STAGE * model_parallel


def check_model_parallel_arguments(model_parallel, micro_batches, stage_boundaries):
    """Validates the Trainer's model-parallel arguments; returns `(K, M, boundaries)`.

    Args:
        model_parallel: stages per model replica, an integer >= 1.
        micro_batches: micro-batches per step, an integer >= 1, or None for
            `default_micro_batches(K)` (must be None when K is 1).
        stage_boundaries: None, or the K-1 layer names where stages 1..K-1
            begin (must be None when K is 1).

    Raises:
        ValueError: a value out of range, or a pipeline argument without
            `model_parallel > 1`.

    Example:

    >>> check_model_parallel_arguments(2, None, None)
    (2, 4, None)
    """
    for name, value in (("model_parallel", model_parallel), ("micro_batches", micro_batches)):
        if value is not None:
            check_int_at_least(name, value, 1)
    if model_parallel == 1:
        if micro_batches is not None:
            raise ValueError(
                f"micro_batches={micro_batches} applies only to a model split over devices "
                "(model_parallel > 1). For several batches per optimizer step on one device "
                "use grad_accum_steps.")
        if stage_boundaries:
            raise ValueError(
                f"stage_boundaries={stage_boundaries!r} splits the model into "
                f"{len(stage_boundaries) + 1} stages, but model_parallel=1; pass "
                f"model_parallel={len(stage_boundaries) + 1}.")
        return 1, 1, None
    return int(model_parallel), int(micro_batches or default_micro_batches(model_parallel)), (
        list(stage_boundaries) if stage_boundaries is not None else None)


def check_pipeline_settings(model, hooks, strategy, *, model_parallel, jit_compile,
                            grad_accum_steps):
    """Refuses, by name, what the pipelined step cannot honour.

    Args:
        model: the `keras.Model`.
        hooks: `tfdist.training.model_hooks.own_hooks(model)`.
        strategy: the trainer's strategy.
        model_parallel: K > 1.
        jit_compile, grad_accum_steps: the trainer's settings.

    Raises:
        ValueError: the model's own train/test/predict step or
            compute_loss (the split cannot see inside them), XLA, gradient
            accumulation, a parameter-server strategy, or several replicas
            per worker; each message says the way out.

    Example:

    >>> check_pipeline_settings(model, {}, tf.distribute.get_strategy(), model_parallel=2,
    ...                         jit_compile=False, grad_accum_steps=1)
    """
    from tfdist.distribute.introspection import num_workers  # pylint: disable=import-outside-toplevel

    if hooks:
        names = ", ".join(f"{cls.__name__}.{hook}" for hook, cls in hooks.items())
        raise ValueError(
            f"model_parallel={model_parallel} cannot run the model's own {names}: the "
            "pipeline runs the model stage by stage, micro-batch by micro-batch, and cannot "
            "split code inside a custom step or loss. Remove the override (compile the loss "
            "instead), or train with model_parallel=1.")
    if jit_compile:
        raise ValueError(
            f"jit_compile=True is not supported with model_parallel={model_parallel}: XLA "
            "compiles one function on one device, while each pipeline stage runs on its own "
            "device and its backward waits for the later stages. Pass jit_compile=False "
            "(the recipes' --xla off), or train with model_parallel=1 to use XLA.")
    if grad_accum_steps > 1:
        raise ValueError(
            f"grad_accum_steps={grad_accum_steps} is not supported with model_parallel="
            f"{model_parallel}: every pipelined step already sums the gradients of its "
            "micro-batches before one optimizer update. For a larger effective batch, raise "
            "the batch size (and micro_batches with it).")
    if isinstance(strategy, tf.distribute.experimental.ParameterServerStrategy):
        raise ValueError(
            f"model_parallel={model_parallel} is not supported under ParameterServerStrategy "
            "(variables on parameter servers, asynchronous steps). Use the default strategy "
            "on one worker, or MultiWorkerMirroredStrategy with one device per worker.")
    workers = num_workers(strategy)
    if strategy.num_replicas_in_sync != workers:
        per_worker = strategy.num_replicas_in_sync // max(workers, 1)
        raise ValueError(
            f"model_parallel={model_parallel} needs one model replica per worker, but "
            f"{type(strategy).__name__} has {per_worker} replicas on each worker "
            f"({strategy.num_replicas_in_sync} in all). Data parallelism across the devices "
            "of one worker (e.g. 4 devices = 2 replicas x 2 stages) is not possible with "
            "TensorFlow's strategies: MirroredStrategy runs each replica under one device "
            "and mirrors every variable over exactly its replica devices, so no replica can "
            "hold a stage on another device. Ways out: the default strategy (or "
            "OneDeviceStrategy, MirroredStrategy over one device) on one worker, "
            "MultiWorkerMirroredStrategy with one device per worker for data parallelism "
            "across workers, or model_parallel=1 for data parallelism across devices.")


class PipelineStepFunctions(FitLoopSteps):
    """The Trainer's step functions for a model split into pipeline stages.

    Same contract as `tfdist.training.step.StepFunctions`, so the Trainer's
    loop, callbacks, metrics logging and backups work unchanged. Build it
    after `tfdist.training.model_parallel.placement.place_stages` has put the stages'
    variables on their devices.

    Args:
        model: the compiled, built `keras.Model` (its layers are the stages').
        optimizer: the built optimizer (`model.optimizer`).
        loss: a `GlobalCompileLoss`, or None (prediction only, or a model with
            only `add_loss` terms).
        strategy: the trainer's strategy (one replica per worker).
        stages: the `StageGraph`s from `tfdist.training.model_parallel.stages.split_model`.
        micro_batches: M, micro-batches per step (>= 1).
        clip_norm: clip the summed gradient to this global norm, or None.
        run_eagerly: run the functions eagerly (no `tf.function`).

    Attributes:
        train_function: `f(iterator, num_steps) -> (steps_run, logs)`.
        test_function: `f(iterator, num_steps) -> (steps_run, logs)`.
        predict_function: `f(distributed_batch) -> outputs` (all workers
            gathered, in input order).
        skip_function: `f(iterator, num_batches) -> batches_skipped`.
        accumulator: None (no gradient accumulation across steps).

    A `tfdist.training.step_kinds.FitLoopSteps`, whose `reset_accumulation`
    (nothing to drop) and `at_update_boundary` (always True: every pipelined
    step ends with its optimizer update) it takes.

    Example:

    >>> steps = PipelineStepFunctions(model, model.optimizer,
    ...                               GlobalCompileLoss(seam.model_compile_loss(model)), strategy,
    ...                               stages, micro_batches=4, clip_norm=None)
    >>> ran, logs = steps.train_function(iter(dataset), tf.constant(3))
    """

    def __init__(self, model, optimizer, loss, strategy, stages, *, micro_batches, clip_norm,
                 run_eagerly=False):
        from tfdist.distribute.introspection import num_workers  # pylint: disable=import-outside-toplevel

        self.model = model
        self.optimizer = optimizer
        self.loss = loss
        self.strategy = strategy
        self.stages = list(stages)
        self.micro_batches = micro_batches
        self.clip_norm = clip_norm
        self.accumulator = None
        self.workers = num_workers(strategy)
        self.normalized = loss is None or loss.normalized
        self.loss_stats = LossStatsLayout(1 if loss is None else len(loss.losses))
        self._sum_weight = 1.0 / (micro_batches * self.workers)
        # The weight of a non-last stage's regularisation in J_m (see `_loss_terms`).
        self._reg_factor = 1.0 if self.normalized else self._sum_weight
        self._input_keys = model_input_keys(model)
        self._output_keys = model_output_keys(model)
        (self.train_function, self.test_function, self.predict_function,
         self.skip_function) = compile_step_functions(
            self._train_loop, self._test_loop, self._predict_batch, run_eagerly=run_eagerly)


    # ---------------------------------------------------------------- forward
    def _local(self, data):
        """This worker's tensors of a (distributed) batch."""
        return this_workers(self.strategy, data)

    def _micro_batches(self, x, y, sample_weight):
        """Cuts the batch into M micro-batches of sizes differing by at most one."""
        size = tf.shape(tf.nest.flatten(x)[0])[0]
        parts = []
        for m in range(self.micro_batches):
            start = (size * m) // self.micro_batches
            end = (size * (m + 1)) // self.micro_batches
            cut = lambda t, s=start, e=end: t[s:e]  # noqa: E731
            parts.append(tuple(None if part is None else tf.nest.map_structure(cut, part)
                               for part in (x, y, sample_weight)))
        return parts

    def _forward(self, index, x, y, sample_weight, training, record, streams, with_loss=True):
        """Runs one micro-batch through every stage; returns what the backward needs.

        `streams[s]` holds what stage s computed last: this micro-batch's work
        on stage s starts after it (see `_after`), and replaces it.
        """
        env = dict(zip(self._input_keys, flat_inputs(self.model, x)))
        model_inputs = set(self._input_keys)
        result = {"tapes": [], "watched": [], "outputs": [], "regs": [], "local": []}
        last = len(self.stages) - 1
        for stage in self.stages:
            with tf.device(stage.device), tf.name_scope(f"stage_{stage.index}/forward_{index}"):
                local = _after(streams[stage.index], {
                    key: env[key] for key in stage.input_keys + stage.loss_keys})
                inputs = [local[key] for key in stage.input_keys]
                watched = [key for key in stage.input_keys + stage.loss_keys
                           if local[key].dtype.is_floating and key not in model_inputs]
                tape = tf.GradientTape() if record else contextlib.nullcontext()
                with tape:
                    if record:
                        tape.watch([local[key] for key in watched])
                    with warnings.catch_warnings():
                        # Keras warns that a Functional stage "destroys" the mask of its
                        # inputs; its layers keep computing and attaching masks
                        # themselves, so the outputs carry them (tested).
                        warnings.filterwarnings("ignore", message=".*input with a mask attached")
                        outputs = stage.model(inputs, training=training)
                    outputs = list(outputs) if isinstance(outputs, (list, tuple)) else [outputs]
                    env.update(zip(stage.output_keys, outputs))
                    reg = _regularization(stage.model)
                    if stage.index == last:
                        values = {**env, **local}  # earlier stages' outputs: the watched copies
                        y_pred = pack_outputs(self.model,
                                              [values[key] for key in self._output_keys])
                        if with_loss:
                            regs = [r for r in result["regs"] if r is not None]
                            regs += [reg] if reg is not None else []
                            objective, weight, stats = self._loss_terms(
                                x, y, y_pred, sample_weight, reg, regs)
                            result.update(objective=self.optimizer.scale_loss(objective)
                                          if record else objective, weight=weight, stats=stats)
                        result["y_pred"] = y_pred
                if stage.index == last and with_loss and y is not None:
                    self.model.compute_metrics(x, y, result["y_pred"], sample_weight=sample_weight)
            streams[stage.index] = outputs + ([result["objective"]] if stage.index == last
                                              and "objective" in result else [])
            result["tapes"].append(tape)
            result["watched"].append(watched)
            result["outputs"].append(outputs)
            result["regs"].append(reg)
            result["local"].append(local)
        return result

    def _loss_terms(self, x, y, y_pred, sample_weight, reg_last, regs):
        """The micro-batch's local objective `J_m` for the last stage, its weight `c_m` and
        its statistics.

        `J_m` is the micro-batch's own mean loss plus regularisation. The
        backward differentiates `J_m` weighted by `c_m / C` (`C = sum_m c_m`
        on this worker), so that what flows between the stages (in float16
        under `mixed_float16`) has the magnitude of one replica's gradient of
        its mean loss, and each stage multiplies its summed variable gradients
        by `C` (in their own dtype) before the cross-worker sum and the
        division by `D`. For `"sum"` losses `J_m = sum_k w_k n_k + R / (M *
        workers)`, with weight 1 and no division.
        """
        examples = tf.cast(tf.shape(tf.nest.flatten(x)[0])[0], tf.float32)
        reg_total = tf.add_n([tf.identity(r) for r in regs]) if regs else tf.zeros(())
        reg_last = reg_last if reg_last is not None else tf.zeros(())
        if self.loss is None:
            if not self.model.losses and not regs:
                raise ValueError(
                    f"No loss to compute for the model {self.model.name!r}: it was compiled "
                    "without a loss and has no add_loss() terms. Pass loss= to "
                    "model.compile() (or to the Trainer).")
            stats = self.loss_stats.build([tf.zeros(())], [examples], examples,
                                          examples * reg_total, examples)
            return reg_last, examples, stats
        terms = self.loss.local_terms(y, y_pred, sample_weight)
        self._check_proportional(terms)
        weights = self.loss.weights
        if self.normalized:
            weight = terms[0].count
            objective = tf.add_n([w * tf.math.divide_no_nan(t.numerator, t.count)
                                  for w, t in zip(weights, terms)]) + reg_last
        else:
            weight = tf.constant(self._sum_weight, tf.float32)
            objective = tf.add_n([w * t.numerator for w, t in zip(weights, terms)]) + (
                weight * reg_last)
        stats = self.loss_stats.build([t.numerator for t in terms], [t.count for t in terms],
                                      weight, weight * reg_total, examples)
        return objective, weight, stats

    def _check_proportional(self, terms):
        """Several losses share one weight per micro-batch: exact only for counts
        proportional to the batch (see `StepFunctions`)."""
        if len(terms) < 2 or not self.normalized or (self.micro_batches == 1
                                                      and self.workers == 1):
            return
        for name, term in zip(self.loss.names, terms):
            if term.kind not in ("size", "one"):
                raise ValueError(
                    f"The compiled loss for output {name!r} divides by a count that depends "
                    f"on the data, and the model has {len(terms)} compiled losses: over "
                    f"{self.micro_batches} micro-batches x {self.workers} worker(s) tfdist "
                    "reduces several losses exactly only when each one's count is "
                    "proportional to the batch. Give that loss reduction="
                    "'sum_over_batch_size' without a mask, or use micro_batches=1.")

    # --------------------------------------------------------------- backward
    def _backward(self, index, forward, scale, streams, share):
        """Gradients of every stage's variables for one micro-batch, stage by stage
        (each stage's work after what `streams` says it computed last), of the
        micro-batch's objective weighted by `share` (see `_loss_terms`)."""
        upstream = {}
        grads = [None] * len(self.stages)
        last = len(self.stages) - 1
        for stage in reversed(self.stages):
            s = stage.index
            with tf.device(stage.device), tf.name_scope(f"stage_{s}/backward_{index}"):
                targets, seeds = [], []
                if s == last:
                    targets.append(forward["objective"])
                    seeds.append(tf.ones_like(forward["objective"]) * share)
                else:
                    for key, tensor in zip(stage.output_keys, forward["outputs"][s]):
                        if upstream.get(key) is not None:
                            targets.append(tensor)
                            seeds.append(tf.cast(upstream[key], tensor.dtype))
                    reg = forward["regs"][s]
                    if reg is not None:
                        targets.append(reg)
                        seeds.append(tf.cast(self._reg_factor * scale * share, reg.dtype))
                if not targets:
                    continue
                seeds = list(_after(streams[s], dict(enumerate(seeds))).values())
                watched = forward["watched"][s]
                sources = list(stage.trainable_variables) + [forward["local"][s][k]
                                                             for k in watched]
                result = forward["tapes"][s].gradient(targets, sources, output_gradients=seeds)
                streams[s] = [_values(g) for g in result if g is not None]
                count = len(stage.trainable_variables)
                grads[s] = result[:count]
                for key, grad in zip(watched, result[count:]):
                    if grad is None:
                        continue
                    grad = tf.convert_to_tensor(grad)
                    upstream[key] = grad if upstream.get(key) is None else upstream[key] + grad
        return grads

    def _stage_sums(self, per_micro_batch, factor):
        """Sums each stage's gradients over the micro-batches, times `factor` (None: 1),
        on the stage's device."""
        sums = []
        for stage in self.stages:
            with tf.device(stage.device), tf.name_scope(f"stage_{stage.index}/sum"):
                stage_sums = []
                for i in range(len(stage.trainable_variables)):
                    parts = [grads[stage.index][i] for grads in per_micro_batch
                             if grads[stage.index] is not None
                             and grads[stage.index][i] is not None]
                    total = sum_gradient_parts(parts)
                    stage_sums.append(scale_gradient(total, factor) if factor is not None
                                      else total)
                sums.append(stage_sums)
        return sums

    # ------------------------------------------------------------------ steps
    def _train_step(self, data):
        x, y, sample_weight = unpack(self._local(data), need_targets=False)
        scale = loss_scale(self.optimizer)
        sums, stats = self._pipeline_gradients(x, y, sample_weight, scale)
        summed, totals = self._global_gradients(sums, stats)
        if self.clip_norm is not None:
            summed = self._clip(summed, self.clip_norm * scale)
        by_variable = {id(v): g for stage, grads in zip(self.stages, summed)
                       for v, g in zip(stage.trainable_variables, grads)}
        variables = self.model.trainable_variables
        self.optimizer.apply([by_variable.get(id(v)) for v in variables], variables)
        self._record_loss(totals, self.loss_stats.examples(stats))

    def _pipeline_gradients(self, x, y, sample_weight, scale):
        """The GPipe schedule on this worker's batch: every micro-batch's forward,
        then the backwards; returns each stage's summed gradients (times `C`) and
        the summed loss statistics."""
        streams = [[] for _ in self.stages]
        forwards = [self._forward(m, *part, training=True, record=True, streams=streams)
                    for m, part in enumerate(self._micro_batches(x, y, sample_weight))]
        total = None
        shares = [1.0] * len(forwards)
        if self.normalized:
            with tf.device(self.stages[-1].device):
                total = tf.add_n([forward["weight"] for forward in forwards])
                shares = [tf.math.divide_no_nan(forward["weight"], total) for forward in forwards]
        per_micro_batch = [None] * len(forwards)
        for m in reversed(range(len(forwards))):  # GPipe: the last micro-batch's backward first
            per_micro_batch[m] = self._backward(m, forwards[m], scale, streams, shares[m])
        with tf.device(self.stages[-1].device):
            stats = tf.add_n([forward["stats"] for forward in forwards])
        return self._stage_sums(per_micro_batch, total), stats

    def _global_gradients(self, sums, stats):
        """All-reduces the stages' sums and the statistics across workers and divides
        by `D`, each stage on its device; returns `(gradients by stage, totals)`."""
        flat = [g for stage in sums for g in stage if g is not None]
        reduced = self._sum_across_workers(flat + [self.loss_stats.summed(stats)])
        totals = reduced[-1]
        divisor = self.loss_stats.weight(totals) if self.normalized else None
        position, summed = 0, []
        for stage, stage_sums in zip(self.stages, sums):
            with tf.device(stage.device), tf.name_scope(f"stage_{stage.index}/scale"):
                out = []
                for g in stage_sums:
                    if g is None:
                        out.append(None)
                        continue
                    g = reduced[position]
                    position += 1
                    out.append(divide_gradient(g, divisor) if divisor is not None else g)
                summed.append(out)
        return summed, totals

    def _clip(self, grads_by_stage, clip):
        """Clips by the global norm over all stages; each stage's squared norm on its device."""
        squares = []
        for stage, grads in zip(self.stages, grads_by_stage):
            present = [g for g in grads if g is not None]
            if present:
                with tf.device(stage.device):
                    # A sparse gradient's norm over its slices, as tf.clip_by_global_norm
                    # (the one-device step's) takes it.
                    squares.append(tf.add_n([
                        tf.reduce_sum(tf.square(tf.cast(_values(g), tf.float32)))
                        for g in present]))
        norm = tf.sqrt(tf.add_n(squares))
        factor = clip * tf.minimum(1.0 / norm, 1.0 / clip)
        clipped = []
        for stage, grads in zip(self.stages, grads_by_stage):
            with tf.device(stage.device):
                clipped.append([scale_gradient(g, factor) for g in grads])
        return clipped

    def _sum_across_workers(self, tensors):
        """One all-reduce (SUM) of `tensors` across the workers (identity on one)."""
        if self.workers == 1:
            return tensors
        return sum_across_workers(self.strategy, list(tensors))

    def _test_step(self, data):
        x, y, sample_weight = unpack(self._local(data), need_targets=False)
        streams = [[] for _ in self.stages]
        forwards = [self._forward(m, *part, training=False, record=False, streams=streams)
                    for m, part in enumerate(self._micro_batches(x, y, sample_weight))]
        with tf.device(self.stages[-1].device):
            stats = tf.add_n([forward["stats"] for forward in forwards])
        totals = self._sum_across_workers([self.loss_stats.summed(stats)])[0]
        self._record_loss(totals, self.loss_stats.examples(stats))

    def _global_loss(self, totals):
        """`(total loss, per-loss values)` of the global batch from summed statistics."""
        weights = [1.0] * self.loss_stats.num_losses if self.loss is None else self.loss.weights
        return self.loss_stats.global_loss(totals, weights, self.normalized)

    def _record_loss(self, totals, examples):
        with tf.device(self.stages[-1].device):
            loss_value, per_loss = self._global_loss(totals)
            model_loss_tracker(self.model).update_state(loss_value, sample_weight=examples)
            if self.loss is not None:
                for tracker, value in zip(self.loss.trackers, per_loss):
                    tracker.update_state(value)

    def _metric_results(self):
        if self.workers == 1:
            return self.model.get_metrics_result()
        return global_metric_results(self.model, self.strategy)

    # ------------------------------------------------------------------ loops
    def _loop(self, step, iterator, num_steps):
        return run_steps(step, iterator, num_steps), self._metric_results()

    def _train_loop(self, iterator, num_steps):
        with outside_strategy_scopes(), gradients_already_summed(self.optimizer), \
                learning_rate_evaluated_once(self.optimizer), \
                updates_on_variable_devices(self.optimizer):
            return self._loop(self._train_step, iterator, num_steps)

    def _test_loop(self, iterator, num_steps):
        with outside_strategy_scopes():
            return self._loop(self._test_step, iterator, num_steps)


    def _predict_batch(self, data):
        with outside_strategy_scopes():
            x, _, _ = unpack(self._local(data), need_targets=False)
            parts = self._micro_batches(x, None, None)
            streams = [[] for _ in self.stages]
            outputs = [self._forward(m, part[0], None, None, training=False, record=False,
                                     streams=streams, with_loss=False)["y_pred"]
                       for m, part in enumerate(parts)]
            with tf.device(self.stages[-1].device):
                joined = tf.nest.map_structure(lambda *t: tf.concat(t, axis=0), *outputs)
            if self.workers == 1:
                return joined
            return gather_across_workers(self.strategy, joined)


def _after(previous, tensors):
    """`tensors` (a dict) as copies that wait for `previous` (a list of tensors).

    A device runs its work in order; TensorFlow's executor runs any ready
    op. Chaining each stage's units of work (forward of micro-batch 0, 1,
    ..., then the backwards) through these waits gives every stage the order
    of a device stream, so that what runs at the same time is *different
    stages* (the pipeline) rather than several micro-batches of one stage:
    on CPUs the logical devices share one thread pool, and without the chain
    it fills with one stage's micro-batches. Keras masks are carried over.
    """
    if not previous:
        return dict(tensors)
    with tf.control_dependencies(previous):
        copies = {}
        for key, tensor in tensors.items():
            copy = tf.identity(tensor)
            mask = get_keras_mask(tensor)
            if mask is not None:
                set_keras_mask(copy, mask)
            copies[key] = copy
        return copies


def _regularization(stage_model):
    """The stage's losses of its last call (weight regularisers, `add_loss`), or None."""
    losses = stage_model.losses
    if not losses:
        return None
    return tf.add_n([tf.cast(tf.reduce_sum(loss), tf.float32) for loss in losses])


def _values(gradient):
    return gradient.values if isinstance(gradient, tf.IndexedSlices) else gradient
