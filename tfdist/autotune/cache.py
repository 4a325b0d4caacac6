"""Remembered autotune decisions, one per model, batch, hardware, TF version and tfdist code.

A trial costs seconds to minutes; its decision is stored in a JSON file so
that the next run of the same model on the same kind of machine starts at
once. The key is a hash of a *signature*: what the step's speed depends on
(the recipe and the options that shape the model, the data and the batch,
the strategy and its replicas, the CPU or GPU model and flags, the TensorFlow
and Keras versions, and tfdist's own code: a hash of its sources, so that a
new tfdist, whose step may be faster in one setting than in another, measures
again instead of reusing what an older one measured). Options that only
change how long the run is or where it writes (epochs, model_dir, seed, ...)
are left out: each recipe option declares it
(`tfdist.recipes.config.Option.changes_step_speed`).

The file is `$TFDIST_AUTOTUNE_CACHE`, else `$XDG_CACHE_HOME/tfdist/autotune.json`,
else `~/.cache/tfdist/autotune.json`. It is written whole to a temporary file
and renamed, so a reader never sees half a file. A path that holds something
else (a folder, a file that is not JSON, JSON that is not a decision cache: a
mistyped `--autotune-cache`, say) is reported once and left as it is: the
run measures and goes on without caching (`cache_problem`). Only the default
file, tfdist's own, is replaced when it cannot be read.

Example:

    cache = DecisionCache()
    key = signature_key(signature)
    entry = cache.get(key)            # None on a miss
    cache.put(key, {"choice": {...}, "figures": [...]})
"""

import datetime
import functools
import hashlib
import json
import logging
import os
import tempfile

from tfdist.precision import HARDWARE_FLAGS, cpu_model_name

logger = logging.getLogger("tfdist")

CACHE_ENV = "TFDIST_AUTOTUNE_CACHE"
FORMAT_VERSION = 1


def default_cache_path(environ=None):
    """Where decisions are kept (see the module docstring).

    Args:
        environ: the environment (default `os.environ`).

    Example:

    >>> default_cache_path({"TFDIST_AUTOTUNE_CACHE": "/tmp/a.json"})
    '/tmp/a.json'
    >>> default_cache_path({"XDG_CACHE_HOME": "/c", "HOME": "/h"})
    '/c/tfdist/autotune.json'
    """
    environ = os.environ if environ is None else environ
    if environ.get(CACHE_ENV):
        return environ[CACHE_ENV]
    base = environ.get("XDG_CACHE_HOME") or os.path.join(
        environ.get("HOME") or os.path.expanduser("~"), ".cache")
    return os.path.join(base, "tfdist", "autotune.json")


def hardware_signature(cpu_flags, gpus=(), cpu_name=None, cpus=None):
    """What the hardware contributes to a signature.

    Args:
        cpu_flags: the CPU feature flags (only those that change kernels are kept).
        gpus: `(name, (major, minor))` of each GPU.
        cpu_name: the CPU model name (default: read from /proc/cpuinfo).
        cpus: CPUs this process may use (default: its affinity).

    Example:

    >>> hardware_signature({"avx2", "sse"}, cpu_name="X", cpus=2)
    {'cpu': 'X', 'cpu_flags': ['avx2'], 'cpus': 2, 'gpus': []}
    """
    if cpus is None:
        cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {"cpu": cpu_name if cpu_name is not None else cpu_model_name(),
            "cpu_flags": sorted(set(cpu_flags).intersection(HARDWARE_FLAGS)),
            "cpus": cpus, "gpus": [[name, list(capability)] for name, capability in gpus]}


def code_fingerprint(root=None):
    """A short hash of tfdist's Python sources: it changes whenever its code does.

    Read once per process (about 200 small files).

    Args:
        root: the package folder to hash (default: tfdist's own).

    Example:

    >>> len(code_fingerprint())
    16
    """
    return _fingerprint(os.path.abspath(root or os.path.dirname(os.path.dirname(__file__))))


@functools.lru_cache(maxsize=None)
def _fingerprint(root):
    digest = hashlib.sha256()
    for folder, subfolders, files in os.walk(root):
        subfolders.sort()
        for name in sorted(files):
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                digest.update(os.path.relpath(path, root).encode() + b"\0")
                with open(path, "rb") as source:
                    digest.update(source.read() + b"\0")
    return digest.hexdigest()[:16]


def signature_key(signature):
    """A short stable hash of a signature (a JSON-serialisable dict).

    Example:

    >>> signature_key({"a": 1}) == signature_key({"a": 1})
    True
    >>> len(signature_key({"a": 1}))
    16
    """
    text = json.dumps(signature, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def cache_problem(path):
    """Why `path` cannot be used as the decision cache, or None when it can: it is
    missing (it will be created) or holds a cache of decisions (of any format version).

    Example:

    >>> cache_problem("/tmp")
    'it is a folder, not a file'
    >>> cache_problem("/no/such/autotune.json") is None
    True
    """
    return _load(path)[1]


def _load(path):
    """`(decisions, problem)`: the decisions in `path` ({} when it is missing or
    holds another format version), and why it is not a cache (None when it is)."""
    if os.path.isdir(path):
        return {}, "it is a folder, not a file"
    try:
        with open(path) as stream:
            content = json.load(stream)
    except FileNotFoundError:
        return {}, None
    except OSError as error:
        return {}, f"it cannot be read: {error}"
    except ValueError as error:
        return {}, f"it is not JSON: {error}"
    if not isinstance(content, dict) or "format" not in content:
        return {}, "it holds JSON that is not a tfdist autotune cache"
    if content["format"] != FORMAT_VERSION or not isinstance(content.get("decisions"), dict):
        return {}, None  # another version's cache: replaced by this one's
    return content["decisions"], None


class DecisionCache:
    """The JSON file of autotune decisions, keyed by `signature_key`.

    Args:
        path: the file (default: `default_cache_path()`).

    Example:

    >>> cache = DecisionCache("/tmp/autotune.json")
    >>> cache.put("abc", {"choice": {"precision": "float32", "xla": True}})
    >>> cache.get("abc")["choice"]["xla"]
    True
    """

    def __init__(self, path=None):
        self.path = path or default_cache_path()
        # The default file (no path given, none in the environment) is tfdist's own.
        self._own_file = not path and not os.environ.get(CACHE_ENV)
        self._reported = False

    def _read(self):
        """The stored decisions, and whether the file may be replaced: not when it holds
        something other than a cache, unless it is tfdist's own default file (a folder
        never). A problem is reported once per `DecisionCache`."""
        decisions, problem = _load(self.path)
        if problem is None:
            return decisions, True
        replace = self._own_file and not os.path.isdir(self.path)
        if not self._reported:
            self._reported = True
            if replace:
                logger.warning("The autotune cache %s is not usable (%s); it is tfdist's own "
                               "file, so it is replaced by this run's decisions.",
                               self.path, problem)
            else:
                logger.warning("The autotune cache %s is not usable (%s); it is left as it is "
                               "and decisions are not cached. Name another file with "
                               "--autotune-cache or $%s, or move this one away.",
                               self.path, problem, CACHE_ENV)
        return {}, replace

    def get(self, key):
        """The stored entry for `key`, or None.

        Example:

        >>> DecisionCache("/nonexistent/x.json").get("abc") is None
        True
        """
        entry = self._read()[0].get(key)
        return entry if isinstance(entry, dict) else None

    def put(self, key, entry):
        """Stores `entry` (a JSON-serialisable dict) under `key`, atomically.

        The time of the decision is added as `measured_at`. A cache that
        cannot be written is a warning, not an error: the run goes on. A
        path that holds something other than a cache is never replaced.

        Returns:
            True when the file was written.

        Example:

        >>> DecisionCache("/tmp/autotune.json").put("abc", {"choice": {}})
        True
        """
        decisions, replaceable = self._read()
        if not replaceable:
            return False
        decisions[key] = dict(entry, measured_at=datetime.datetime.now().isoformat(
            timespec="seconds"))
        folder = os.path.dirname(os.path.abspath(self.path))
        try:
            os.makedirs(folder, exist_ok=True)
            handle, temporary = tempfile.mkstemp(dir=folder, prefix=".autotune-", suffix=".tmp")
            try:
                with os.fdopen(handle, "w") as stream:
                    json.dump({"format": FORMAT_VERSION, "decisions": decisions}, stream,
                              indent=1, sort_keys=True)
                os.replace(temporary, self.path)
            except BaseException:
                if os.path.exists(temporary):
                    os.unlink(temporary)
                raise
        except OSError as error:
            logger.warning("The autotune decision could not be cached in %s (%s); the next run "
                           "will measure again. Set $%s or --autotune-cache to a writable file.",
                           self.path, error, CACHE_ENV)
            return False
        return True
