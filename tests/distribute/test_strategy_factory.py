"""The strategy factory (tfdist.distribute.strategy_factory) and what it made (introspection).

In-process tests run on the 2 logical CPUs tests/conftest.py made. Anything
that needs a different device count or a multi-worker cluster runs in fresh
processes with hard deadlines.
"""

import functools
import json
import logging
import os
import socket
import subprocess
import sys
import time

from helpers import mw
from helpers.errors import assert_names_value_and_choices
from helpers.tf_config import tf_config as localhost_tf_config
import numpy as np
import pytest
import tensorflow as tf

from tfdist.distribute.tf_config import TFConfigError
from tfdist.distribute.devices import DeviceConfigError
from tfdist.distribute.strategy_factory import choose_strategy, create_strategy
from tfdist.distribute.strategy_names import STRATEGY_NAMES, UNSUPPORTED_STRATEGIES
from tfdist.distribute.introspection import StrategyInfo, describe_strategy
from tfdist.distribute.collectives import is_chief
from tfdist.distribute.startup import write_ready_file

WORKER = os.path.join("tests", "helpers", "workers", "strategy_worker.py")


# A worker's TF_CONFIG in a cluster of workers at 127.0.0.1:20000, 20001, ...
tf_config = functools.partial(localhost_tf_config, "worker", host="127.0.0.1", first_port=20000)


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch):
    for name in ("TF_CONFIG", "TFDIST_READY_FILE", "TFDIST_DEVICES_PER_WORKER",
                 "TFDIST_STARTUP_TIMEOUT"):
        monkeypatch.delenv(name, raising=False)


# ---------------------------------------------------------------- names and arguments

def test_unknown_name_lists_valid_names():
    with pytest.raises(ValueError) as caught:
        create_strategy("mirored")
    assert_names_value_and_choices(caught.value, "mirored", STRATEGY_NAMES)


@pytest.mark.parametrize("name", sorted(UNSUPPORTED_STRATEGIES))
def test_unsupported_names_say_so_by_name(name):
    with pytest.raises(ValueError) as caught:
        create_strategy(name.upper().replace("_", "-"))
    assert f"does not support '{name}' yet" in str(caught.value)
    assert "Use '" in str(caught.value)


@pytest.mark.parametrize("kwargs, fragment", [
    ({"devices": 0}, "devices must be >= 1, got 0"),
    ({"devices": 65}, "devices=65 is more than 64, the most devices per worker"),
    ({"devices": True}, "got True"),
    ({"devices": []}, "got []"),
    ({"devices": ["/cpu:0", 1]}, "got ['/cpu:0', 1]"),
    ({"collective_timeout": -5}, "collective_timeout must be a finite number of seconds > 0 or None"),
    ({"collective_timeout": float("inf")}, "collective_timeout must be a finite number of seconds > 0 "
                                           "or None (no limit), got inf"),
    ({"startup_timeout": "soon"}, "startup_timeout must be a finite number of seconds > 0 or None "
                                  "(no limit), got 'soon'"),
    ({"cluster_resolver": "kubernetes"}, "got 'kubernetes'"),
    ({"all_reduce": "ring"}, "valid: nccl, hierarchical_copy, reduction_to_one_device"),
])
def test_bad_arguments_name_the_value(kwargs, fragment):
    with pytest.raises(ValueError) as caught:
        create_strategy("mirrored", **kwargs)
    assert fragment in str(caught.value)


def test_all_reduce_on_a_strategy_that_does_not_all_reduce():
    with pytest.raises(ValueError, match=r"does not apply to strategy 'one_device'.*mirrored \(nccl"):
        create_strategy("one_device", all_reduce="nccl")


def test_nccl_on_cpu_devices_is_an_error():
    with pytest.raises(ValueError, match=r"'nccl' needs GPUs.*CPU:0.*hierarchical_copy"):
        create_strategy("mirrored", devices=2, all_reduce="nccl")


@pytest.mark.parametrize("value", ["-3", "inf", "nan", "soon"])
def test_bad_startup_timeout_environment(monkeypatch, value):
    monkeypatch.setenv("TFDIST_STARTUP_TIMEOUT", value)
    with pytest.raises(ValueError, match=f"TFDIST_STARTUP_TIMEOUT='{value}' must be a finite "
                                         "number of seconds > 0"):
        create_strategy("one_device")


# ---------------------------------------------------------------- auto

def test_auto_without_cluster_picks_one_device_and_logs_why(caplog):
    caplog.set_level(logging.INFO, logger="tfdist")
    strategy = create_strategy()
    info = describe_strategy(strategy)
    assert isinstance(strategy, tf.distribute.OneDeviceStrategy)
    assert info.name == "one_device"
    assert "auto picked one_device" in info.note and "no GPU" in info.note
    assert any("picked 'one_device'" in r.getMessage() for r in caplog.records
               if r.name == "tfdist")


def test_auto_with_several_devices_picks_mirrored():
    strategy = create_strategy("auto", devices=2)
    assert isinstance(strategy, tf.distribute.MirroredStrategy)
    assert strategy.num_replicas_in_sync == 2
    assert "devices=2 asks for 2 local devices" in describe_strategy(strategy).note


def test_auto_with_two_workers_in_tf_config_picks_multi_worker(monkeypatch):
    monkeypatch.setenv("TF_CONFIG", tf_config(workers=2, index=1))
    name, reason = choose_strategy()
    assert name == "multi_worker_mirrored"
    assert "TF_CONFIG names 2 workers" in reason and "127.0.0.1:20001" in reason


def test_auto_with_chief_and_worker_picks_multi_worker(monkeypatch):
    monkeypatch.setenv("TF_CONFIG", json.dumps(
        {"cluster": {"chief": ["127.0.0.1:3000"], "worker": ["127.0.0.1:3001"]},
         "task": {"type": "chief", "index": 0}}))
    assert choose_strategy()[0] == "multi_worker_mirrored"


def test_auto_with_one_worker_in_tf_config_stays_local(monkeypatch):
    monkeypatch.setenv("TF_CONFIG", tf_config(workers=1))
    name, reason = choose_strategy()
    assert name == "one_device" and "single worker" in reason
    assert choose_strategy(devices=2)[0] == "mirrored"


def test_one_worker_of_a_launch_with_devices_per_worker_gets_that_many_replicas(monkeypatch):
    """`tfdist launch --workers 1 --devices-per-worker 2` sets TF_CONFIG (one worker) and
    TFDIST_DEVICES_PER_WORKER=2: auto and mirrored take 2 devices (auto ran one device,
    silently), one_device refuses it, a bad value is named."""
    monkeypatch.setenv("TF_CONFIG", tf_config(workers=1))
    monkeypatch.setenv("TFDIST_DEVICES_PER_WORKER", "2")
    name, reason = choose_strategy()
    assert name == "mirrored", reason
    assert "single worker; TFDIST_DEVICES_PER_WORKER=2 asks for 2 local devices" in reason
    auto = create_strategy("auto")
    assert isinstance(auto, tf.distribute.MirroredStrategy) and auto.num_replicas_in_sync == 2
    assert create_strategy("mirrored").num_replicas_in_sync == 2
    assert create_strategy("auto", devices=1).num_replicas_in_sync == 1  # the argument wins
    with pytest.raises(ValueError, match=r"'one_device' uses one device, but "
                                         r"TFDIST_DEVICES_PER_WORKER=2 \(set by `tfdist launch "
                                         r"--devices-per-worker`\) asks for 2"):
        create_strategy("one_device")
    with pytest.raises(ValueError, match=r"'default' uses one device, but TFDIST_DEVICES_PER_WORKER=2"):
        create_strategy("default")
    monkeypatch.setenv("TFDIST_DEVICES_PER_WORKER", "1")
    assert choose_strategy()[0] == "one_device"
    assert describe_strategy(create_strategy("one_device")).num_replicas == 1
    assert create_strategy("default") is tf.distribute.get_strategy()
    monkeypatch.setenv("TFDIST_DEVICES_PER_WORKER", "two")
    with pytest.raises(ValueError, match="TFDIST_DEVICES_PER_WORKER='two' must be an integer"):
        create_strategy("mirrored")


def test_auto_on_the_evaluator_task_stays_local(monkeypatch):
    monkeypatch.setenv("TF_CONFIG", json.dumps(
        {"cluster": {"worker": ["h:1", "h:2"], "evaluator": ["h:3"]},
         "task": {"type": "evaluator", "index": 0}}))
    name, reason = choose_strategy()
    assert name == "one_device" and "evaluator" in reason


def test_auto_picks_parameter_server_when_the_cluster_has_ps_tasks(monkeypatch):
    monkeypatch.setenv("TF_CONFIG", tf_config(workers=2, ps=["127.0.0.1:4000"]))
    name, reason = choose_strategy()
    assert name == "parameter_server" and "1 ps task(s)" in reason


def test_multi_worker_mirrored_refuses_ps_tasks_and_names_the_way_out(monkeypatch):
    monkeypatch.setenv("TF_CONFIG", tf_config(workers=2, ps=["127.0.0.1:4000"]))
    with pytest.raises(ValueError, match="'ps' tasks, which multi_worker_mirrored does not use"
                                         ".*'parameter_server'"):
        create_strategy("multi_worker_mirrored")


def test_parameter_server_needs_chief_workers_and_ps(monkeypatch):
    monkeypatch.setenv("TF_CONFIG", tf_config(workers=2))
    with pytest.raises(ValueError, match="needs 'chief', 'worker' and 'ps' tasks.*no 'ps'"):
        create_strategy("parameter_server")
    monkeypatch.delenv("TF_CONFIG")
    with pytest.raises(ValueError, match="tfdist.launch --workers N --ps M"):
        create_strategy("parameter_server")


def test_auto_with_malformed_tf_config_is_an_error(monkeypatch):
    monkeypatch.setenv("TF_CONFIG", tf_config(workers=2, index=2))
    with pytest.raises(TFConfigError, match="index 2 is out of range"):
        create_strategy("auto")


def test_auto_with_a_cluster_resolver_instance():
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec({"worker": ["127.0.0.1:5000", "127.0.0.1:5001", "127.0.0.1:5002"]}),
        task_type="worker", task_id=2)
    name, reason = choose_strategy(cluster_resolver=resolver)
    assert name == "multi_worker_mirrored"
    assert "SimpleClusterResolver names 3 workers" in reason and "127.0.0.1:5002" in reason
    empty = tf.distribute.cluster_resolver.SimpleClusterResolver(tf.train.ClusterSpec({}))
    assert choose_strategy(cluster_resolver=empty)[0] == "one_device"


# ---------------------------------------------------------------- single machine

def test_mirrored_on_two_logical_cpus_sums_across_replicas():
    strategy = create_strategy("mirrored", devices=2)
    info = describe_strategy(strategy)
    assert info == StrategyInfo(
        name="mirrored", num_replicas=2, num_workers=1, worker_index=0, is_chief=True,
        devices=("/job:localhost/replica:0/task:0/device:CPU:0",
                 "/job:localhost/replica:0/task:0/device:CPU:1"),
        all_reduce=None, note="no GPU: 2 logical CPU device(s)")

    @tf.function
    def step():
        def replica_fn():
            replica = tf.distribute.get_replica_context().replica_id_in_sync_group
            return tf.cast(replica, tf.float32) * 10.0 + 1.0
        return strategy.run(replica_fn)

    per_replica = step()
    local = strategy.experimental_local_results(per_replica)
    assert [float(v) for v in local] == [1.0, 11.0]
    assert float(strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)) == 12.0


def test_mirrored_with_an_all_reduce_implementation():
    strategy = create_strategy("mirrored", devices=["/cpu:0", "/cpu:1"],
                               all_reduce="reduction_to_one_device")
    value = strategy.reduce(tf.distribute.ReduceOp.SUM,
                            strategy.run(lambda: tf.constant(2.5)), axis=None)
    assert float(value) == 5.0
    assert describe_strategy(strategy).all_reduce == "reduction_to_one_device"


def test_mirrored_without_devices_uses_the_cpus_that_exist():
    info = describe_strategy(create_strategy("mirrored"))
    assert info.num_replicas == 2
    assert "2 logical CPU device(s) that exist" in info.note


def test_mirrored_cannot_resplit_an_initialised_runtime():
    with pytest.raises(DeviceConfigError, match="into 4 logical devices.*already initialised with 2"):
        create_strategy("mirrored", devices=4)


def test_mirrored_with_a_device_that_does_not_exist():
    with pytest.raises(DeviceConfigError, match=r"'/cpu:5' does not exist.*CPU:1"):
        create_strategy("mirrored", devices=["/cpu:0", "/cpu:5"])


def test_one_device_and_default():
    one = create_strategy("one_device")
    assert describe_strategy(one).devices == ("/job:localhost/replica:0/task:0/device:CPU:0",)
    assert describe_strategy(create_strategy("one_device", devices=["/cpu:1"])).devices == (
        "/job:localhost/replica:0/task:0/device:CPU:1",)
    with pytest.raises(ValueError, match="exactly one device, got devices=3"):
        create_strategy("one_device", devices=3)
    default = create_strategy("default")
    assert default is tf.distribute.get_strategy()
    info = describe_strategy(default)
    assert (info.name, info.num_replicas, info.is_chief) == ("default", 1, True)
    with pytest.raises(ValueError, match="takes no devices, got devices=2"):
        create_strategy("default", devices=2)


def test_describe_and_is_chief_for_strategies_not_made_by_tfdist():
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    info = describe_strategy(strategy)
    assert (info.name, info.num_replicas, info.num_workers, info.note) == ("mirrored", 2, 1, "")
    assert is_chief(strategy) and is_chief()


def test_ready_file_is_written_after_creation(monkeypatch, tmp_path):
    ready = tmp_path / "worker0.ready"
    monkeypatch.setenv("TFDIST_READY_FILE", str(ready))
    create_strategy("mirrored", devices=2)
    content = json.loads(ready.read_text())
    assert content["strategy"] == "mirrored" and content["num_replicas"] == 2
    assert content["pid"] == os.getpid()
    assert os.listdir(tmp_path) == ["worker0.ready"]  # no temporary file left behind
    assert write_ready_file(str(tmp_path / "other")) == str(tmp_path / "other")


def test_fresh_process_three_devices_then_multi_worker_too_late():
    """mirrored with devices=3 splits the CPU in a fresh process; after that TF is
    initialised, so multi_worker_mirrored must explain that it comes first."""
    code = (
        "import json, os\n"
        "import tensorflow as tf\n"
        "from tfdist.distribute.strategy_factory import create_strategy\n"
        "from tfdist.distribute.introspection import describe_strategy\n"
        "s = create_strategy('mirrored', devices=3)\n"
        "total = s.reduce('SUM', s.run(lambda: tf.constant(1.0)), axis=None)\n"
        "print('RESULT', s.num_replicas_in_sync, len(describe_strategy(s).devices), float(total))\n"
        "os.environ['TF_CONFIG'] = json.dumps({'cluster': {'worker': ['127.0.0.1:%d']},\n"
        "                                      'task': {'type': 'worker', 'index': 0}})\n"
        "try:\n"
        "    create_strategy('multi_worker_mirrored')\n"
        "except RuntimeError as error:\n"
        "    print('LATE', error)\n" % _free_ports(1)[0])
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    env.pop("TF_CONFIG", None)
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                            text=True, timeout=180)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "RESULT 3 3 3.0" in result.stdout
    assert "LATE multi_worker_mirrored must be created before TensorFlow initialises" in result.stdout


# ---------------------------------------------------------------- multi-worker

def test_multi_worker_without_cluster_says_how_to_get_one():
    with pytest.raises(ValueError, match="needs a cluster.*tfdist.launch.*TF_CONFIG"):
        create_strategy("multi_worker_mirrored")


@pytest.mark.parametrize("env, kwargs, fragment", [
    ({}, {"all_reduce": "nccl"}, "'nccl' needs GPUs, but this worker has none"),
    ({}, {"all_reduce": "hierarchical_copy"}, "valid: auto, ring, nccl"),
    ({}, {"devices": ["/cpu:0"]}, "count per worker"),
    ({"TFDIST_DEVICES_PER_WORKER": "two"}, {}, "TFDIST_DEVICES_PER_WORKER='two'"),
])
def test_multi_worker_argument_errors_come_before_any_connection(monkeypatch, env, kwargs, fragment):
    monkeypatch.setenv("TF_CONFIG", tf_config(workers=2))
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ValueError) as caught:
        create_strategy("multi_worker_mirrored", **kwargs)
    assert fragment in str(caught.value)


def test_multi_worker_resolver_without_a_task_is_an_error():
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec({"worker": ["127.0.0.1:5000", "127.0.0.1:5001"]}))
    with pytest.raises(ValueError, match="SimpleClusterResolver names a cluster but not this "
                                         "process's task.*task_type=None"):
        create_strategy("multi_worker_mirrored", cluster_resolver=resolver)


def test_slurm_resolver_outside_slurm_is_a_clear_error(monkeypatch):
    for name in [n for n in os.environ if n.startswith("SLURM_")]:
        monkeypatch.delenv(name)
    with pytest.raises(ValueError, match="cluster_resolver='slurm' needs to run inside a SLURM job"):
        create_strategy("multi_worker_mirrored", cluster_resolver="slurm")


def test_multi_worker_on_the_evaluator_task_is_an_error(monkeypatch):
    monkeypatch.setenv("TF_CONFIG", json.dumps(
        {"cluster": {"worker": ["h:1", "h:2"], "evaluator": ["h:3"]},
         "task": {"type": "evaluator", "index": 0}}))
    with pytest.raises(ValueError, match="'evaluator' task, which does not take part"):
        create_strategy("multi_worker_mirrored")


def _results(output):
    results = {}
    for line in output.splitlines():
        if "STRATEGY_RESULT " in line:
            result = json.loads(line.split("STRATEGY_RESULT ", 1)[1])
            results[result["worker_index"]] = result
    return results


@pytest.mark.multiworker
@pytest.mark.parametrize("devices_per_worker, collective_timeout", [(None, None), (2, 600.0)])
def test_two_workers_form_one_cluster(devices_per_worker, collective_timeout):
    args = [WORKER, "auto"] + ([str(collective_timeout)] if collective_timeout else [])
    job = mw.launch(args, workers=2, timeout=180, startup_timeout=150,
                    devices_per_worker=devices_per_worker)
    assert job.returncode == 0, job.stdout[-5000:]
    results = _results(job.stdout)
    assert sorted(results) == [0, 1], job.stdout[-5000:]
    per_worker = devices_per_worker or 1
    for index, result in results.items():
        assert result["name"] == "multi_worker_mirrored"
        assert "auto picked multi_worker_mirrored" in result["note"]
        assert result["num_workers"] == 2
        assert result["num_replicas"] == 2 * per_worker
        assert len(result["devices"]) == per_worker
        assert all(f"/task:{index}/" in device for device in result["devices"])
        # Each replica contributes (worker index + 1): 1 + 2 per device per worker.
        assert result["allreduce"] == 3.0 * per_worker
        assert result["variable"] == 100.0  # the chief's initial value, broadcast
        assert result["ready_file"] is True
        assert result["is_chief"] == result["is_chief_fn"] == (index == 0)
        assert result["collective_timeout"] == collective_timeout


def _free_ports(count):
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


@pytest.mark.multiworker
def test_missing_peer_fails_within_the_startup_deadline():
    """Worker 0 (the coordination leader) and worker 1 each started without
    their peer: both must fail with the deadline error, not hang."""
    deadline = 5
    processes = []
    started = time.monotonic()
    for index in (0, 1):
        addresses = [f"127.0.0.1:{port}" for port in _free_ports(2)]
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", TFDIST_STARTUP_TIMEOUT=str(deadline),
                   PYTHONPATH=mw.REPO_ROOT,
                   TF_CONFIG=json.dumps({"cluster": {"worker": addresses},
                                         "task": {"type": "worker", "index": index}}))
        process = subprocess.Popen([sys.executable, WORKER, "multi_worker_mirrored"], env=env,
                                   cwd=mw.REPO_ROOT, stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT, text=True)
        processes.append((process, addresses[1 - index]))
    try:
        for process, missing in processes:
            # Hard limit: start-up (TF import on a busy machine) + deadline + slack.
            output, _ = process.communicate(timeout=deadline + 100)
            assert process.returncode != 0, output[-3000:]
            assert "StrategyStartupError" in output, output[-3000:]
            assert f"waited up to {deadline} s (start-up deadline)" in output
            assert missing in output
    finally:
        for process, _ in processes:
            if process.poll() is None:
                process.kill()
                process.wait()
    assert time.monotonic() - started < deadline + 100


def test_two_mirrored_strategies_in_one_process_keep_their_collectives_apart():
    # Same devices, different shapes: with shared collective keys the second
    # strategy's all-reduce would reuse the first one's instance and abort.
    first = create_strategy("mirrored", devices=2)
    second = create_strategy("mirrored", devices=2)
    for strategy, shape in ((first, (3,)), (second, (5, 2)), (first, (3,))):
        value = strategy.run(lambda: tf.distribute.get_replica_context().all_reduce(
            "sum", tf.ones(shape)))
        assert strategy.experimental_local_results(value)[0].numpy().tolist() == \
            (2 * np.ones(shape)).tolist()
