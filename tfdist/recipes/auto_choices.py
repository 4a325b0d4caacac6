"""How a recipe settles `--precision auto` / `--xla auto`: the rules, a cached
decision, or a trial on the run's own model and batch (`--autotune`).

The trial runs in the recipe's process before the real model is built, on
one device (the first GPU, or the CPU) with one replica's share of the
batch: each candidate setting gets its own model, optimizer and step (built
as the run will build them) and one batch of the run's training data
replayed from memory (`tfdist.autotune.tune`). One replica is what the
precision and XLA change; the all-reduce carries float32 gradients in every
setting, and compiling once instead of once per device keeps the trial short. It is
skipped, and the rules decide, when there is nothing to choose, under
several workers (each would time on its own and they could disagree), under
parameter servers and with `--model-parallel`.

Example:

    precision, jit_compile, xla_reason, summary = settle_auto_choices(
        recipe, config, info, data, on_gpu=False,
        rules=(precision, jit_compile, xla_reason), total_steps=1000)
"""

from tfdist.autotune import DecisionCache, candidate_grid, candidate_precisions
from tfdist.autotune.modes import why_flags_rule_out_a_trial
from tfdist.precision import PrecisionChoice
from tfdist.recipes.recipe_optimizer import build_recipe_optimizer
from tfdist.recipes.model_parallel_flags import xla_blocker as model_parallel_xla_blocker
from tfdist.recipes.record import config_values
from tfdist.recipes.tensor_parallel_flags import precision_under_tensor_parallel
from tfdist.recipes.tensor_parallel_flags import xla_blocker as tensor_parallel_xla_blocker
from tfdist.xla import leave_uncompiled_where_slower, resolve_xla, respect_xla_blocker


def skip_reason(config, info):
    """Why this run cannot hold a trial (the rules decide), or None.

    Example:

    >>> skip_reason(argparse.Namespace(model_parallel=1), types.SimpleNamespace(
    ...     name="multi_worker_mirrored", num_workers=2))[:33]
    'autotune skipped under 2 workers:'
    """
    if info.name == "parameter_server":
        return ("autotune skipped under parameter servers (steps run on remote workers); the "
                "rules decide")
    if info.num_workers > 1:
        return (f"autotune skipped under {info.num_workers} workers: each would time on its own "
                "and they could pick differently; the rules decide (run once on one worker "
                "with --autotune on to see the trial, then name the winner with --precision "
                "and --xla)")
    if getattr(config, "model_parallel", 1) > 1:
        return "autotune skipped with --model-parallel (pipeline stages); the rules decide"
    if getattr(config, "tensor_parallel", 1) > 1:
        return "autotune skipped with --tensor-parallel (split layers); the rules decide"
    return None


def run_signature(recipe_name, config, options, data, info):
    """What a recipe's cached decision is valid for, besides the hardware and
    versions (`tfdist.autotune.tune` adds those): the recipe, the options that
    shape the step (those whose `Option` declares `changes_step_speed`), the
    data and the strategy.

    Example:

    >>> sorted(run_signature("transformer", config, options, data, info))
    ['data', 'options', 'recipe', 'strategy']
    """
    shaping = [option for option in options if option.changes_step_speed]
    values = config_values(config, shaping)
    return {"recipe": recipe_name, "options": values,
            "data": {"info": data.info, "tokens_per_example": data.tokens_per_example,
                     "description": data.description},
            "strategy": {"name": info.name, "replicas": info.num_replicas}}


def _trial_builder(recipe, config, data, batch_size, total_steps):
    """`candidate -> (trainer, dataset)`, built the way the run builds its own,
    but on one device (the first GPU, or the CPU) with one replica's batch."""
    import tensorflow as tf

    from tfdist.data import make_dataset_fn
    from tfdist.training import Trainer

    strategy = tf.distribute.get_strategy()  # the default: one device

    def build(candidate):
        # Deterministic: every candidate gets the very same batch, so that
        # their first losses differ only by their arithmetic.
        dataset_fn = make_dataset_fn(data.train, batch_size, training=True, seed=config.seed,
                                     deterministic=True)
        dataset = dataset_fn(None).take(1).cache().repeat()
        with strategy.scope():
            built = recipe.build_model(config, data)
            if candidate.jit_compile and built.xla_blocker:
                raise ValueError(built.xla_blocker)
            optimizer = build_recipe_optimizer(config, total_steps, built)
            trainer = Trainer(built.model, optimizer, built.loss, built.metrics,
                              strategy=strategy, jit_compile=candidate.jit_compile,
                              grad_accum_steps=config.grad_accum_steps,
                              clip_norm=config.clip_norm)
        return trainer, dataset

    return build


def settle_auto_choices(recipe, config, info, data, *, on_gpu, rules, total_steps, say=print):
    """The run's precision and XLA settings, with `--autotune` applied.

    Args:
        recipe: the `Recipe`.
        config: the parsed config (`autotune`, `autotune_cache`,
            `autotune_budget`, `precision`, `xla`, ...).
        info: the run's `describe_strategy`.
        data: the recipe's `RecipeData`.
        on_gpu: whether the step runs on GPUs.
        rules: `(PrecisionChoice, jit_compile, xla_reason)` from the fixed rules.
        total_steps: the run's optimizer steps (for the learning-rate schedule).
        say: prints the trial's progress and figures (the chief's print).

    Returns:
        `(PrecisionChoice, jit_compile, xla_reason, summary)`, where
        `summary` is one line for the start block (None when autotune had
        nothing to do).

    Example:

    >>> precision, jit, reason, summary = settle_auto_choices(
    ...     recipe, config, info, data, on_gpu=False, rules=rules, total_steps=100)
    """
    from tfdist.autotune.tune import machine_hardware, tune

    precision, jit_compile, xla_reason = rules
    if why_flags_rule_out_a_trial(config.autotune, config.precision, config.xla):
        return precision, jit_compile, xla_reason, None
    flags, capabilities = machine_hardware(on_gpu)
    grid = candidate_grid(config.precision, config.xla, on_gpu=on_gpu,
                          gpu_capabilities=capabilities, cpu_flags=flags,
                          xla_blocker=recipe.xla_blocker(config) if recipe.xla_blocker else None)
    if len(grid) < 2:
        return precision, jit_compile, xla_reason, None
    skipped = skip_reason(config, info)
    if skipped:
        return precision, jit_compile, xla_reason, skipped
    per_replica = config.global_batch_size // info.num_replicas
    say(f"autotune: the trial runs on one device with one replica's batch ({per_replica} "
        "examples); --autotune off skips it")
    decision, source = tune(
        grid, _trial_builder(recipe, config, data, per_replica, total_steps),
        global_batch_size=per_replica, seed=config.seed,
        signature=run_signature(recipe.name, config, recipe.all_options(), data, info),
        cache=DecisionCache(config.autotune_cache), refresh=config.autotune == "refresh",
        max_seconds=config.autotune_budget, log=say)
    if decision.choice is None:
        return precision, jit_compile, xla_reason, f"{decision.reason}; the rules decide"
    chosen = decision.choice
    if config.precision == "auto":
        precision = PrecisionChoice(chosen.policy, decision.reason)
    if config.xla == "auto":
        jit_compile, xla_reason = chosen.jit_compile, decision.reason
    _, precision_note = candidate_precisions(config.precision, on_gpu, capabilities, flags)
    return precision, jit_compile, xla_reason, (
        f"{chosen.label}, {source} (--autotune off: the rules; refresh: measure again)"
        + (f"; {precision_note}" if precision_note else ""))


def rule_choices(recipe, config, on_gpu):
    """The precision and XLA settings this config resolves to on this machine.

    Example:

    >>> precision, jit_compile, xla_reason = rule_choices(RECIPE, config, on_gpu=False)
    """
    from tfdist.precision import resolve_precision

    precision = precision_under_tensor_parallel(config, resolve_precision(config.precision))
    jit_compile, xla_reason = resolve_xla(config.xla, precision.policy, on_gpu=on_gpu)
    blocker = (recipe.xla_blocker(config) if recipe.xla_blocker else None) or (
        model_parallel_xla_blocker(config)) or tensor_parallel_xla_blocker(config) or (
        parameter_server_xla_blocker(config))
    jit_compile, xla_reason = respect_xla_blocker(config.xla, jit_compile, xla_reason, blocker)
    slower = recipe.xla_slower_on_cpu(config) if recipe.xla_slower_on_cpu else None
    jit_compile, xla_reason = leave_uncompiled_where_slower(config.xla, jit_compile, xla_reason,
                                                            slower, on_gpu)
    return precision, jit_compile, xla_reason


def parameter_server_xla_blocker(config):
    """Why XLA is off under `--strategy parameter_server` (for `--xla auto`), or None.

    The variables live on the ps tasks and a worker's step reads them over the
    network; XLA cannot compile a step that reads a variable placed on another
    task (TensorFlow 2.21: "Trying to access resource ... located in device
    /job:ps/... from device /job:worker/...").

    Example:

    >>> parameter_server_xla_blocker(argparse.Namespace(strategy="parameter_server"))[:31]
    'the variables live on ps tasks,'
    """
    if config.strategy != "parameter_server":
        return None
    return ("the variables live on ps tasks, and XLA cannot compile a step that reads a "
            "variable placed on another task")
