"""The seam: where tfdist reaches into TensorFlow's or Keras's private parts.

Everything tfdist needs from a private module or attribute (`keras.src`,
`tensorflow.python`, an underscored Keras/TensorFlow member, a monkey-patch)
lives in this package, one small named function per need, each saying which
internal it uses and why the public API does not serve. Nothing else in
tfdist imports `keras.src` or `tensorflow.python` or reads an underscored
Keras/TensorFlow member. Each function is pinned by `tests/test_seam.py`,
which names the seam and the installed Keras/TensorFlow versions when an
upgrade moves an internal. A TensorFlow or Keras upgrade then means reading
this package and running that test, not grepping the package.

One module per topic: `keras_import`, `keras_optimizer`, `keras_losses`,
`keras_model`, `keras_layers`, `keras_data`, `keras_callbacks`, `tf_distribute`,
`tf_data`, `tf_runtime`.
Importing `tfdist.seam` imports neither TensorFlow nor Keras; each function
does when called (`ProgbarLoggerHooks`, a Keras class, loads on first use).

Example:

    from tfdist import seam

    seam.install_quiet_device_iterators()   # idempotent; tfdist.data and tfdist.training call it
"""

from tfdist.seam.keras_data import (keras_array_adapter, keras_can_convert_arrays,
                                    keras_class_weight_map_fn,
                                    keras_packed_arrays, keras_python_input_dataset,
                                    keras_sliceable, keras_sparse_rows,
                                    keras_train_validation_split)
from tfdist.seam.keras_import import keras_import_without_matplotlib
from tfdist.seam.keras_layers import attention_dropout_layer, replace_attention_dropout_layer
from tfdist.seam.keras_losses import (compile_loss_entries, compile_loss_entries_replaced,
                                      declare_metric_direction, get_keras_mask,
                                      keras_loss_function_wrapper, keras_loss_scaling_disabled,
                                      model_compile_loss, model_loss_tracker, model_loss_value,
                                      set_keras_mask, squeeze_or_expand_to_same_rank)
from tfdist.seam.keras_model import (backup_and_restore_position, callback_model,
                                     direct_sublayers, has_layer_graph, join_predicted_batches,
                                     metrics_in_keras_order, model_compile_config,
                                     model_initial_epoch, model_strategy, nodes_by_depth,
                                     outputs_structure, producing_layer_name, sequential_graph,
                                     set_model_initial_epoch, set_variable_storage,
                                     standardized_inputs, symbolic_build, variable_storage)
from tfdist.seam.keras_optimizer import (adam_moments, gradient_sum_skipped, gradient_sum_wrapped,
                                         held_learning_rate, held_learning_rate_replaced,
                                         optimizer_iterations_variable,
                                         optimizer_trainable_variables,
                                         optimizer_weight_decay_method,
                                         override_weight_decay_method,
                                         restore_weight_decay_method, set_optimizer_strategy)
from tfdist.seam.tf_data import install_quiet_device_iterators, per_replica_value_spec
from tfdist.seam.tf_distribute import (create_plain_variable, default_strategy,
                                       is_plain_resource_variable,
                                       mirrored_strategy_with_key_base,
                                       multi_worker_strategy_on_local_devices,
                                       new_resource_variable, parameter_server_count,
                                       save_on_read_variables_with_one_reduction,
                                       set_parameter_server_placement, strategy_cluster_resolver,
                                       strategy_scopes_hidden, strategy_worker_count,
                                       without_colocation)
from tfdist.seam.tf_runtime import (checkpoint_state, configure_coordination_service,
                                    coordination_key_value_store, forget_retracing_counts,
                                    install_exact_bfloat16_bias_gradients,
                                    leave_tfdist_code_unconverted, local_gpu_memory_limits,
                                    onednn_enabled, wait_for_peers_at_exit)


__all__ = [
    "ProgbarLoggerHooks",
    "adam_moments",
    "attention_dropout_layer",
    "backup_and_restore_position",
    "callback_model",
    "checkpoint_state",
    "compile_loss_entries",
    "compile_loss_entries_replaced",
    "configure_coordination_service",
    "coordination_key_value_store",
    "create_plain_variable",
    "declare_metric_direction",
    "default_strategy",
    "direct_sublayers",
    "forget_retracing_counts",
    "get_keras_mask",
    "gradient_sum_skipped",
    "gradient_sum_wrapped",
    "has_layer_graph",
    "held_learning_rate",
    "held_learning_rate_replaced",
    "install_exact_bfloat16_bias_gradients",
    "install_quiet_device_iterators",
    "is_plain_resource_variable",
    "join_predicted_batches",
    "keras_array_adapter",
    "keras_import_without_matplotlib",
    "keras_can_convert_arrays",
    "keras_class_weight_map_fn",
    "keras_loss_function_wrapper",
    "keras_loss_scaling_disabled",
    "keras_packed_arrays",
    "keras_python_input_dataset",
    "keras_sliceable",
    "keras_sparse_rows",
    "keras_train_validation_split",
    "leave_tfdist_code_unconverted",
    "local_gpu_memory_limits",
    "metrics_in_keras_order",
    "mirrored_strategy_with_key_base",
    "model_compile_config",
    "model_compile_loss",
    "model_initial_epoch",
    "model_loss_tracker",
    "model_loss_value",
    "model_strategy",
    "multi_worker_strategy_on_local_devices",
    "new_resource_variable",
    "nodes_by_depth",
    "onednn_enabled",
    "optimizer_iterations_variable",
    "optimizer_trainable_variables",
    "optimizer_weight_decay_method",
    "outputs_structure",
    "override_weight_decay_method",
    "parameter_server_count",
    "per_replica_value_spec",
    "producing_layer_name",
    "replace_attention_dropout_layer",
    "restore_weight_decay_method",
    "save_on_read_variables_with_one_reduction",
    "sequential_graph",
    "set_keras_mask",
    "set_model_initial_epoch",
    "set_optimizer_strategy",
    "set_parameter_server_placement",
    "set_variable_storage",
    "squeeze_or_expand_to_same_rank",
    "standardized_inputs",
    "strategy_cluster_resolver",
    "strategy_scopes_hidden",
    "strategy_worker_count",
    "symbolic_build",
    "variable_storage",
    "wait_for_peers_at_exit",
    "without_colocation",
]


def __getattr__(name):
    """`ProgbarLoggerHooks` (a Keras class) loads Keras on first use only."""
    if name == "ProgbarLoggerHooks":
        from tfdist.seam.keras_callbacks import ProgbarLoggerHooks

        return ProgbarLoggerHooks
    raise AttributeError(f"module 'tfdist.seam' has no attribute {name!r}")
