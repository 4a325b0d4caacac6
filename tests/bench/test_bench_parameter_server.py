"""`tfdist bench parameter-server`: the commands it runs and how it reads them
(the real jobs it launches are the ones tests/test_parameter_server.py runs)."""

import pytest

from tfdist.bench.ps_bench import build_parser, format_report, parse_run, run_command


def test_both_modes_run_the_same_recipe_at_the_same_global_batch():
    args = build_parser().parse_args(["--batch", "32", "--workers", "3", "--ps", "2"])
    all_reduce = run_command("all-reduce", args)
    ps = run_command("parameter-server", args)
    assert "--ps" not in all_reduce and ps[ps.index("--ps") + 1] == "2"
    for command, strategy in ((all_reduce, "multi_worker_mirrored"), (ps, "parameter_server")):
        recipe = command[command.index("--") + 1:]
        assert recipe[recipe.index("--strategy") + 1] == strategy
        assert recipe[recipe.index("--global-batch-size") + 1] == "32"
        assert command[command.index("--workers") + 1] == "3"


def test_the_throughput_line_is_read_with_its_unit():
    output = ("[chief] Throughput: 1.26k examples/s (1.26k per replica) | step 50 ms\n"
              "[chief]   steps per worker  worker 0: 11, worker 1: 9\n")
    assert parse_run(output) == (1260.0, "worker 0: 11, worker 1: 9")
    assert parse_run("Throughput: 950.5 examples/s")[0] == 950.5
    with pytest.raises(ValueError, match="no throughput line"):
        parse_run("Traceback ...\nValueError: boom")


def test_the_report_shows_every_round_and_the_ratio_of_medians():
    report = {"model": "transformer", "size": "tiny", "global_batch": 64, "workers": 2, "ps": 1,
              "steps": 40, "rounds": 2, "steps_per_worker": ["worker 0: 20, worker 1: 20"],
              "examples_per_second": {"all-reduce": [1000.0, 1100.0],
                                      "parameter-server": [1500.0, 1600.0]},
              "median": {"all-reduce": 1050.0, "parameter-server": 1550.0},
              "ratio_ps_to_all_reduce": 1550.0 / 1050.0}
    text = format_report(report)
    assert "1000.0   1100.0" in text and "1.48x" in text and "worker 1: 20" in text
