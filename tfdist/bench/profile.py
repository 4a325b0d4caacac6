"""Where a training step's time goes: capture a profile and sum it by op kind.

`capture_profile` records a few steps of a contender with tfdist's
`ProfilerWindow` callback (a TensorBoard profile you can also open in
TensorBoard's Profile tab); `summarise_profile` reads the XSpace file and
adds up the *self* time of every TensorFlow op and XLA HLO op executed on
the compute threads, grouped into kinds (matmul, softmax/loss, RNG and bitwise,
elementwise and other), so XLA and non-XLA steps are read the same way.

Example:

    path = capture_profile(contender, "profiles/tfdist-fp32", steps=2)
    summary = summarise_profile(path)
    summary["kinds"]["matmul"]["share"]      # fraction of the ops' self time
"""

import collections
import glob
import os
import re

KINDS = (
    ("matmul", re.compile(r"matmul|batchmatmul|einsum|(^|[^a-z])dot|convolution|conv2d|"
                          r"tensordot|gemm", re.I)),
    ("softmax/loss", re.compile(r"softmax|crossentropy|exponential|logsumexp|log_", re.I)),
    ("rng and bitwise", re.compile(r"random|rng|bitwise|philox|threefry", re.I)),
    ("data and copies", re.compile(r"iterator|dataset|copy|transpose|concatenate|slice|gather|"
                                   r"scatter|identity|bitcast|reshape|broadcast|select", re.I)),
)
"""Op kinds, tested in order on an op's name; the rest is 'elementwise and other'."""
OTHER = "elementwise and other"

# Events that only wrap other events (their self time is bookkeeping).
_CONTAINERS = re.compile(r"^(ExecutorState::|ThunkExecutor::|CpuExecutable::|BlockUntilReady|"
                         r"ParallelFor|KernelAndDeviceFunc|EagerKernelExecute|"
                         r"ExecutorDoneCallback|.*::Run$)")
_COMPUTE_LINE = re.compile(r"^(tf_Compute|tf_numa_.*Eigen|tf_inter_op|XLA|tf_XLA)", re.I)


def op_kind(name):
    """The kind of an op from its (TF or HLO) name.

    Args:
        name: a TensorFlow op name (`scope/.../MatMul`) or an XLA HLO name
            (`dot.3`, `add_fusion`).

    Example:

    >>> op_kind("gradient_tape/decoder_lm/lm_head/Tensordot/MatMul"), op_kind("add_fusion.3")
    ('matmul', 'elementwise and other')
    """
    leaf = name.rsplit("/", 1)[-1]
    for kind, pattern in KINDS:
        if pattern.search(leaf):
            return kind
    return OTHER


def self_times(events):
    """Self time of each event on one timeline (nested events subtract from their parent).

    Args:
        events: `(name, start, duration)` tuples on one thread, any order.

    Returns:
        A list of `(name, self_time)`.

    Example:

    >>> self_times([("outer", 0, 10), ("inner", 2, 3)])
    [('outer', 7), ('inner', 3)]
    """
    ordered = sorted(events, key=lambda e: (e[1], -e[2]))
    result = []
    stack = []  # [index into result, end]
    for name, start, duration in ordered:
        while stack and start >= stack[-1][1]:
            stack.pop()
        if stack:
            parent = stack[-1][0]
            result[parent] = (result[parent][0], result[parent][1] - duration)
        result.append((name, duration))
        stack.append((len(result) - 1, start + duration))
    return result


def summarise_events(lines):
    """Sums op self times by kind over compute-thread timelines.

    Args:
        lines: `{thread name: [(op name, start, duration), ...]}` (any time
            unit).

    Returns:
        `{"total": ..., "kinds": {kind: {"time": ..., "share": ...}},
        "top_ops": [(name, time), ...]}` (top 10 op names by self time).

    Example:

    >>> lines = {"tf_Compute/1": [("MatMul", 0, 6), ("Add", 6, 2), ("Softmax", 8, 2)]}
    >>> summarise_events(lines)["kinds"]["matmul"]
    {'time': 6, 'share': 0.6}
    """
    by_kind = collections.Counter()
    by_op = collections.Counter()
    for thread, events in lines.items():
        if not _COMPUTE_LINE.search(thread):
            continue
        for name, own in self_times(events):
            if _CONTAINERS.search(name) or own <= 0:
                continue
            short = re.sub(r"\.\d+$", "", name.rsplit("/", 1)[-1].split(":")[0])
            by_kind[op_kind(name)] += own
            by_op[short] += own
    total = sum(by_kind.values())
    kinds = {kind: {"time": by_kind[kind], "share": by_kind[kind] / total if total else 0.0}
             for kind in [k for k, _ in KINDS] + [OTHER]}
    return {"total": total, "kinds": kinds, "top_ops": by_op.most_common(10)}


def read_xspace(path):
    """Reads the timelines of a profile's `.xplane.pb` file.

    Args:
        path: the `.xplane.pb` file (see `find_xspace`).

    Returns:
        `{thread name: [(op name, start_ps, duration_ps), ...]}`.

    Example:

    >>> lines = read_xspace(find_xspace("profiles/tfdist_fp32"))
    >>> summarise_events(lines)["kinds"]["matmul"]["share"]
    0.62
    """
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    space = xplane_pb2.XSpace()
    with open(path, "rb") as stream:
        space.ParseFromString(stream.read())
    lines = collections.defaultdict(list)
    for plane in space.planes:
        names = {key: value.name for key, value in plane.event_metadata.items()}
        for line in plane.lines:
            for event in line.events:
                lines[line.name].append((names.get(event.metadata_id, "?"), event.offset_ps,
                                         event.duration_ps))
    return dict(lines)


def find_xspace(log_dir):
    """The newest `.xplane.pb` under `log_dir` (as `ProfilerWindow` writes it).

    Args:
        log_dir: the folder given to `ProfilerWindow` / `capture_profile`.

    Example:

    >>> find_xspace("profiles/tfdist_fp32")
    'profiles/tfdist_fp32/plugins/profile/2026_11_22_15_32_06/vm.xplane.pb'

    Raises:
        FileNotFoundError: none there.
    """
    paths = sorted(glob.glob(os.path.join(log_dir, "plugins", "profile", "*", "*.xplane.pb")))
    if not paths:
        raise FileNotFoundError(f"No profile (*.xplane.pb) under {log_dir}/plugins/profile.")
    return paths[-1]


def capture_profile(contender, log_dir, steps=2, warmup_steps=1, input="pipeline"):
    """Profiles `steps` training steps of a warmed-up contender.

    Args:
        contender: a `tfdist.bench.engines.Contender` (already warmed up); the
            model alone (engine "model") is profiled around its own loop.
        log_dir: the TensorBoard log folder to write the profile under.
        steps: profiled steps, >= 1.
        warmup_steps: steps before the window (iterator start-up).
        input: "pipeline" (the real input pipeline; waiting for it shows as
            iterator ops) or "memory" (one batch replayed from memory: the
            compute alone), see `Contender.run`.

    Returns:
        The path of the `.xplane.pb` file.

    Example:

    >>> summarise_profile(capture_profile(contender, "profiles/ours"))["kinds"]["matmul"]
    {'time': 5432100000, 'share': 0.62}
    """
    if getattr(contender, "model_alone", None) is not None:  # no Keras loop, no callbacks
        import tensorflow as tf

        if warmup_steps:
            contender.run(warmup_steps, input=input, warmup_steps=0)
        tf.profiler.experimental.start(log_dir)
        try:
            contender.run(steps, input=input, warmup_steps=0)
        finally:
            tf.profiler.experimental.stop()
        return find_xspace(log_dir)
    from tfdist.callbacks import ProfilerWindow

    window = ProfilerWindow(log_dir, start_step=warmup_steps, stop_step=warmup_steps + steps)
    contender.run(steps, input=input, warmup_steps=warmup_steps, callbacks=[window])
    return find_xspace(log_dir)


def summarise_profile(path_or_dir):
    """`summarise_events` of a profile file (or the newest one in a log folder).

    Args:
        path_or_dir: a `.xplane.pb` file, or a `ProfilerWindow` log folder.

    Example:

    >>> summarise_profile("profiles/ours")["path"].endswith(".xplane.pb")
    True
    """
    path = path_or_dir if path_or_dir.endswith(".xplane.pb") else find_xspace(path_or_dir)
    summary = summarise_events(read_xspace(path))
    summary["path"] = path
    return summary


def format_profile(name, summary):
    """One line: each kind's share, then the top op names.

    Args:
        name: the contender's name.
        summary: a `summarise_events` / `summarise_profile` result.

    Example:

    >>> format_profile("tfdist", {"total": 10, "kinds": {"matmul": {"time": 6, "share": 0.6}},
    ...                           "top_ops": [("MatMul", 6)]})
    '  tfdist: matmul 60% | top ops: MatMul 60%'
    """
    kinds = " | ".join(f"{kind} {100 * value['share']:.0f}%"
                       for kind, value in summary["kinds"].items() if value["share"] >= 0.005)
    total = summary["total"] or 1
    top = ", ".join(f"{op} {100 * t / total:.0f}%" for op, t in summary["top_ops"][:5])
    return f"  {name}: {kinds} | top ops: {top}"
