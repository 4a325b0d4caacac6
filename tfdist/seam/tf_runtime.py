"""The seam to TensorFlow's runtime internals: the eager context's
coordination service (key-value store, barrier, configuration), the local
device list, the retracing counters, the checkpoint index message, AutoGraph's
list of packages it leaves unconverted, the gradient registry's entry for
`BiasAdd`.

Example:

    from tfdist.seam import wait_for_peers_at_exit

    wait_for_peers_at_exit(timeout_seconds=20)   # a multi-worker run's last act
"""


def leave_tfdist_code_unconverted():
    """Tells AutoGraph to call tfdist's own functions as they are, unconverted,
    as TensorFlow already does for Keras, NumPy and itself.

    tfdist's code that runs inside graphs (its tf.data pipelines' functions,
    its losses, the decoding loops) is graph code: it uses `tf.cond` and
    `tf.while_loop` and never branches in Python on a tensor. AutoGraph
    nevertheless converts every such function the first time a
    `Dataset.map` (or a `tf.function` with AutoGraph on) traces it: it reads
    the function's source, rewrites it and compiles the result, about 40 ms
    per function (measured: 0.36 s of CPU for the 9 conversions of a
    one-device Transformer recipe run, TF 2.21, an AMX Xeon), in every
    process and for the same unchanged result. The user's own functions
    (a subclass's `decode`, a model's `call`) are still converted.

    Private: `tensorflow.python.autograph.core.config.CONVERSION_RULES` and
    `config_lib.DoNotConvert` (TensorFlow's list of packages it does not
    convert; `tf.autograph.experimental.do_not_convert` is the public form,
    one function at a time). tfdist.data and tfdist.training call this when
    imported.

    Returns:
        True when the rule was added by this call, False when it already was.

    Example:

    >>> leave_tfdist_code_unconverted()
    False
    """
    from tensorflow.python.autograph.core import config, config_lib

    if any(isinstance(rule, config_lib.DoNotConvert) and rule.matches("tfdist")
           for rule in config.CONVERSION_RULES):
        return False
    config.CONVERSION_RULES = (*config.CONVERSION_RULES, config_lib.DoNotConvert("tfdist"))
    return True


def install_exact_bfloat16_bias_gradients():
    """Makes the bias gradient of every bfloat16 `BiasAdd` (channels last) a
    float32-accumulated sum: `tf.reduce_sum` over every axis but the last.

    Keras adds the bias of `Dense`, `EinsumDense` and convolution layers with
    `tf.nn.bias_add`, whose gradient is TensorFlow's `BiasAddGrad` kernel. On
    CPUs that kernel sums bfloat16 gradients in bfloat16: over 4,096 rows of
    standard-normal values its result is off by 10-20% of the largest entry
    (against 0.2-0.3%, the rounding of the bfloat16 result, for a float32
    accumulation), so under `mixed_bfloat16` the bias of every such layer
    learns from a gradient with that error. TensorFlow's `Sum` kernel (and
    XLA's reduce) accumulates bfloat16 in float32 on every CPU. A matrix
    product with a row of ones, used before, does so only where oneDNN's
    bfloat16 kernel runs (AVX512-BF16, AMX): on an AVX2-only CPU it missed
    the bound by 1.6x and took 4x the sum's time. Other dtypes and
    channels-first (`NCHW`) bias adds keep TensorFlow's gradient.

    Private: `tensorflow.python.framework.ops._gradient_registry` (its
    `_registry["BiasAdd"]["type"]` entry). `tf.RegisterGradient` refuses a
    second function for an op type, and `tf.custom_gradient` would have to
    wrap every Keras layer that adds a bias. tfdist.training calls this when
    imported, so it holds for `Trainer` and for any `model.fit` in the same
    process.

    Returns:
        True when installed by this call, False when it already was.

    Example:

    >>> install_exact_bfloat16_bias_gradients()
    False
    """
    import tensorflow as tf
    from tensorflow.python.framework import ops

    entry = ops._gradient_registry._registry["BiasAdd"]
    tensorflows = entry["type"]
    if getattr(tensorflows, "tfdist_wraps", None) is not None:
        return False

    def bias_add_gradient(op, received_grad):
        # Eager tapes keep no inputs for BiasAdd (the gradient's dtype and last
        # dimension are the bias's) and give no data_format when it is the
        # default, NHWC.
        data_format = op.get_attr("data_format")
        if received_grad.dtype != tf.bfloat16 or data_format not in (None, b"NHWC", "NHWC"):
            return tensorflows(op, received_grad)
        # TensorFlow's Sum kernel accumulates bfloat16 in float32 on every
        # CPU, and XLA's reduce does too.
        axes = tf.range(tf.rank(received_grad) - 1)
        return received_grad, tf.reduce_sum(received_grad, axis=axes)

    bias_add_gradient.tfdist_wraps = tensorflows
    entry["type"] = bias_add_gradient
    return True


def wait_for_peers_at_exit(timeout_seconds=20.0, name="tfdist/exit"):
    """Multi-worker runs: waits until every worker reached this point, or `timeout_seconds`.

    The chief hosts TensorFlow's coordination service. When it exits first,
    a worker still finishing its own stop keeps sending heartbeats to a
    closed port for ~10 s (`Failed to send RPC to coordination service`,
    `Connection refused`) before it leaves. A barrier just before exit lets
    the chief leave only once every worker is done with the service. A peer
    that is gone or late is not waited for beyond the deadline.

    Private: `tensorflow.python.eager.context.context().wait_at_barrier`
    (the coordination service's barrier has no public API in TF 2.21).

    Args:
        timeout_seconds: the longest wait (keep it below the grace period a
            cluster manager gives between SIGTERM and SIGKILL).
        name: the barrier's id; every worker must use the same one.

    Returns:
        True when every worker arrived, False when the service is not
        running (a single-process run) or the wait failed or timed out.

    Example:

    >>> wait_for_peers_at_exit(timeout_seconds=5)
    False
    """
    from tensorflow.python.eager import context

    ctx = context.context()
    if not ctx.coordination_service:
        return False
    try:
        ctx.wait_at_barrier(name, int(timeout_seconds * 1000))
    except Exception:  # noqa: BLE001 - tf.errors.OpError: a peer is gone or late; leave anyway
        return False
    return True


def coordination_key_value_store():
    """The object whose `set_config_key_value(key, value)` and
    `get_config_key_value(key, timeout_in_ms=...)` reach the coordination
    service's key-value store shared by every worker of the cluster.

    Private: `tensorflow.python.eager.context.context()` (the store has no
    public API in TF 2.21).

    Example:

    >>> store = coordination_key_value_store()
    >>> store.set_config_key_value("tfdist/claim", "worker:0")
    """
    from tensorflow.python.eager import context

    return context.context()


def configure_coordination_service(leader, jobs, register_timeout_seconds):
    """Configures TensorFlow's coordination service (as `MultiWorkerMirroredStrategy` would)
    with a bounded cluster registration, unless someone already configured it.

    Args:
        leader: the service leader task, e.g. `"/job:chief/replica:0/task:0"`.
        jobs: `{job name: number of tasks}` of the coordinated jobs.
        register_timeout_seconds: how long a task waits for the others to register.

    Returns:
        False when the service was already configured (nothing changed), True otherwise.

    Private: `tensorflow.python.eager.context.context().configure_coordination_service`
    and its `coordination_service` config (no public setting for the timeout).

    Example:

    >>> configure_coordination_service("/job:worker/replica:0/task:0", {"worker": 2}, 60)
    True
    """
    from tensorflow.python.eager import context

    ctx = context.context()
    if ctx.coordination_service is not None:
        return False
    ctx.configure_coordination_service(
        service_type="standalone", service_leader=leader,
        cluster_register_timeout_in_ms=int(register_timeout_seconds * 1000))
    service = ctx.coordination_service
    for name, num_tasks in jobs.items():
        service.coordinated_job_list.add(name=name, num_tasks=num_tasks)
    service.cluster_register_with_barrier = True
    return True


def local_gpu_memory_limits():
    """The memory limit in bytes of each local GPU's allocator, in TensorFlow's numbering.

    Private: `tensorflow.python.client.device_lib.list_local_devices` (the one
    place TensorFlow reports a GPU allocator's limit).

    Example:

    >>> local_gpu_memory_limits()   # a machine without GPUs
    []
    """
    from tensorflow.python.client import device_lib

    return [d.memory_limit for d in device_lib.list_local_devices() if d.device_type == "GPU"]


def onednn_enabled():
    """Whether TensorFlow runs its oneDNN CPU kernels in this process, which also
    makes oneDNN's pooled allocator TensorFlow's default for CPU tensors.

    TensorFlow decides this once per process: `TF_ENABLE_ONEDNN_OPTS` when set,
    else on where the CPU has AVX512-VNNI, AVX512-BF16 or AMX.

    Private: `tensorflow.python.util._pywrap_util_port.IsMklEnabled` (no public
    API says whether oneDNN is on; TensorFlow only logs it at import).

    Example:

    >>> onednn_enabled() in (True, False)
    True
    """
    from tensorflow.python.util import _pywrap_util_port

    return bool(_pywrap_util_port.IsMklEnabled())


def forget_retracing_counts():
    """Forgets how often each `tf.function` was traced, so earlier traces do not count
    towards TensorFlow's "excessive retracing" warning.

    Returns:
        False when TensorFlow's counters are not found (then the warning is only noise).

    Private: `polymorphic_function._frequent_tracing_detector_manager._detectors`.

    Example:

    >>> forget_retracing_counts()
    True
    """
    try:
        from tensorflow.python.eager.polymorphic_function import polymorphic_function

        polymorphic_function._frequent_tracing_detector_manager._detectors.clear()  # noqa: SLF001
    except (ImportError, AttributeError):
        return False
    return True


def checkpoint_state():
    """An empty `CheckpointState` protocol buffer: the format of TensorFlow's
    `checkpoint` index file, parsed by tfdist's backup index reader.

    Private: `tensorflow.python.training.checkpoint_state_pb2` (the message
    has no public export).

    Example:

    >>> checkpoint_state().all_model_checkpoint_paths
    []
    """
    from tensorflow.python.training import checkpoint_state_pb2

    return checkpoint_state_pb2.CheckpointState()
