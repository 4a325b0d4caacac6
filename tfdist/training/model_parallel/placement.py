"""Putting each pipeline stage's variables, and its optimizer state, on its device.

Keras creates a model's variables when the model is built, before anyone
knows how it will be split, and under a strategy's scope they are the
strategy's (mirrored over its replica devices). `place_stages` therefore
*re-creates* them: every Keras variable of stage s gets a new plain
`tf.Variable` on stage s's device holding its current value, swapped in as
the Keras variable's storage (`tfdist.seam.set_variable_storage`; Keras's TensorFlow
backend accepts a `tf.Variable` as a variable's storage, and checkpoints,
`get_weights` and the layers all go through the Keras variable, so nothing
else changes). The model's metric variables move to the last stage's device
(metrics are updated where the outputs are). The optimizer must not be built
yet: it is built afterwards, outside any strategy, so that each slot variable
(momentum, Adam's moments, ...) is created next to the variable it belongs
to.

Plain variables, because under `MultiWorkerMirroredStrategy` with one replica
per worker each worker holds one copy of each stage anyway, and mirrored
variables cannot live on a device other than the replica's. Their values
come from the strategy's variables, which it has already made equal on every
worker, and every worker applies the same all-reduced gradients, so the
copies stay equal.

Example:

    plan = plan_stages(model, 2).with_devices(stage_devices(strategy, 2))
    stages = split_model(model, plan)
    place_stages(stages, model, optimizer)
"""

import contextlib

import keras
import tensorflow as tf

from tfdist.seam import (create_plain_variable, default_strategy, is_plain_resource_variable,
                         new_resource_variable, optimizer_weight_decay_method,
                         override_weight_decay_method, restore_weight_decay_method,
                         set_optimizer_strategy, set_variable_storage, strategy_scopes_hidden,
                         variable_storage)
from tfdist.training.optimizer import optimizer_chain


class StagePlacementError(RuntimeError):
    """The devices or the optimizer state that stages need are not available.

    Example:

        try:
            place_stages(stages, model, optimizer)
        except StagePlacementError as error:
            print(error)  # names the stage and the device it lacks
    """


def stage_devices(strategy, num_stages):
    """The K devices of this worker that the K stages run on.

    The devices are of the type of the strategy's replica device (GPU when
    the worker trains on GPUs, else CPU) and of this worker's task: stage s
    runs on device index s. Without GPUs the CPU must have been split into at
    least K logical devices before TensorFlow started
    (`tfdist.distribute.devices.split_cpu_into_logical_devices(K)`; the recipes do it
    for `--model-parallel K`).

    Args:
        strategy: the trainer's strategy (one replica per worker).
        num_stages: K.

    Returns:
        A list of K device names.

    Raises:
        StagePlacementError: fewer than K devices of that type on this worker.

    Example:

    >>> stage_devices(tf.distribute.get_strategy(), 2)
    ['/device:CPU:0', '/device:CPU:1']
    """
    try:
        replica_device = strategy.extended.worker_devices[0]
    except RuntimeError:  # the default strategy has no device of its own
        replica_device = ""
    spec = tf.DeviceSpec.from_string(replica_device)
    device_type = (spec.device_type or "CPU").upper()
    if not spec.device_type and tf.config.list_logical_devices("GPU"):
        device_type = "GPU"
    local = [d for d in tf.config.list_logical_devices(device_type) if _is_local(d.name, spec)]
    if len(local) < num_stages:
        k = num_stages
        way_out = (f"make {k} GPUs visible (CUDA_VISIBLE_DEVICES)" if device_type == "GPU" else
                   f"split the CPU into {k} logical devices before TensorFlow starts: "
                   f"tfdist.distribute.devices.split_cpu_into_logical_devices({k}) at the top of the "
                   f"program (the recipes' --model-parallel {k} does it)")
        raise StagePlacementError(
            f"model_parallel={num_stages} needs {num_stages} {device_type} devices on this "
            f"worker, one per stage, but it has {len(local)}: {[d.name for d in local]}. "
            f"Use model_parallel <= {max(len(local), 1)}, or {way_out}.")
    return [spec.make_merged_spec(tf.DeviceSpec(device_type=device_type, device_index=index))
            .to_string() if spec.job else f"/device:{device_type}:{index}"
            for index in range(num_stages)]


def _is_local(name, spec):
    device = tf.DeviceSpec.from_string(name)
    if not spec.job or not device.job:
        return True
    return device.job == spec.job and (device.task or 0) == (spec.task or 0)


def place_stages(stages, model, optimizer):
    """Re-creates every stage's variables on its device and builds the optimizer there.

    Args:
        stages: the `StageGraph`s from `tfdist.training.model_parallel.stages.split_model`.
        model: the model they were split from (its remaining variables, such
            as metric totals, go to the last stage's device).
        optimizer: the model's optimizer, not built yet, or None (prediction).

    Raises:
        StagePlacementError: the optimizer is already built (its slot
            variables sit on one device, keyed to the old variables).

    Example:

    >>> place_stages(split_model(model, plan), model, model.optimizer)
    >>> model.layers[-1].kernel.value.device
    '/job:localhost/replica:0/task:0/device:CPU:1'
    """
    if optimizer is not None and optimizer.built:
        raise StagePlacementError(
            f"The optimizer {optimizer.name!r} is already built (e.g. by an earlier fit or "
            "evaluate with model_parallel=1): its slot variables sit on one device. Give the "
            "model-parallel Trainer a fresh optimizer (model.compile(optimizer=...) or "
            "Trainer(optimizer=...)); restore optimizer state from a backup after "
            "training starts (BackupAndResume does).")
    placed = set()
    for stage in stages:
        for variable in stage.variables:
            move_variable(variable, stage.device)
            placed.add(id(variable))
    last = stages[-1].device
    for variable in model.variables:
        if id(variable) not in placed:
            move_variable(variable, last)
            placed.add(id(variable))
    place_metric_variables(model, last)
    if optimizer is None:
        return
    for opt in optimizer_chain(optimizer):
        # The optimizer updates plain variables with the default strategy's
        # update (`extended.update` of a mirrored strategy accepts only its
        # own variables); the cross-worker sum is the pipeline's own.
        set_optimizer_strategy(opt, default_strategy())
    with outside_strategy_scopes(), tf.device(last), plain_variables():
        optimizer.build(model.trainable_variables)


def place_metric_variables(model, device):
    """Moves the model's metric variables (loss trackers, compiled metrics) to `device`.

    Idempotent: variables already stored as plain variables on `device` stay.
    The trainer calls it again whenever it builds metrics later (evaluate
    after predict, say).

    Example:

    >>> place_metric_variables(model, stages[-1].device)
    """
    target = tf.DeviceSpec.from_string(device)
    for variable in model.metrics_variables:
        storage = variable_storage(variable)
        if (is_plain_resource_variable(storage)
                and tf.DeviceSpec.from_string(storage.device).device_index == target.device_index):
            continue
        move_variable(variable, device)


def move_variable(variable, device):
    """Gives a Keras variable new storage: a plain `tf.Variable` on `device`, same value.

    Args:
        variable: a `keras.Variable` (its TensorFlow-backend storage is
            replaced; the Keras variable object, its path and what tracks it
            stay).
        device: a TensorFlow device name.

    Example:

    >>> move_variable(layer.kernel, "/device:CPU:1")
    >>> layer.kernel.value.device.endswith("CPU:1")
    True
    """
    with tf.init_scope():
        storage = variable_storage(variable)
        value = tf.convert_to_tensor(storage) if storage is not None else None
        if value is None:
            raise StagePlacementError(f"The variable {variable.path!r} has no value yet.")
        with tf.device(device):
            storage = new_resource_variable(
                initial_value=tf.identity(value), trainable=variable.trainable,
                name=variable.name, dtype=value.dtype)
    set_variable_storage(variable, storage)


@contextlib.contextmanager
def deferred_build(optimizer):
    """Context in which Keras does not build `optimizer` (None: no effect).

    Keras's symbolic build (`tfdist.seam.symbolic_build`), which builds the model and its metrics
    from the data, also builds the optimizer, creating its slot variables
    next to the model's variables before they are placed. Inside this
    context the optimizer reads as built, so that `place_stages` can build it
    afterwards, on the stages' devices.

    Example:

    >>> with deferred_build(model.optimizer):
    ...     seam.symbolic_build(model, data_batch=spec)
    >>> model.optimizer.built
    False
    """
    if optimizer is None or optimizer.built:
        yield
        return
    optimizer.built = True
    try:
        yield
    finally:
        optimizer.built = False


@contextlib.contextmanager
def plain_variables():
    """Context in which `tf.Variable(...)` makes plain variables, even inside a strategy's scope.

    Example:

    >>> with strategy.scope(), plain_variables():
    ...     v = tf.Variable(1.0)   # not a MirroredVariable
    """
    def create(next_creator, **kwargs):  # pylint: disable=unused-argument
        for name in ("synchronization", "aggregation"):
            kwargs.pop(name, None)
        return create_plain_variable(**kwargs)

    with tf.variable_creator_scope(create):
        yield


@contextlib.contextmanager
def outside_strategy_scopes():
    """Context in which no `strategy.scope()` is active (the default strategy is).

    The stages' variables are plain and the optimizer updates them with the
    default strategy, which refuses to run inside another strategy's scope.
    A program may call `fit` inside `with strategy.scope():` (Keras
    programs often do); the pipeline traces its functions and builds the
    optimizer inside this context instead. TensorFlow keeps the active
    scopes on the default graph, per thread; this hides them and puts them
    back on exit. Variables created inside are still the strategy's: use
    `plain_variables()` for those.

    Example:

    >>> with strategy.scope():
    ...     with outside_strategy_scopes():
    ...         tf.distribute.has_strategy()
    False
    """
    with strategy_scopes_hidden():
        yield


@contextlib.contextmanager
def updates_on_variable_devices(optimizer):
    """Context in which the optimizer computes each variable's update on that variable's device.

    Keras's `optimizer.apply` updates each variable through `update_step`
    (and AdamW-style decay through its weight-decay method) without a device;
    inside this context both run under `tf.device(<the variable's device>)`,
    so a stage's optimizer arithmetic stays with the stage. Use it around the
    code that *traces* `optimizer.apply`.

    Example:

    >>> with updates_on_variable_devices(optimizer):
    ...     optimizer.apply(grads, model.trainable_variables)
    """
    patched = []
    for opt in optimizer_chain(optimizer):
        step, decay = opt.update_step, optimizer_weight_decay_method(opt)

        def update_step(gradient, variable, learning_rate, _step=step):
            with tf.device(_device_of(variable)):
                return _step(gradient, variable, learning_rate)

        def apply_weight_decay(variables, _decay=decay):
            by_device = {}
            for variable in variables:
                by_device.setdefault(_device_of(variable), []).append(variable)
            for device, group in by_device.items():
                with tf.device(device):
                    _decay(group)

        object.__setattr__(opt, "update_step", update_step)
        override_weight_decay_method(opt, apply_weight_decay)
        patched.append(opt)
    try:
        yield
    finally:
        for opt in patched:
            object.__delattr__(opt, "update_step")
            restore_weight_decay_method(opt)


def _device_of(variable):
    if isinstance(variable, keras.Variable):
        variable = variable.value
    return variable.device


def variable_bytes_by_device(variables):
    """Bytes of `variables` per device they live on.

    Args:
        variables: Keras or TensorFlow variables.

    Returns:
        A dict `{device name: bytes}`.

    Example:

    >>> variable_bytes_by_device(model.variables)
    {'/job:localhost/replica:0/task:0/device:CPU:0': 844800, ...}
    """
    result = {}
    for variable in variables:
        device = _device_of(variable)
        size = int(tf.size(variable).numpy()) * tf.as_dtype(variable.dtype).size
        result[device] = result.get(device, 0) + size
    return result
