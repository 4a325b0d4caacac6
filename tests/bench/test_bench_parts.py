"""The benchmark's building blocks on fixed inputs: clock, profile sums, sweep
plan, plot series, entrants, workloads."""

import pytest

from tfdist.bench import profile, timing
from tfdist.bench.engine_compare import engine_entrants
from tfdist.bench.plot import DEVICES_SERIES, WORKERS_SERIES, series
from tfdist.bench.settings import settings_entrants
from tfdist.bench.sweep import SweepPoint, global_batch_for, point_command, sweep_points
from tfdist.bench.workloads import Workload


def test_step_clock_skips_warmup_and_splits_grouped_steps(monkeypatch):
    ticks = iter([0.0, 1.0, 1.5, 2.5, 4.5])
    monkeypatch.setattr(timing.time, "perf_counter", lambda: next(ticks))
    clock = timing.StepClock(warmup_steps=1)
    clock.on_train_begin()
    for batch in range(4):
        clock.on_train_batch_end(batch)
    assert clock.step_times == [0.5, 1.0, 2.0]  # the 1.0 s first step is left out

    ticks = iter([0.0, 3.0, 9.0])
    grouped = timing.StepClock(warmup_steps=0, steps_per_execution=3)
    grouped.on_train_begin()
    grouped.on_train_batch_end(2)
    grouped.on_train_batch_end(5)
    assert grouped.step_times == [1.0] * 3 + [2.0] * 3
    with pytest.raises(ValueError, match="warmup_steps must be an integer >= 0, got -1"):
        timing.StepClock(warmup_steps=-1)


def test_self_times_subtract_nested_events():
    events = [("outer", 0, 10), ("inner", 2, 3), ("inner2", 6, 2), ("next", 10, 4)]
    assert profile.self_times(events) == [("outer", 5), ("inner", 3), ("inner2", 2), ("next", 4)]


def test_profile_sums_self_time_by_kind_on_compute_threads():
    lines = {
        "tf_Compute/1": [("ExecutorState::Process", 0, 100),
                         ("model/dense/MatMul:MatMul", 0, 60),
                         ("loss/SparseSoftmaxCrossEntropyWithLogits", 60, 20),
                         ("add_fusion.3", 80, 20)],
        "tf_numa_-1_Eigen/7": [("dot.2", 0, 50), ("stateless_random_bits", 50, 25),
                               ("transpose.1", 75, 25)],
        "python": [("train", 0, 1000)],   # not a compute thread
    }
    summary = profile.summarise_events(lines)
    assert summary["total"] == 200
    kinds = {k: v["time"] for k, v in summary["kinds"].items()}
    assert kinds == {"matmul": 110, "softmax/loss": 20, "rng and bitwise": 25,
                     "data and copies": 25, "elementwise and other": 20}
    assert summary["kinds"]["matmul"]["share"] == pytest.approx(0.55)
    assert summary["top_ops"][0] == ("MatMul", 60)
    assert "matmul 55%" in profile.format_profile("x", summary)


@pytest.mark.parametrize("name, kind", [
    ("gradient_tape/decoder_lm/lm_head/Tensordot/MatMul", "matmul"),
    ("attention/einsum/Einsum", "matmul"), ("dot.12", "matmul"),
    ("convolution.3", "matmul"), ("subtract_exponential_fusion", "softmax/loss"),
    ("dropout/StatelessRandomUniformV2", "rng and bitwise"), ("concatenate_bitcast_fusion.2",
                                                          "data and copies"),
    ("AssignSubVariableOp", "elementwise and other")])
def test_op_kind(name, kind):
    assert profile.op_kind(name) == kind


def test_sweep_points_and_batches():
    assert [p.name for p in sweep_points(3, 2)] == ["r1-w1", "r2-w1", "r3-w1", "r2-w2"]
    assert [p.name for p in sweep_points(1, 1)] == ["r1-w1"]
    assert [p.name for p in sweep_points(8, 4)] == ["r1-w1", "r2-w1", "r4-w1", "r8-w1",
                                                   "r2-w2", "r4-w4"]
    assert [(p.devices, p.workers) for p in sweep_points(6, 1)] == [(1, 1), (2, 1), (4, 1),
                                                                     (6, 1)]
    point = SweepPoint(devices=2, workers=1)
    assert global_batch_for(point, "weak", 16) == 32
    assert global_batch_for(point, "strong", 16) == 16
    with pytest.raises(ValueError, match="global batch 15 does not split evenly over 2"):
        global_batch_for(point, "strong", 15)
    with pytest.raises(ValueError, match="'linear' is not one of weak, strong"):
        global_batch_for(point, "linear", 16)
    with pytest.raises(ValueError, match="max_workers must be an integer >= 1, got 0"):
        sweep_points(2, 0)


def test_point_commands_pick_the_strategy_of_the_point():
    workload = Workload("transformer", size="tiny", recipe_flags=("--dropout", "0"))
    single = point_command(workload, SweepPoint(2, 1), 32, "float32", "auto", 2, 3, 1, "p.json")
    assert single[1:4] == ["-m", "tfdist.bench", "point"]
    assert single[single.index("--strategy") + 1] == "mirrored"
    assert single[single.index("--devices") + 1] == "2"
    assert single[single.index("--recipe-flags") + 1] == "--dropout 0"
    multi = point_command(workload, SweepPoint(1, 2), 32, "float32", "auto", 2, 3, 1, "p.json",
                          input_share=False)
    assert multi[multi.index("--strategy") + 1] == "multi_worker_mirrored"
    assert multi[-1] == "--no-input-share"


def test_plot_series_start_both_lines_at_the_baseline():
    rows = [{"replicas": 1, "workers": 1, "examples_per_sec": 10.0, "efficiency": 1.0},
            {"replicas": 2, "workers": 1, "examples_per_sec": 15.0, "efficiency": 0.75},
            {"replicas": 2, "workers": 2, "examples_per_sec": 12.0, "efficiency": 0.6},
            {"replicas": 4, "workers": 1, "error": "failed"}]
    assert series(rows) == {DEVICES_SERIES: [(1, 10.0, 1.0), (2, 15.0, 0.75)],
                            WORKERS_SERIES: [(1, 10.0, 1.0), (2, 12.0, 0.6)]}


def test_engine_entrants_pair_same_settings_and_defaults():
    entrants, comparisons = engine_entrants(strategy="mirrored", devices=1)
    by_name = {e.name: e for e in entrants}
    for label, ours, theirs in comparisons[:-1]:
        a, b = by_name[ours].setting, by_name[theirs].setting
        assert (a.engine, b.engine) == ("tfdist", "keras")
        assert (a.precision, a.xla) == (b.precision, b.xla)
        assert by_name[ours].strategy == by_name[theirs].strategy == "mirrored"
    label, ours, theirs = comparisons[-1]
    assert label.startswith("defaults vs defaults")
    assert (by_name[ours].setting.precision, by_name[ours].setting.xla,
            by_name[ours].strategy) == ("auto", "auto", "auto")
    assert (by_name[theirs].setting.precision, by_name[theirs].setting.xla,
            by_name[theirs].strategy) == ("float32", "auto", "default")
    with pytest.raises(ValueError, match="'auto'"):
        engine_entrants(same_xla=("auto",))


def test_settings_entrants_vary_one_factor_from_the_baseline():
    entrants, comparisons = settings_entrants()
    by_name = {e.name: e.setting for e in entrants}
    for _, a, b in comparisons:
        changed = [f for f in ("engine", "precision", "xla")
                   if getattr(by_name[a], f) != getattr(by_name[b], f)]
        assert len(changed) == 1, (a, b, changed)
    assert [e.optional for e in entrants if e.setting.precision != "float32"] == [True, True]
    with pytest.raises(ValueError, match="'speed'"):
        settings_entrants(("speed",))


def test_workload_validation_names_the_bad_value():
    assert Workload("transformer").size == "small"
    assert Workload("cnn").label == "cnn resnet_tiny (embedded shapes)"
    with pytest.raises(ValueError, match="'rnn'.*transformer, cnn"):
        Workload("rnn")
    with pytest.raises(ValueError, match="'huge'.*tiny, small"):
        Workload("transformer", size="huge")
    with pytest.raises(ValueError, match="'synthetic' is not available for the cnn"):
        Workload("cnn", data="synthetic")


def test_workload_builds_the_recipe_model_and_its_flops():
    from tfdist.models import decoder_lm_flops_per_token, transformer_config

    workload = Workload("transformer", size="tiny", sequence_length=16, vocab_size=64)
    data = workload.build_data(8)
    assert data.tokens_per_example == 16 and data.train.num_examples > 0
    built = workload.build_model(data, 8)
    config = transformer_config("tiny", vocab_size=64, max_len=16)
    assert built.flops_per_example == decoder_lm_flops_per_token(config, seq_len=16) * 16
    assert built.model.output_shape == (None, None, 64)


def test_median_run_keeps_the_median_repeat_and_every_throughput():
    from tfdist.bench.sweep import median_run

    entries = [{"examples_per_sec": 30.0, "tag": "a"}, {"error": "exit status 1"},
               {"examples_per_sec": 10.0, "tag": "b"}, {"examples_per_sec": 20.0, "tag": "c"}]
    chosen = median_run(entries)
    assert chosen["tag"] == "c"
    assert chosen["repeat_examples_per_sec"] == [30.0, 10.0, 20.0]
    assert median_run([{"examples_per_sec": 2.0}, {"examples_per_sec": 1.0}])[
        "examples_per_sec"] == 1.0  # lower median of an even count
    assert "error" in median_run([{"error": "x"}])


def test_default_sweep_extent_is_every_gpu_or_two_cpu_devices():
    from tfdist.bench.sweep import default_max_replicas, sweep_counts

    assert default_max_replicas({"CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7"}) == 8
    assert default_max_replicas({"CUDA_VISIBLE_DEVICES": "-1"}) == 2
    assert sweep_counts(1) == [1]
    assert sweep_counts(16) == [1, 2, 4, 8, 16]


def test_the_benchs_tfdist_defaults_leave_the_resnets_step_uncompiled_on_cpus_as_the_recipe():
    from tfdist.bench.engines import Contender, Setting
    from tfdist.distribute.strategy_factory import create_strategy

    strategy = create_strategy("default")
    auto = Contender(Setting("tfdist", "float32", "auto"), Workload("cnn"), strategy, 16)
    assert auto.jit_compile is False and "fused batch-norm kernels" in auto.xla_reason
    asked = Contender(Setting("tfdist", "float32", "on"), Workload("cnn"), strategy, 16)
    assert asked.jit_compile is True


def test_the_benchs_tfdist_defaults_turn_xla_off_for_a_model_that_cannot_compile_as_the_recipe():
    from tfdist.bench.engines import Contender, Setting
    from tfdist.distribute.strategy_factory import create_strategy
    from tfdist.models.builders import SYNC_BN_XLA_BLOCKER

    strategy = create_strategy("default")
    synchronised = Workload("cnn", image_size=16, recipe_flags=("--sync-bn",))
    auto = Contender(Setting("tfdist", "float32", "auto"), synchronised, strategy, 8)
    assert (auto.jit_compile, auto.xla_reason) == (False, f"auto: {SYNC_BN_XLA_BLOCKER}")
    with pytest.raises(ValueError, match=r"^XLA on is not possible for this model: synchronised "
                                         r".*\. Measure it with XLA off or auto\.$"):
        Contender(Setting("tfdist", "float32", "on"), synchronised, strategy, 8)


@pytest.mark.parametrize("argv, size, batch, rounds, steps", [
    ([], "small", 32, 6, 3),
    (["--size", "base"], "base", 16, 6, 3),
    # The CNN's step is about ten times shorter: more steps a round, so that the
    # input pipeline refilling after each round's new iterator does not decide the ratio.
    (["--model", "cnn"], "resnet_tiny", 128, 6, 30),
    (["--model", "cnn", "--batch", "64", "--steps", "5", "--rounds", "2"], "resnet_tiny", 64, 2, 5),
    (["--model", "cnn", "--quick"], "resnet_tiny", 8, 1, 2),
    # --quick presets; what the command line gives wins.
    (["--quick", "--batch", "16", "--steps", "4", "--size", "small"], "small", 16, 1, 4),
    (["--rounds", "3", "--quick"], "tiny", 8, 3, 2),
])
def test_the_engine_benchmark_runs_each_model_at_its_recipe_batch(argv, size, batch, rounds, steps):
    from tfdist.bench.commands import engine_args, engine_run

    args = engine_args(argv)
    workload, found_batch, found_rounds, found_steps, _ = engine_run(args)
    assert (workload.size, found_batch, found_rounds, found_steps) == (size, batch, rounds, steps)


def test_quick_presets_what_the_command_line_leaves_unset_and_honours_what_it_gives():
    from tfdist.bench import autotune_check, pipeline_bench, ps_bench, resume_bench
    from tfdist.bench.commands import engine_args, engine_run
    from tfdist.bench.flags import parse_quick
    from tfdist.bench.run import ReportOptions

    workload, batch, *_ = engine_run(engine_args(["--quick", "--sequence-length", "64"]))
    assert (workload.sequence_length, workload.vocab_size, batch) == (64, 256, 8)
    workload, batch, *_ = engine_run(engine_args(["--quick", "--model", "cnn"]))
    assert (workload.image_size, batch) == (16, 8)
    assert (engine_args(["--quick"]).warmup_steps, engine_args([]).warmup_steps) == (1, 2)
    workload, *_ = engine_run(engine_args([]))
    assert (workload.sequence_length, workload.vocab_size, workload.image_size) == (128, 8000,
                                                                                    None)

    args = parse_quick(autotune_check.parser(),
                       ["--quick", "--models", "transformer=tiny,cnn=resnet_tiny",
                        "--batch", "16", "--rounds", "2"], autotune_check.QUICK)
    assert (args.rounds, args.steps, args.trial_seconds) == (2, 2, 1.0)
    checked = autotune_check.workloads_to_check(args)
    assert [(w.model, w.sequence_length, w.image_size, batch) for w, batch in checked] == [
        ("transformer", 32, None, 16), ("cnn", 128, 16, 16)]
    full = autotune_check.workloads_to_check(parse_quick(
        autotune_check.parser(), ["--models", "transformer=tiny,cnn=resnet_tiny"],
        autotune_check.QUICK))
    assert [(w.sequence_length, w.image_size, batch) for w, batch in full] == [
        (128, None, 64), (128, None, 128)]

    split = pipeline_bench.split_bench_args(pipeline_bench.parser(),
                                            ["--quick", "--steps", "5", "--layers", "3"])
    assert (split.batch, split.steps, split.rounds, split.layers, split.warmup_steps) == (
        8, 5, 1, 3, 1)

    ps = ps_bench.parse_args(["--quick", "--steps", "12"])
    assert (ps.rounds, ps.steps) == (1, 12)
    assert (ps_bench.parse_args([]).rounds, ps_bench.parse_args([]).steps) == (2, 40)

    resume = parse_quick(resume_bench.parser(), ["--position", "60", "--quick"],
                         resume_bench.QUICK)
    assert (resume.position, resume.examples, resume.batch) == (60, 96, 8)

    assert (ReportOptions(quick=True).rounds, ReportOptions(quick=True).sweep_steps) == (1, 2)
    assert ReportOptions(quick=True, rounds=4, sweep_steps=5).rounds == 4
    assert ReportOptions(quick=True, rounds=4, sweep_steps=5).sweep_steps == 5
    assert (ReportOptions().rounds, ReportOptions().warmup_steps) == (3, 2)


@pytest.mark.parametrize("argv, named", [
    (["engine", "--model", "cnn", "--sequence-length", "64"],
     "engine: error: --sequence-length shapes the Transformer's synthetic tokens, not the "
     "CNN's images: drop it."),
    (["engine", "--data", "embedded", "--vocab-size", "300", "--sequence-length", "16"],
     "--sequence-length and --vocab-size shape the Transformer's synthetic tokens, not the "
     "embedded task: drop them."),
    (["report", "--models", "cnn", "--vocab-size", "300"], "--vocab-size shapes"),
    (["report", "--data", "embedded", "--sequence-length", "64"], "not the embedded task"),
    (["autotune", "--models", "cnn=resnet_tiny", "--quick", "--sequence-length", "64"],
     "not the CNN's images"),
])
def test_token_flags_for_data_they_do_not_shape_exit_2_naming_them(argv, named, capsys):
    from tfdist.bench.commands import main

    assert main(argv) == 2
    error = capsys.readouterr().err
    assert named in error, error
    assert "Traceback" not in error and len(error.strip().splitlines()) == 1, error
