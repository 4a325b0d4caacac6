"""tfdist.xla.resolve_xla: the `--xla` decision and its reason."""

import pytest

from tfdist.xla import XLA_MODES, resolve_xla


@pytest.mark.parametrize("policy,on_gpu,expected", [
    ("float32", False, True),
    ("mixed_float16", False, True),
    ("mixed_bfloat16", False, False),
    ("float32", True, True),
    ("mixed_bfloat16", True, True),
])
def test_auto_decision(policy, on_gpu, expected):
    jit_compile, reason = resolve_xla("auto", policy, on_gpu=on_gpu)
    assert jit_compile is expected
    assert reason.startswith("auto: ")


@pytest.mark.parametrize("mode,expected", [("on", True), ("off", False)])
def test_asked_for_wins_over_auto_rules(mode, expected):
    for policy in ("float32", "mixed_bfloat16"):
        for on_gpu in (False, True):
            assert resolve_xla(mode, policy, on_gpu) == (expected, "asked for")


def test_unknown_mode_names_value_and_choices():
    with pytest.raises(ValueError) as error:
        resolve_xla("yes", "float32", on_gpu=False)
    message = str(error.value)
    assert "'yes'" in message
    assert all(mode in message for mode in XLA_MODES)


def test_resolving_does_not_start_tensorflow():
    import subprocess
    import sys

    code = ("import sys; from tfdist.xla import resolve_xla; resolve_xla('auto', 'float32', False);"
            "print('tensorflow' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize("strategy,mode,expected", [
    ("parameter_server", "auto", False), ("mirrored", "auto", True), ("mirrored", "on", True)])
def test_parameter_servers_turn_auto_xla_off_with_the_reason(strategy, mode, expected):
    """On a float32 CPU run the rules pick XLA, except under parameter servers, whose
    workers read variables placed on the ps tasks (XLA cannot compile that)."""
    import argparse

    from tfdist.recipes.auto_choices import parameter_server_xla_blocker
    from tfdist.xla import respect_xla_blocker

    config = argparse.Namespace(strategy=strategy)
    jit, reason = resolve_xla(mode, "float32", on_gpu=False)
    jit, reason = respect_xla_blocker(mode, jit, reason, parameter_server_xla_blocker(config))
    assert jit is expected
    assert ("ps tasks" in reason) is (strategy == "parameter_server")


def test_xla_on_under_parameter_servers_is_refused_naming_the_way_out():
    import argparse

    from tfdist.recipes.auto_choices import parameter_server_xla_blocker
    from tfdist.xla import respect_xla_blocker

    blocker = parameter_server_xla_blocker(argparse.Namespace(strategy="parameter_server"))
    with pytest.raises(ValueError, match=r"--xla on is not possible.*ps tasks.*--xla off or auto"):
        respect_xla_blocker("on", True, "asked for", blocker)
