import keras
import pytest

from helpers.errors import assert_names_value_and_choices
from tfdist.precision import PRECISIONS, apply_precision, detect_precision, resolve_precision


@pytest.mark.parametrize("capabilities, expected", [
    ([(8, 0)], "mixed_bfloat16"),
    ([(9, 0), (8, 6)], "mixed_bfloat16"),
    ([(7, 0)], "mixed_float16"),
    ([(8, 0), (7, 5)], "mixed_float16"),  # the oldest GPU decides
    ([(6, 1)], "float32"),
])
def test_auto_on_gpus_follows_compute_capability(capabilities, expected):
    choice = detect_precision(gpu_capabilities=capabilities, flags=set())
    assert choice.policy == expected
    assert "compute capability" in choice.reason


@pytest.mark.parametrize("flags, expected", [
    ({"avx2", "amx_bf16"}, "mixed_bfloat16"),
    ({"avx512f", "avx512_bf16"}, "mixed_bfloat16"),
    ({"avx2", "avx512f"}, "float32"),
    (set(), "float32"),
])
def test_auto_on_cpus_follows_bf16_instructions(flags, expected):
    assert detect_precision(gpu_capabilities=[], flags=flags).policy == expected


def test_unknown_precision_names_the_value_and_the_valid_ones():
    with pytest.raises(ValueError) as error:
        resolve_precision("fp8")
    assert_names_value_and_choices(error.value, "fp8", PRECISIONS)


def test_loss_scaling_only_for_float16():
    assert resolve_precision("mixed_float16").loss_scaling
    assert not resolve_precision("mixed_bfloat16").loss_scaling
    assert resolve_precision("mixed_bfloat16").compute_dtype == "bfloat16"


def test_apply_sets_the_keras_global_policy():
    try:
        choice = apply_precision("mixed_bfloat16")
        assert keras.mixed_precision.dtype_policy().name == "mixed_bfloat16"
        layer = keras.layers.Dense(2)
        layer.build((None, 3))
        assert layer.compute_dtype == "bfloat16" and layer.kernel.dtype == "float32"
        assert choice.policy == "mixed_bfloat16"
    finally:
        keras.mixed_precision.set_global_policy("float32")


def test_cpu_flags_come_from_the_environment_when_described_there(monkeypatch):
    from tfdist.precision import cpu_flags

    assert cpu_flags(environ={"TFDIST_CPU_FLAGS": "avx2, amx_bf16  fma"}) == {"avx2", "amx_bf16", "fma"}
    assert cpu_flags(environ={"TFDIST_CPU_FLAGS": ""}) == set()
    monkeypatch.setenv("TFDIST_CPU_FLAGS", "avx2 fma")
    choice = detect_precision(gpu_capabilities=[])
    assert choice.policy == "float32" and "$TFDIST_CPU_FLAGS" in choice.reason
    monkeypatch.setenv("TFDIST_CPU_FLAGS", "avx2 amx_bf16")
    assert detect_precision(gpu_capabilities=[]).policy == "mixed_bfloat16"


@pytest.mark.parametrize("written, meant", [("AVX2", "avx2"), ("avx512bf16", "avx512_bf16"),
                                             ("amx-bf16", "amx_bf16"), ("AMX_TILE", "amx_tile")])
def test_a_flag_spelt_otherwise_than_the_cpu_spells_it_is_refused(written, meant):
    """Counted as absent, it made `auto` pick for another CPU than the one described."""
    from tfdist.precision import cpu_flags

    with pytest.raises(ValueError) as error:
        cpu_flags(environ={"TFDIST_CPU_FLAGS": f"fma {written}"})
    assert f"names {written!r}" in str(error.value) and f"did you mean {meant!r}" in str(error.value)


def test_flags_no_rule_reads_are_kept_as_written():
    from tfdist.precision import cpu_flags

    assert cpu_flags(environ={"TFDIST_CPU_FLAGS": "sse4_2 vaes avx512_vnni"}) == {
        "sse4_2", "vaes", "avx512_vnni"}


@pytest.mark.parametrize("alias, name", [("bf16", "mixed_bfloat16"), ("FP16", "mixed_float16"),
                                         ("fp32", "float32"), (" mixed_bf16 ", "mixed_bfloat16")])
def test_aliases_resolve_to_keras_policies(alias, name):
    from tfdist.precision import canonical_precision

    assert canonical_precision(alias) == name
    assert resolve_precision(alias).policy == name
