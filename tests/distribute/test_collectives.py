"""Cross-worker decisions (tfdist.distribute.collectives), in process.

The collectives run for real across the 2 logical CPUs tests/conftest.py
made (MirroredStrategy: one worker, two replicas). Their multi-worker uses
(workers that disagree on a backup) are covered by
tests/callbacks/test_callback_backup.py and test_callback_worker_safe.py.
"""

import json
import subprocess
import sys

import numpy as np
import pytest

import tfdist.distribute
from tfdist.distribute.collectives import agree, agreed_seed, barrier, broadcast, gather, is_chief
from tfdist.distribute.strategy_factory import create_strategy


@pytest.fixture(scope="module")
def mirrored():
    return create_strategy("mirrored", devices=2)


@pytest.fixture(autouse=True)
def no_cluster(monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)


def test_gather_gives_one_row_per_replica(mirrored):
    table = gather(mirrored, [3, 7])
    assert table.dtype == np.int64
    assert table.tolist() == [[3, 7], [3, 7]]
    assert gather(mirrored, [4, -1]).tolist() == [[4, -1], [4, -1]]  # same strategy, new values


def test_agree_returns_the_table_and_never_asks_for_a_message_when_rows_match(mirrored):
    def disagreement(table):
        raise AssertionError(f"rows matched, yet asked to explain {table}")

    table = agree(mirrored, [2, 1000], disagreement)
    assert table.tolist() == [[2, 1000], [2, 1000]]


def test_broadcast_gives_the_first_replicas_number_exactly(mirrored):
    assert broadcast(mirrored, 12345) == 12345.0
    assert broadcast(mirrored, 2**31 - 1) == float(2**31 - 1)  # the largest drawn seed


def test_agreed_seed_on_one_worker_is_the_seed_itself(mirrored):
    assert agreed_seed(mirrored, 7) == 7
    assert agreed_seed(create_strategy("one_device"), 2**31 - 1) == 2**31 - 1


def test_barrier_counts_every_replica(mirrored):
    assert barrier(mirrored) == mirrored.num_replicas_in_sync == 2
    assert barrier(mirrored, timeout_seconds=30) == 2


def test_is_chief_follows_the_strategy_then_tf_config(mirrored, monkeypatch):
    monkeypatch.setenv("TF_CONFIG", json.dumps({
        "cluster": {"worker": ["127.0.0.1:20001", "127.0.0.1:20002"]},
        "task": {"type": "worker", "index": 1}}))
    assert is_chief(mirrored)  # a single-machine strategy is alone, whatever TF_CONFIG says
    assert not is_chief()      # no strategy: TF_CONFIG's worker 1 is not the chief
    monkeypatch.delenv("TF_CONFIG")
    assert is_chief()


def test_package_exports_load_on_first_use_without_tensorflow_at_import():
    assert tfdist.distribute.create_strategy is create_strategy
    assert tfdist.distribute.is_chief is is_chief
    with pytest.raises(AttributeError, match="no attribute 'create_stratgy'"):
        tfdist.distribute.create_stratgy  # noqa: B018 (a typo must not pass)
    code = ("import sys, tfdist.distribute, tfdist.distribute.tf_config\n"
            "print('tensorflow' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True, timeout=120)
    assert result.stdout.strip() == "False", result.stderr
