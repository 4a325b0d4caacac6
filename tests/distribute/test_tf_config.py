"""TF_CONFIG parsing and validation (tfdist.distribute.tf_config)."""

import json

import pytest

from tfdist.distribute.tf_config import (ClusterConfig, TFConfigError, parse_tf_config,
                                         tf_config_text)

TWO_WORKERS = {"cluster": {"worker": ["127.0.0.1:2222", "127.0.0.1:2223"]},
               "task": {"type": "worker", "index": 1}}


def with_task(cluster, task):
    return {"cluster": cluster, "task": task}


def test_unset_or_empty_is_none(monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    assert parse_tf_config() is None
    monkeypatch.setenv("TF_CONFIG", "  ")
    assert parse_tf_config() is None
    assert parse_tf_config("") is None


def test_reads_environment(monkeypatch):
    monkeypatch.setenv("TF_CONFIG", json.dumps(TWO_WORKERS))
    config = parse_tf_config()
    assert config.cluster["worker"] == ("127.0.0.1:2222", "127.0.0.1:2223")
    assert (config.task_type, config.task_index) == ("worker", 1)
    assert config.num_workers == 2
    assert config.is_chief is False
    assert config.own_address == "127.0.0.1:2223"
    assert config.worker_index == 1
    assert config.peers() == [("worker", 0, "127.0.0.1:2222")]


def test_json_string_and_dict_agree():
    assert parse_tf_config(json.dumps(TWO_WORKERS)) == parse_tf_config(TWO_WORKERS)


def test_worker_zero_is_chief_without_chief_task():
    config = parse_tf_config(with_task({"worker": ["a:1", "b:2"]}, {"type": "worker", "index": 0}))
    assert config.is_chief and config.worker_index == 0


def test_chief_task_is_chief_and_first():
    cluster = {"chief": ["c:1"], "worker": ["a:1", "b:2"], "evaluator": ["e:1"]}
    chief = parse_tf_config(with_task(cluster, {"type": "chief", "index": 0}))
    worker0 = parse_tf_config(with_task(cluster, {"type": "worker", "index": 0}))
    evaluator = parse_tf_config(with_task(cluster, {"type": "evaluator", "index": 0}))
    assert chief.is_chief and chief.worker_index == 0 and chief.num_workers == 3
    assert not worker0.is_chief and worker0.worker_index == 1
    assert not evaluator.is_chief and evaluator.worker_index is None
    assert [t[2] for t in chief.training_tasks()] == ["c:1", "a:1", "b:2"]
    assert chief.as_dict()["cluster"]["worker"] == ["a:1", "b:2"]


def test_ipv6_and_hostnames_are_accepted():
    config = parse_tf_config(with_task({"worker": ["[::1]:2222", "node-7.cluster:65535"]},
                                       {"type": "worker", "index": 0}))
    assert config.own_address == "[::1]:2222"


def test_config_is_frozen():
    config = parse_tf_config(TWO_WORKERS)
    assert isinstance(config, ClusterConfig)
    with pytest.raises(AttributeError):
        config.task_index = 0
    with pytest.raises(TypeError):
        config.cluster["worker"] = ("x:1",)


W = {"worker": ["a:1", "b:2"]}
T = {"type": "worker", "index": 0}

ERRORS = [
    # (TF_CONFIG, substrings the message must contain)
    ('{"cluster": {"worker": ["a:1"],}}', ["not valid JSON", "line 1 column 32", "<here>"]),
    ("[1, 2]", ["JSON object", "list"]),
    ({"task": T}, ["no 'cluster'", "task"]),
    (with_task(["a:1"], T), ["'cluster' must be a non-empty object", "['a:1']"]),
    (with_task({}, T), ["'cluster' must be a non-empty object", "{}"]),
    (with_task({"master": ["a:1"]}, T),
     ["unknown task type 'master'", "chief, worker, ps, evaluator"]),
    (with_task({"worker": "a:1"}, T), ["cluster['worker']", "list", "'a:1'"]),
    (with_task({"worker": []}, T), ["cluster['worker']", "non-empty list"]),
    (with_task({"worker": ["a:1", 7]}, T), ["cluster['worker'][1]", "string", "7"]),
    (with_task({"worker": ["localhost"]}, T), ["cluster['worker'][0]", "'localhost'", "host:port"]),
    (with_task({"worker": [":2222"]}, T), ["':2222'", "host:port"]),
    (with_task({"worker": ["a:0"]}, T), ["'a:0'", "port '0'", "1..65535"]),
    (with_task({"worker": ["a:70000"]}, T), ["'a:70000'", "1..65535"]),
    (with_task({"worker": ["a:http"]}, T), ["port 'http'", "1..65535"]),
    (with_task({"worker": ["grpc://10.0.0.1:2222"]}, T),
     ["cluster['worker'][0]", "'grpc://10.0.0.1:2222'", "URL", "'grpc://'", "'host:port'",
      "e.g. '10.0.0.1:2222'"]),
    (with_task({"worker": ["a:1", "http://b:2/"]}, T),
     ["cluster['worker'][1]", "'http://b:2/'", "'http://'", "'host:port'", "e.g. 'b:2'"]),
    (with_task({"chief": ["c:1/train"], "worker": ["a:1"]}, T),
     ["cluster['chief'][0]", "'c:1/train'", "a path", "'host:port'", "e.g. 'c:1'"]),
    (with_task({"worker": ["http://b"]}, T), ["'http://b'", "URL", "'host:port'"]),
    (with_task({"worker": ["a:1", "b:2", "a:1"]}, T),
     ["'a:1' appears twice", "cluster['worker'][0]", "cluster['worker'][2]"]),
    (with_task({"chief": ["c:1"], "worker": ["c:1"]}, T),
     ["'c:1' appears twice", "cluster['chief'][0]", "cluster['worker'][0]"]),
    (with_task({"chief": ["c:1", "c:2"], "worker": ["a:1"]}, T),
     ["cluster['chief'] lists 2", "at most one chief"]),
    (with_task({"ps": ["p:1"]}, {"type": "ps", "index": 0}), ["no 'chief' or 'worker'", "ps"]),
    ({"cluster": W}, ["no 'task'"]),
    ({"cluster": W, "task": "worker"}, ["'task' must be an object", "'worker'"]),
    ({"cluster": W, "task": {"index": 0}}, ["'task' has no 'type'"]),
    ({"cluster": W, "task": {"type": "worker"}}, ["'task' has no 'index'"]),
    ({"cluster": W, "task": {"type": "master", "index": 0}},
     ["task type 'master'", "chief, worker, ps, evaluator"]),
    ({"cluster": W, "task": {"type": "chief", "index": 0}},
     ["task type 'chief' is not in the cluster", "worker"]),
    ({"cluster": W, "task": {"type": "worker", "index": "1"}}, ["index must be an integer", "'1'"]),
    ({"cluster": W, "task": {"type": "worker", "index": True}}, ["index must be an integer", "bool"]),
    ({"cluster": W, "task": {"type": "worker", "index": 1.0}}, ["index must be an integer", "1.0"]),
    ({"cluster": W, "task": {"type": "worker", "index": -1}}, ["index -1", "0..1"]),
    ({"cluster": W, "task": {"type": "worker", "index": 2}},
     ["index 2 is out of range", "'worker'", "2 worker address(es)", "0..1"]),
]


@pytest.mark.parametrize("raw, expected", ERRORS, ids=[str(i) for i in range(len(ERRORS))])
def test_errors_name_the_field_and_value(raw, expected):
    with pytest.raises(TFConfigError) as caught:
        parse_tf_config(raw)
    for fragment in expected:
        assert fragment in str(caught.value)
    assert isinstance(caught.value, ValueError)


def test_bad_environment_value_is_an_error_not_a_single_worker(monkeypatch):
    monkeypatch.setenv("TF_CONFIG", "{cluster: }")
    with pytest.raises(TFConfigError, match="not valid JSON"):
        parse_tf_config()


def test_an_evaluator_may_sit_outside_the_cluster_as_in_tensorflow():
    config = parse_tf_config({"cluster": {"worker": ["a:1", "b:2"]},
                              "task": {"type": "evaluator", "index": 0}})
    assert config.task_type == "evaluator" and config.own_address is None
    assert not config.is_chief
    with pytest.raises(TFConfigError, match="index 1 is out of range for an evaluator"):
        parse_tf_config({"cluster": {"worker": ["a:1"]}, "task": {"type": "evaluator", "index": 1}})


def test_config_from_resolver_reads_any_cluster_resolver():
    import tensorflow as tf

    from tfdist.distribute.tf_config import config_from_resolver

    spec = tf.train.ClusterSpec({"chief": ["a:1"], "worker": ["b:2", "c:3"]})
    config = config_from_resolver(
        tf.distribute.cluster_resolver.SimpleClusterResolver(spec, task_type="worker", task_id=1))
    assert config == parse_tf_config({"cluster": {"chief": ["a:1"], "worker": ["b:2", "c:3"]},
                                      "task": {"type": "worker", "index": 1}})
    assert config.own_address == "c:3" and config.num_workers == 3 and not config.is_chief
    assert config_from_resolver(tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec({}))) is None
    with pytest.raises(ValueError,
                       match=r"names a cluster but not this process's task.*task_type=None"):
        config_from_resolver(tf.distribute.cluster_resolver.SimpleClusterResolver(spec))


def test_the_tf_config_a_launcher_writes_is_parsed_back_to_the_same_task():
    cluster = {"chief": ["127.0.0.1:2222"], "worker": ["[::1]:2223", "[::1]:2224"],
               "ps": ["127.0.0.1:2225"]}
    parsed = parse_tf_config(tf_config_text(cluster, "worker", 1))
    assert (parsed.task_type, parsed.task_index, parsed.own_address) == ("worker", 1, "[::1]:2224")


def test_a_launcher_never_writes_a_tf_config_that_names_a_task_outside_its_cluster():
    with pytest.raises(TFConfigError, match="index"):
        tf_config_text({"worker": ["127.0.0.1:2222"]}, "worker", 1)
