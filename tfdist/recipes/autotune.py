"""How a recipe settles `--precision auto` / `--xla auto`: the rules, a cached
decision, or a trial on the run's own model and batch (`--autotune`).

The trial runs in the recipe's process, under the run's strategy, before the
real model is built: each candidate setting gets its own model, optimizer
and step (built exactly as the run will build them) and one batch of the
run's training data replayed from memory. It is skipped, and the rules
decide, when there is nothing to choose, under several workers (each
would time on its own and they could disagree), under parameter servers and
with `--model-parallel`.

Example:

    precision, jit_compile, xla_reason, report = settle_auto_choices(
        recipe, config, strategy, info, data, on_gpu=False,
        rules=(precision, jit_compile, xla_reason), total_steps=1000)
"""

import gc
import logging
import time

from tfdist.autotune import (Candidate, DecisionCache, Decision, candidate_grid,
                             candidate_precisions, choose, format_decision, hardware_signature,
                             signature_key)
from tfdist.autotune.cache import RUN_ONLY_OPTIONS
from tfdist.precision import PrecisionChoice, cpu_flags
from tfdist.recipes.record import config_values

logger = logging.getLogger("tfdist")

TRIAL_ROUNDS = 3
TRIAL_STEPS = 3
TRIAL_WARMUP_STEPS = 2


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
    return None


def run_signature(recipe_name, config, options, data, info, hardware):
    """What a cached decision is valid for (see `tfdist.autotune.cache`).

    Example:

    >>> signature = run_signature("transformer", config, options, data, info, hardware)
    >>> sorted(signature)
    ['data', 'hardware', 'options', 'recipe', 'strategy', 'versions']
    """
    import keras
    import tensorflow as tf

    values = {name: value for name, value in config_values(config, options).items()
              if name not in RUN_ONLY_OPTIONS}
    return {"recipe": recipe_name, "options": values,
            "data": {"info": data.info, "tokens_per_example": data.tokens_per_example,
                     "description": data.description},
            "strategy": {"name": info.name, "replicas": info.num_replicas},
            "hardware": hardware,
            "versions": {"tensorflow": tf.__version__, "keras": keras.__version__}}


def _hardware(on_gpu):
    import tensorflow as tf

    gpus = []
    for gpu in tf.config.list_physical_devices("GPU") if on_gpu else []:
        details = tf.config.experimental.get_device_details(gpu)
        gpus.append((details.get("device_name", gpu.name),
                     tuple(details.get("compute_capability") or (0, 0))))
    return hardware_signature(cpu_flags(), gpus)


def _trial_builder(recipe, config, strategy, data, total_steps):
    """`candidate -> (trainer, dataset)`, built the way the run builds its own."""
    from tfdist.data import make_dataset_fn
    from tfdist.optimizers import build_optimizer
    from tfdist.training import Trainer

    def build(candidate):
        dataset_fn = make_dataset_fn(data.train, config.global_batch_size, training=True,
                                     seed=config.seed)
        dataset = strategy.distribute_datasets_from_function(
            lambda context: dataset_fn(context).take(1).cache().repeat())
        with strategy.scope():
            built = recipe.build_model(config, data)
            if candidate.jit_compile and built.xla_blocker:
                raise ValueError(built.xla_blocker)
            optimizer = build_optimizer(
                config.optimizer, config.learning_rate, schedule=config.schedule,
                warmup_steps=config.warmup_steps, total_steps=total_steps,
                weight_decay=config.weight_decay)
            if built.prepare_optimizer is not None:
                built.prepare_optimizer(optimizer)
            trainer = Trainer(built.model, optimizer, built.loss, built.metrics,
                              strategy=strategy, jit_compile=candidate.jit_compile,
                              grad_accum_steps=config.grad_accum_steps,
                              clip_norm=config.clip_norm)
        return trainer, dataset

    return build


def _decision_from_cache(entry):
    choice = entry.get("choice") or {}
    if choice.get("precision") is None:
        return None
    return Decision(Candidate(choice["precision"], bool(choice["xla"])), entry.get("rows", []),
                    entry.get("reason", "autotune"), measured_at=entry.get("measured_at"))


def settle_auto_choices(recipe, config, strategy, info, data, *, on_gpu, rules, total_steps,
                        say=print):
    """The run's precision and XLA settings, with `--autotune` applied.

    Args:
        recipe: the `Recipe`.
        config: the parsed config (`autotune`, `autotune_cache`,
            `autotune_budget`, `precision`, `xla`, ...).
        strategy, info: the run's strategy and its `describe_strategy`.
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
    ...     recipe, config, strategy, info, data, on_gpu=False, rules=rules, total_steps=100)
    """
    precision, jit_compile, xla_reason = rules
    if config.autotune == "off" or (config.precision != "auto" and config.xla != "auto"):
        return precision, jit_compile, xla_reason, None
    blocker = recipe.xla_blocker(config) if recipe.xla_blocker else None
    flags = cpu_flags()
    gpu_capabilities = []
    if on_gpu:
        gpu_capabilities = [capability for _, capability in _hardware(True)["gpus"]]
    grid = candidate_grid(config.precision, config.xla, on_gpu=on_gpu,
                          gpu_capabilities=[tuple(c) for c in gpu_capabilities],
                          cpu_flags=flags, xla_blocker=blocker)
    if len(grid) < 2:
        return precision, jit_compile, xla_reason, None
    skipped = skip_reason(config, info)
    if skipped:
        return precision, jit_compile, xla_reason, skipped
    signature = run_signature(recipe.name, config, recipe.all_options(), data, info,
                              _hardware(on_gpu))
    key = signature_key(signature)
    cache = DecisionCache(config.autotune_cache)
    decision = None
    if config.autotune == "on":
        entry = cache.get(key)
        decision = _decision_from_cache(entry) if entry else None
        if decision is not None and decision.choice not in grid:
            decision = None
    if decision is None:
        decision = _run_trial(recipe, config, strategy, data, grid, total_steps, say)
        source = f"measured in {decision.trial_seconds:.0f} s"
        if decision.choice is not None:
            stored = cache.put(key, {"choice": decision.choice.as_dict(), "rows": decision.rows,
                                     "reason": decision.reason,
                                     "trial_seconds": decision.trial_seconds,
                                     "signature": signature})
            source += f", cached in {cache.path}" if stored else ""
    else:
        source = f"cached in {cache.path}, measured {decision.measured_at}"
        say(format_decision(decision, config.global_batch_size))
    _, precision_note = candidate_precisions(config.precision, on_gpu,
                                             [tuple(c) for c in gpu_capabilities], flags)
    if decision.choice is None:
        note = f"{decision.reason}; the rules decide"
        return precision, jit_compile, xla_reason, note
    chosen = decision.choice
    if config.precision == "auto":
        precision = PrecisionChoice(chosen.policy, decision.reason)
    if config.xla == "auto":
        jit_compile, xla_reason = chosen.jit_compile, decision.reason
    summary = (f"{chosen.label}, {source} (--autotune off: the rules; refresh: measure again)"
               + (f"; {precision_note}" if precision_note else ""))
    return precision, jit_compile, xla_reason, summary


def _run_trial(recipe, config, strategy, data, grid, total_steps, say):
    import keras

    from tfdist.autotune.trial import run_trial

    say(f"autotune: timing {len(grid)} settings on this model and batch "
        f"({'; '.join(c.label for c in grid)}): compile, then up to {TRIAL_ROUNDS} alternating "
        f"rounds of {TRIAL_STEPS}+ steps each (about 0.5 s), no new round after "
        f"{config.autotune_budget:g} s (--autotune off skips this)")
    started = time.perf_counter()
    timings = run_trial(grid, _trial_builder(recipe, config, strategy, data, total_steps),
                        seed=config.seed, rounds=TRIAL_ROUNDS, steps=TRIAL_STEPS,
                        warmup_steps=TRIAL_WARMUP_STEPS, max_seconds=config.autotune_budget,
                        log=say)
    decision = choose(timings, config.global_batch_size)
    decision.trial_seconds = time.perf_counter() - started
    # The trial's models are gone; their layer names must not shift the run's.
    del timings
    keras.backend.clear_session()
    gc.collect()
    say(format_decision(decision, config.global_batch_size))
    return decision
