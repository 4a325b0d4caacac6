"""TF_CONFIG values for tests: a cluster of localhost addresses and this task.

    from helpers.tf_config import tf_config

    monkeypatch.setenv("TF_CONFIG", tf_config("worker", 1))
"""

import json


def localhost_cluster(workers=2, chief=False, host="localhost", first_port=1000, **extra):
    """A cluster dict: `workers` workers on consecutive ports from `first_port`,
    a chief on the port below when `chief`, and any `extra` jobs as given.

    Example: `localhost_cluster(2, chief=True)` ->
    `{"worker": ["localhost:1000", "localhost:1001"], "chief": ["localhost:999"]}`
    """
    cluster = {"worker": [f"{host}:{first_port + i}" for i in range(workers)], **extra}
    if chief:
        cluster["chief"] = [f"{host}:{first_port - 1}"]
    return cluster


def tf_config(task_type="worker", index=0, chief=False, workers=2, host="localhost",
              first_port=1000, **extra):
    """The TF_CONFIG JSON of task (`task_type`, `index`) in a `localhost_cluster`.

    Example: `tf_config("worker", 1)` is worker 1 of two workers on localhost:1000-1001;
    `tf_config(ps=["127.0.0.1:4000"])` adds a parameter server.
    """
    cluster = localhost_cluster(workers, chief, host, first_port, **extra)
    return json.dumps({"cluster": cluster, "task": {"type": task_type, "index": index}})
