"""deploy/tfjob.yaml and tfjob-ps.yaml: the Kubeflow TFJobs that run the
Transformer recipe (multi_worker_mirrored, and parameter_server).

Checks the manifests' fields, then builds the TF_CONFIG the training
operator (kubeflow/training-operator v1, `genClusterSpec` and
`genTFConfigJSONStr` in pkg/controller.v1/tensorflow/tensorflow.go) injects
into each replica's pod, and checks that tfdist accepts every one of them
and that all replicas agree on one chief.
"""

import json
import os
import subprocess
import sys

from helpers import mw
import pytest
import yaml

from tfdist.distribute.tf_config import TFConfigError, parse_tf_config
from tfdist.launch import local_cluster as launch_cluster
from tfdist.recipes.recipe_runner import CLUSTER_LOST_EXIT_CODE
from tfdist.runtime.stop_signals import PREEMPTED_EXIT_CODE
from tfdist.distribute.strategy_factory import choose_strategy
from tfdist.distribute.introspection import task_info

TFJOB = os.path.join(mw.REPO_ROOT, "deploy", "tfjob.yaml")
TFJOB_PS = os.path.join(mw.REPO_ROOT, "deploy", "tfjob-ps.yaml")
DEFAULT_PORT = 2222          # the operator's TFJobDefaultPort
PORT_NAME = "tfjob-port"     # the operator's TFJobDefaultPortName
CONTAINER = "tensorflow"     # the operator's TFJobDefaultContainerName


def documents(path=TFJOB):
    with open(path) as stream:
        return [doc for doc in yaml.safe_load_all(stream) if doc]


def the(kind, docs=None, path=TFJOB):
    found = [doc for doc in (docs or documents(path)) if doc["kind"] == kind]
    assert len(found) == 1, f"{path} should hold one {kind}, has {len(found)}"
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


# ---------------------------------------------------------------- tfjob-ps.yaml (parameter_server)

def ps_specs():
    return the("TFJob", path=TFJOB_PS)["spec"]["tfReplicaSpecs"]


def env_of(spec):
    return {env["name"]: env.get("value") for env in container(spec).get("env", [])}


def test_ps_tfjob_has_one_chief_workers_and_ps_tasks_and_cleans_up_the_servers():
    tfjob = the("TFJob", path=TFJOB_PS)
    assert tfjob["apiVersion"] == "kubeflow.org/v1"
    specs = tfjob["spec"]["tfReplicaSpecs"]
    assert set(specs) == {"Chief", "Worker", "PS"}
    assert specs["Chief"]["replicas"] == 1
    assert specs["Worker"]["replicas"] >= 1 and specs["PS"]["replicas"] >= 1
    # Workers and ps tasks serve until stopped: when the chief ends the job,
    # the operator must delete them (None would leave them running forever).
    assert tfjob["spec"]["runPolicy"]["cleanPodPolicy"] == "Running"
    backoff = tfjob["spec"]["runPolicy"]["backoffLimit"]
    assert isinstance(backoff, int) and backoff >= 1
    assert tfjob["metadata"]["name"] != the("TFJob")["metadata"]["name"]


def test_ps_tfjob_runs_the_same_parameter_server_command_in_every_replica():
    specs = ps_specs()
    for replica_type, spec in specs.items():
        main = container(spec)
        assert main["image"] == "tfdist:latest", replica_type
        assert "command" not in main, replica_type  # the image's ENTRYPOINT stays in front
        args = main["args"]
        assert args[:3] == ["python", "-m", "tfdist.recipes.transformer"], replica_type
        assert args[args.index("--strategy") + 1] == "parameter_server", replica_type
        assert replica_port(spec) == DEFAULT_PORT
        assert "TF_CONFIG" not in env_of(spec), "the operator writes TF_CONFIG"
        assert env_of(spec)["TFDIST_STARTUP_TIMEOUT"] == "1800", replica_type
    assert len({json.dumps(container(spec)["args"]) for spec in specs.values()}) == 1


def test_ps_tfjob_gives_gpus_to_the_workers_only():
    specs = ps_specs()
    gpus = container(specs["Worker"])["resources"]["limits"]["nvidia.com/gpu"]
    assert int(gpus) >= 1
    for replica_type in ("Chief", "PS"):
        resources = container(specs[replica_type]).get("resources", {})
        assert "nvidia.com/gpu" not in resources.get("limits", {}), replica_type
        # Hidden as well, so that TensorFlow takes no GPU memory there even
        # where the runtime exposes every GPU to every container.
        assert env_of(specs[replica_type])["CUDA_VISIBLE_DEVICES"] == "", replica_type


def test_ps_tfjob_model_dir_is_on_a_volume_the_chief_writes():
    docs = documents(TFJOB_PS)
    claim = the("PersistentVolumeClaim", docs, path=TFJOB_PS)
    assert claim["metadata"]["name"] != the("PersistentVolumeClaim")["metadata"]["name"]
    chief = the("TFJob", docs, path=TFJOB_PS)["spec"]["tfReplicaSpecs"]["Chief"]
    pod = chief["template"]["spec"]
    args = container(chief)["args"]
    model_dir = args[args.index("--model-dir") + 1]
    mounts = [mount for mount in container(chief)["volumeMounts"]
              if model_dir.startswith(mount["mountPath"].rstrip("/") + "/")]
    assert len(mounts) == 1, f"--model-dir {model_dir} is on no volume of the chief"
    assert not mounts[0].get("readOnly", False)
    volumes = {volume["name"]: volume for volume in pod["volumes"]}
    assert volumes[mounts[0]["name"]]["persistentVolumeClaim"]["claimName"] == \
        claim["metadata"]["name"]
    assert pod["securityContext"]["fsGroup"] == 1000  # the image's uid 1000 writes there


def test_ps_tfjob_restarts_lost_servers_whatever_ended_them_and_the_chief_by_exit_code():
    specs = ps_specs()
    chief = specs["Chief"]
    assert chief["restartPolicy"] == "ExitCode"
    assert operator_restarts("ExitCode", PREEMPTED_EXIT_CODE)    # backup written: resume
    assert operator_restarts("ExitCode", 137)                    # killed, OOM
    assert operator_restarts("ExitCode", CLUSTER_LOST_EXIT_CODE)  # a ps task lost: 141
    assert not operator_restarts("ExitCode", 2)                  # bad flag or config
    assert not operator_restarts("ExitCode", 1)
    assert chief["template"]["spec"]["terminationGracePeriodSeconds"] >= 60  # step + backup
    for replica_type in ("Worker", "PS"):
        policy = specs[replica_type]["restartPolicy"]
        assert policy in ("OnFailure", "Always"), replica_type
        # A serving task comes back whatever ended it; the chief's coordinator
        # uses a worker again once it is back.
        for code in (1, 2, 137, PREEMPTED_EXIT_CODE, CLUSTER_LOST_EXIT_CODE):
            assert operator_restarts(policy, code), (replica_type, code)


def test_ps_recipe_accepts_the_tfjob_flags(tmp_path):
    args = list(container(ps_specs()["Chief"])["args"])
    args[args.index("--model-dir") + 1] = str(tmp_path / "run")
    job = subprocess.run([sys.executable, *args[1:], "--print-config"], cwd=mw.REPO_ROOT,
                         capture_output=True, text=True, timeout=120,
                         env=dict(os.environ, PYTHONPATH=mw.REPO_ROOT))
    assert job.returncode == 0, job.stderr
    assert "strategy: parameter_server" in job.stdout


@pytest.mark.parametrize("cluster_domain", [None, "cluster.local"])
def test_every_ps_tfjob_replica_accepts_its_tf_config(cluster_domain):
    tfjob = the("TFJob", path=TFJOB_PS)
    specs = tfjob["spec"]["tfReplicaSpecs"]
    workers, ps = specs["Worker"]["replicas"], specs["PS"]["replicas"]
    configs = operator_tf_configs(tfjob, cluster_domain)
    assert len(configs) == 1 + workers + ps
    suffix = ".cluster.local" if cluster_domain else ""

    def addresses(kind, count):
        return tuple(f"tfdist-transformer-ps-{kind}-{i}.default.svc{suffix}:2222"
                     for i in range(count))

    chiefs, ranks = [], []
    for (kind, index), raw in configs.items():
        config = parse_tf_config(raw)
        assert dict(config.cluster) == {"chief": addresses("chief", 1),
                                        "worker": addresses("worker", workers),
                                        "ps": addresses("ps", ps)}
        assert (config.task_type, config.task_index) == (kind, index)
        assert config.own_address == addresses(kind, index + 1)[index]
        assert config.num_workers == 1 + workers  # the chief and the workers train
        if config.is_chief:
            chiefs.append((kind, index))
        if kind == "ps":
            assert config.worker_index is None
        else:
            ranks.append(config.worker_index)
    assert chiefs == [("chief", 0)]
    assert sorted(ranks) == list(range(1 + workers))
    # The local launcher (`python -m tfdist.launch --workers N --ps M`) builds
    # the same task types, so a program tried there runs unchanged here.
    local = launch_cluster.cluster_spec(
        "127.0.0.1", list(range(3000, 3001 + workers + ps)),
        launch_cluster.job_tasks(workers, ps))
    assert {kind: len(hosts) for kind, hosts in local.items()} == \
        {kind: len(hosts) for kind, hosts in config.cluster.items()}
