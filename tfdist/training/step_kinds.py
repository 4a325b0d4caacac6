"""The declared interface of the step kinds, and the loss-statistics layout they share.

A *step kind* is an object that runs training steps for a loop. There are
four:

* `tfdist.training.step.StepFunctions`: tfdist's own distributed step
  (any strategy; one device, mirrored, multi-worker, parameter servers);
* `tfdist.training.model_parallel.gpipe.PipelineStepFunctions`: the same
  step for a model split into pipeline stages;
* `tfdist.training.own_step.OwnStepFunctions`: a model's own `train_step` /
  `test_step` / `predict_step` (the trainer runs it combined with the
  engine: `tfdist.training.own_step.StepFunctionsWithOwnSteps`);
* `tfdist.training.ps_loop.WorkerSteps`: the step the chief schedules on
  parameter-server workers, built from a `StepFunctions`' replica parts.

Every step kind is a `StepKind`. The ones `Trainer.fit` / `evaluate` /
`predict` run are also `FitLoopSteps`; the one the parameter-server worker
step is built from is also `ReplicaSteps`. The protocols are
`typing.runtime_checkable`: `isinstance(steps, FitLoopSteps)` checks that
every member is there.

The loss statistics (`LossStatsLayout`) are the vector each replica (or
micro-batch) computes beside its gradients and that is summed across
replicas: every compiled loss's numerator and count, the replica's weight,
its weighted regularisation, and its number of examples.
"""

from typing import Any, Callable, Protocol, runtime_checkable

import tensorflow as tf


@runtime_checkable
class StepKind(Protocol):
    """What every step kind has: the model it trains and its training function.

    Attributes:
        model: the `keras.Model`.
        train_function: `f(iterator, num_steps)` running up to `num_steps`
            training steps on batches of `iterator`; returns
            `(steps_run, logs)` (for `WorkerSteps`: `(metric_deltas,
            worker_index)`, what the steps add to the metric totals).

    Example:

    >>> isinstance(trainer.step_functions, StepKind)
    True
    """

    model: Any
    train_function: Callable


@runtime_checkable
class FitLoopSteps(StepKind, Protocol):
    """What `Trainer`'s loop (`fit`, `evaluate`, `predict`, resuming) calls on its
    step functions.

    Attributes:
        test_function: `f(iterator, num_steps) -> (steps_run, logs)`.
        predict_function: `f(distributed_batch) -> outputs` (all replicas
            and workers gathered, in input order).
        skip_function: `f(iterator, num_batches) -> batches_skipped`: draws
            and discards batches (to resume at a data position).

    Example:

    >>> steps = trainer.prepare(dist_dataset, mode="train")
    >>> isinstance(steps, FitLoopSteps)
    True
    """

    test_function: Callable
    predict_function: Callable
    skip_function: Callable

    def reset_accumulation(self):
        """Drops a partial gradient accumulation (no-op without one; this
        default, for a step kind that subclasses `FitLoopSteps` and never
        accumulates, does nothing).

        Example:

        >>> steps.reset_accumulation()
        """

    def at_update_boundary(self):
        """True when no gradient accumulation is in progress (this default,
        for a step kind that never accumulates: always True).

        Example:

        >>> steps.at_update_boundary()
        True
        """
        return True


@runtime_checkable
class ReplicaSteps(Protocol):
    """The replica parts of a step, from which another step kind is built
    (`tfdist.training.ps_loop.WorkerSteps` runs them on parameter-server
    workers). Call them inside `strategy.run`.

    Attributes:
        model: the `keras.Model`.
        optimizer: its optimizer.
        loss_stats: the `LossStatsLayout` of the statistics they exchange.

    Example:

    >>> isinstance(StepFunctions(model, model.optimizer, loss, strategy,
    ...                          jit_compile=False, grad_accum_steps=1, clip_norm=None),
    ...            ReplicaSteps)
    True
    """

    model: Any
    optimizer: Any
    loss_stats: "LossStatsLayout"

    def compute_gradients(self, x, y, sample_weight):
        """Forward and backward on the replica's batch: `(grads, stats, y_pred, mask)`.

        Example:

        >>> grads, stats, y_pred, mask = steps.compute_gradients(x, y, None)
        """

    def reduce_and_apply(self, grads, stats, record=True):
        """Sums across replicas, normalises, clips, applies; returns the summed statistics.

        Example:

        >>> totals = steps.reduce_and_apply(grads, stats, record=False)
        """

    def update_metrics(self, x, y, y_pred, mask, sample_weight):
        """Updates the model's compiled metrics with the replica's batch.

        Example:

        >>> steps.update_metrics(x, y, y_pred, mask, None)
        """

    def record_loss(self, totals, examples):
        """Records the global loss from summed statistics in the model's trackers.

        Example:

        >>> steps.record_loss(totals, steps.loss_stats.examples(stats))
        """


class LossStatsLayout:
    """The layout of the loss-statistics vector of `num_losses` compiled losses.

    One vector per replica (or micro-batch), float32, of `size = 2k + 3`
    entries for k losses::

        [n_1 .. n_k, c_1 .. c_k, weight, weight * regularisation, examples]

    the numerator `n_i` and count `c_i` of each compiled loss (see
    `tfdist.training.loss.GlobalCompileLoss`), the replica's weight `c` in
    the global loss, its regularisation times that weight, and its number of
    examples. The first `summed_size = 2k + 2` entries are summed across
    replicas (`summed`); the examples stay per replica (they weigh the
    replica's loss in the loss tracker).

    Args:
        num_losses: k, the number of compiled losses (1 for a model's own
            `compute_loss` or a model with only `add_loss` terms).

    Example:

    >>> layout = LossStatsLayout(2)
    >>> stats = layout.build([1.0, 2.0], [4.0, 4.0], 4.0, 0.4, 4.0)
    >>> layout.counts(stats).numpy().tolist(), float(layout.examples(stats))
    ([4.0, 4.0], 4.0)
    """

    def __init__(self, num_losses):
        if isinstance(num_losses, bool) or not isinstance(num_losses, int) or num_losses < 1:
            raise ValueError(
                f"LossStatsLayout needs the number of compiled losses, an int >= 1; got "
                f"{num_losses!r} (use 1 for a model's own compute_loss or add_loss terms "
                "alone).")
        self.num_losses = num_losses
        self.weight_index = 2 * num_losses
        self.regularization_index = 2 * num_losses + 1
        self.examples_index = 2 * num_losses + 2
        self.summed_size = self.examples_index
        self.size = self.examples_index + 1

    def __repr__(self):
        return f"LossStatsLayout(num_losses={self.num_losses})"

    def build(self, numerators, counts, weight, weighted_regularization, examples):
        """The statistics vector (a float32 tensor of `size`).

        Args:
            numerators, counts: one scalar per compiled loss (k each).
            weight: the replica's weight `c` in the global loss.
            weighted_regularization: its regularisation times `weight`.
            examples: its number of examples.

        Raises:
            ValueError: not k numerators and k counts.

        Example:

        >>> LossStatsLayout(1).build([2.0], [4.0], 4.0, 0.0, 4.0)
        """
        numerators, counts = list(numerators), list(counts)
        if len(numerators) != self.num_losses or len(counts) != self.num_losses:
            raise ValueError(
                f"{self!r}.build got {len(numerators)} numerators and {len(counts)} counts; "
                f"it needs {self.num_losses} of each, one per compiled loss.")
        return tf.stack(numerators + counts + [weight, weighted_regularization, examples])

    def summed(self, stats):
        """The entries summed across replicas (all but the examples).

        Example:

        >>> totals = context.all_reduce("sum", layout.summed(stats))
        """
        return stats[:self.summed_size]

    def numerators(self, totals):
        """The compiled losses' numerators.

        Example:

        >>> layout.numerators(totals)
        """
        return totals[:self.num_losses]

    def counts(self, totals):
        """The compiled losses' counts.

        Example:

        >>> layout.counts(totals)
        """
        return totals[self.num_losses:2 * self.num_losses]

    def weight(self, totals):
        """The (summed) weight `c`, what normalised gradients are divided by.

        Example:

        >>> layout.weight(totals)
        """
        return totals[self.weight_index]

    def examples(self, stats):
        """The number of examples of one replica's statistics.

        Example:

        >>> layout.examples(stats)
        """
        return stats[self.examples_index]

    def global_loss(self, totals, loss_weights, normalized):
        """The loss of the global batch from summed statistics.

        Args:
            totals: the summed statistics (`summed` of every replica, added).
            loss_weights: the compiled losses' weights (k floats).
            normalized: True for mean reductions (each loss is its numerator
                over its count), False for `"sum"` (the numerator itself).

        Returns:
            `(total, per_loss)`: the weighted sum of the losses plus the
            regularisation, and each compiled loss's own value (unweighted,
            as Keras logs it).

        Example:

        >>> total, per_loss = layout.global_loss(totals, [1.0], normalized=True)
        """
        k = self.num_losses
        regularization = tf.math.divide_no_nan(totals[self.regularization_index],
                                               self.weight(totals))
        numerators, counts = self.numerators(totals), self.counts(totals)
        if normalized:
            per_loss = [tf.math.divide_no_nan(numerators[i], counts[i]) for i in range(k)]
        else:
            per_loss = [numerators[i] for i in range(k)]
        total = tf.add_n([w * value for w, value in zip(loss_weights, per_loss)]) + regularization
        return total, per_loss
