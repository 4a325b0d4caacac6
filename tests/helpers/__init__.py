"""Shared test helpers: localhost workers, recipe runs, damaged files, fakes.

    from helpers import mw
    from helpers.recipe_util import run_recipe
"""
