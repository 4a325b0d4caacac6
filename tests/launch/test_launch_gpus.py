"""`--gpus-per-worker`: each localhost worker gets CUDA_VISIBLE_DEVICES of its own.

There is no GPU here; what is tested is what the launcher hands out: real
launcher processes and real workers that print the environment they got.
`nvidia-smi` does not exist on this machine, so its listing is read from a
stand-in executable put first on PATH.
"""

import io
import json
import os
import stat

import pytest

from tfdist.launch import launch
from tfdist.launch.gpus import assign_gpus, nvidia_smi_gpus, visible_gpus
from test_launch import PY, launcher_env, lines_of, run, script


def seen_env(out, rank):
    (line,) = [x for x in lines_of(out, rank) if x.startswith("ENV ")]
    return json.loads(line[len("ENV "):])


@pytest.mark.parametrize("value, expected", [
    ("0,1,2,3", ["0", "1", "2", "3"]),
    (" 3, 1 ", ["3", "1"]),
    ("GPU-6f1c, GPU-a2b9", ["GPU-6f1c", "GPU-a2b9"]),
    ("", []),
    ("-1", []),
])
def test_visible_gpus_follows_cuda_visible_devices(value, expected):
    def must_not_list():
        raise AssertionError("CUDA_VISIBLE_DEVICES is set: nothing else may be asked")
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": value}, list_gpus=must_not_list) == expected


def test_visible_gpus_asks_the_machine_when_unset():
    assert visible_gpus({}, list_gpus=lambda: ["0", "1"]) == ["0", "1"]


def fake_nvidia_smi(tmp_path, monkeypatch, body):
    tool = tmp_path / "nvidia-smi"
    tool.write_text("#!/bin/sh\n" + body)
    tool.chmod(tool.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")


def test_nvidia_smi_listing_is_parsed(tmp_path, monkeypatch):
    fake_nvidia_smi(tmp_path, monkeypatch, (
        "echo 'GPU 0: NVIDIA A100-SXM4-80GB (UUID: GPU-6f1c)'\n"
        "echo '  MIG 1g.10gb Device 0: (UUID: MIG-1)'\n"
        "echo 'GPU 1: NVIDIA A100-SXM4-80GB (UUID: GPU-a2b9)'\n"))
    assert nvidia_smi_gpus() == ["0", "1"]


def test_failing_or_missing_nvidia_smi_means_no_gpus(tmp_path, monkeypatch):
    fake_nvidia_smi(tmp_path, monkeypatch, "echo 'NVIDIA-SMI has failed' >&2\nexit 9\n")
    assert nvidia_smi_gpus() == []
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert nvidia_smi_gpus() == []


def test_hung_nvidia_smi_is_given_up_on(tmp_path, monkeypatch):
    fake_nvidia_smi(tmp_path, monkeypatch, "exec sleep 30\n")
    assert nvidia_smi_gpus(timeout=0.5) == []


def test_assign_gpus_gives_consecutive_groups_and_leaves_the_rest():
    assert assign_gpus(list("012345"), workers=2, gpus_per_worker=2) == [["0", "1"], ["2", "3"]]


def test_too_few_gpus_is_an_error_naming_the_counts():
    with pytest.raises(ValueError) as error:
        assign_gpus(["0", "1"], workers=2, gpus_per_worker=2)
    message = str(error.value)
    assert "needs 4 GPU(s), but 2 are visible" in message and "found: 0, 1" in message
    with pytest.raises(ValueError, match="found: none"):
        assign_gpus([], workers=1, gpus_per_worker=1)


def test_each_worker_sees_only_its_own_gpus():
    env = launcher_env(CUDA_VISIBLE_DEVICES="4,5,6,7,8")
    code, out, err, _ = run(["--workers", "2", "--gpus-per-worker", "2"],
                            [PY, script("launch_env.py")], env=env)
    assert code == 0, err
    assert seen_env(out, 0)["CUDA_VISIBLE_DEVICES"] == "4,5"
    assert seen_env(out, 1)["CUDA_VISIBLE_DEVICES"] == "6,7"
    assert "GPUs per worker: worker 0: 4,5; worker 1: 6,7" in err


def test_without_the_flag_every_worker_keeps_the_launchers_gpus():
    env = launcher_env(CUDA_VISIBLE_DEVICES="0,1")
    code, out, err, _ = run(["--workers", "2"], [PY, script("launch_env.py")], env=env)
    assert code == 0, err
    assert [seen_env(out, rank)["CUDA_VISIBLE_DEVICES"] for rank in (0, 1)] == ["0,1", "0,1"]


def test_too_few_gpus_exits_2_before_any_worker_starts():
    env = launcher_env(CUDA_VISIBLE_DEVICES="0,1,2,3")
    code, out, err, _ = run(["--workers", "2", "--gpus-per-worker", "3"],
                            [PY, "-c", "print('must not run')"], env=env)
    assert code == 2
    assert "needs 6 GPU(s), but 4 are visible" in err, err
    assert "must not run" not in out


def test_python_api_checks_gpus_per_worker():
    with pytest.raises(ValueError, match="gpus_per_worker must be an integer >= 1, got 0"):
        launch([PY, "-c", "pass"], 1, gpus_per_worker=0)
    with pytest.raises(ValueError, match="needs 2 GPU"):
        launch([PY, "-c", "pass"], 2, gpus_per_worker=1,
               env=launcher_env(CUDA_VISIBLE_DEVICES="-1"), errors=io.StringIO())
