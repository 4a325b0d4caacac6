import keras
import pytest

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
    assert "'fp8'" in str(error.value)
    for name in PRECISIONS:
        assert name in str(error.value)


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
