"""One call from a grid of settings to a decision: the cached one, or a new trial.

`tune` is what the recipes call; `tune_model` is the same for your own
program: give it a function that builds and compiles your model and a
dataset, and it times the settings with tfdist's engine and says which to
use.

Example:

    def build():
        model = make_my_model()
        model.compile(keras.optimizers.AdamW(1e-3), "sparse_categorical_crossentropy")
        return model

    decision = tune_model(build, train_dataset, global_batch_size=64)
    keras.mixed_precision.set_global_policy(decision.choice.policy)
    model = build()
    Trainer(model, jit_compile=decision.choice.jit_compile).fit(train_dataset, epochs=3)
"""

import gc
import time

from tfdist.autotune.cache import (DecisionCache, code_fingerprint, hardware_signature,
                                   signature_key)
from tfdist.autotune.candidates import Candidate, candidate_grid
from tfdist.autotune.decide import Decision, choose, format_decision
from tfdist.seam import forget_retracing_counts, strategy_worker_count

TRIAL_ROUNDS = 3
TRIAL_STEPS = 3
TRIAL_WARMUP_STEPS = 2


def environment_signature(on_gpu=None):
    """The hardware and library versions a decision depends on.

    Args:
        on_gpu: describe the GPUs too (default: whether TensorFlow sees any).

    Example:

    >>> sorted(environment_signature())
    ['hardware', 'versions']
    """
    import keras
    import tensorflow as tf

    from tfdist.precision import cpu_flags

    return {"hardware": hardware_signature(cpu_flags(), _gpu_descriptions(on_gpu)),
            "versions": {"tensorflow": tf.__version__, "keras": keras.__version__,
                         "tfdist_code": code_fingerprint()}}


def machine_hardware(on_gpu=None):
    """This machine's CPU flags and GPU compute capabilities, as `candidate_grid`
    and `candidate_precisions` take them.

    Args:
        on_gpu: describe the GPUs (default: whether TensorFlow sees any);
            False gives no capabilities.

    Returns:
        `(cpu_flags, gpu_capabilities)`: a set of flag names and a list of
        `(major, minor)`, one per GPU.

    Example:

    >>> flags, capabilities = machine_hardware(on_gpu=False)
    >>> capabilities
    []
    """
    from tfdist.precision import cpu_flags

    return cpu_flags(), [capability for _, capability in _gpu_descriptions(on_gpu)]


def _gpu_descriptions(on_gpu=None):
    """`tfdist.precision.gpu_descriptions()`, or none when `on_gpu` is False.

    Example:

    >>> _gpu_descriptions(on_gpu=False)
    []
    """
    from tfdist.precision import gpu_descriptions

    return gpu_descriptions() if on_gpu is None or on_gpu else []


def machine_grid(precision, xla, xla_blocker=None):
    """The candidate grid (`candidate_grid`) for this machine's CPU flags and GPUs.

    Args:
        precision: "auto" or a policy name, canonical.
        xla: "auto", "on" or "off".
        xla_blocker: why the model cannot be XLA-compiled, or None.

    Example:

    >>> [c.label for c in machine_grid("float32", "auto")]
    ['float32, XLA off', 'float32, XLA on']
    """
    flags, capabilities = machine_hardware()
    return candidate_grid(precision, xla, on_gpu=bool(capabilities),
                          gpu_capabilities=capabilities, cpu_flags=flags,
                          xla_blocker=xla_blocker)


def _forget_trial_tracing():
    """The trial traced each candidate's step functions once; TensorFlow counts
    those traces per method, and would call the real run's first evaluation
    (the 5th trace of the same method) "excessive retracing". Its counters are
    private (`tfdist.seam.forget_retracing_counts`): where they are not found,
    the warning is only noise."""
    forget_retracing_counts()


def _cached_decision(entry, grid):
    choice = (entry or {}).get("choice") or {}
    if choice.get("precision") is None:
        return None
    candidate = Candidate(choice["precision"], bool(choice["xla"]))
    if candidate not in grid:
        return None
    return Decision(candidate, entry.get("rows", []), entry.get("reason", "autotune"),
                    measured_at=entry.get("measured_at"))


def tune(grid, build, *, global_batch_size, seed=None, signature=None, cache=None,
         refresh=False, max_seconds=120.0, log=print):
    """Decides among `grid`: from the cache when it holds this signature, else by a trial.

    Args:
        grid: the `Candidate`s (at least one).
        build: `candidate -> (trainer, dataset)`, see `run_trial`.
        global_batch_size: examples per step.
        seed: see `run_trial` (None: the global seeds are left alone).
        signature: what the decision is valid for (a JSON-serialisable dict
            naming the model and batch; `environment_signature()` is added),
            or None to neither read nor write the cache.
        cache: a `DecisionCache` (default: the default file).
        refresh: run a trial even when a decision is cached.
        max_seconds: the trial's budget (see `run_trial`).
        log: prints progress and the figures.

    Returns:
        `(decision, source)`: a `Decision` (its `choice` None when no
        setting was eligible) and a few words on where it came from
        ("measured in 31 s, cached in ...", "cached in ..., measured ...").

    Example:

    >>> decision, source = tune(grid, build, global_batch_size=64,
    ...                         signature={"model": "my_lm", "batch": 64})
    """
    import keras

    from tfdist.autotune.trial import run_trial

    key = None
    if signature is not None:
        cache = cache or DecisionCache()
        signature = dict(signature, **environment_signature())
        key = signature_key(signature)
        decision = None if refresh else _cached_decision(cache.get(key), grid)
        if decision is not None:
            log(format_decision(decision, global_batch_size))
            return decision, f"cached in {cache.path}, measured {decision.measured_at}"
    log(f"autotune: timing {len(grid)} settings on this model and batch "
        f"({'; '.join(c.label for c in grid)}): compile, then up to {TRIAL_ROUNDS} alternating "
        f"rounds of {TRIAL_STEPS}+ steps each (about 0.5 s), no new round after "
        f"{max_seconds:g} s")
    started = time.perf_counter()
    timings = run_trial(grid, build, seed=seed, rounds=TRIAL_ROUNDS, steps=TRIAL_STEPS,
                        warmup_steps=TRIAL_WARMUP_STEPS, max_seconds=max_seconds, log=log)
    decision = choose(timings, global_batch_size)
    decision.trial_seconds = time.perf_counter() - started
    # The trial's models are gone; their layer names must not shift the next model's.
    del timings
    keras.backend.clear_session()
    gc.collect()
    _forget_trial_tracing()
    log(format_decision(decision, global_batch_size))
    source = f"measured in {decision.trial_seconds:.0f} s"
    if key is not None and decision.choice is not None:
        stored = cache.put(key, {"choice": decision.choice.as_dict(), "rows": decision.rows,
                                 "reason": decision.reason,
                                 "trial_seconds": decision.trial_seconds,
                                 "signature": signature})
        if stored:
            source += f", cached in {cache.path}"
    return decision, source


def tune_model(build_model, dataset, *, global_batch_size, strategy=None, precision="auto",
               xla="auto", signature=None, cache_path=None, refresh=False, max_seconds=120.0,
               log=print):
    """Times precision and XLA settings on your own model; returns the `Decision`.

    Each candidate's model is built by `build_model()` with the candidate's
    precision as the Keras global policy, inside `strategy.scope()`, and
    trained a few steps by `tfdist.training.Trainer` (its `jit_compile` as
    the candidate says) on the first batch of `dataset`, replayed. Your
    compile() arguments (optimizer, loss, metrics) are kept. Afterwards the
    global policy is as it was: apply the choice yourself (see the module
    example).

    Args:
        build_model: `() -> keras.Model`, compiled.
        dataset: a `tf.data.Dataset` of global batches, `(x, y)` or `(x, y, w)`.
        global_batch_size: examples per batch of `dataset`.
        strategy: the `tf.distribute.Strategy` to time under (default: the
            default strategy). Several workers are refused: each would time
            on its own and they could disagree.
        precision: "auto" or a policy to keep fixed.
        xla: "auto", "on" or "off".
        signature: a JSON-serialisable dict naming your model and batch, to
            cache the decision under (with the hardware and versions); None
            to always measure.
        cache_path: the cache file (default: `default_cache_path()`).
        refresh: measure even when a decision is cached.
        max_seconds, log: see `tune`.

    Returns:
        A `Decision`; `decision.choice` is the `Candidate` to use (None when
        no setting ran with a loss that agrees with float32).

    Raises:
        ValueError: a bad precision or XLA mode, or a multi-worker strategy.

    Example:

    >>> decision = tune_model(build, dataset, global_batch_size=64, signature={"model": "mine"})
    >>> decision.choice.label
    'mixed_bfloat16, XLA off'
    """
    import tensorflow as tf

    from tfdist.precision import canonical_precision
    from tfdist.training import Trainer
    from tfdist.xla import XLA_MODES

    if xla not in XLA_MODES:
        raise ValueError(f"Unknown XLA mode {xla!r}; choose one of {', '.join(XLA_MODES)}.")
    strategy = strategy or tf.distribute.get_strategy()
    workers = strategy_worker_count(strategy)
    if workers > 1:
        raise ValueError(f"tune_model under {workers} workers: each would time on its own and "
                         "they could disagree. Tune on one worker, then pass the choice to all.")
    grid = machine_grid(canonical_precision(precision), xla)
    if len(grid) == 1:
        return Decision(grid[0], [], "autotune: only one setting is possible here")
    replay = dataset.take(1).cache().repeat()

    def build(candidate):
        with strategy.scope():
            model = build_model()
            trainer = Trainer(model, strategy=strategy, jit_compile=candidate.jit_compile)
        return trainer, replay

    decision, _ = tune(grid, build, global_batch_size=global_batch_size, signature=signature,
                       cache=DecisionCache(cache_path), refresh=refresh, max_seconds=max_seconds,
                       log=log)
    return decision
