"""The model's forward and backward alone: how fast any engine's step could be.

A training step is the model's forward and backward passes plus what the
engine adds around them: the loss, the metrics, the optimizer's update, the
loop. `ModelAloneStep` times the first part alone: the gradients of the
model's trainable variables for a fixed upstream gradient of its outputs
(`tape.gradient(outputs, variables, output_gradients=...)`), so no loss,
metric or update runs, not even a reduction of the outputs. The outputs
themselves are computed in full: one value of each is returned with the
gradients, since TensorFlow prunes the ops whose values nothing uses (a
language model's output layer would be left out, about 7% of the `small`
Transformer's step). An engine that
runs this model's TensorFlow forward and backward cannot take less time per
step than this; the speed goals report it as the ceiling of their
throughput ratio (`tfdist.bench.goals`).

Example:

    step = ModelAloneStep(model, jit_compile=False)
    times = step.run(dataset, steps=5)   # seconds per step, input included
"""

import time

import numpy as np
import tensorflow as tf

from tfdist.runtime.argtypes import check_int_at_least

UPSTREAM_SEED = 0
"""Seed of the fixed upstream gradient (standard normal values times `UPSTREAM_SCALE`)."""
UPSTREAM_SCALE = 1e-3


def _inputs_of(batch):
    """The model inputs of a `(inputs, targets[, weights])` batch, or the batch itself."""
    return batch[0] if isinstance(batch, tuple) else batch


class ModelAloneStep:
    """Gradients of a model's trainable variables for a fixed upstream gradient.

    Args:
        model: a built Keras model (its first call builds it otherwise).
        jit_compile: compile the step with XLA.

    Example:

    >>> model = keras.Sequential([keras.layers.Dense(3)])
    >>> step = ModelAloneStep(model, jit_compile=False)
    >>> [tuple(g.shape) for g in step(np.ones((4, 2), "float32"))]
    [(2, 3), (3,)]
    """

    def __init__(self, model, jit_compile=False):
        self.model = model
        self.jit_compile = bool(jit_compile)
        self._upstream = {}
        self.output_values = None
        self._step = tf.function(self._gradients, jit_compile=self.jit_compile,
                                 autograph=False)

    def _gradients(self, inputs, upstream):
        with tf.GradientTape() as tape:
            outputs = self.model(inputs, training=True)
        gradients = tape.gradient(outputs, self.model.trainable_variables,
                                  output_gradients=upstream)
        # The gradients need none of the outputs' values (their own gradient is the
        # fixed upstream one), so TensorFlow would prune the forward ops that only
        # make the outputs: a language model's output layer (its matmul, bias and
        # cast, about 7% of the `small` Transformer's step). One value of each output
        # returned with the gradients keeps the whole forward pass computed.
        return gradients, [tf.reshape(output, [-1])[0] for output in tf.nest.flatten(outputs)]

    def upstream(self, inputs):
        """The fixed upstream gradient for the outputs of `inputs`' shape (made once per shape).

        Example:

        >>> step.upstream(np.ones((4, 2), "float32")).shape
        TensorShape([4, 3])
        """
        key = tuple(tuple(t.shape) for t in tf.nest.flatten(inputs))
        if key not in self._upstream:
            outputs = self.model(inputs, training=False)  # once per shape, for its outputs'
            rng = np.random.default_rng(UPSTREAM_SEED)
            self._upstream[key] = tf.nest.map_structure(
                lambda output: tf.constant(
                    rng.standard_normal(tuple(output.shape)).astype("float32")
                    * UPSTREAM_SCALE, dtype=output.dtype),
                outputs)
        return self._upstream[key]

    def __call__(self, inputs):
        """The gradients for one batch of inputs (a list, one per trainable variable).

        The first value of each of the model's outputs, computed in the same
        step, is left in `output_values`.

        Example:

        >>> len(step(np.ones((4, 2), "float32")))
        2
        >>> step.output_values[0].shape
        TensorShape([])
        """
        gradients, self.output_values = self._step(inputs, self.upstream(inputs))
        return gradients

    def run(self, dataset, steps, warmup_steps=1):
        """Runs `warmup_steps + steps` steps from `dataset`; returns the last `steps` step times.

        A step's time runs from the end of the one before it (the first from
        the start of the call), so it includes waiting for input, as
        `tfdist.bench.timing.StepClock` measures a training step.

        Args:
            dataset: yields `(inputs, targets)` batches (targets unused) or inputs.
            steps: measured steps, >= 1.
            warmup_steps: steps at the start left out (the first creates the iterator).

        Example:

        >>> len(step.run(dataset.repeat(), steps=3))
        3
        """
        check_int_at_least("steps", steps, 1)
        check_int_at_least("warmup_steps", warmup_steps, 0)
        iterator = iter(dataset)
        times = []
        last = time.perf_counter()
        for index in range(warmup_steps + steps):
            gradients = self(_inputs_of(next(iterator)))
            gradients[-1].numpy()  # the step has run to its end
            now = time.perf_counter()
            if index >= warmup_steps:
                times.append(now - last)
            last = now
        return times
