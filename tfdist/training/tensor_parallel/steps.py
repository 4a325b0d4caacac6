"""The train / test / predict steps of a tensor-parallel model: one replica per worker.

A tensor-parallel model's shards are plain variables on this worker's K
devices, so no `tf.distribute` strategy can mirror them: `MirroredStrategy`
runs each replica under one device and mirrors every variable over exactly
its replica devices. The replica computation (forward, loss, backward, each
shard on its device) therefore runs on this worker outside the strategy,
and the strategy is used only for what crosses workers:
`MultiWorkerMirroredStrategy` with one device per worker sums the
gradients and loss statistics of all workers in one all-reduce per step
(`strategy.run` of a `ReplicaContext.all_reduce`), reads the metrics in one
more, and gathers predictions. Everything else is `StepFunctions`, unchanged:
the same loss statistics, division by the global count, global-norm
clipping, accumulation and optimizer step, so 2 workers x K shards compute
what one device computes on the global batch. With the default strategy
(one worker) nothing crosses and the sums are the identity.

Gradient-accumulation buffers sit beside their variables, each shard's on
its device.

Example:

    steps = WorkerReplicaStepFunctions(split, split.optimizer, loss, strategy,
                                       jit_compile=False, grad_accum_steps=1, clip_norm=None)
    ran, logs = steps.train_function(iter(dist_dataset), tf.constant(10))
"""

import tensorflow as tf

from tfdist.distribute.introspection import num_workers
from tfdist.training.across_workers import gather_across_workers, sum_across_workers, this_workers
from tfdist.training.accumulate import GradientAccumulator
from tfdist.training.inputs import unpack
from tfdist.training.model_parallel.placement import outside_strategy_scopes, plain_variables
from tfdist.training.step import StepFunctions


class WorkerReplicaStepFunctions(StepFunctions):
    """`StepFunctions` for one replica per worker whose variables are plain
    variables on this worker's devices (a tensor-parallel split copy).

    Takes `StepFunctions`' arguments; `strategy` is the default strategy or
    a `MultiWorkerMirroredStrategy` with one device per worker.

    Example:

    >>> steps = WorkerReplicaStepFunctions(split, split.optimizer, loss, strategy,
    ...                                    jit_compile=False, grad_accum_steps=2, clip_norm=1.0)
    >>> ran, logs = steps.train_function(iter(dist_dataset), tf.constant(4))
    """

    def __init__(self, model, optimizer, loss, strategy, **settings):
        self.workers = num_workers(strategy)
        super().__init__(model, optimizer, loss, strategy, **settings)

    def _make_accumulator(self):
        with outside_strategy_scopes(), plain_variables():
            self.accumulator = GradientAccumulator(self.model.trainable_variables,
                                                   self.loss_stats.size, on_variable_devices=True)
            self.micro_step = tf.Variable(0, dtype=tf.int64, trainable=False,
                                          name="micro_step")

    def _run_replicas(self, replica_fn, args=()):
        # This worker's one replica, here, on its own devices.
        return replica_fn(*[this_workers(self.strategy, arg) for arg in args])

    def _sum_over_replicas(self, values):
        if self.workers == 1:
            return values
        return sum_across_workers(self.strategy, values)

    def _train_loop(self, iterator, num_steps):
        with outside_strategy_scopes():
            return super()._train_loop(iterator, num_steps)

    def _test_loop(self, iterator, num_steps):
        with outside_strategy_scopes():
            return super()._test_loop(iterator, num_steps)

    def _predict_batch(self, data):
        with outside_strategy_scopes():
            x, _, _ = unpack(this_workers(self.strategy, data), need_targets=False)
            outputs = self._compute_predictions(x)
        if self.workers == 1:
            return outputs
        return gather_across_workers(self.strategy, outputs)
