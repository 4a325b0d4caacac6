"""TF_CONFIG parsing and validation.

`TF_CONFIG` is how TensorFlow learns the cluster it belongs to (Kubeflow's
TFJob, tfdist's launcher and most schedulers write it). TensorFlow reads it
leniently: a typo can leave a worker believing it is alone, or hang it while
it waits for a peer that does not exist. `parse_tf_config` checks every field
up front and names the bad one. It never imports TensorFlow, so launchers and
command-line tools can use it cheaply.
"""

import dataclasses
import json
import os
import types

TASK_TYPES = ("chief", "worker", "ps", "evaluator")
"""Task types TensorFlow's cluster resolvers know."""

TRAINING_TASK_TYPES = ("chief", "worker")
"""Task types that take part in synchronous (multi-worker mirrored) training."""


class StrategyStartupError(RuntimeError):
    """A multi-worker or parameter-server cluster did not form within the deadline.

    Example:

        try:
            strategy = create_strategy("multi_worker_mirrored")
        except StrategyStartupError as error:
            print(error)  # names the tasks that never answered
    """


class TFConfigError(ValueError):
    """TF_CONFIG is malformed; the message names the field and the bad value.

    Example:

        try:
            parse_tf_config('{"cluster": ')
        except TFConfigError as error:
            print(error)  # TF_CONFIG is not valid JSON: ... at line 1 column 13 ...
    """


@dataclasses.dataclass(frozen=True)
class ClusterConfig:
    """A validated TF_CONFIG.

    Args:
        cluster: read-only mapping task type -> tuple of "host:port" addresses,
            in task-index order.
        task_type: this process's task type, one of `TASK_TYPES`.
        task_index: this process's index within `cluster[task_type]`.

    Example:

    >>> config = parse_tf_config({"cluster": {"worker": ["a:1", "b:2"]},
    ...                           "task": {"type": "worker", "index": 1}})
    >>> config.num_workers, config.is_chief, config.own_address
    (2, False, 'b:2')
    """

    cluster: types.MappingProxyType = dataclasses.field(hash=False)
    task_type: str
    task_index: int

    @property
    def num_workers(self):
        """Number of training tasks (chief + worker)."""
        return sum(len(self.cluster.get(kind, ())) for kind in TRAINING_TASK_TYPES)

    @property
    def is_chief(self):
        """True for the chief task, or for worker 0 when there is no chief."""
        if self.task_type == "chief":
            return True
        return self.task_type == "worker" and self.task_index == 0 and "chief" not in self.cluster

    @property
    def own_address(self):
        """This task's "host:port" (None for an evaluator outside the cluster)."""
        addresses = self.cluster.get(self.task_type)
        return addresses[self.task_index] if addresses else None

    @property
    def worker_index(self):
        """Index among the training tasks (chief first, then workers), or None
        for a ps/evaluator task. Matches TensorFlow's `id_in_cluster`."""
        if self.task_type == "chief":
            return 0
        if self.task_type == "worker":
            return self.task_index + len(self.cluster.get("chief", ()))
        return None

    def training_tasks(self):
        """Returns [(task_type, index, address)] for every chief and worker task,
        in worker-index order."""
        return [(kind, index, address)
                for kind in TRAINING_TASK_TYPES
                for index, address in enumerate(self.cluster.get(kind, ()))]

    def peers(self):
        """Returns the training tasks other than this one, as
        [(task_type, index, address)]."""
        return [task for task in self.training_tasks()
                if (task[0], task[1]) != (self.task_type, self.task_index)]

    def as_dict(self):
        """Returns the config as a TF_CONFIG-shaped dict (lists, plain dicts)."""
        return {"cluster": {kind: list(addresses) for kind, addresses in self.cluster.items()},
                "task": {"type": self.task_type, "index": self.task_index}}


def tf_config_text(cluster, task_type, task_index):
    """Returns the TF_CONFIG value that makes a process task `task_index` of `task_type` in `cluster`.

    The text is checked by `parse_tf_config` before it is returned, so a
    launcher never hands a worker a TF_CONFIG that TensorFlow would misread.

    Args:
        cluster: {task type: [address, ...]}, e.g. {"worker": ["127.0.0.1:2222"]}.
        task_type: "chief", "worker", "ps" or "evaluator".
        task_index: the task's index in `cluster[task_type]`.

    Raises:
        TFConfigError: naming the bad field.

    Example:

    >>> tf_config_text({"worker": ["127.0.0.1:2222"]}, "worker", 0)
    '{"cluster": {"worker": ["127.0.0.1:2222"]}, "task": {"type": "worker", "index": 0}}'
    """
    text = json.dumps({"cluster": cluster, "task": {"type": task_type, "index": task_index}})
    parse_tf_config(text)
    return text


def parse_tf_config(raw=None):
    """Parses and validates TF_CONFIG.

    Args:
        raw: a JSON string, an already decoded dict, or None to read the
            `TF_CONFIG` environment variable.

    Returns:
        A `ClusterConfig`, or None when TF_CONFIG is unset or empty (a
        single-machine run). A TF_CONFIG that is set but wrong is an error,
        never a silent single worker.

    Raises:
        TFConfigError: the first problem found, naming the field, the bad value
            and what is allowed.

    Example:

    >>> parse_tf_config('{"cluster": {"worker": ["127.0.0.1:2222"]},'
    ...                 ' "task": {"type": "worker", "index": 0}}').num_workers
    1
    >>> parse_tf_config("") is None
    True
    """
    if raw is None:
        raw = os.environ.get("TF_CONFIG")
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        return None
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except json.JSONDecodeError as error:
            raise TFConfigError(
                f"TF_CONFIG is not valid JSON: {error.msg} at line {error.lineno} "
                f"column {error.colno} (character {error.pos}): {_excerpt(error.doc, error.pos)}"
            ) from None
    if not isinstance(raw, dict):
        raise TFConfigError(
            f"TF_CONFIG must be a JSON object with 'cluster' and 'task', got "
            f"{type(raw).__name__} {_short(raw)}.")
    cluster = _parse_cluster(raw)
    task_type, task_index = _parse_task(raw, cluster)
    return ClusterConfig(cluster=types.MappingProxyType(cluster), task_type=task_type,
                         task_index=task_index)


def config_from_resolver(resolver):
    """The `ClusterConfig` a TensorFlow cluster resolver names, or None for no cluster.

    Works with any `tf.distribute.cluster_resolver.ClusterResolver` (TF_CONFIG,
    SLURM, Kubernetes, ...) and imports no TensorFlow itself.

    Raises:
        ValueError: the resolver names a cluster but not this process's task.

    Example:

    >>> resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
    ...     tf.train.ClusterSpec({"worker": ["a:1", "b:2"]}), task_type="worker", task_id=1)
    >>> config_from_resolver(resolver).own_address
    'b:2'
    """
    spec = resolver.cluster_spec().as_dict()
    if not spec:
        return None
    if resolver.task_type is None or resolver.task_id is None:
        raise ValueError(
            f"{type(resolver).__name__} names a cluster but not this process's task (task_type="
            f"{resolver.task_type!r}, task_id={resolver.task_id!r}); both are needed.")
    cluster = {kind: tuple(tasks.values() if isinstance(tasks, dict) else tasks)
               for kind, tasks in spec.items()}
    return ClusterConfig(cluster=types.MappingProxyType(cluster), task_type=resolver.task_type,
                         task_index=resolver.task_id)


def _parse_cluster(raw):
    if "cluster" not in raw:
        raise TFConfigError(
            f"TF_CONFIG has no 'cluster' (keys: {sorted(raw)}); it must map task types "
            f"({', '.join(TASK_TYPES)}) to lists of 'host:port' addresses.")
    cluster = raw["cluster"]
    if not isinstance(cluster, dict) or not cluster:
        raise TFConfigError(
            f"TF_CONFIG 'cluster' must be a non-empty object mapping task types "
            f"({', '.join(TASK_TYPES)}) to lists of 'host:port' addresses, got {_short(cluster)}.")
    seen = {}
    parsed = {}
    for kind, addresses in cluster.items():
        if kind not in TASK_TYPES:
            raise TFConfigError(
                f"TF_CONFIG cluster has unknown task type {kind!r}; allowed: "
                f"{', '.join(TASK_TYPES)}.")
        if not isinstance(addresses, list) or not addresses:
            raise TFConfigError(
                f"TF_CONFIG cluster[{kind!r}] must be a non-empty list of 'host:port' "
                f"strings, got {_short(addresses)}.")
        for index, address in enumerate(addresses):
            _check_address(kind, index, address)
            if address in seen:
                raise TFConfigError(
                    f"TF_CONFIG address {address!r} appears twice: cluster[{seen[address][0]!r}]"
                    f"[{seen[address][1]}] and cluster[{kind!r}][{index}]; every task needs "
                    "its own host:port.")
            seen[address] = (kind, index)
        parsed[kind] = tuple(addresses)
    if len(parsed.get("chief", ())) > 1:
        raise TFConfigError(
            f"TF_CONFIG cluster['chief'] lists {len(parsed['chief'])} addresses "
            f"{list(parsed['chief'])}; at most one chief is allowed (put the others "
            "under 'worker').")
    if not any(kind in parsed for kind in TRAINING_TASK_TYPES):
        raise TFConfigError(
            f"TF_CONFIG cluster has no 'chief' or 'worker' task (task types: "
            f"{sorted(parsed)}); at least one is needed to train.")
    return parsed


def _check_address(kind, index, address):
    where = f"TF_CONFIG cluster[{kind!r}][{index}]"
    if not isinstance(address, str):
        raise TFConfigError(f"{where} must be a 'host:port' string, got {_short(address)}.")
    scheme, has_scheme, rest = address.partition("://")
    if has_scheme or "/" in address:
        # grpc://host:port, http://..., host:port/path: TensorFlow would take the
        # scheme for a host name or the path for part of the port, and then wait
        # for a peer that cannot exist.
        bare = (rest if has_scheme else address).split("/", 1)[0]
        host, _, port = bare.rpartition(":")
        if not (host and port.isdigit()):
            bare = "10.0.0.1:2222"
        what = f"a URL with scheme {scheme + '://'!r}" if has_scheme else "an address with a path"
        raise TFConfigError(
            f"{where} = {address!r} is {what}; TF_CONFIG addresses are plain 'host:port' with "
            f"no scheme and no path, e.g. {bare!r}.")
    host, sep, port = address.rpartition(":")
    if not sep or not host:
        raise TFConfigError(f"{where} = {address!r} is not 'host:port' (e.g. '10.0.0.1:2222').")
    if not port.isdigit() or not 1 <= int(port) <= 65535:
        raise TFConfigError(
            f"{where} = {address!r} has port {port!r}; the port must be an integer "
            "in 1..65535.")


def _parse_task(raw, cluster):
    if "task" not in raw:
        raise TFConfigError(
            "TF_CONFIG has no 'task'; it must say which task this process is, e.g. "
            '"task": {"type": "worker", "index": 0}.')
    task = raw["task"]
    if not isinstance(task, dict):
        raise TFConfigError(
            f"TF_CONFIG 'task' must be an object like {{\"type\": \"worker\", \"index\": 0}}, "
            f"got {_short(task)}.")
    for key in ("type", "index"):
        if key not in task:
            raise TFConfigError(
                f"TF_CONFIG 'task' has no {key!r} (got {_short(task)}); it needs both "
                "'type' and 'index'.")
    kind, index = task["type"], task["index"]
    if kind not in TASK_TYPES:
        raise TFConfigError(
            f"TF_CONFIG task type {_short(kind)} is unknown; allowed: {', '.join(TASK_TYPES)}.")
    if not isinstance(index, int) or isinstance(index, bool):
        raise TFConfigError(
            f"TF_CONFIG task index must be an integer, got {type(index).__name__} {_short(index)}.")
    if kind == "evaluator" and kind not in cluster:
        # TensorFlow's convention: the evaluator runs beside the cluster, not in it.
        if index != 0:
            raise TFConfigError(
                f"TF_CONFIG task index {index} is out of range for an evaluator outside the "
                "cluster: there is one evaluator, index 0.")
        return kind, index
    if kind not in cluster:
        raise TFConfigError(
            f"TF_CONFIG task type {kind!r} is not in the cluster (task types there: "
            f"{', '.join(sorted(cluster))}).")
    count = len(cluster[kind])
    if not 0 <= index < count:
        raise TFConfigError(
            f"TF_CONFIG task index {index} is out of range for task type {kind!r}: the "
            f"cluster lists {count} {kind} address(es), so the index must be in 0..{count - 1}.")
    return kind, index


def _short(value, limit=80):
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _excerpt(text, position, width=20):
    start = max(0, position - width)
    return repr(text[start:position]) + " <here> " + repr(text[position:position + width])
