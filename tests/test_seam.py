"""The seam (`tfdist.seam`): each private TensorFlow/Keras member tfdist relies
on exists and does what it says, so an upgrade that moves one fails here, by
the seam's name and with the installed Keras/TensorFlow versions, instead of
deep inside a run.

`PINS` names, for every seam function, the internals it uses; each is checked
to exist (`test_the_internal_behind_each_seam_exists`), every public seam
function must have a pin (`test_every_seam_function_is_pinned`), nothing
outside `tfdist/seam/` may import `keras.src` or `tensorflow.python`, and the
tests after those check what each seam does, where that is cheap."""

import importlib
import inspect
import os
import pathlib
import pkgutil
import re
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.data.ops import multi_device_iterator_ops

import tfdist.data.input_pipeline  # noqa: F401 - importing tfdist's input code installs the hook
from tfdist import seam

VERSIONS = f"Keras {keras.__version__}, TensorFlow {tf.__version__}"


def broken(name, what):
    """The failure message of a seam: its name, what moved, the versions, the way out."""
    return (f"tfdist.seam.{name}: {what} ({VERSIONS}). This Keras/TensorFlow moved an internal "
            f"the seam relies on: adapt tfdist/seam/ (see the function's docstring).")


# seam function -> the internals it uses: (module, "Class.attribute" or "function"),
# or (module, "Class", "source text") for an attribute set in the class's code.
PINS = {
    "keras_import_without_matplotlib": [
        ("keras.src.visualization.plot_image_gallery", "plt"),
        ("keras.src.visualization.plot_bounding_box_gallery", "patches")],
    "install_quiet_device_iterators": [
        ("tensorflow.python.data.ops.multi_device_iterator_ops", "_create_device_dataset")],
    "per_replica_value_spec": [
        ("tensorflow.python.distribute.values", "PerReplicaSpec", "self._value_specs")],
    "wait_for_peers_at_exit": [("tensorflow.python.eager.context", "Context.wait_at_barrier"),
                               ("tensorflow.python.eager.context", "Context.coordination_service")],
    "coordination_key_value_store": [
        ("tensorflow.python.eager.context", "Context.set_config_key_value"),
        ("tensorflow.python.eager.context", "Context.get_config_key_value")],
    "configure_coordination_service": [
        ("tensorflow.python.eager.context", "Context.configure_coordination_service"),
        ("tensorflow.python.eager.context", "Context.coordination_service")],
    "local_gpu_memory_limits": [("tensorflow.python.client.device_lib", "list_local_devices")],
    "onednn_enabled": [("tensorflow.python.util._pywrap_util_port", "IsMklEnabled")],
    "install_exact_bfloat16_bias_gradients": [
        ("tensorflow.python.framework.ops", "_gradient_registry"),
        ("tensorflow.python.framework.registry", "Registry", "self._registry")],
    "leave_tfdist_code_unconverted": [
        ("tensorflow.python.autograph.core.config", "CONVERSION_RULES"),
        ("tensorflow.python.autograph.core.config_lib", "DoNotConvert.matches")],
    "forget_retracing_counts": [
        ("tensorflow.python.eager.polymorphic_function.polymorphic_function",
         "_frequent_tracing_detector_manager")],
    "checkpoint_state": [("tensorflow.python.training.checkpoint_state_pb2", "CheckpointState")],
    "default_strategy": [("tensorflow.python.distribute.distribute_lib", "_get_default_strategy")],
    "strategy_scopes_hidden": [
        ("tensorflow.python.framework.ops", "Graph._distribution_strategy_stack")],
    "create_plain_variable": [
        ("tensorflow.python.ops.resource_variable_ops", "default_variable_creator_v2")],
    "new_resource_variable": [("tensorflow.python.ops.resource_variable_ops", "ResourceVariable")],
    "is_plain_resource_variable": [
        ("tensorflow.python.ops.resource_variable_ops", "ResourceVariable")],
    "without_colocation": [("tensorflow.python.framework.ops", "colocate_with")],
    "parameter_server_count": [
        ("tensorflow.python.distribute.parameter_server_strategy_v2",
         "ParameterServerStrategyV2Extended", "self._num_ps")],
    "set_parameter_server_placement": [
        ("tensorflow.python.distribute.parameter_server_strategy_v2",
         "ParameterServerStrategyV2Extended._create_variable_round_robin")],
    "strategy_worker_count": [
        ("tensorflow.python.distribute.collective_all_reduce_strategy",
         "CollectiveAllReduceExtended", "self._num_workers")],
    "strategy_cluster_resolver": [
        ("tensorflow.python.distribute.parameter_server_strategy_v2",
         "ParameterServerStrategyV2", "self._cluster_resolver")],
    "mirrored_strategy_with_key_base": [
        ("tensorflow.python.distribute.mirrored_strategy", "MirroredStrategy._collective_key_base")],
    "save_on_read_variables_with_one_reduction": [
        ("tensorflow.python.distribute.values", "DistributedDelegate.__getattr__",
         "getattr(self._get(), name)"),
        ("tensorflow.python.checkpoint.functional_saver", "_single_shard_save",
         'hasattr(tensor, "_wrapped_name")'),
        ("tensorflow.python.checkpoint.functional_saver", "_single_shard_save",
         'hasattr(tensor, "_wrapped_slice_spec")'),
        ("tensorflow.python.checkpoint.saveable_compat", "get_saveable_name",
         "getattr(cls_or_obj, _LEGACY_SAVEABLE_NAME, None)")],
    "multi_worker_strategy_on_local_devices": [
        ("tensorflow.python.distribute.collective_all_reduce_strategy",
         "CollectiveAllReduceExtended._initialize_local_devices")],
    "keras_class_weight_map_fn": [
        ("keras.src.trainers.data_adapters.tf_dataset_adapter", "make_class_weight_map_fn")],
    "keras_can_convert_arrays": [
        ("keras.src.trainers.data_adapters.array_data_adapter", "can_convert_arrays")],
    "keras_array_adapter": [
        ("keras.src.trainers.data_adapters.array_data_adapter", "ArrayDataAdapter.num_batches")],
    "keras_packed_arrays": [
        ("keras.src.trainers.data_adapters.array_data_adapter", "ArrayDataAdapter",
         "self._inputs")],
    "keras_sliceable": [("keras.src.trainers.data_adapters.array_slicing", "convert_to_sliceable")],
    "keras_train_validation_split": [
        ("keras.src.trainers.data_adapters.array_slicing", "train_validation_split")],
    "keras_python_input_dataset": [("keras.src.trainers.data_adapters", "get_data_adapter")],
    "keras_sparse_rows": [
        ("keras.src.trainers.data_adapters.array_slicing", "TensorflowSparseWrapper"),
        ("keras.src.trainers.data_adapters.array_slicing", "slice_tensorflow_sparse_wrapper")],
    "get_keras_mask": [("keras.src.backend.common.masking", "get_keras_mask")],
    "set_keras_mask": [("keras.src.backend.common.masking", "set_keras_mask")],
    "squeeze_or_expand_to_same_rank": [
        ("keras.src.losses.loss", "squeeze_or_expand_to_same_rank")],
    "keras_loss_function_wrapper": [("keras.src.losses.losses", "LossFunctionWrapper")],
    "keras_loss_scaling_disabled": [("keras.src.losses.loss", "scale_loss_for_distribution"),
                                    ("keras.src.losses.loss", "unscale_loss_for_distribution")],
    "model_compile_loss": [("keras.src.trainers.trainer", "Trainer", "self._compile_loss")],
    "compile_loss_entries": [
        ("keras.src.trainers.compile_utils", "CompileLoss", "self._flat_losses")],
    "compile_loss_entries_replaced": [
        ("keras.src.trainers.compile_utils", "CompileLoss", "self._flat_losses"),
        ("keras.src.trainers.compile_utils", "CompileLoss", "self._metrics")],
    "model_loss_value": [("keras.src.trainers.trainer", "Trainer._compute_loss")],
    "model_loss_tracker": [("keras.src.trainers.trainer", "Trainer", "self._loss_tracker")],
    "declare_metric_direction": [
        ("keras.src.callbacks.monitor_callback", "MonitorCallback", "_direction")],
    "gradient_sum_skipped": [
        ("keras.src.backend.tensorflow.optimizer", "TFOptimizer._all_reduce_sum_gradients")],
    "gradient_sum_wrapped": [
        ("keras.src.backend.tensorflow.optimizer", "TFOptimizer._all_reduce_sum_gradients")],
    "adam_moments": [("keras.src.optimizers.adam", "Adam", "self._momentums"),
                     ("keras.src.optimizers.adam", "Adam", "self._velocities"),
                     ("keras.src.optimizers.base_optimizer", "BaseOptimizer._get_variable_index")],
    "optimizer_iterations_variable": [
        ("keras.src.optimizers.base_optimizer", "BaseOptimizer", "self._iterations")],
    "set_optimizer_strategy": [
        ("keras.src.backend.tensorflow.optimizer", "TFOptimizer", "self._distribution_strategy")],
    "optimizer_weight_decay_method": [
        ("keras.src.optimizers.base_optimizer", "BaseOptimizer._apply_weight_decay")],
    "override_weight_decay_method": [
        ("keras.src.optimizers.base_optimizer", "BaseOptimizer._apply_weight_decay")],
    "restore_weight_decay_method": [
        ("keras.src.optimizers.base_optimizer", "BaseOptimizer._apply_weight_decay")],
    "optimizer_trainable_variables": [
        ("keras.src.optimizers.base_optimizer", "BaseOptimizer", "self._trainable_variables")],
    "held_learning_rate": [
        ("keras.src.optimizers.base_optimizer", "BaseOptimizer", "self._learning_rate")],
    "held_learning_rate_replaced": [
        ("keras.src.optimizers.base_optimizer", "BaseOptimizer", "self._learning_rate"),
        ("keras.src.optimizers.base_optimizer", "BaseOptimizer._get_current_learning_rate")],
    "join_predicted_batches": [
        ("keras.src.backend.tensorflow.trainer", "potentially_ragged_concat"),
        ("keras.src.backend.tensorflow.trainer", "convert_to_np_if_not_ragged")],
    "metrics_in_keras_order": [("keras.src.trainers.trainer", "Trainer._flatten_metrics_in_order")],
    "model_compile_config": [("keras.src.trainers.trainer", "Trainer", "self._compile_config")],
    "symbolic_build": [("keras.src.trainers.trainer", "Trainer._symbolic_build")],
    "model_initial_epoch": [("keras.src.callbacks.backup_and_restore", "BackupAndRestore",
                             "self.model._initial_epoch")],
    "set_model_initial_epoch": [("keras.src.backend.tensorflow.trainer", "TensorFlowTrainer",
                                 "self._initial_epoch")],
    "model_strategy": [("keras.src.backend.tensorflow.trainer", "TensorFlowTrainer",
                        "self._distribute_strategy")],
    "callback_model": [("keras.src.callbacks.callback", "Callback", "self._model")],
    "backup_and_restore_position": [
        ("keras.src.callbacks.backup_and_restore", "BackupAndRestore", "self._current_epoch"),
        ("keras.src.callbacks.backup_and_restore", "BackupAndRestore", "self._last_batch_seen")],
    "sequential_graph": [("keras.src.models.sequential", "Sequential", "self._functional")],
    "has_layer_graph": [("keras.src.ops.function", "Function", "self._nodes_by_depth"),
                        ("keras.src.ops.function", "Function", "self._outputs_struct")],
    "nodes_by_depth": [("keras.src.ops.function", "Function", "self._nodes_by_depth")],
    "outputs_structure": [("keras.src.ops.function", "Function", "self._outputs_struct")],
    "standardized_inputs": [("keras.src.models.functional", "Functional._standardize_inputs")],
    "producing_layer_name": [("keras.src.ops.node", "Node", "tensor._keras_history = ")],
    "direct_sublayers": [("keras.src.layers.layer", "Layer._flatten_layers")],
    "attention_dropout_layer": [
        ("keras.src.layers.attention.multi_head_attention", "MultiHeadAttention._build_attention",
         "self._dropout_layer = Dropout(")],
    "replace_attention_dropout_layer": [
        ("keras.src.layers.attention.multi_head_attention", "MultiHeadAttention._build_attention",
         "self._dropout_layer = Dropout("),
        ("keras.src.layers.attention.multi_head_attention",
         "MultiHeadAttention._compute_attention", "self._dropout_layer("),
        ("keras.src.layers.layer", "Layer", "self._tracker = "),
        ("keras.src.utils.tracking", "Tracker.untrack"),
        ("keras.src.utils.tracking", "Tracker.unlock"),
        ("keras.src.utils.tracking", "Tracker.lock")],
    "variable_storage": [("keras.src.backend.common.variables", "Variable", "self._value")],
    "set_variable_storage": [("keras.src.backend.common.variables", "Variable", "self._value")],
    "ProgbarLoggerHooks": [("keras.src.callbacks.progbar_logger", "ProgbarLogger._update_progbar"),
                           ("keras.src.callbacks.progbar_logger",
                            "ProgbarLogger._finalize_progbar"),
                           ("keras.src.callbacks.progbar_logger", "ProgbarLogger._update_progbar",
                            "self._maybe_init_progbar()"),
                           ("keras.src.utils.progbar", "Progbar.update",
                            "self._estimate_step_duration(current, now)")],
}

PIN_CASES = [(name, pin) for name, pins in PINS.items() for pin in pins]


@pytest.mark.parametrize("name, pin", PIN_CASES,
                         ids=[f"{name}-{pin[1]}" for name, pin in PIN_CASES])
def test_the_internal_behind_each_seam_exists(name, pin):
    module_name, attribute = pin[0], pin[1]
    try:
        found = importlib.import_module(module_name)
    except ImportError as error:
        pytest.fail(broken(name, f"the module {module_name} is gone ({error})"))
    for part in attribute.split("."):
        if not hasattr(found, part):
            pytest.fail(broken(name, f"{module_name}.{attribute} is gone (no {part!r})"))
        found = getattr(found, part)
    if len(pin) == 3:  # an attribute the class sets in its own code
        source = inspect.getsource(found)
        assert pin[2] in source, broken(
            name, f"{module_name}.{attribute} no longer uses {pin[2]!r}")


def test_every_seam_function_is_pinned():
    public = set()
    for module_info in pkgutil.iter_modules(seam.__path__):
        module = importlib.import_module(f"tfdist.seam.{module_info.name}")
        public |= {name for name, value in vars(module).items()
                   if not name.startswith("_") and getattr(value, "__module__", "") == module.__name__}
    assert sorted(public - set(PINS)) == [], "seam functions without a pin in PINS"
    assert sorted(set(PINS) - public) == [], "pins of seam functions that do not exist"
    assert sorted(seam.__all__) == sorted(public), "tfdist.seam.__all__ must list every seam"
    for name in public:  # the package exports every seam
        assert getattr(seam, name) is not None


def test_nothing_outside_the_seam_reaches_keras_src_or_tensorflow_python():
    package = pathlib.Path(seam.__file__).parent.parent
    found = [f"{path.relative_to(package.parent)}:{number}: {line.strip()}"
             for path in sorted(package.rglob("*.py")) if "seam" not in path.parts
             for number, line in enumerate(path.read_text().splitlines(), 1)
             if re.search(r"keras\.src|tensorflow\.python", line)]
    assert found == [], "keras.src / tensorflow.python outside tfdist/seam/:\n" + "\n".join(found)


def _per_device_datasets(distributed_iterator):
    """The per-device datasets behind a MirroredStrategy input iterator."""
    found = []
    for worker_iterator in distributed_iterator._iterators:  # noqa: SLF001 - inspecting TF
        device_iterators = worker_iterator._iterator._device_iterators  # noqa: SLF001
        found += [iterator._dataset for iterator in device_iterators]  # noqa: SLF001
    return found


def test_quiet_device_iterators_is_installed_once_by_importing_tfdist_data():
    assert hasattr(multi_device_iterator_ops._create_device_dataset, "tfdist_wraps")
    assert seam.install_quiet_device_iterators() is False  # already installed


def test_autograph_calls_tfdist_functions_as_they_are_and_still_converts_the_users():
    from tensorflow.python.autograph.impl import conversion

    from tfdist.data.input_pipeline import DatasetFn

    assert seam.leave_tfdist_code_unconverted() is False  # installed by importing tfdist.data

    def users_function(x):
        return x

    assert conversion.is_allowlisted(DatasetFn.__call__)
    assert not conversion.is_allowlisted(users_function)
    # A user's function that branches in Python on a tensor is still converted.
    def clipped(x):
        if x > 2:
            return tf.constant(2, tf.int64)
        return x

    assert list(tf.data.Dataset.range(5).map(clipped).as_numpy_iterator()) == [0, 1, 2, 2, 2]


def test_per_device_datasets_run_without_autotune_and_the_users_pipeline_keeps_it():
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    dataset = tf.data.Dataset.range(64).map(
        lambda x: tf.cast(x, tf.float32), num_parallel_calls=tf.data.AUTOTUNE).batch(8)
    iterator = iter(strategy.experimental_distribute_dataset(dataset))
    first = next(iterator)
    per_device = _per_device_datasets(iterator)
    assert len(per_device) == 2
    assert [d.options().autotune.enabled for d in per_device] == [False, False]
    assert dataset.options().autotune.enabled is not False  # the user's options are untouched
    values = [t.numpy().tolist() for t in strategy.experimental_local_results(first)]
    assert values == [[0.0, 1.0, 2.0, 3.0], [4.0, 5.0, 6.0, 7.0]]  # data still flows per replica


def test_wait_for_peers_at_exit_returns_at_once_without_a_coordination_service():
    import time

    start = time.monotonic()
    assert seam.wait_for_peers_at_exit(timeout_seconds=5) is False  # one process, no service
    assert time.monotonic() - start < 1.0


def test_join_predicted_batches_gives_numpy_for_dense_and_ragged_for_ragged_outputs():
    import numpy as np

    dense = seam.join_predicted_batches([tf.ones([2, 3]), tf.zeros([1, 3])])
    assert isinstance(dense, np.ndarray) and dense.tolist() == [[1.0] * 3] * 2 + [[0.0] * 3]
    ragged = seam.join_predicted_batches([tf.ragged.constant([[1], [2, 3]]),
                                          tf.ragged.constant([[4, 5, 6]])])
    assert isinstance(ragged, tf.RaggedTensor)
    assert ragged.to_list() == [[1], [2, 3], [4, 5, 6]]


def test_metrics_in_keras_order_follows_metrics_names():
    import keras

    inputs = keras.Input((2,))
    model = keras.Model(inputs, {"a": keras.layers.Dense(1, name="a")(inputs),
                                 "b": keras.layers.Dense(1, name="b")(inputs)})
    model.compile("sgd", loss={"a": "mse", "b": "mae"}, metrics={"b": ["mae"]})
    x = np.zeros((4, 2), "float32")
    y = {"a": np.zeros((4, 1), "float32"), "b": np.ones((4, 1), "float32")}
    logs = model.evaluate(x, y, verbose=0, return_dict=True)
    shuffled = dict(reversed(list(logs.items())))
    expected = model.evaluate(x, y, verbose=0)
    for got, want in zip(seam.metrics_in_keras_order(model, shuffled), expected, strict=True):
        assert got == want


def test_checkpoint_state_parses_the_index_tensorflow_writes(tmp_path):
    from google.protobuf import text_format

    checkpoint = tf.train.Checkpoint(v=tf.Variable(1.0))
    manager = tf.train.CheckpointManager(checkpoint, str(tmp_path), max_to_keep=2)
    manager.save()
    manager.save()
    state = seam.checkpoint_state()
    text_format.Parse((tmp_path / "checkpoint").read_text(), state)
    assert [p.rsplit("/", 1)[-1] for p in state.all_model_checkpoint_paths] == ["ckpt-1", "ckpt-2"]


def _two_cpus():
    return tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])


def _sgd_step_on_two_replicas(context_manager):
    """v starts at 0; each replica's gradient is 1; SGD(1.0) applies it, traced inside `context_manager`."""
    strategy = _two_cpus()
    with strategy.scope():
        v = keras.Variable(0.0)
        optimizer = keras.optimizers.SGD(1.0)
        optimizer.build([v])

    @tf.function
    def step():
        with context_manager(optimizer):
            strategy.run(lambda: optimizer.apply([tf.constant(1.0)], [v]))

    step()
    return float(v.numpy())


def test_the_optimizer_seams_skip_or_wrap_keras_cross_replica_gradient_sum():
    import contextlib

    from keras.src.backend.tensorflow.optimizer import TFOptimizer

    def halved(original):
        return lambda self, gv: original(self, [(g * 0.5, var) for g, var in gv])

    keras_sum = TFOptimizer._all_reduce_sum_gradients
    assert _sgd_step_on_two_replicas(lambda opt: contextlib.nullcontext()) == -2.0  # Keras sums
    assert _sgd_step_on_two_replicas(lambda opt: seam.gradient_sum_skipped([opt])) == -1.0
    assert _sgd_step_on_two_replicas(lambda opt: seam.gradient_sum_wrapped(halved)) == -1.0
    assert TFOptimizer._all_reduce_sum_gradients is keras_sum  # the class patch is undone
    optimizer = keras.optimizers.SGD()
    with seam.gradient_sum_skipped([optimizer]):
        assert "_all_reduce_sum_gradients" in vars(optimizer)
    assert "_all_reduce_sum_gradients" not in vars(optimizer)  # the instance patch is undone


def test_keras_loss_scaling_disabled_keeps_the_value_and_restores_keras():
    from keras.src.losses import loss as keras_loss_module

    strategy = _two_cpus()
    with strategy.scope():
        assert float(keras_loss_module.scale_loss_for_distribution(tf.constant(2.0))) == 1.0
        with seam.keras_loss_scaling_disabled():
            assert float(keras_loss_module.scale_loss_for_distribution(tf.constant(2.0))) == 2.0
            assert float(keras_loss_module.unscale_loss_for_distribution(tf.constant(2.0))) == 2.0
        assert float(keras_loss_module.scale_loss_for_distribution(tf.constant(2.0))) == 1.0
        assert float(keras_loss_module.unscale_loss_for_distribution(tf.constant(2.0))) == 4.0


def test_strategy_seams_hide_scopes_and_make_plain_variables():
    strategy = _two_cpus()
    with strategy.scope():
        with seam.strategy_scopes_hidden():
            assert not tf.distribute.has_strategy()
            assert tf.distribute.get_strategy() is seam.default_strategy()
        assert tf.distribute.get_strategy() is strategy
        assert not seam.is_plain_resource_variable(tf.Variable(1.0))  # a MirroredVariable

        def plain(next_creator, **kwargs):  # pylint: disable=unused-argument
            return seam.create_plain_variable(**kwargs)

        with tf.variable_creator_scope(plain):
            assert seam.is_plain_resource_variable(tf.Variable(1.0))
    with tf.device("/cpu:1"), seam.without_colocation():
        moved = seam.new_resource_variable(initial_value=tf.ones([2]), trainable=True)
    assert seam.is_plain_resource_variable(moved) and moved.device.endswith("CPU:1")
    assert seam.strategy_worker_count(strategy) == 1
    assert seam.strategy_cluster_resolver(strategy) is None
    base = tf.distribute.MirroredStrategy._collective_key_base
    keyed = seam.mirrored_strategy_with_key_base(990_000, ["/cpu:0", "/cpu:1"], None)
    assert keyed.num_replicas_in_sync == 2
    assert tf.distribute.MirroredStrategy._collective_key_base == base  # put back


def test_a_checkpoint_save_reduces_each_on_read_variable_once(tmp_path, monkeypatch):
    from tensorflow.python.distribute import values

    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    with strategy.scope():
        metric = keras.metrics.Mean()
    replica = lambda: tf.distribute.get_replica_context().replica_id_in_sync_group  # noqa: E731
    strategy.run(lambda: metric.update_state(tf.cast(replica(), tf.float32) + 1.0))  # 1 and 2
    total, count = (seam.variable_storage(v) for v in metric.variables)  # SyncOnReadVariables
    reads = []
    reduce_replicas = values.SyncOnReadVariable._get_cross_replica  # noqa: SLF001 - counted
    monkeypatch.setattr(values.SyncOnReadVariable, "_get_cross_replica",
                        lambda self: reads.append(self.name) or reduce_replicas(self))
    seam.save_on_read_variables_with_one_reduction()  # True unless a backup test installed it
    assert seam.save_on_read_variables_with_one_reduction() is False  # idempotent
    # As a backup saves them (Keras variables), then as TensorFlow variables:
    # TensorFlow alone reduces each 3 times in either case.
    for name, saved in [("keras", metric.variables), ("tf", (total, count))]:
        reads.clear()
        path = tf.train.Checkpoint(total=saved[0], count=saved[1]).write(str(tmp_path / name))
        assert sorted(reads) == sorted([total.name, count.name]), name
        reader = tf.train.load_checkpoint(path)
        assert reader.get_tensor("total/.ATTRIBUTES/VARIABLE_VALUE") == 3.0  # the replicas' sum
        assert reader.get_tensor("count/.ATTRIBUTES/VARIABLE_VALUE") == 2.0
    reads.clear()
    assert not hasattr(total, "_wrapped_name") and reads == []
    assert float(total.numpy()) == 3.0 and reads == [total.name]  # the value still reduces
    total._wrapped_name = "set on the variable"  # noqa: SLF001 - as a DTensor save would
    assert total._wrapped_name == "set on the variable"  # noqa: SLF001


def test_variable_storage_can_be_swapped_for_a_plain_variable_on_another_device():
    variable = keras.Variable(np.array([1.0, 2.0], "float32"))
    assert seam.variable_storage(variable) is not None
    with tf.device("/cpu:1"):
        storage = seam.new_resource_variable(initial_value=[3.0, 4.0])
    seam.set_variable_storage(variable, storage)
    assert variable.value.device.endswith("CPU:1")
    assert variable.numpy().tolist() == [3.0, 4.0]


def test_an_attention_dropout_layer_is_replaced_in_place_and_used(tmp_path):
    attention = keras.layers.MultiHeadAttention(2, 4, dropout=0.5)
    attention.build((2, 3, 8), (2, 3, 8))
    old = seam.attention_dropout_layer(attention)
    assert isinstance(old, keras.layers.Dropout) and old.rate == 0.5
    count = len(attention.variables)
    calls = []

    class Recording(keras.layers.Dropout):
        def call(self, inputs, training=False):
            calls.append(tuple(inputs.shape))
            return super().call(inputs, training=training)

    seam.replace_attention_dropout_layer(attention, Recording(0.5))
    assert seam.attention_dropout_layer(attention) is not old
    assert len(attention.variables) == count  # one seed generator out, one in
    assert old not in seam.direct_sublayers(attention)
    with pytest.raises(ValueError, match="already built"):
        attention.extra = keras.layers.Dense(1)  # still locked, as a built layer is
    x = np.ones((2, 3, 8), "float32")
    attention(x, x, training=True)
    assert calls == [(2, 2, 3, 3)]  # the attention probabilities went through it
    checkpoint = tf.train.Checkpoint(attention=attention)
    path = checkpoint.write(str(tmp_path / "ckpt"))
    fresh = keras.layers.MultiHeadAttention(2, 4, dropout=0.5)
    fresh.build((2, 3, 8), (2, 3, 8))  # Keras's own dropout: the same names
    tf.train.Checkpoint(attention=fresh).read(path).assert_consumed()


def test_mask_and_loss_helpers():
    values = tf.ones([2])
    seam.set_keras_mask(values, tf.constant([True, False]))
    assert seam.get_keras_mask(values).numpy().tolist() == [True, False]
    assert seam.get_keras_mask(tf.ones([2])) is None
    a, b = seam.squeeze_or_expand_to_same_rank(tf.ones([4, 1]), tf.ones([4]))
    assert a.shape == b.shape
    wrapped = seam.keras_loss_function_wrapper(keras.losses.mean_squared_error, name="mse")
    assert isinstance(wrapped, keras.losses.Loss) and wrapped.name == "mse"
    assert float(wrapped(tf.zeros([2, 1]), tf.ones([2, 1]))) == 1.0


def test_array_seams_pack_and_split_as_keras_does():
    x, y = np.arange(20.0).reshape(10, 2), np.array([0, 1] * 5)
    assert seam.keras_can_convert_arrays((x, y)) is True
    adapter = seam.keras_array_adapter(x, y, None, 4, {0: 1.0, 1: 3.0})
    assert adapter.num_batches == 3
    packed_x, packed_y, weights = seam.keras_packed_arrays(adapter)
    assert np.asarray(weights).tolist() == [1.0, 3.0] * 5
    assert np.asarray(seam.keras_sliceable((x,))[0]).dtype == np.float32  # floatx
    train, validation = seam.keras_train_validation_split((x, y), 0.2)
    assert (len(train[0]), len(validation[0])) == (8, 2)
    assert seam.keras_sparse_rows(x, [0]) is None
    mapped = seam.keras_class_weight_map_fn({0: 1.0, 1: 3.0})(tf.constant([[1.0]]),
                                                            tf.constant([1]))
    assert mapped[2].numpy().tolist() == [3.0]

    def batches():
        while True:
            yield x[:2], y[:2]

    dataset = seam.keras_python_input_dataset(batches(), shuffle=False, class_weight=None)
    assert next(iter(dataset))[0].shape == (2, 2)
    spec = tf.TensorSpec([None, 4])
    assert seam.per_replica_value_spec(spec) is spec


def test_progbar_hooks_time_a_resumed_epoch_from_its_first_batch(capsys):
    import time

    logger = seam.ProgbarLoggerHooks()
    logger.set_params({"verbose": 2, "epochs": 1, "steps": 400})
    logger.on_epoch_begin(0)
    for batch in range(395, 400):  # an epoch resumed at batch 395: 5 steps of >= 20 ms
        logger.on_train_batch_begin(batch)
        time.sleep(0.02)
        logger.on_train_batch_end(batch, {"loss": 1.0})
    logger.on_epoch_end(0, {"loss": 1.0})
    rate = re.search(r"^400/400 - \d+s - (\d+)ms/step - loss: 1\.0000$", capsys.readouterr().out,
                     flags=re.MULTILINE)
    assert rate and int(rate.group(1)) >= 18  # not the elapsed time / 400 (~0 ms)


def test_model_seams_on_a_fitted_functional_model(capsys):
    inputs = keras.Input((2,), name="x")
    hidden = keras.layers.Dense(3, name="hidden")(inputs)
    model = keras.Model(inputs, keras.layers.Dense(1, name="out")(hidden))
    model.compile(keras.optimizers.SGD(0.1), "mse", metrics=["mae"])
    assert seam.model_compile_config(model).config["loss"] == "mse"
    x, y = np.ones((4, 2), "float32"), np.zeros((4, 1), "float32")

    class ShownLossOnly(seam.ProgbarLoggerHooks):
        def shown_logs(self, logs):
            return {"loss": logs["loss"]} if logs else logs

        def after_bar(self, logs):
            print(f"after the bar: {sorted(logs)}")

    model.fit(x, y, epochs=1, batch_size=4, verbose=1, callbacks=[ShownLossOnly()])
    printed = capsys.readouterr().out
    assert "loss:" in printed and "mae" not in printed.split("after the bar")[0]
    assert "after the bar: ['loss', 'mae']" in printed
    compile_loss = seam.model_compile_loss(model)
    assert [entry.loss is not None for entry in seam.compile_loss_entries(compile_loss)] == [True]
    saved = seam.compile_loss_entries(compile_loss)
    with seam.compile_loss_entries_replaced(compile_loss, []):
        assert seam.compile_loss_entries(compile_loss) == []
    assert seam.compile_loss_entries(compile_loss) is saved
    value = seam.model_loss_value(model, x=x, y=y, y_pred=model(x), sample_weight=None,
                                  training=False)
    assert float(value) >= 0.0
    assert float(seam.model_loss_tracker(model).result()) >= 0.0
    assert seam.model_strategy(model) is None  # not created under a strategy
    with _two_cpus().scope() as strategy:
        assert seam.model_strategy(keras.Sequential([keras.layers.Dense(1)])) is strategy
    # the functional graph
    assert seam.has_layer_graph(model)
    assert sorted(seam.nodes_by_depth(model)) == [0, 1, 2]
    assert seam.producing_layer_name(hidden) == "hidden"
    assert seam.direct_sublayers(model.get_layer("hidden")) == []
    flat = seam.standardized_inputs(model, {"x": x})
    assert [tuple(t.shape) for t in flat] == [(4, 2)]
    assert keras.tree.pack_sequence_as(seam.outputs_structure(model), ["y"]) in ("y", ["y"])
    sequential = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    assert seam.has_layer_graph(seam.sequential_graph(sequential))
    assert seam.sequential_graph(keras.Sequential([keras.layers.Dense(1)])) is None
    # resume epoch, callbacks
    assert seam.model_initial_epoch(model) is None
    seam.set_model_initial_epoch(model, 3)
    assert seam.model_initial_epoch(model) == 3
    seam.set_model_initial_epoch(model, None)
    callback = keras.callbacks.Callback()
    assert seam.callback_model(callback) is None
    callback.set_model(model)
    assert seam.callback_model(callback) is model


def test_symbolic_build_builds_the_compiled_loss_from_a_spec():
    inputs = keras.Input((2,))
    model = keras.Model(inputs, keras.layers.Dense(1)(inputs))
    model.compile("sgd", "mse")
    assert not seam.model_compile_loss(model).built
    seam.symbolic_build(model, data_batch=(tf.TensorSpec([None, 2]), tf.TensorSpec([None, 1])))
    assert seam.model_compile_loss(model).built


def test_optimizer_state_seams():
    variable = keras.Variable(1.0)
    optimizer = keras.optimizers.AdamW(0.1, weight_decay=0.5)
    optimizer.build([variable])
    assert int(seam.optimizer_iterations_variable(optimizer).numpy()) == 0
    assert list(seam.optimizer_trainable_variables(optimizer)) == [variable]
    assert isinstance(seam.held_learning_rate(optimizer), keras.Variable)
    held = seam.held_learning_rate(optimizer)
    with seam.held_learning_rate_replaced(optimizer, lambda: 0.25):
        assert float(optimizer.learning_rate) == 0.25  # Keras reads the replacement
    assert seam.held_learning_rate(optimizer) is held
    assert float(optimizer.learning_rate) == pytest.approx(0.1)
    decayed = []
    seam.override_weight_decay_method(optimizer, decayed.append)
    seam.optimizer_weight_decay_method(optimizer)([variable])
    assert decayed == [[variable]]
    seam.restore_weight_decay_method(optimizer)
    assert seam.optimizer_weight_decay_method(optimizer).__func__.__name__ == "_apply_weight_decay"
    seam.set_optimizer_strategy(optimizer, seam.default_strategy())
    optimizer.apply([tf.constant(1.0)], [variable])
    assert int(seam.optimizer_iterations_variable(optimizer).numpy()) == 1


def test_metric_direction_is_what_keras_callbacks_read():
    from tfdist.models.losses import MaskedAccuracy

    stopper = keras.callbacks.EarlyStopping(monitor="masked_accuracy", mode="auto")
    inputs = keras.Input((3,))
    model = keras.Model(inputs, keras.layers.Dense(4)(inputs))
    model.compile("sgd", "sparse_categorical_crossentropy", metrics=[MaskedAccuracy()])
    model.fit(np.ones((2, 3)), np.ones((2,)), verbose=0, epochs=1, callbacks=[stopper])
    assert stopper.monitor_op is keras.ops.greater  # "up": larger is better


def test_backup_and_restore_position_starts_at_zero(tmp_path):
    assert seam.backup_and_restore_position(
        keras.callbacks.BackupAndRestore(str(tmp_path))) == (0, 0)


def test_runtime_seams_answer_without_a_cluster_or_gpu():
    store = seam.coordination_key_value_store()
    assert callable(store.set_config_key_value) and callable(store.get_config_key_value)
    assert seam.local_gpu_memory_limits() == []  # this machine has no GPU
    assert seam.forget_retracing_counts() is True


KERAS_PLOTS_AFTER_TFDIST = """
import sys
import numpy as np
{before}
import tfdist
{first_import}
import keras
print("matplotlib imported with keras:", "matplotlib" in sys.modules)
try:
    keras.visualization.plot_image_gallery(np.random.rand(4, 8, 8, 3), value_range=(0, 1),
                                           path=sys.argv[1])
except ImportError as error:
    print("ImportError:", error)
    raise SystemExit(0)
import matplotlib.patches
import matplotlib.pyplot
from keras.src.visualization import plot_bounding_box_gallery, plot_image_gallery
print("the program's pyplot is Keras's:",
      plot_image_gallery.plt.subplots is matplotlib.pyplot.subplots,
      plot_bounding_box_gallery.patches.Patch is matplotlib.patches.Patch)
"""


def _plot_after_tfdist(tmp_path, before="", first_import=""):
    """Runs KERAS_PLOTS_AFTER_TFDIST in a new process that sees the real matplotlib
    (the processes tests start otherwise have it hidden: tests/conftest.py)."""
    from helpers.paths import python_path_with_bench_extra

    path = tmp_path / "gallery.png"
    env = dict(os.environ, PYTHONPATH=python_path_with_bench_extra(os.environ))
    result = subprocess.run([sys.executable, "-c", KERAS_PLOTS_AFTER_TFDIST.format(
                                 before=before, first_import=first_import),
                             str(path)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stdout[-3000:]
    return result.stdout, path


@pytest.mark.parametrize("first_import", [
    "",
    # As the recipes, the bench and doctor start: TensorFlow first, which looks
    # Keras up (importlib.util.find_spec) before it imports it.
    "from tfdist.runtime.tf_logging import import_tensorflow; import_tensorflow(3)",
], ids=["keras", "tensorflow first"])
def test_keras_imported_after_tfdist_imports_matplotlib_at_its_first_plot(tmp_path, first_import):
    out, path = _plot_after_tfdist(tmp_path, first_import=first_import)
    assert "matplotlib imported with keras: False" in out, out[-3000:]
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", out[-3000:]
    assert "the program's pyplot is Keras's: True True" in out, out[-3000:]


def test_without_matplotlib_keras_keeps_its_own_install_message(tmp_path):
    out, path = _plot_after_tfdist(tmp_path, before="sys.modules['matplotlib'] = None")
    assert "ImportError: The `plot_image_gallery` function requires the `matplotlib` package" \
        in out, out[-3000:]
    assert not path.exists()
