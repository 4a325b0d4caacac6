"""tfdist on SLURM: `cluster_resolver="slurm"` and deploy/slurm.sbatch.

* What tfdist resolves from the variables a real allocation sets (the
  sbatch file's layout, 2 nodes) for every rank, without creating a strategy.
* A real 2-process run on localhost driven only by SLURM variables (no
  TF_CONFIG): both processes train and end with the same weights, those of
  one process fitting the same batches.
* The sbatch script's stop/requeue flow, with fake `srun`, `scancel` and
  `scontrol` on PATH.
"""

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time

from helpers import mw
import numpy as np
import pytest

from tfdist.distribute.tf_config import parse_tf_config
from tfdist.distribute.ports import bind_error, describe_holders
from tfdist.runtime.stop_signals import PREEMPTED_EXIT_CODE
from tfdist.distribute.strategy_factory import choose_strategy, resolve_cluster
from helpers.paths import WORKERS_DIR  # noqa: E402
from helpers.processes import finish

SBATCH = os.path.join(mw.REPO_ROOT, "deploy", "slurm.sbatch")
WORKER = os.path.join("tests", "helpers", "workers", "slurm_worker.py")
RESOLVER_PORT_BASE = 8888  # SlurmClusterResolver's default, which tfdist uses


def sbatch_options():
    """The `#SBATCH --name=value` lines of the sbatch file, as a dict."""
    options = {}
    with open(SBATCH) as stream:
        for line in stream:
            match = re.match(r"#SBATCH\s+--([\w-]+)(?:=(\S+))?", line)
            if match:
                options[match.group(1)] = match.group(2)
    return options


def srun_command():
    """The sbatch file's srun command, its continuation lines joined."""
    with open(SBATCH) as stream:
        text = stream.read().replace("\\\n", " ")
    lines = [line.strip() for line in text.splitlines() if line.strip().startswith("srun ")]
    assert len(lines) == 1, lines
    return lines[0]


def slurm_env(rank, nodes, tasks_per_node, gpus_per_node, job_id="4242"):
    """The task-level variables `srun` sets in a job step (SLURM 23.x names)."""
    count = len(nodes) * tasks_per_node
    node_id, local_id = divmod(rank, tasks_per_node)
    # SLURM's compressed form for consecutive numbered nodes: gpu01,gpu02 -> gpu[01-02].
    numbered = [re.fullmatch(r"([a-z]+)(\d+)", node) for node in nodes]
    if len(nodes) > 1 and all(numbered) and len({m.group(1) for m in numbered}) == 1:
        nodelist = f"{numbered[0].group(1)}[{numbered[0].group(2)}-{numbered[-1].group(2)}]"
    else:
        nodelist = ",".join(nodes)
    tasks = f"{tasks_per_node}(x{len(nodes)})" if len(nodes) > 1 else str(tasks_per_node)
    return {
        "SLURM_JOB_ID": job_id, "SLURM_JOBID": job_id, "SLURM_STEP_ID": "0",
        "SLURM_JOB_NUM_NODES": str(len(nodes)), "SLURM_NNODES": str(len(nodes)),
        "SLURM_JOB_NODELIST": nodelist, "SLURM_NODELIST": nodelist,
        "SLURM_STEP_NODELIST": nodelist, "SLURM_STEP_NUM_NODES": str(len(nodes)),
        "SLURM_NTASKS": str(count), "SLURM_NPROCS": str(count),
        "SLURM_STEP_NUM_TASKS": str(count), "SLURM_NTASKS_PER_NODE": str(tasks_per_node),
        "SLURM_TASKS_PER_NODE": tasks, "SLURM_STEP_TASKS_PER_NODE": tasks,
        "SLURM_PROCID": str(rank), "SLURM_NODEID": str(node_id), "SLURM_LOCALID": str(local_id),
        "SLURMD_NODENAME": nodes[node_id], "SLURM_TOPOLOGY_ADDR": nodes[node_id],
        # The task's GPUs: with one task per node, all of the node's.
        "CUDA_VISIBLE_DEVICES": ",".join(str(i) for i in range(gpus_per_node)),
    }


@pytest.fixture
def slurm_step(monkeypatch, tmp_path):
    """Sets SLURM variables in this process (restored afterwards).

    TensorFlow 2.21's SlurmClusterResolver expands the node list itself; a
    fake `scontrol show hostnames` on PATH answers in case a TensorFlow
    version asks SLURM instead, and logs the call.
    """
    for name in [n for n in os.environ if n.startswith("SLURM")] + ["TF_CONFIG"]:
        monkeypatch.delenv(name, raising=False)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "scontrol"
    fake.write_text(textwrap.dedent(f"""\
        #!{sys.executable}
        import sys
        from tensorflow.python.distribute.cluster_resolver.slurm_cluster_resolver import expand_hostlist
        open({str(tmp_path / "scontrol.log")!r}, "a").write(" ".join(sys.argv[1:]) + "\\n")
        if sys.argv[1:3] != ["show", "hostnames"]:
            sys.exit("fake scontrol: only 'show hostnames' is known")
        print("\\n".join(expand_hostlist(sys.argv[3])))
        """))
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")

    def enter(rank, nodes, tasks_per_node, gpus_per_node):
        env = slurm_env(rank, nodes, tasks_per_node, gpus_per_node)
        for name, value in env.items():
            # The resolver rewrites CUDA_VISIBLE_DEVICES; setenv restores it afterwards.
            monkeypatch.setenv(name, value)
        return env

    return enter


def allocation():
    """(nodes, tasks per node, GPUs per node) of the sbatch file's allocation."""
    options = sbatch_options()
    count = int(options["nodes"])
    nodes = [f"gpu{i + 1:02d}" for i in range(count)]
    gpus = int(options["gres"].rpartition(":")[2])
    return nodes, int(options["ntasks-per-node"]), gpus


# ---------------------------------------------------------------- what tfdist resolves

def test_the_sbatch_allocation_resolves_to_one_worker_per_node(slurm_step):
    nodes, tasks_per_node, gpus = allocation()
    assert (len(nodes), tasks_per_node) == (2, 1)
    expected = tuple(f"{node}:{RESOLVER_PORT_BASE}" for node in nodes)
    chiefs = []
    for rank in range(len(nodes)):
        env = slurm_step(rank, nodes, tasks_per_node, gpus)
        assert env["SLURM_STEP_NODELIST"] == "gpu[01-02]"
        assert env["SLURM_STEP_TASKS_PER_NODE"] == "1(x2)"

        cluster = resolve_cluster("slurm")
        config = cluster.config
        assert cluster.source == "SlurmClusterResolver"
        assert dict(config.cluster) == {"worker": expected}
        assert (config.task_type, config.task_index) == ("worker", rank)
        assert config.own_address == expected[rank]
        assert config.num_workers == len(nodes)
        assert config.worker_index == rank
        chiefs.append(config.is_chief)
        # Each task keeps every GPU of its node.
        assert os.environ["CUDA_VISIBLE_DEVICES"] == ",".join(map(str, range(gpus)))
        # The same cluster written as a TF_CONFIG passes tfdist's TF_CONFIG checks.
        assert parse_tf_config(json.dumps(config.as_dict())) == config

        name, reason = choose_strategy(cluster_resolver="slurm")
        assert name == "multi_worker_mirrored"
        assert f"SlurmClusterResolver names {len(nodes)} workers" in reason
        assert f"this is worker {rank} at {expected[rank]}" in reason
    assert chiefs == [True, False]


def test_several_tasks_per_node_get_ports_and_gpus_by_local_rank(slurm_step):
    """The other layout (one task per GPU): 2 nodes x 2 tasks, 4 GPUs a node."""
    nodes = ["gpu01", "gpu02"]
    for rank in range(4):
        slurm_step(rank, nodes, tasks_per_node=2, gpus_per_node=4)
        config = resolve_cluster("slurm").config
        assert dict(config.cluster) == {"worker": ("gpu01:8888", "gpu01:8889",
                                                   "gpu02:8888", "gpu02:8889")}
        assert config.task_index == rank
        assert config.is_chief == (rank == 0)
        assert os.environ["CUDA_VISIBLE_DEVICES"] == ["0,1", "2,3"][rank % 2]


def test_a_single_task_step_is_not_multi_worker(slurm_step):
    slurm_step(0, ["gpu01"], tasks_per_node=1, gpus_per_node=1)
    name, reason = choose_strategy(cluster_resolver="slurm")
    assert name == "one_device"
    assert "SlurmClusterResolver names a single worker" in reason


# ---------------------------------------------------------------- a real run

def _results(outputs):
    results = {}
    for output in outputs:
        for line in output.splitlines():
            if line.startswith("SLURM_RESULT "):
                result = json.loads(line.split(" ", 1)[1])
                results[result["rank"]] = result
    return results


def _reference_weights():
    """One process, no strategy: the same model fitted on the same batches."""
    sys.path.insert(0, WORKERS_DIR)
    try:
        import slurm_worker  # pylint: disable=import-outside-toplevel
    finally:
        sys.path.pop(0)
    from tfdist.training import Trainer  # pylint: disable=import-outside-toplevel

    model = slurm_worker.build_model()
    x, y = slurm_worker.data()
    Trainer(model).fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0)
    return model.get_weights()


@pytest.mark.multiworker
def test_two_tasks_on_localhost_train_from_slurm_variables_alone(tmp_path):
    ports = [RESOLVER_PORT_BASE, RESOLVER_PORT_BASE + 1]
    for port in ports:
        # tfdist builds SlurmClusterResolver with its fixed port base, so a
        # process holding one of these ports cannot be avoided with other ports.
        if bind_error(port) is not None:
            pytest.skip(f"port {port} (SlurmClusterResolver's) is held by {describe_holders(port)}")
    base = {name: value for name, value in os.environ.items()
            if not name.startswith("SLURM") and name != "TF_CONFIG"}
    base.update(PYTHONPATH=mw.REPO_ROOT, PYTHONUNBUFFERED="1", TF_CPP_MIN_LOG_LEVEL="2",
                TFDIST_STARTUP_TIMEOUT="120")
    processes = []
    logs = []
    try:
        for rank in range(2):
            env = dict(base, **slurm_env(rank, ["localhost"], tasks_per_node=2, gpus_per_node=2))
            log = open(tmp_path / f"task{rank}.log", "w+")
            logs.append(log)
            processes.append(subprocess.Popen([sys.executable, WORKER], cwd=mw.REPO_ROOT, env=env,
                                              stdout=log, stderr=subprocess.STDOUT))
        deadline = time.monotonic() + 240
        for process in processes:
            process.wait(timeout=max(deadline - time.monotonic(), 1))
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()
    outputs = []
    for log in logs:
        log.seek(0)
        outputs.append(log.read())
        log.close()
    for rank, (process, output) in enumerate(zip(processes, outputs, strict=True)):
        assert process.returncode == 0, \
            f"task {rank} exited {process.returncode}:\n{output[-4000:]}"
    results = _results(outputs)
    assert sorted(results) == [0, 1], "\n".join(o[-2000:] for o in outputs)
    for rank, result in results.items():
        assert result["resolver"] == "SlurmClusterResolver"
        assert result["cluster"] == {"worker": ["localhost:8888", "localhost:8889"]}
        assert result["task"] == ["worker", rank, rank == 0]
        assert result["is_chief"] == (rank == 0)
        assert (result["num_workers"], result["num_replicas"]) == (2, 2)
        assert result["worker_index"] == rank
    first, second = results[0], results[1]
    assert first["loss"] == second["loss"]
    for a, b in zip(first["weights"], second["weights"], strict=True):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(first["weights"], _reference_weights(), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------- the sbatch file

def test_sbatch_asks_for_sigterm_before_the_time_limit_and_requeue():
    options = sbatch_options()
    match = re.fullmatch(r"B:(?:SIG)?TERM@(\d+)", options["signal"])
    assert match, options["signal"]
    assert int(match.group(1)) >= 60
    assert "requeue" in options and "no-requeue" not in options
    assert options["open-mode"] == "append"
    assert options["ntasks-per-node"] == "1"
    assert "exclusive" in options
    subprocess.run(["bash", "-n", SBATCH], check=True)


def test_sbatch_runs_the_transformer_recipe_with_the_slurm_resolver():
    command = srun_command()
    assert "--kill-on-bad-exit=0" in command
    assert "python -m tfdist.recipes.transformer" in command
    assert "--strategy multi_worker_mirrored" in command
    assert "--cluster-resolver slurm" in command
    assert '--model-dir "$RUN_DIR"' in command


def test_sbatch_recipe_flags_are_valid(tmp_path):
    from tfdist.recipes import config  # pylint: disable=import-outside-toplevel

    if not any(option.name == "cluster_resolver" for option in config.COMMON_OPTIONS):
        pytest.skip("the recipes have no --cluster-resolver flag yet")
    command = srun_command().replace('"$RUN_DIR"', str(tmp_path / "run")).replace(' "$@" &', "")
    args = command.split("tfdist.recipes.transformer", 1)[1].split()
    job = subprocess.run([sys.executable, "-m", "tfdist.recipes.transformer", *args,
                          "--print-config"], cwd=mw.REPO_ROOT, capture_output=True, text=True,
                         timeout=120, env=dict(os.environ, PYTHONPATH=mw.REPO_ROOT))
    assert job.returncode == 0, job.stderr
    assert "cluster_resolver: slurm" in job.stdout
    assert "strategy: multi_worker_mirrored" in job.stdout


FAKE_SRUN = """\
#!/bin/bash
# Fake srun: logs its arguments and runs one "task" that trains until SIGTERM
# (then exits FAKE_TERM_EXIT, default 143 like tfdist after its backup), or
# exits FAKE_EXIT at once.
echo "$*" >> "$FAKE_DIR/srun.log"
if [ -n "${FAKE_EXIT:-}" ]; then exit "$FAKE_EXIT"; fi
sh -c "trap 'exit ${FAKE_TERM_EXIT:-143}' TERM; while :; do sleep 0.05; done" &
echo $! > "$FAKE_DIR/task.pid"
wait $!
"""

FAKE_SCANCEL = """\
#!/bin/bash
# Fake scancel: logs, and with --signal=TERM signals the task (a job step), not srun.
echo "$*" >> "$FAKE_DIR/scancel.log"
if [ "$1" = "--signal=TERM" ]; then kill -TERM "$(cat "$FAKE_DIR/task.pid")"; fi
"""

FAKE_SCONTROL = """\
#!/bin/bash
echo "$*" >> "$FAKE_DIR/scontrol.log"
"""


def run_sbatch(tmp_path, send_sigterm=False, fake_exit=None, term_exit=None, restart_count=None):
    """Runs the sbatch script under bash with fake SLURM commands.

    Returns (exit code, output, {command: logged lines}).
    """
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name, text in (("srun", FAKE_SRUN), ("scancel", FAKE_SCANCEL), ("scontrol", FAKE_SCONTROL)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    env = {name: value for name, value in os.environ.items() if not name.startswith("SLURM")}
    env.update(PATH=f"{bin_dir}{os.pathsep}{env['PATH']}", FAKE_DIR=str(tmp_path),
               SLURM_JOB_ID="4242", SLURM_JOB_NODELIST="gpu[01-02]",
               SLURM_SUBMIT_DIR=str(tmp_path))
    if fake_exit is not None:
        env["FAKE_EXIT"] = str(fake_exit)
    if term_exit is not None:
        env["FAKE_TERM_EXIT"] = str(term_exit)
    if restart_count is not None:
        env["SLURM_RESTART_COUNT"] = str(restart_count)
    process = subprocess.Popen(["bash", SBATCH, "--epochs", "3"], env=env, cwd=tmp_path,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if send_sigterm:
        # SLURM's --signal=B:TERM@120 signals the batch shell alone.
        deadline = time.monotonic() + 30
        while not (tmp_path / "task.pid").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.2)
        process.send_signal(signal.SIGTERM)
    returncode, output = finish(process, timeout=60)
    logs = {}
    for name in ("srun", "scancel", "scontrol"):
        path = tmp_path / f"{name}.log"
        logs[name] = path.read_text().splitlines() if path.exists() else []
    return returncode, output, logs


def test_sbatch_time_limit_signal_backs_up_and_requeues(tmp_path):
    code, output, logs = run_sbatch(tmp_path, send_sigterm=True, restart_count=2)
    assert code == PREEMPTED_EXIT_CODE, output
    # The workers got SIGTERM through scancel (job steps only), and the job was requeued.
    assert logs["scancel"] == ["--signal=TERM 4242"], output
    assert logs["scontrol"] == ["requeue 4242"], output
    assert f"resumes from the backup in {tmp_path}/runs/transformer-slurm" in output
    # The recipe got the run folder and the extra flags.
    (srun,) = logs["srun"]
    assert f"--model-dir {tmp_path}/runs/transformer-slurm" in srun
    assert srun.endswith("--epochs 3")


@pytest.mark.parametrize("term_exit, requeued", [(137, True), (1, False)])
def test_sbatch_requeues_on_the_workers_exit_code_not_on_its_own_signal(tmp_path, term_exit,
                                                                        requeued):
    """The script's `wait` also returns 143 when SIGTERM interrupts it; what
    counts is srun's own code: 137 (stopped before the first step) is
    requeued, 1 (an error while stopping) is not."""
    code, output, logs = run_sbatch(tmp_path, send_sigterm=True, term_exit=term_exit)
    assert code == term_exit, output
    assert f"exit {term_exit}" in output
    assert logs["scontrol"] == (["requeue 4242"] if requeued else [])


def test_sbatch_stops_requeueing_after_max_requeues(tmp_path):
    code, output, logs = run_sbatch(tmp_path, send_sigterm=True, restart_count=20)
    assert code == PREEMPTED_EXIT_CODE, output
    assert logs["scancel"] == ["--signal=TERM 4242"]
    assert logs["scontrol"] == []
    assert "not requeued: already requeued 20 times (MAX_REQUEUES=20)" in output


@pytest.mark.parametrize("fake_exit, fragment", [
    (0, "training finished"),
    # A stop by hand (scancel --signal=TERM JOBID) reaches the workers, not the script.
    (PREEMPTED_EXIT_CODE, "submit the same command again to resume"),
    (2, "workers failed (exit 2)"),
])
def test_sbatch_without_its_signal_never_requeues(tmp_path, fake_exit, fragment):
    code, output, logs = run_sbatch(tmp_path, fake_exit=fake_exit)
    assert code == fake_exit, output
    assert fragment in output
    assert logs["scontrol"] == [] and logs["scancel"] == []


def test_cpu_nodes_and_gpus_bound_by_slurm_resolve_without_touching_the_gpus(slurm_step,
                                                                             monkeypatch):
    """No nvidia-smi on a CPU node, one GPU per task already bound by SLURM:
    TensorFlow's resolver defaults fail on both; tfdist's set-up does not."""
    slurm_step(1, ["cpu01", "cpu02"], tasks_per_node=1, gpus_per_node=0)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    config = resolve_cluster("slurm").config
    assert dict(config.cluster) == {"worker": ("cpu01:8888", "cpu02:8888")}
    assert "CUDA_VISIBLE_DEVICES" not in os.environ
    slurm_step(3, ["gpu01", "gpu02"], tasks_per_node=2, gpus_per_node=1)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")  # SLURM's --gpus-per-task=1 binding
    config = resolve_cluster("slurm").config
    assert (config.task_index, config.own_address) == (3, "gpu02:8889")
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "1"


def test_the_port_base_comes_from_the_environment_and_is_checked(slurm_step, monkeypatch):
    slurm_step(0, ["gpu01", "gpu02"], tasks_per_node=1, gpus_per_node=1)
    monkeypatch.setenv("TFDIST_SLURM_PORT_BASE", "23456")
    assert resolve_cluster("slurm").config.cluster["worker"] == ("gpu01:23456", "gpu02:23456")
    monkeypatch.setenv("TFDIST_SLURM_PORT_BASE", "80")
    with pytest.raises(ValueError, match="TFDIST_SLURM_PORT_BASE='80' is not a port number"):
        resolve_cluster("slurm")
