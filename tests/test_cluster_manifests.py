"""recipes/cluster/tfjob.yaml: the Kubeflow TFJob that runs the Transformer recipe.

Checks the manifest's fields, then builds the TF_CONFIG the training
operator (kubeflow/training-operator v1, `genClusterSpec` and
`genTFConfigJSONStr` in pkg/controller.v1/tensorflow/tensorflow.go) injects
into each replica's pod, and checks that tfdist accepts every one of them
and that all replicas agree on one chief.
"""

import json
import os
import subprocess
import sys

import mw
import pytest
import yaml

from tfdist.cluster import TFConfigError, parse_tf_config
from tfdist.recipes.runner import CLUSTER_LOST_EXIT_CODE
from tfdist.stop_signals import PREEMPTED_EXIT_CODE
from tfdist.strategy import choose_strategy, task_info

TFJOB = os.path.join(mw.REPO_ROOT, "recipes", "cluster", "tfjob.yaml")
DEFAULT_PORT = 2222          # the operator's TFJobDefaultPort
PORT_NAME = "tfjob-port"     # the operator's TFJobDefaultPortName
CONTAINER = "tensorflow"     # the operator's TFJobDefaultContainerName


def documents():
    with open(TFJOB) as stream:
        return [doc for doc in yaml.safe_load_all(stream) if doc]


def the(kind, docs=None):
    found = [doc for doc in (docs or documents()) if doc["kind"] == kind]
    assert len(found) == 1, f"{TFJOB} should hold one {kind}, has {len(found)}"
    return found[0]


def container(replica_spec):
    (found,) = [c for c in replica_spec["template"]["spec"]["containers"] if c["name"] == CONTAINER]
    return found


def replica_port(replica_spec):
    """The operator's GetPortFromTFJob: the `tfjob-port` of the `tensorflow`
    container, else 2222."""
    for port in container(replica_spec).get("ports", []):
        if port.get("name") == PORT_NAME:
            return port["containerPort"]
    return DEFAULT_PORT


def operator_tf_configs(tfjob, cluster_domain=None):
    """{(replica type, index): TF_CONFIG string} as the operator writes them.

    The operator lower-cases the replica type, names replica i of type T
    `<job>-<t>-<i>.<namespace>.svc` (+ "." + $CUSTOM_CLUSTER_DOMAIN) with the
    replica type's port, and adds `"environment": "cloud"`.
    """
    name = tfjob["metadata"]["name"]
    namespace = tfjob["metadata"].get("namespace", "default")
    cluster = {}
    for replica_type, spec in tfjob["spec"]["tfReplicaSpecs"].items():
        kind = replica_type.lower()
        hosts = []
        for index in range(spec.get("replicas", 1)):
            host = f"{name}-{kind}-{index}.{namespace}.svc".replace("/", "-")
            if cluster_domain:
                host += "." + cluster_domain
            hosts.append(f"{host}:{replica_port(spec)}")
        cluster[kind] = hosts
    return {(kind, index): json.dumps({"cluster": cluster, "task": {"type": kind, "index": index},
                                       "environment": "cloud"})
            for kind, hosts in cluster.items() for index in range(len(hosts))}


def operator_restarts(restart_policy, exit_code):
    """Whether the operator recreates a pod that exited with `exit_code`
    (pkg/controller.v1/common/pod.go; retryable means >= 128)."""
    if restart_policy == "ExitCode":
        return exit_code >= 128
    return restart_policy in ("OnFailure", "Always")


# ---------------------------------------------------------------- the manifest

def test_tfjob_has_a_chief_and_workers_and_no_parameter_servers():
    tfjob = the("TFJob")
    assert tfjob["apiVersion"] == "kubeflow.org/v1"
    specs = tfjob["spec"]["tfReplicaSpecs"]
    assert set(specs) == {"Chief", "Worker"}
    assert specs["Chief"]["replicas"] == 1
    assert specs["Worker"]["replicas"] >= 1


def test_every_replica_runs_the_recipe_in_the_tensorflow_container_with_gpus():
    specs = the("TFJob")["spec"]["tfReplicaSpecs"]
    gpus = set()
    for replica_type, spec in specs.items():
        main = container(spec)
        assert main["image"] == "tfdist:latest", replica_type
        # args, not command: the image's ENTRYPOINT stays in front of tfdist.
        assert "command" not in main, replica_type
        args = main["args"]
        assert args[:3] == ["python", "-m", "tfdist.recipes.transformer"], replica_type
        assert args[args.index("--strategy") + 1] == "multi_worker_mirrored"
        gpus.add(int(main["resources"]["limits"]["nvidia.com/gpu"]))
        assert replica_port(spec) == DEFAULT_PORT
        assert "TF_CONFIG" not in {env["name"] for env in main.get("env", [])}, \
            "the operator writes TF_CONFIG"
    assert len(gpus) == 1 and gpus.pop() >= 1, "every replica needs the same number of GPUs"
    assert len({json.dumps(container(spec)["args"]) for spec in specs.values()}) == 1


def test_model_dir_is_on_one_read_write_many_volume_mounted_by_every_replica():
    docs = documents()
    claim = the("PersistentVolumeClaim", docs)
    assert "ReadWriteMany" in claim["spec"]["accessModes"]
    for replica_type, spec in the("TFJob", docs)["spec"]["tfReplicaSpecs"].items():
        pod = spec["template"]["spec"]
        volumes = {volume["name"]: volume for volume in pod["volumes"]}
        args = container(spec)["args"]
        model_dir = args[args.index("--model-dir") + 1]
        mounts = [mount for mount in container(spec)["volumeMounts"]
                  if model_dir.startswith(mount["mountPath"].rstrip("/") + "/")]
        assert len(mounts) == 1, f"{replica_type}: --model-dir {model_dir} is on no volume"
        volume = volumes[mounts[0]["name"]]
        assert volume["persistentVolumeClaim"]["claimName"] == claim["metadata"]["name"]
        assert not mounts[0].get("readOnly", False)
        # The image runs as uid 1000: the volume must be writable for it.
        assert pod["securityContext"]["fsGroup"] == 1000


def test_restart_policy_restarts_a_preempted_run_and_not_a_bad_config():
    tfjob = the("TFJob")
    backoff = tfjob["spec"]["runPolicy"]["backoffLimit"]
    assert isinstance(backoff, int) and backoff >= 1
    for replica_type, spec in tfjob["spec"]["tfReplicaSpecs"].items():
        policy = spec["restartPolicy"]
        assert policy == "ExitCode", replica_type
        assert operator_restarts(policy, PREEMPTED_EXIT_CODE)  # SIGTERM: backed up, exit 143
        assert operator_restarts(policy, 137)                  # SIGKILL, OOM kill
        assert operator_restarts(policy, CLUSTER_LOST_EXIT_CODE)   # a peer lost: exit 141
        assert not operator_restarts(policy, 2)                # bad flag or config
        assert not operator_restarts(policy, 1)
        # Time for a step, the workers' agreement and the backup after SIGTERM.
        assert spec["template"]["spec"]["terminationGracePeriodSeconds"] >= 60


def test_recipe_accepts_the_tfjob_flags(tmp_path):
    args = list(container(the("TFJob")["spec"]["tfReplicaSpecs"]["Chief"])["args"])
    model_dir = args.index("--model-dir") + 1
    args[model_dir] = str(tmp_path / "run")
    job = subprocess.run([sys.executable, *args[1:], "--print-config"], cwd=mw.REPO_ROOT,
                         capture_output=True, text=True, timeout=120,
                         env=dict(os.environ, PYTHONPATH=mw.REPO_ROOT))
    assert job.returncode == 0, job.stderr
    assert "strategy: multi_worker_mirrored" in job.stdout
    assert f"model_dir: {tmp_path / 'run'}" in job.stdout


# ---------------------------------------------------------------- the operator's TF_CONFIG

@pytest.mark.parametrize("cluster_domain", [None, "cluster.local"])
def test_every_replica_accepts_its_tf_config_and_all_agree_on_the_chief(monkeypatch,
                                                                        cluster_domain):
    tfjob = the("TFJob")
    workers = tfjob["spec"]["tfReplicaSpecs"]["Worker"]["replicas"]
    configs = operator_tf_configs(tfjob, cluster_domain)
    assert len(configs) == 1 + workers
    suffix = ".cluster.local" if cluster_domain else ""
    chief_address = f"tfdist-transformer-chief-0.default.svc{suffix}:2222"
    chiefs, indices = [], []
    for (kind, index), raw in configs.items():
        config = parse_tf_config(raw)
        assert config.cluster["chief"] == (chief_address,)
        assert config.cluster["worker"] == tuple(
            f"tfdist-transformer-worker-{i}.default.svc{suffix}:2222" for i in range(workers))
        assert (config.task_type, config.task_index) == (kind, index)
        assert config.own_address.startswith(f"tfdist-transformer-{kind}-{index}.")
        assert config.num_workers == 1 + workers
        indices.append(config.worker_index)
        if config.is_chief:
            chiefs.append((kind, index))

        # What the recipe's create_strategy sees in the pod.
        monkeypatch.setenv("TF_CONFIG", raw)
        name, reason = choose_strategy()
        assert name == "multi_worker_mirrored", reason
        assert task_info() == (kind, index, kind == "chief")
    assert chiefs == [("chief", 0)]
    assert sorted(indices) == list(range(1 + workers))


def test_a_master_replica_would_be_refused():
    """Why the manifest says Chief: the operator names a Master replica
    `master` in TF_CONFIG, which multi-worker TensorFlow does not know."""
    tfjob = the("TFJob")
    specs = tfjob["spec"]["tfReplicaSpecs"]
    specs["Master"] = specs.pop("Chief")
    raw = operator_tf_configs(tfjob)[("master", 0)]
    with pytest.raises(TFConfigError, match="unknown task type 'master'"):
        parse_tf_config(raw)
