"""What the suite's fork servers, their clients and tests/helpers/zygote.py agree on.

A forked run skips Python's, TensorFlow's and Keras's start-up, so it may only
be forked from a server whose environment had the same values of everything
read during that start-up (`import_time_environment`). The server compares
each request's environment with its own and refuses one that differs.

    from zygote_protocol import import_time_environment
    import_time_environment({"TF_CPP_MIN_LOG_LEVEL": "2", "HOME": "/root"})
    # {'TF_CPP_MIN_LOG_LEVEL': '2'}
"""

import json

# Environment variables read while Python, TensorFlow, Keras or their libraries
# start, before a forked run could change them: a run whose values differ gets
# a fresh interpreter. (TF_CONFIG is read when a strategy is made.)
IMPORT_TIME_PREFIXES = ("PYTHON", "TF_", "TENSORFLOW", "KERAS", "XLA", "CUDA", "NVIDIA", "LD_",
                        "OMP_", "KMP_", "MKL", "DNNL", "ONEDNN", "OPENBLAS", "MALLOC", "GLIBC")
RUNTIME_VARIABLES = {"TF_CONFIG"}
# The server's socket, for a client (zygote_client.py) started by a test or by
# tfdist's launcher; a forked run does not see it.
SOCKET_VARIABLE = "TFDIST_TEST_ZYGOTE_SOCKET"


def run_target(argv):
    """What `python ARGV` runs, as a request's `module` or `path` with its `args`; None
    for anything else (`-c`, interpreter options), which only a fresh interpreter runs.

    Example: `run_target(["-m", "tfdist.recipes.cnn", "--epochs", "1"])`
    # {'module': 'tfdist.recipes.cnn', 'args': ['--epochs', '1']}
    """
    if len(argv) >= 2 and argv[0] == "-m":
        return {"module": argv[1], "args": list(argv[2:])}
    if argv and argv[0].endswith(".py"):
        return {"path": argv[0], "args": list(argv[1:])}
    return None


def import_time_environment(env):
    """The part of `env` a forked run could not change.

    Example: `import_time_environment(os.environ)`
    """
    return {name: value for name, value in env.items()
            if name.startswith(IMPORT_TIME_PREFIXES) and name not in RUNTIME_VARIABLES}


def first_difference(env, reference):
    """The name of a variable whose import-time value differs between `env` and
    `reference` (set in one, unset in the other, or another value), or None.

    Example: `first_difference({"TF_X": "1"}, {}) == "TF_X"`
    """
    mine, theirs = import_time_environment(env), import_time_environment(reference)
    return next((name for name in sorted(set(mine) | set(theirs))
                 if mine.get(name) != theirs.get(name)), None)


def read_message(connection, buffer, deadline_seconds=None):
    """The next JSON line from `connection`; `buffer` is a one-item list of bytes
    read past the previous line. Raises ConnectionError at the end of the stream.

    Example: `pid = read_message(connection, [b""])["pid"]`
    """
    if deadline_seconds is not None:
        connection.settimeout(deadline_seconds)
    while b"\n" not in buffer[0]:
        chunk = connection.recv(4096)
        if not chunk:
            raise ConnectionError("the zygote server closed the connection before its answer")
        buffer[0] += chunk
    line, buffer[0] = buffer[0].split(b"\n", 1)
    return json.loads(line)


def message(payload):
    """One JSON line, as `read_message` reads it.

    Example: `connection.sendall(message({"pid": 12}))`
    """
    return json.dumps(payload).encode() + b"\n"
