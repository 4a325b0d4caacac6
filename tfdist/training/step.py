"""The distributed train / test / predict steps (what runs inside the loop).

One training step, per replica:

1. *Replica computation* (optionally one XLA cluster: `tf.function(
   jit_compile=True)` around this part only): forward pass, the replica's
   loss numerator `n` and count `c` (see `GlobalLoss`), regularisation `R`,
   and the gradient of the local objective `J = n / c + R`, scaled by the
   optimizer's loss scale and multiplied back by `c`. So each replica returns
   `c * dJ = dn + c * dR`, free of any per-replica normalisation.
2. *All-reduce* (outside XLA): one `ReplicaContext.all_reduce(SUM)` of the
   gradients together with the statistics `[n, c, c * R]`. Dividing by
   `D = sum(c)` gives `d(sum(n) / D) + sum(c / D * dR)`: exactly the gradient
   of the single-device loss on the global batch, with the regularisation
   counted once (its per-replica weights `c / D` add up to 1).
3. *Global-norm clipping* of the summed gradient, then `optimizer.apply` with
   the optimizer's own cross-replica sum disabled
   (`gradients_already_summed`), so the gradients are summed exactly once and
   `LossScaleOptimizer` unscales, skips non-finite steps and adjusts its scale
   identically on every replica.

With gradient accumulation over K micro-batches, step 1 runs every
micro-batch and adds into per-replica float32 buffers; steps 2-3 run once per
K micro-batches on the sums, which gives the gradient of one step on the
K-times larger batch and advances `optimizer.iterations` by one.

For `"sum"` losses the divisor is 1, `J = n + R / (K * N)` and the gradients
are not multiplied by `c`.

Several compiled losses (one per output, `loss_weights` w_k): each has its
own numerator and count, all carried in the statistics, and the replica
objective is `J = sum_k w_k n_k / c_k + R` with the weight `c = c_1`. That is
exactly the global `sum_k w_k N_k / C_k` when every loss's count is the same
multiple of the batch on every replica (no mask, no sample-weighted mean);
otherwise, with more than one replica or accumulation step, the step refuses
the model with an error naming the loss. A model's own `compute_loss` gives
the replica's mean loss `L`, weighted by its number of examples (`n = L * e`,
`c = e`).
"""

import tensorflow as tf

from tfdist.seam import (default_strategy, get_keras_mask, install_exact_bfloat16_bias_gradients,
                         model_loss_tracker, model_loss_value, set_keras_mask)
from tfdist.training.accumulate import GradientAccumulator
from tfdist.training.inputs import unpack
from tfdist.training.metrics_sync import global_metric_results
from tfdist.training.model_hooks import keras_losses_unscaled
from tfdist.training.optimizer import (divide_gradient, gradients_already_summed,
                                       learning_rate_evaluated_once, loss_scale, scale_gradient)
from tfdist.training.step_kinds import LossStatsLayout

# bfloat16 bias gradients summed in float32 (TensorFlow's CPU kernel sums them in bfloat16).
install_exact_bfloat16_bias_gradients()


class StepFunctions:
    """Builds the compiled train, test and predict functions of a `Trainer`.

    The model, optimizer and compiled metrics must already be built inside
    `strategy.scope()`.

    The loss of one step is the model's compiled loss (`GlobalCompileLoss`:
    one loss or one per output, with `loss_weights`) plus its regularisation
    losses, reduced over the global batch; or, when the model overrides
    `compute_loss`, that method's value (see `tfdist.training.model_hooks`).
    Several compiled losses must have counts proportional across replicas
    (no Keras mask, no `"mean_with_sample_weight"` with sample weights) when
    there is more than one replica or accumulation step; otherwise the step
    raises a `ValueError` that names the loss.

    Args:
        model: the compiled, built `keras.Model` (its `compute_metrics`
            updates the metrics and its loss tracker records the loss).
        optimizer: the built optimizer (`model.optimizer`).
        loss: a `GlobalCompileLoss`, or None when the model's own
            `compute_loss` gives the loss (or it has only `add_loss` terms).
        strategy: the `tf.distribute.Strategy`.
        jit_compile: compile the replica computation with XLA.
        grad_accum_steps: micro-batches per optimizer step (>= 1).
        clip_norm: clip the summed gradient to this global norm, or None.
        custom_loss: call the model's own `compute_loss`.
        run_eagerly: run the functions eagerly (no `tf.function`).

    Attributes:
        train_function: `f(iterator, num_steps) -> (steps_run, logs)`.
        test_function: `f(iterator, num_steps) -> (steps_run, logs)`.
        predict_function: `f(distributed_batch) -> outputs` (all replicas and
            workers gathered, in input order).
        skip_function: `f(iterator, num_batches) -> batches_skipped`: draws
            and discards batches (to resume at a data position).
        compute_gradients: `f(x, y, sample_weight) -> (grads, stats, y_pred,
            mask)`, the replica computation (forward, loss, backward; XLA
            when `jit_compile`); call it inside `strategy.run`.
        loss_stats: the `LossStatsLayout` of the statistics carried next to
            the gradients.

    A `tfdist.training.step_kinds.FitLoopSteps` and `ReplicaSteps`.

    Example:

    >>> steps = StepFunctions(model, model.optimizer, GlobalCompileLoss(seam.model_compile_loss(model)),
    ...                       strategy, jit_compile=False, grad_accum_steps=1, clip_norm=None)
    >>> ran, logs = steps.train_function(iter(dist_dataset), tf.constant(10))
    """

    def __init__(self, model, optimizer, loss, strategy, *, jit_compile, grad_accum_steps,
                 clip_norm, custom_loss=False, run_eagerly=False):
        self.model = model
        self.optimizer = optimizer
        self.loss = loss
        self.custom_loss = custom_loss
        self.strategy = strategy
        self.grad_accum_steps = grad_accum_steps
        self.clip_norm = clip_norm
        self.normalized = custom_loss or loss is None or loss.normalized
        # Statistics carried next to the gradients (see LossStatsLayout).
        self.loss_stats = LossStatsLayout(
            1 if (custom_loss or loss is None) else len(loss.losses))
        self._sum_weight = 1.0 / (grad_accum_steps * strategy.num_replicas_in_sync)
        # One replica, no accumulation: c * dJ / sum(c) is dJ, and nothing to all-reduce.
        self._single = strategy.num_replicas_in_sync == 1 and grad_accum_steps == 1
        self.accumulator = None
        if grad_accum_steps > 1:
            self._make_accumulator()
        # What XLA compiles: the replica computation (forward, loss, backward),
        # never the all-reduce or the update, except without any distribution
        # at all, where the whole step is compiled (as Keras does).
        whole_step = (jit_compile and self._single
                      and strategy is default_strategy())
        self.compute_gradients = _jit(self._gradients, jit_compile and not whole_step)
        self._compute_loss_terms = _jit(self._loss_terms, jit_compile and not whole_step)
        self._compute_predictions = _jit(self._predictions, jit_compile)
        self._run_replica_train = _jit(self._replica_train, whole_step)
        self._run_replica_test = _jit(self._replica_test, whole_step)
        (self.train_function, self.test_function, self.predict_function,
         self.skip_function) = compile_step_functions(
            self._train_loop, self._test_loop, self._predict_batch, run_eagerly=run_eagerly)

    def _make_accumulator(self):
        """The per-replica gradient buffers and the micro-batch counter."""
        with self.strategy.scope():
            self.accumulator = GradientAccumulator(self.model.trainable_variables,
                                                   self.loss_stats.size)
            self.micro_step = tf.Variable(
                0, dtype=tf.int64, trainable=False, name="micro_step",
                aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)

    def _run_replicas(self, replica_fn, args=()):
        """Runs `replica_fn(*args)` on every replica (`strategy.run`)."""
        return self.strategy.run(replica_fn, args=args)

    def _sum_over_replicas(self, values):
        """In replica context: the SUM of `values` over all replicas (one all-reduce)."""
        return tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM, values)

    # ----------------------------------------------------------- replica work
    def _objective_terms(self, x, y, sample_weight, training):
        """Forward pass and this replica's loss terms.

        Returns `(y_pred, objective, weight, stats)`: the replica's local
        objective `J`, its weight `c` in the global loss (the first loss's
        count, the number of examples for a model's own `compute_loss`, or a
        constant for `"sum"` losses) and the statistics vector.
        """
        y_pred = self.model(x, training=training)
        examples = tf.cast(tf.shape(tf.nest.flatten(x)[0])[0], tf.float32)
        if self.custom_loss:
            with keras_losses_unscaled():
                value = model_loss_value(self.model, x=x, y=y, y_pred=y_pred,
                                         sample_weight=sample_weight, training=training)
            value = tf.cast(value, tf.float32)
            stats = self.loss_stats.build([value * examples], [examples], examples,
                                          tf.zeros(()), examples)
            return y_pred, value, examples, stats
        reg = _regularization(self.model)
        if self.loss is None and not self.model.losses:
            raise ValueError(
                f"No loss to compute for the model {self.model.name!r}: it was compiled "
                "without a loss, has no add_loss() terms and does not override "
                "compute_loss or train_step/test_step. Pass loss= to model.compile() "
                "(or to the Trainer).")
        if self.loss is None:  # add_loss terms only
            stats = self.loss_stats.build([tf.zeros(())], [examples], examples, examples * reg,
                                          examples)
            return y_pred, reg, examples, stats
        terms = self.loss.local_terms(y, y_pred, sample_weight)
        self._check_proportional(terms)
        weights = self.loss.weights
        if self.normalized:
            objective = tf.add_n([w * tf.math.divide_no_nan(t.numerator, t.count)
                                  for w, t in zip(weights, terms)]) + reg
            weight = terms[0].count
        else:
            objective = tf.add_n([w * t.numerator for w, t in zip(weights, terms)]
                                 ) + self._sum_weight * reg
            weight = tf.constant(self._sum_weight, tf.float32)
        stats = self.loss_stats.build([t.numerator for t in terms], [t.count for t in terms],
                                      weight, weight * reg, examples)
        return y_pred, objective, weight, stats

    def _check_proportional(self, terms):
        """Several losses share one weight per replica; that is exact only when
        each loss's count is the same multiple of the batch on every replica."""
        if len(terms) < 2 or self._single or not self.normalized:
            return
        for name, term in zip(self.loss.names, terms):
            if term.kind not in ("size", "one"):
                reason = ("a Keras mask" if term.kind == "mask" else
                          "'mean_with_sample_weight' with sample weights")
                raise ValueError(
                    f"The compiled loss for output {name!r} divides by a count that "
                    f"depends on the data ({reason}), and the model has "
                    f"{len(terms)} compiled losses. Over "
                    f"{self.strategy.num_replicas_in_sync} replicas x "
                    f"{self.grad_accum_steps} accumulation steps tfdist reduces several "
                    "losses over the global batch exactly only when each one's count is "
                    "proportional to the batch. Ways out: give that loss "
                    "reduction='sum_over_batch_size' without a mask, or combine the "
                    "losses in the model's own compute_loss (weighted by examples), or "
                    "train on one replica.")

    def _gradients(self, x, y, sample_weight):
        """Replica computation: gradients of `c * J` (see module docstring)."""
        variables = self.model.trainable_variables
        with tf.GradientTape() as tape:
            y_pred, objective, weight, stats = self._objective_terms(
                x, y, sample_weight, training=True)
            scaled = self.optimizer.scale_loss(objective)
        grads = tape.gradient(scaled, variables)
        if self.normalized and not self._single:
            grads = [scale_gradient(g, weight) for g in grads]
        return grads, stats, y_pred, tf.nest.map_structure(get_keras_mask, y_pred)

    def _loss_terms(self, x, y, sample_weight):
        y_pred, _, _, stats = self._objective_terms(x, y, sample_weight, training=False)
        return stats, y_pred, tf.nest.map_structure(get_keras_mask, y_pred)

    def _predictions(self, x):
        return self.model(x, training=False)

    def update_metrics(self, x, y, y_pred, mask, sample_weight):
        """Updates the model's compiled metrics with a replica's batch (its
        predictions' Keras masks put back first). Call it inside `strategy.run`.

        Example:

        >>> grads, stats, y_pred, mask = steps.compute_gradients(x, y, None)
        >>> steps.update_metrics(x, y, y_pred, mask, None)
        """
        for tensor, tensor_mask in zip(tf.nest.flatten(y_pred), tf.nest.flatten(mask)):
            if tensor_mask is not None:
                set_keras_mask(tensor, tensor_mask)
        self.model.compute_metrics(x, y, y_pred, sample_weight=sample_weight)

    def _global_loss(self, totals):
        """Loss of the global batch from all-reduced statistics.

        Returns `(loss, divisor, per_loss)`: the total (weighted losses plus
        regularisation), what the summed gradients are divided by, and each
        compiled loss's own global value (unweighted, as Keras logs it).
        """
        layout = self.loss_stats
        weights = ([1.0] * layout.num_losses if self.loss is None or self.custom_loss
                   else self.loss.weights)
        total, per_loss = layout.global_loss(totals, weights, self.normalized)
        divisor = layout.weight(totals) if self.normalized else tf.constant(1.0, tf.float32)
        return total, divisor, per_loss

    def record_loss(self, totals, examples):
        """Records the global loss (and each compiled loss's) in the model's trackers.

        Args:
            totals: the statistics summed across replicas
                (`loss_stats.summed`, all-reduced).
            examples: this replica's number of examples (`loss_stats.examples`).

        Example:

        >>> steps.record_loss(totals, steps.loss_stats.examples(stats))
        """
        loss_value, _, per_loss = self._global_loss(totals)
        model_loss_tracker(self.model).update_state(loss_value, sample_weight=examples)
        if self.loss is not None and not self.custom_loss:
            # Keras weighs each batch's `<output>_loss` equally (its weight is the
            # batch's static size, None for a dataset that keeps its last batch),
            # so one-device Keras logs the plain mean over batches: so does tfdist.
            for tracker, value in zip(self.loss.trackers, per_loss):
                tracker.update_state(value)

    def reduce_and_apply(self, grads, stats, record=True):
        """All-reduce, normalise, clip and apply; records the loss (unless
        `record` is False). Returns the all-reduced statistics. Call it inside
        `strategy.run`, with the gradients and statistics of `compute_gradients`.

        Example:

        >>> grads, stats, y_pred, mask = steps.compute_gradients(x, y, None)
        >>> totals = steps.reduce_and_apply(grads, stats)
        """
        variables = self.model.trainable_variables
        summed_stats = self.loss_stats.summed(stats)
        present = [i for i, g in enumerate(grads) if g is not None]
        if self._single:
            reduced = [grads[i] for i in present] + [summed_stats]
        else:
            reduced = self._sum_over_replicas([grads[i] for i in present] + [summed_stats])
        totals = reduced[-1]
        _, divisor, _ = self._global_loss(totals)
        summed = reduced[:-1]
        if self.normalized and not self._single:
            summed = [divide_gradient(g, divisor) for g in summed]
        if self.clip_norm is not None:
            summed, _ = tf.clip_by_global_norm(summed, self.clip_norm * loss_scale(self.optimizer))
        full = [None] * len(grads)
        for i, g in zip(present, summed):
            full[i] = g
        self.optimizer.apply(full, variables)
        if record:
            self.record_loss(totals, self.loss_stats.examples(stats))
        return totals

    def _replica_train(self, data):
        x, y, sample_weight = unpack(data, need_targets=False)
        grads, stats, y_pred, mask = self.compute_gradients(x, y, sample_weight)
        self.update_metrics(x, y, y_pred, mask, sample_weight)
        self.reduce_and_apply(grads, stats)

    def _replica_accumulate(self, data):
        x, y, sample_weight = unpack(data, need_targets=False)
        grads, stats, y_pred, mask = self.compute_gradients(x, y, sample_weight)
        self.update_metrics(x, y, y_pred, mask, sample_weight)
        self.accumulator.add(grads, stats)

    def _replica_apply_accumulated(self):
        grads, stats = self.accumulator.read()
        self.reduce_and_apply(grads, stats)
        self.accumulator.reset()

    def _replica_test(self, data):
        x, y, sample_weight = unpack(data, need_targets=False)
        stats, y_pred, mask = self._compute_loss_terms(x, y, sample_weight)
        self.update_metrics(x, y, y_pred, mask, sample_weight)
        totals = self.loss_stats.summed(stats)
        if not self._single:
            totals = self._sum_over_replicas(totals)
        self.record_loss(totals, self.loss_stats.examples(stats))

    def _replica_predict(self, data):
        x, _, _ = unpack(data, need_targets=False)
        return self._compute_predictions(x)

    # ------------------------------------------------------ cross-replica work
    def _train_step(self, data):
        if self.accumulator is None:
            self._run_replicas(self._run_replica_train, args=(data,))
            return
        self._run_replicas(self._replica_accumulate, args=(data,))
        micro_step = self.micro_step.assign_add(1)
        tf.cond(tf.equal(micro_step % self.grad_accum_steps, 0),
                lambda: self._run_replicas(self._replica_apply_accumulated),
                lambda: None)

    def _test_step(self, data):
        self._run_replicas(self._run_replica_test, args=(data,))

    def _loop(self, step, iterator, num_steps):
        return run_steps(step, iterator, num_steps), self._metric_results()

    def _metric_results(self):
        if self._single:
            return self.model.get_metrics_result()
        return global_metric_results(self.model, self.strategy)

    def _train_loop(self, iterator, num_steps):
        with gradients_already_summed(self.optimizer), \
                learning_rate_evaluated_once(self.optimizer):
            return self._loop(self._train_step, iterator, num_steps)

    def _test_loop(self, iterator, num_steps):
        return self._loop(self._test_step, iterator, num_steps)

    def reset_accumulation(self):
        """Drops a partial gradient accumulation: zeroes every replica's
        buffers and the micro-batch counter (no-op without accumulation).

        Example:

        >>> steps.reset_accumulation()  # before resuming from a backup
        """
        if self.accumulator is None:
            return
        tf.function(lambda: self._run_replicas(self.accumulator.reset), autograph=False)()
        self.micro_step.assign(0)

    def at_update_boundary(self):
        """True when no gradient accumulation is in progress (always without one):
        the optimizer is between two updates.

        Example:

        >>> steps.at_update_boundary()
        True
        """
        if self.accumulator is None:
            return True
        return int(self.micro_step.numpy()) % self.grad_accum_steps == 0

    def _predict_batch(self, data):
        return gather_replica_outputs(self.strategy, self._replica_predict, (data,))


def gather_replica_outputs(strategy, replica_fn, args):
    """Runs `replica_fn(*args)` on every replica and gathers its outputs along the
    batch axis, in replica order (all workers included), so every worker gets
    the global batch's outputs in input order.

    A `tf.RaggedTensor` output cannot be gathered by `strategy.gather`; it is
    sent as its flat values and row lengths (dense tensors, gathered like any
    other) and put together again, so ragged outputs stay ragged, as in Keras's
    `predict`. Call it inside a `tf.function`.

    Example:

    >>> outputs = gather_replica_outputs(strategy, lambda batch: model(batch), (batch,))
    """
    structures = []

    def replica(*replica_args):
        outputs = replica_fn(*replica_args)
        structures.append(outputs)
        return [_ragged_parts(leaf) for leaf in tf.nest.flatten(outputs)]

    parts = strategy.run(replica, args=args)
    gathered = tf.nest.map_structure(lambda value: strategy.gather(value, axis=0), parts)
    structure = structures[0]
    leaves = [_from_parts(leaf, leaf_parts)
              for leaf, leaf_parts in zip(tf.nest.flatten(structure), gathered, strict=True)]
    return tf.nest.pack_sequence_as(structure, leaves)


def _ragged_parts(value):
    """A ragged tensor as dense tensors that gather by concatenation: its flat
    values and the row lengths of each ragged dimension; any other value as itself."""
    if isinstance(value, tf.RaggedTensor):
        return (value.flat_values,) + tuple(value.nested_row_lengths())
    return (value,)


def _from_parts(like, parts):
    if isinstance(like, tf.RaggedTensor):
        return tf.RaggedTensor.from_nested_row_lengths(parts[0], list(parts[1:]),
                                                       validate=False)
    return parts[0]


def run_steps(step, iterator, num_steps):
    """Runs `step(batch)` on up to `num_steps` batches of `iterator` in one graph loop.

    Returns the number of steps run (an int32 tensor; fewer than `num_steps`
    when the iterator ran out). Call it inside a `tf.function`.

    Example:

    >>> ran = run_steps(train_step, iterator, tf.constant(10))
    """
    def body(done_steps, exhausted):
        optional = iterator.get_next_as_optional()
        has_value = optional.has_value()

        def run():
            step(optional.get_value())
            return done_steps + 1

        done_steps = tf.cond(has_value, run, lambda: done_steps)
        return done_steps, tf.logical_not(has_value)

    done, _ = tf.while_loop(
        lambda done_steps, exhausted: tf.logical_and(done_steps < num_steps,
                                                     tf.logical_not(exhausted)),
        body, [tf.constant(0, tf.int32), tf.constant(False)])
    return done


def compile_step_functions(train_loop, test_loop, predict_batch, *, run_eagerly):
    """A step kind's `(train_function, test_function, predict_function,
    skip_function)`: its train and test loops, its predict function and
    `skip_batches`, each a `tf.function` (no autograph, retracing reduced)
    unless `run_eagerly`.

    Example:

    >>> train_function, test_function, predict_function, skip_function = (
    ...     compile_step_functions(train_loop, test_loop, predict_batch, run_eagerly=False))
    """
    functions = (train_loop, test_loop, predict_batch, skip_batches)
    if run_eagerly:
        return functions
    return tuple(tf.function(function, reduce_retracing=True, autograph=False)
                 for function in functions)


def skip_batches(iterator, num_batches):
    """Draws and discards up to `num_batches` batches; returns how many there were (int64).

    Example:

    >>> skipped = skip_batches(iterator, tf.constant(5, tf.int64))
    """
    def body(done, exhausted):
        has_value = iterator.get_next_as_optional().has_value()
        return done + tf.cast(has_value, tf.int64), tf.logical_not(has_value)

    done, _ = tf.while_loop(
        lambda done, exhausted: tf.logical_and(done < num_batches, tf.logical_not(exhausted)),
        body, [tf.constant(0, tf.int64), tf.constant(False)])
    return done


def _jit(function, jit_compile):
    if not jit_compile:
        return function
    return tf.function(function, jit_compile=True, autograph=False)


def _regularization(model):
    losses = model.losses
    if not losses:
        return tf.zeros((), tf.float32)
    return tf.add_n([tf.cast(tf.reduce_sum(loss), tf.float32) for loss in losses])
