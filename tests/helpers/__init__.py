"""Shared test helpers: localhost workers, recipe runs, damaged files, fakes,
and what tests used to write for themselves: interrupting a fit (interrupt.py),
comparing trainings (compare.py), recording callbacks (recorders.py), TF_CONFIG
values (tf_config.py), per-replica batches (replicas.py), errors that teach
(errors.py), a worker that SIGKILLs itself (sigkill.py).

    from helpers import mw
    from helpers.recipe_util import run_recipe
"""
