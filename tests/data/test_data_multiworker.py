"""tfdist.data across 2 worker processes (MultiWorkerMirroredStrategy, through tests/helpers/mw.py).

One launch serves all tests here: each worker iterates one epoch of three
sources (5 TFRecord files -> sharded by file; 1 file and an in-memory array
-> sharded by record) and writes the example ids its replica received.
"""

import collections
import json

import pytest

from helpers import mw
from tfdist.data import write_token_tfrecords
from tfdist.data.tokens import BOS_ID, EOS_ID, NUM_RESERVED

pytestmark = pytest.mark.multiworker

SOURCES = {  # name -> (ids, expected shard mode)
    "many_files": (list(range(37)), "file"),
    "one_file": (list(range(100, 123)), "record"),
    "memory": (list(range(19)), "record"),
}


def id_rows(ids):
    return [[BOS_ID, NUM_RESERVED + i, NUM_RESERVED + i, EOS_ID] for i in ids]


@pytest.fixture(scope="module")
def worker_results(tmp_path_factory):
    data_dir = tmp_path_factory.mktemp("shards")
    out = tmp_path_factory.mktemp("results")
    write_token_tfrecords(id_rows(SOURCES["many_files"][0]), str(data_dir / "many"), num_files=5)
    write_token_tfrecords(id_rows(SOURCES["one_file"][0]), str(data_dir / "one"), num_files=1)
    result = mw.launch(["tests/helpers/workers/data_shard_worker.py", "--data-dir", str(data_dir),
                        "--out", str(out), "--global-batch-size", "4",
                        "--memory-examples", str(len(SOURCES["memory"][0]))],
                       workers=2, timeout=200, startup_timeout=150)
    assert result.returncode == 0, result.stdout[-4000:]
    files = sorted(out.glob("worker-*.json"))
    assert [f.name for f in files] == ["worker-0.json", "worker-1.json"], result.stdout[-4000:]
    results = [json.loads(f.read_text()) for f in files]
    assert [r["rank"] for r in results] == [0, 1]
    assert all(r["replicas"] == 2 for r in results)
    return results


@pytest.mark.parametrize("name", ["many_files", "one_file", "memory"])
def test_two_workers_see_every_example_exactly_once(worker_results, name):
    expected_ids, expected_mode = SOURCES[name]
    per_worker = [r["sources"][name] for r in worker_results]
    for worker in per_worker:
        assert worker["modes"] == [expected_mode]
        assert worker["ids"], f"a worker got no examples of {name}"
    assert not set(per_worker[0]["ids"]) & set(per_worker[1]["ids"])
    seen = collections.Counter(per_worker[0]["ids"] + per_worker[1]["ids"])
    assert sorted(seen) == expected_ids and set(seen.values()) == {1}
    # Uneven shards still take the same number of steps (partial batches are padded).
    assert per_worker[0]["steps"] == per_worker[1]["steps"]
