"""One benchmark contestant: a workload trained by tfdist's engine or by Keras `fit`.

A `Setting` says how to train (engine, precision, XLA); a `Contender` is
that setting built: its own model and optimizer in the strategy scope, its
own input pipelines (the real one, and the same first batch replayed from
memory to measure the time spent waiting for input), ready to run a few
steps at a time so that several contenders can alternate in one process.

Example:

    strategy = create_strategy("default")
    workload = Workload("transformer", size="small")
    ours = Contender(Setting("tfdist", "float32", "off"), workload, strategy, 32)
    keras_fit = Contender(Setting("keras", "float32", "off"), workload, strategy, 32)
    ours.warm_up(); keras_fit.warm_up()
    times = ours.run(steps=5)          # seconds per step
"""

import dataclasses

from tfdist.runtime.argtypes import check_int_at_least

ENGINES = ("tfdist", "keras", "model")
"""`tfdist`: `tfdist.training.Trainer`; `keras`: `model.compile` + `model.fit`;
`model`: the model's forward and backward alone, with no loss, metric or
optimizer update (`tfdist.bench.model_alone`): the ceiling of any engine."""
XLA_CHOICES = ("on", "off", "auto")
LOSSES = ("recipe", "keras")
"""`recipe`: the recipe's own loss, metrics and optimizer; `keras`: what a
Keras user writes for the same task: Keras's standard loss and accuracy
(`Workload.keras_standard_loss`) and Keras's own class of the recipe's
optimizer (`keras.optimizers.AdamW`, not tfdist's fused one)."""
INPUTS = ("pipeline", "memory")
"""`pipeline`: tfdist's input pipeline; `memory`: its first batch replayed
from memory (no input work), for the input-wait share."""


@dataclasses.dataclass(frozen=True)
class Setting:
    """How a contender trains.

    Args:
        engine: "tfdist" (`tfdist.training.Trainer`), "keras"
            (`model.compile` + `model.fit`) or "model" (the model's forward
            and backward alone, `tfdist.bench.model_alone.ModelAloneStep`;
            only under the default strategy).
        precision: "float32", "mixed_bfloat16", "mixed_float16" or "auto"
            (tfdist's detection, as the recipes resolve it).
        xla: "on", "off" or "auto". For tfdist, auto is the recipes'
            `resolve_xla`; for Keras, `compile(jit_compile="auto")`, resolved
            by Keras (off on CPU-only machines and under any strategy).
        loss: "recipe" (the recipe's loss, metrics and optimizer) or
            "keras" (the standard Keras loss and accuracy for the task, and
            Keras's own optimizer class; see `LOSSES`). The model alone
            has none: only "recipe" (the default) is accepted with it.

    Raises:
        ValueError: a value outside the allowed ones (which are named), or
            Keras's loss asked of the model alone.

    Example:

    >>> Setting("keras", "float32", "auto").label
    'keras fit, float32, XLA auto'
    >>> Setting("keras", "mixed_bfloat16", "off", loss="keras").label
    "keras fit, mixed_bfloat16, XLA off, Keras's loss"
    """

    engine: str = "tfdist"
    precision: str = "float32"
    xla: str = "off"
    loss: str = "recipe"

    def __post_init__(self):
        from tfdist.precision import PRECISIONS

        for name, value, allowed in (("engine", self.engine, ENGINES),
                                     ("precision", self.precision, PRECISIONS),
                                     ("xla", self.xla, XLA_CHOICES),
                                     ("loss", self.loss, LOSSES)):
            if value not in allowed:
                raise ValueError(f"Setting {name}={value!r} is not allowed; choose one of "
                                 f"{', '.join(allowed)}.")
        if self.engine == "model" and self.loss != "recipe":
            raise ValueError(f"Setting engine='model' runs no loss, so loss={self.loss!r} "
                             f"would be ignored; leave loss at 'recipe'.")

    @property
    def label(self):
        """A short label, e.g. 'tfdist, mixed_bfloat16, XLA off' (see the class example)."""
        engine = {"keras": "keras fit", "model": "model alone"}.get(self.engine, "tfdist")
        loss = ", Keras's loss" if self.loss == "keras" else ""
        return f"{engine}, {self.precision}, XLA {self.xla}{loss}"


class Contender:
    """A `Setting` built for a workload under a strategy, ready to alternate.

    The Keras dtype policy is set to the setting's precision while the data
    pipelines, model and optimizer are built, then restored, so contenders of
    different precisions live side by side in one process.

    Args:
        setting: a `Setting`.
        workload: a `tfdist.bench.workloads.Workload`.
        strategy: the `tf.distribute.Strategy` (made by
            `tfdist.distribute.strategy_factory.create_strategy`).
        global_batch_size: examples per step over all replicas.
        seed: seed of the weights and the data order.
        total_steps: length of the learning-rate schedule.

    Attributes:
        policy: the resolved precision policy name.
        jit_compile: whether the step is XLA-compiled (as resolved).
        xla_reason: why (tfdist's reason, or Keras's resolution).
        tokens_per_example, flops_per_example: for the figures.
        num_replicas: replicas in sync.
        strategy_name: the strategy's name (`describe_strategy`).
        trainer: the `tfdist.training.Trainer` (engine "tfdist"), else None.
        model_alone: the `ModelAloneStep` (engine "model"), else None.

    Raises:
        ValueError: Keras `fit` under `MultiWorkerMirroredStrategy` (it fails
            there: keras-team/keras#20585), the model alone under any strategy
            but the default one, or XLA forced on a model that cannot be
            compiled.

    Example:

    >>> contender = Contender(Setting(), Workload("cnn"), create_strategy("default"), 64)
    >>> contender.warm_up()
    >>> len(contender.run(steps=3))
    3
    """

    def __init__(self, setting, workload, strategy, global_batch_size, seed=0, total_steps=1000):
        import keras
        import tensorflow as tf

        from tfdist.data import distribute_dataset, make_dataset_fn
        from tfdist.distribute.devices import gpu_count
        from tfdist.precision import resolve_precision
        from tfdist.xla import leave_uncompiled_where_slower, resolve_xla, respect_xla_blocker
        from tfdist.distribute.introspection import describe_strategy
        from tfdist.bench.model_alone import ModelAloneStep
        from tfdist.training import Trainer

        if setting.engine == "keras" and isinstance(
                strategy, tf.distribute.MultiWorkerMirroredStrategy):
            raise ValueError("Keras fit cannot be benchmarked under multi_worker_mirrored: it "
                             "fails there (keras-team/keras#20585). Use engine 'tfdist'.")
        if setting.engine == "model" and strategy is not tf.distribute.get_strategy():
            raise ValueError(f"The model alone runs under the default strategy only, got "
                             f"{type(strategy).__name__}; create it with "
                             f"create_strategy('default').")
        self.setting = setting
        self.workload = workload
        self.strategy = strategy
        self.global_batch_size = global_batch_size
        self.num_replicas = int(strategy.num_replicas_in_sync)
        self.strategy_name = describe_strategy(strategy).name
        choice = resolve_precision(setting.precision)
        self.policy = choice.policy
        self.precision_reason = choice.reason
        previous = keras.mixed_precision.dtype_policy()
        keras.mixed_precision.set_global_policy(self.policy)
        try:
            keras.utils.set_random_seed(seed)
            data = workload.build_data(global_batch_size)
            self.tokens_per_example = data.tokens_per_example
            dataset_fn = make_dataset_fn(data.train, global_batch_size, training=True, seed=seed)
            replay = lambda context: dataset_fn(context).take(1).cache().repeat()  # noqa: E731
            if setting.engine == "tfdist":
                self._datasets = {
                    "pipeline": distribute_dataset(strategy, data.train, global_batch_size,
                                                   training=True, seed=seed),
                    "memory": strategy.distribute_datasets_from_function(replay)}
            else:
                self._datasets = {"pipeline": dataset_fn(None), "memory": replay(None)}
            with strategy.scope():
                built = workload.build_model(data, global_batch_size)
                optimizer = workload.build_optimizer(global_batch_size, total_steps,
                                                     keras_standard=setting.loss == "keras")
                if built.prepare_optimizer is not None:
                    built.prepare_optimizer(optimizer)
                self.flops_per_example = built.flops_per_example
                self.model = built.model
                loss, metrics = built.loss, built.metrics
                if setting.loss == "keras":
                    loss, metrics = workload.keras_standard_loss()
                self.trainer = self.model_alone = None
                if setting.engine in ("tfdist", "model"):
                    on_gpu = gpu_count() > 0
                    jit, reason = resolve_xla(setting.xla, self.policy, on_gpu=on_gpu)
                    jit, reason = respect_xla_blocker(  # as the recipes
                        setting.xla, jit, reason, built.xla_blocker, asked="XLA on",
                        way_out="Measure it with XLA off or auto.")
                    jit, reason = leave_uncompiled_where_slower(
                        setting.xla, jit, reason, built.xla_slower_on_cpu, on_gpu)
                    if setting.engine == "tfdist":
                        self.trainer = Trainer(built.model, optimizer, loss, metrics,
                                               strategy=strategy, jit_compile=jit)
                    else:
                        self.model_alone = ModelAloneStep(built.model, jit_compile=jit)
                    self.jit_compile, self.xla_reason = jit, reason
                else:
                    jit = {"on": True, "off": False, "auto": "auto"}[setting.xla]
                    built.model.compile(optimizer=optimizer, loss=loss, metrics=metrics,
                                        jit_compile=jit)
                    self.jit_compile = bool(built.model.jit_compile)
                    self.xla_reason = ("Keras compile(jit_compile='auto') resolved it"
                                       if setting.xla == "auto" else "asked for")
        finally:
            keras.mixed_precision.set_global_policy(previous)

    def run(self, steps, input="pipeline", warmup_steps=1, callbacks=()):
        """Trains `warmup_steps + steps` steps and returns the last `steps` step times (s).

        Args:
            steps: measured steps, >= 1.
            input: "pipeline" (the real input pipeline) or "memory" (one
                batch replayed from memory).
            warmup_steps: steps at the start of this call left out (the
                first creates the data iterator).
            callbacks: more Keras callbacks for this call (e.g. a profiler);
                the model alone runs no Keras loop and takes none.

        Raises:
            ValueError: an unknown input, or callbacks given to the model alone.

        Example:

        >>> contender.run(5, input="memory")
        [0.41, 0.40, 0.40, 0.42, 0.41]
        """
        if input not in self._datasets:
            raise ValueError(f"input must be one of {', '.join(INPUTS)}, got {input!r}.")
        check_int_at_least("steps", steps, 1)
        from tfdist.bench.timing import StepClock

        if self.model_alone is not None:
            if callbacks:
                raise ValueError("The model alone runs no Keras loop, so it takes no callbacks; "
                                 "profile it with tf.profiler around run().")
            return self.model_alone.run(self._datasets[input], steps, warmup_steps)
        clock = StepClock(warmup_steps=warmup_steps)
        options = dict(epochs=1, steps_per_epoch=steps + warmup_steps,
                       callbacks=[clock, *callbacks], verbose=0)
        if self.trainer is not None:
            self.trainer.fit(self._datasets[input], **options)
        else:  # tf.data input is never shuffled by fit; say so to silence its warning
            self.model.fit(self._datasets[input], shuffle=False, **options)
        return clock.step_times

    def warm_up(self, steps=2, inputs=("pipeline",)):
        """Runs the first steps (tracing, XLA compilation) for each input, unmeasured.

        Args:
            steps: steps per input.
            inputs: "pipeline" and/or "memory".

        Example:

        >>> contender.warm_up(inputs=("pipeline", "memory"))
        """
        for name in inputs:
            self.run(steps, input=name, warmup_steps=0)

    def describe(self):
        """What was resolved: engine, precision policy and XLA, with reasons.

        Example:

        >>> Contender(Setting("tfdist", "auto", "auto"), workload, strategy, 32).describe()["xla"]
        True
        """
        return {"engine": self.setting.engine, "loss": self.setting.loss,
                "precision_asked": self.setting.precision,
                "precision": self.policy, "precision_reason": self.precision_reason,
                "xla_asked": self.setting.xla, "xla": bool(self.jit_compile),
                "xla_reason": self.xla_reason}
