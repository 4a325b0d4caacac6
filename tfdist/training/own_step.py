"""Running a model's own `train_step` / `test_step` / `predict_step` under a strategy.

A model that overrides these (a GAN, the "customizing what happens in fit"
pattern) runs its own step, on every replica's slice of the global batch
(`strategy.run(model.train_step, (batch,))`), as Keras's `fit` does under a
strategy, with one difference that makes it train like one device: inside
the step every loss is the replica's own mean (Keras's division of losses by
the number of replicas is off, see `keras_losses_unscaled`) and every
optimizer *averages* the replicas' gradients (`gradients_averaged`) instead
of summing them. So whatever the step computes, `self.compute_loss(...)`, a
`keras.losses.Loss` or a hand-written `ops.mean`, means what it means on one
device, and so do the metrics it updates. The average over replicas equals
the global batch's gradient when every replica gets the same number of
examples (a global batch size divisible by the number of replicas, or
`drop_remainder`); for exactness with any batch, leave `train_step` to
tfdist (override `compute_loss` instead).

Also unlike Keras's `fit`, this works under `MultiWorkerMirroredStrategy`,
and the logged values of the model's metrics are read across all replicas
and workers (other values the step returns are averaged over the replicas).
Each step is one compiled call, its batch drawn just before it (the end of
the data is agreed by every worker); `steps_per_execution` sets how often
callbacks run. XLA compiles the whole step only without
distribution (the optimizer's cross-replica reduction cannot be inside XLA):
the trainer refuses `jit_compile=True` otherwise. An optimizer's own
`clipnorm` acts on each replica's gradient here, as in Keras's `fit`.
"""

import tensorflow as tf

from tfdist.training.metrics_sync import global_metric_results
from tfdist.training.model_hooks import keras_losses_unscaled
from tfdist.training.optimizer import gradients_averaged, learning_rate_evaluated_once
from tfdist.training.step import StepFunctions, gather_replica_outputs

OWN_STEP_HOOKS = ("train_step", "test_step", "predict_step")
"""The model methods `StepFunctionsWithOwnSteps` runs in place of the engine's step."""


class OwnStepFunctions:
    """Train, test and predict functions that call the model's own steps.

    Same interface as `tfdist.training.step.StepFunctions` (`train_function`,
    `test_function`: `f(iterator, num_steps) -> (steps_run, logs)`;
    `predict_function`: `f(distributed_batch) -> outputs`): a
    `tfdist.training.step_kinds.StepKind`. The trainer runs it through
    `StepFunctionsWithOwnSteps`, which uses only the hooks the model
    overrides.

    Args:
        model: the compiled, built `keras.Model`.
        strategy: the `tf.distribute.Strategy`.
        jit_compile: compile each step with XLA (only without distribution).
        run_eagerly: run the steps eagerly.

    Example:

    >>> own = OwnStepFunctions(gan, strategy, jit_compile=False, run_eagerly=False)
    >>> ran, logs = own.train_function(iter(dist_dataset), 10)
    """

    def __init__(self, model, strategy, *, jit_compile, run_eagerly):
        self.model = model
        self.strategy = strategy
        if run_eagerly:
            compiled = lambda f: f  # noqa: E731
        else:
            compiled = lambda f: tf.function(f, jit_compile=jit_compile or None,  # noqa: E731
                                             reduce_retracing=True, autograph=False)
        self._train_one = compiled(lambda batch: self._run(model.train_step, batch))
        self._test_one = compiled(lambda batch: self._run(model.test_step, batch))
        self._predict_one = compiled(self._predict)
        self._metric_results = compiled(lambda: global_metric_results(model, strategy))

    def _run(self, step, batch):
        with keras_losses_unscaled(), gradients_averaged(), \
                learning_rate_evaluated_once(getattr(self.model, "optimizer", None)):
            outputs = self.strategy.run(step, args=(batch,))
        return self._reduce_logs(outputs)

    def _reduce_logs(self, outputs):
        """The step's logs: metrics read across replicas, other values averaged."""
        if not isinstance(outputs, dict):
            return {}
        metrics = global_metric_results(self.model, self.strategy)
        logs = {}
        for name, value in _flatten_logs(outputs).items():
            if name in metrics:
                logs[name] = metrics[name]
            else:
                logs[name] = tf.cast(self.strategy.reduce(tf.distribute.ReduceOp.MEAN, value,
                                                          axis=None), tf.float32)
        return logs

    def _predict(self, batch):
        with keras_losses_unscaled():
            return gather_replica_outputs(self.strategy, self.model.predict_step, (batch,))

    def _loop(self, one_step, iterator, num_steps):
        done, logs = 0, None
        while done < int(num_steps):
            # Drawn outside the compiled step: the end of the data is agreed by
            # every worker, and a step that creates variables when first traced
            # (optimizers the model keeps itself) traces without a tf.cond.
            optional = iterator.get_next_as_optional()
            if not bool(optional.has_value()):
                break
            logs = one_step(optional.get_value())
            done += 1
        if logs is None:
            logs = self._metric_results()
        return done, logs

    def train_function(self, iterator, num_steps):
        """Runs up to `num_steps` of the model's `train_step`; returns `(steps_run, logs)`.

        Example:

        >>> ran, logs = own.train_function(iterator, 4)
        """
        return self._loop(self._train_one, iterator, num_steps)

    def test_function(self, iterator, num_steps):
        """Runs up to `num_steps` of the model's `test_step`; returns `(steps_run, logs)`.

        Example:

        >>> ran, logs = own.test_function(iter(val_dataset), 10)
        """
        return self._loop(self._test_one, iterator, num_steps)

    def predict_function(self, batch):
        """The model's `predict_step` on one distributed batch, gathered in order.

        Example:

        >>> outputs = own.predict_function(next(iter(dist_dataset)))
        """
        return self._predict_one(batch)


class StepFunctionsWithOwnSteps(StepFunctions):
    """tfdist's step functions, with the model's own step in place of the engine's
    for each of `train_step`, `test_step`, `predict_step` the model overrides.

    Everything else is the engine's (`StepFunctions`): skipping batches to
    resume, gradient accumulation and the replica parts; so it is a
    `tfdist.training.step_kinds.FitLoopSteps` like `StepFunctions`.

    Args:
        own_steps: the hooks the model overrides (a non-empty collection of
            names from `OWN_STEP_HOOKS`).
        model, optimizer, loss, strategy, jit_compile, grad_accum_steps,
            clip_norm, custom_loss, run_eagerly: as for `StepFunctions`.

    Attributes:
        own: the `OwnStepFunctions` whose functions are used.

    Raises:
        ValueError: `own_steps` is empty or names another method.

    Example:

    >>> steps = StepFunctionsWithOwnSteps(
    ...     gan, gan.optimizer, None, strategy, own_steps=["train_step"], jit_compile=False,
    ...     grad_accum_steps=1, clip_norm=None)
    >>> ran, logs = steps.train_function(iter(dist_dataset), tf.constant(2))  # gan.train_step
    """

    def __init__(self, model, optimizer, loss, strategy, *, own_steps, jit_compile,
                 grad_accum_steps, clip_norm, custom_loss=False, run_eagerly=False):
        own_steps = tuple(own_steps)
        unknown = [hook for hook in own_steps if hook not in OWN_STEP_HOOKS]
        if unknown or not own_steps:
            raise ValueError(
                f"own_steps must name at least one of {', '.join(OWN_STEP_HOOKS)}; got "
                f"{list(own_steps)!r}. Without an overridden step use StepFunctions.")
        super().__init__(model, optimizer, loss, strategy, jit_compile=jit_compile,
                         grad_accum_steps=grad_accum_steps, clip_norm=clip_norm,
                         custom_loss=custom_loss, run_eagerly=run_eagerly)
        self.own = OwnStepFunctions(model, strategy, jit_compile=jit_compile,
                                    run_eagerly=run_eagerly)
        if "train_step" in own_steps:
            self.train_function = self.own.train_function
        if "test_step" in own_steps:
            self.test_function = self.own.test_function
        if "predict_step" in own_steps:
            self.predict_function = self.own.predict_function


def _flatten_logs(logs):
    """Nested dicts of logs (e.g. `CompileMetrics.result()`) merged, as Keras's `fit` does."""
    flat = {}
    for name, value in logs.items():
        if isinstance(value, dict):
            flat.update(_flatten_logs(value))
        else:
            flat[name] = value
    return flat
