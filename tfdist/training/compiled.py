"""What the trainer takes from `model.compile()`, and what it refuses.

`compile()` is the source of truth: the trainer reads the optimizer, loss,
`loss_weights`, metrics, `steps_per_execution`, `jit_compile` and
`run_eagerly` the model was compiled with. Arguments given to the trainer
override the matching compile argument (the model is compiled again with
the merged arguments, inside the strategy's scope), so that nothing the
program set is dropped on the way.
"""

import collections

from keras import tree

from tfdist.distribute.introspection import is_multi_worker
from tfdist.seam import default_strategy, model_compile_config
from tfdist.training.loss import GlobalLoss
from tfdist.training.model_hooks import hook_name

COMPILE_ARGUMENTS = ("optimizer", "loss", "loss_weights", "metrics", "weighted_metrics")
"""The `compile()` arguments the trainer accepts as overrides."""


class CompiledSettings(collections.namedtuple(
        "CompiledSettings", ["jit_compile", "steps_per_execution", "run_eagerly"])):
    """The execution settings of a compiled model (see `compile_model`).

    Example:

    >>> CompiledSettings(jit_compile=False, steps_per_execution=1, run_eagerly=False)
    """


def compile_model(model, strategy, **overrides):
    """Makes sure `model` is compiled with its own arguments plus `overrides`.

    Args:
        model: a `keras.Model`, compiled or not.
        strategy: the strategy whose scope compiling happens in.
        **overrides: `compile()` arguments (see `COMPILE_ARGUMENTS`); None
            values are ignored.

    Returns:
        The model's `CompiledSettings` (`jit_compile` as compiled, False when
        the model was never compiled).

    Raises:
        ValueError: the model is not compiled and no optimizer is given, or a
            loss has a reduction that has no value over a global batch.

    Example:

    >>> model.compile(keras.optimizers.SGD(0.1), "mse", loss_weights=0.5)
    >>> compile_model(model, strategy)            # keeps everything
    >>> compile_model(model, strategy, loss="mae")  # loss_weights=0.5 stays
    """
    given = {name: value for name, value in overrides.items() if value is not None}
    unknown = sorted(set(given) - set(COMPILE_ARGUMENTS))
    if unknown:
        raise TypeError(f"Unknown compile arguments {unknown}; allowed: {COMPILE_ARGUMENTS}.")
    if getattr(model, "compiled", False):
        config = dict(model_compile_config(model).config)
        if given:
            config.update(given)
            with strategy.scope():
                model.compile(**config)
    else:
        if "optimizer" not in given:
            raise ValueError(
                f"The model {model.name!r} is not compiled and no optimizer was given. "
                "Call model.compile(optimizer=..., loss=..., metrics=...) inside "
                "strategy.scope() (as for Keras's fit), or pass optimizer= and loss= "
                "to the Trainer.")
        with strategy.scope():
            model.compile(**given)
        config = dict(model_compile_config(model).config)
    _check_losses(model.loss)
    return CompiledSettings(jit_compile=bool(config.get("jit_compile") or False),
                            steps_per_execution=int(config.get("steps_per_execution") or 1),
                            run_eagerly=bool(config.get("run_eagerly") or False))


def _check_losses(loss):
    """Refuses, before any data is read, a compiled loss without a global value."""
    if loss is None:
        return
    for leaf in tree.flatten(loss):
        if leaf is not None:
            GlobalLoss(leaf)


def check_hooks(model, hooks, strategy, *, jit_compile, run_eagerly, grad_accum_steps,
                clip_norm):
    """Refuses settings that cannot be honoured together with the model's own hooks.

    Args:
        model: the `keras.Model`.
        hooks: `tfdist.training.model_hooks.own_hooks(model)`.
        strategy: the trainer's strategy.
        jit_compile, run_eagerly, grad_accum_steps, clip_norm: the trainer's
            settings.

    Raises:
        ValueError: a setting that the model's own `train_step` would
            silently bypass, XLA around an own step under distribution, or
            `run_eagerly` under several workers; the message names the
            setting and the way out.

    Example:

    >>> check_hooks(gan, own_hooks(gan), strategy, jit_compile=False, run_eagerly=False,
    ...             grad_accum_steps=1, clip_norm=None)
    """
    if run_eagerly and is_multi_worker(strategy):
        raise ValueError(
            "The model was compiled with run_eagerly=True, which tfdist does not run "
            "under MultiWorkerMirroredStrategy (every worker must trace the same "
            "collective operations). Compile with run_eagerly=False, or debug eagerly "
            "on one worker (strategy 'mirrored' or 'default').")
    if run_eagerly and jit_compile:
        raise ValueError("run_eagerly=True and jit_compile=True cannot both hold: "
                         "choose one (Keras turns jit_compile off in that case).")
    if "train_step" not in hooks:
        return
    name = hook_name(model, "train_step", hooks)
    if grad_accum_steps > 1:
        raise ValueError(
            f"grad_accum_steps={grad_accum_steps} cannot be honoured: {name} is the model's "
            "own training step, which applies its own gradients. Accumulate inside "
            "your train_step, or remove the train_step override to use tfdist's step.")
    if clip_norm is not None:
        raise ValueError(
            f"clip_norm={clip_norm} cannot be honoured: {name} applies its own gradients. "
            "Give the optimizer global_clipnorm= instead (it clips the summed "
            "gradient), or clip inside your train_step.")
    if jit_compile and strategy is not default_strategy():
        raise ValueError(
            f"jit_compile=True cannot be honoured with {name} under "
            f"{type(strategy).__name__}: the model's own step calls optimizer.apply, "
            "whose cross-replica sum XLA cannot compile (Keras's fit refuses XLA under "
            "any strategy too). Compile with jit_compile=False, or remove the train_step "
            "override: tfdist's own step compiles the replica computation with XLA.")
