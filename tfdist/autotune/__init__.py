"""Autotune: `--precision auto` / `--xla auto` decided by timing the actual model.

The rules in `tfdist.precision` and `tfdist.xla` are fixed guesses from the
hardware; the fastest setting also depends on the model and the batch. A
trial (`run_trial`) builds the model once per candidate setting
(`candidate_grid`), runs a few steps of each in alternating rounds,
compile time apart, and `choose` picks the fastest whose loss agrees with
float32. `DecisionCache` remembers the decision per model signature,
hardware, TensorFlow version and tfdist code, so the next run starts at once. The
recipes drive this (`tfdist.recipes.auto_choices`); `--autotune off` keeps the
rules.

Example:

    grid = candidate_grid("auto", "auto", on_gpu=False, cpu_flags=cpu_flags())
    timings = run_trial(grid, build, seed=42)
    decision = choose(timings, global_batch_size=64)
    print(format_decision(decision))

    # or, for your own compiled model, cache included:
    decision = tune_model(build_model, dataset, global_batch_size=64, signature={"model": "mine"})
"""

from tfdist.autotune.cache import (CACHE_ENV, DecisionCache, default_cache_path,
                                   hardware_signature, signature_key)
from tfdist.autotune.candidates import Candidate, candidate_grid, candidate_precisions
from tfdist.autotune.modes import AUTOTUNE_ENV, AUTOTUNE_MODES, default_autotune_mode
from tfdist.autotune.decide import LOSS_RTOL, Decision, choose, format_decision, loss_agrees

_TRIAL_NAMES = {"CandidateTiming": "trial", "TrialClock": "trial", "run_trial": "trial",
                "tune": "tune", "tune_model": "tune", "environment_signature": "tune"}


def __getattr__(name):
    # The trial and tuning need Keras (and so TensorFlow); the rest does not, so that
    # the recipes can validate `--autotune` without starting TensorFlow.
    if name in _TRIAL_NAMES:
        import importlib

        return getattr(importlib.import_module(f"tfdist.autotune.{_TRIAL_NAMES[name]}"), name)
    raise AttributeError(f"module 'tfdist.autotune' has no attribute {name!r}")


__all__ = [
    "AUTOTUNE_ENV", "AUTOTUNE_MODES", "CACHE_ENV", "Candidate", "CandidateTiming", "Decision",
    "DecisionCache", "LOSS_RTOL", "TrialClock", "candidate_grid",
    "candidate_precisions", "choose", "default_autotune_mode", "default_cache_path", "format_decision",
    "environment_signature", "hardware_signature", "loss_agrees", "run_trial", "signature_key",
    "tune", "tune_model",
]
