"""`--gpu-memory`: parsing (no TensorFlow), the no-GPU path for real, and the
GPU calls through TensorFlow's API contract.

No GPU exists on these machines. The calls `apply_gpu_memory` makes on GPUs
are checked through its `tf_config` seam: a recorder that hands out real
`tf.config.PhysicalDevice` values, builds real
`tf.config.LogicalDeviceConfiguration`s and binds every call to the
signature of the real TensorFlow function it stands for. What those calls do
on a GPU is TensorFlow's and was not observed here.
"""

import inspect
import subprocess
import sys

import pytest
import tensorflow as tf

from tfdist.runtime.gpu_memory import (GpuMemory, GpuMemoryError, apply_gpu_memory, check_allow_growth_env,
                               check_gpu_memory, describe_gpu_memory, gpu_memory_notice,
                               parse_gpu_memory)

from helpers.paths import REPO_ROOT  # noqa: E402


@pytest.mark.parametrize("text, mode, limit", [
    ("growth", "growth", None), ("preallocate", "preallocate", None),
    ("limit:4096", "limit", 4096), (" LIMIT : 512 ", "limit", 512), ("Growth", "growth", None),
])
def test_the_three_forms_parse_to_a_canonical_setting(text, mode, limit):
    setting = parse_gpu_memory(text)
    assert (setting.mode, setting.limit_mb) == (mode, limit)
    assert check_gpu_memory(text) == (f"limit:{limit}" if limit else mode)


@pytest.mark.parametrize("text, fragment", [
    ("limit:0", "positive whole number of MB (2**20 bytes) per GPU, such as limit:4096; got '0'"),
    ("limit:-5", "got '-5'"),
    ("limit:4GB", "got '4GB'"),
    ("limit:1.5", "got '1.5'"),
    ("limit:", "got ''"),
    ("limit", "must be growth (allocate as needed), preallocate"),
    ("grow", "or limit:MB (MB a positive integer, such as limit:4096); got 'grow'"),
    ("", "got ''"),
])
def test_bad_values_name_the_value_and_the_allowed_forms(text, fragment):
    with pytest.raises(ValueError) as error:
        parse_gpu_memory(text)
    assert fragment in str(error.value)


def test_parsing_and_refusing_need_no_tensorflow():
    code = ("import sys\n"
            "from tfdist.recipes.transformer import RECIPE\n"
            "code = RECIPE.main(['--gpu-memory', 'limit:0'])\n"
            "assert code == 2, code\n"
            "from tfdist.runtime.gpu_memory import parse_gpu_memory\n"
            "parse_gpu_memory('limit:4096')\n"
            "assert 'tensorflow' not in sys.modules, 'TensorFlow was imported'\n")
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "error: flag --gpu-memory: gpu_memory 'limit:0'" in result.stderr


@pytest.mark.parametrize("forced, text, explicit, outcome", [
    (None, "preallocate", True, None),
    ("true", "growth", True, None),
    ("true", "preallocate", False, "overrides the preallocation"),
    ("true", "limit:100", True, "overrides the preallocation up to the limit"),
    ("true", "preallocate", True, ValueError),
    ("false", "growth", True, ValueError),
    ("false", "preallocate", True, None),
    ("false", "limit:100", False, None),
    ("maybe", "preallocate", True, None),   # TensorFlow ignores a value it cannot parse
])
def test_tf_force_gpu_allow_growth_is_obeyed_or_refused(forced, text, explicit, outcome):
    environ = {} if forced is None else {"TF_FORCE_GPU_ALLOW_GROWTH": forced}
    if outcome is ValueError:
        with pytest.raises(ValueError) as error:
            check_allow_growth_env(text, explicit=explicit, environ=environ)
        assert f"$TF_FORCE_GPU_ALLOW_GROWTH={forced}" in str(error.value)
        assert "unset the variable or use --gpu-memory" in str(error.value)
    elif outcome is None:
        assert check_allow_growth_env(text, explicit=explicit, environ=environ) is None
    else:
        assert outcome in check_allow_growth_env(text, explicit=explicit, environ=environ)


def test_without_a_gpu_a_non_default_setting_is_one_line_and_the_default_is_silent():
    assert gpu_memory_notice("growth", 0) == (
        "--gpu-memory growth has no effect: TensorFlow sees no GPU on this machine.")
    assert gpu_memory_notice("limit:4096", 0).startswith("--gpu-memory limit:4096 has no effect")
    assert gpu_memory_notice("preallocate", 0) is None
    assert gpu_memory_notice("growth", 2) is None
    assert describe_gpu_memory("growth", 0) == "growth: no effect, TensorFlow sees no GPU"
    assert describe_gpu_memory("growth", 2, note="x") == "growth on 2 GPU(s): memory taken as needed (x)"


@pytest.mark.skipif(bool(tf.config.list_physical_devices("GPU")), reason="the no-GPU path")
@pytest.mark.parametrize("text", ["growth", "preallocate", "limit:4096"])
def test_on_this_machine_real_tensorflow_sees_no_gpu_and_nothing_is_applied(text):
    before = tf.config.get_logical_device_configuration(tf.config.list_physical_devices("CPU")[0])
    assert apply_gpu_memory(text) == 0
    after = tf.config.get_logical_device_configuration(tf.config.list_physical_devices("CPU")[0])
    assert after == before


class RecordingConfig:
    """Stands in for `tf.config` with GPUs (see the module docstring)."""

    LogicalDeviceConfiguration = tf.config.LogicalDeviceConfiguration

    def __init__(self, gpus, configured=None, initialised=False):
        self.gpus = [tf.config.PhysicalDevice(name=f"/physical_device:GPU:{i}", device_type="GPU")
                     for i in range(gpus)]
        self.configured = dict(configured or {})
        self.initialised = initialised
        self.calls = []
        self.experimental = type("Experimental", (), {})()
        self.experimental.set_memory_growth = self._recorder(
            "set_memory_growth", tf.config.experimental.set_memory_growth,
            "Physical devices cannot be modified after being initialized")

    def _recorder(self, name, real, refusal):
        def record(*args, **kwargs):
            inspect.signature(real).bind(*args, **kwargs)  # the real function's arguments
            if self.initialised:
                raise RuntimeError(refusal)
            self.calls.append((name,) + args)
        return record

    def list_physical_devices(self, device_type=None):
        return list(self.gpus) if device_type == "GPU" else []

    def get_logical_device_configuration(self, device):
        return self.configured.get(device.name)

    def set_logical_device_configuration(self, device, logical_devices):
        self._recorder("set_logical_device_configuration",
                       tf.config.set_logical_device_configuration,
                       "Virtual devices cannot be modified after being initialized")(
            device, logical_devices)


def test_growth_sets_memory_growth_on_every_gpu():
    config = RecordingConfig(gpus=2)
    assert apply_gpu_memory("growth", tf_config=config) == 2
    assert config.calls == [("set_memory_growth", config.gpus[0], True),
                            ("set_memory_growth", config.gpus[1], True)]


def test_limit_gives_every_gpu_one_logical_device_with_that_limit():
    config = RecordingConfig(gpus=2)
    assert apply_gpu_memory(GpuMemory("limit", 4096), tf_config=config) == 2
    wanted = [tf.config.LogicalDeviceConfiguration(memory_limit=4096)]
    assert config.calls == [("set_logical_device_configuration", gpu, wanted)
                            for gpu in config.gpus]
    # One logical device per GPU: /gpu:i stays physical GPU i, so --devices N counts GPUs.
    assert all(len(call[2]) == 1 for call in config.calls)


def test_preallocate_is_tensorflows_default_and_calls_nothing():
    config = RecordingConfig(gpus=2)
    assert apply_gpu_memory("preallocate", tf_config=config) == 2
    assert config.calls == []


def test_after_tensorflow_initialised_the_error_names_the_gpu_and_the_way_out():
    config = RecordingConfig(gpus=1, initialised=True)
    with pytest.raises(GpuMemoryError) as error:
        apply_gpu_memory("limit:1024", tf_config=config)
    message = str(error.value)
    assert "--gpu-memory limit:1024 could not be applied to /physical_device:GPU:0" in message
    assert "before TensorFlow initialises its GPUs" in message
    assert "Virtual devices cannot be modified after being initialized" in message


def test_a_gpu_already_split_is_refused_and_the_same_limit_twice_is_harmless():
    split = [tf.config.LogicalDeviceConfiguration(memory_limit=1000)] * 2
    config = RecordingConfig(gpus=1, configured={"/physical_device:GPU:0": split})
    with pytest.raises(GpuMemoryError, match="growth cannot be set on /physical_device:GPU:0"):
        apply_gpu_memory("growth", tf_config=config)
    with pytest.raises(GpuMemoryError, match="already configured as logical devices"):
        apply_gpu_memory("limit:1000", tf_config=config)
    same = RecordingConfig(gpus=1, configured={
        "/physical_device:GPU:0": [tf.config.LogicalDeviceConfiguration(memory_limit=1000)]})
    assert apply_gpu_memory("limit:1000", tf_config=same) == 1 and same.calls == []


def test_the_recorder_matches_tensorflows_real_api():
    # The names and arguments the seam stands for exist in this TensorFlow.
    assert list(inspect.signature(tf.config.experimental.set_memory_growth).parameters) == [
        "device", "enable"]
    assert list(inspect.signature(tf.config.set_logical_device_configuration).parameters) == [
        "device", "logical_devices"]
    assert tf.config.LogicalDeviceConfiguration(memory_limit=4096).memory_limit == 4096
    # TensorFlow raises ValueError for a device it cannot grow (here the CPU, which
    # conftest splits into logical devices: the same refusal apply_gpu_memory
    # makes up front, with a clearer message, for a split GPU).
    with pytest.raises(ValueError, match="virtual devices configured|non-GPU"):
        tf.config.experimental.set_memory_growth(tf.config.list_physical_devices("CPU")[0], True)


@pytest.mark.skipif(bool(tf.config.list_physical_devices("GPU")), reason="the no-GPU path")
def test_a_recipe_run_says_once_that_growth_has_no_effect_and_records_it(tmp_path):
    import yaml

    from helpers.recipe_util import run_recipe

    result = run_recipe("transformer", [
        "--gpu-memory", "growth", "--epochs", "1", "--steps-per-epoch", "2", "--warmup-steps", "0",
        "--num-examples", "256", "--verbose", "2", "--model-dir", str(tmp_path)], timeout=300)
    assert result.returncode == 0, result.stdout[-3000:]
    notice = "--gpu-memory growth has no effect: TensorFlow sees no GPU on this machine."
    assert result.stdout.count(notice) == 1, result.stdout[-3000:]
    assert "GPU memory" not in result.stdout  # the start block's line is for GPU machines
    record = yaml.safe_load((tmp_path / "config.yaml").read_text())
    assert record["options"]["gpu_memory"] == "growth"
    assert record["resolved"]["gpu_memory"] == "growth: no effect, TensorFlow sees no GPU"
