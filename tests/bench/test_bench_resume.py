"""`tfdist bench resume`: the first-batch time of resumed pipelines, per source kind."""

import json
import time

import pytest
import tensorflow as tf

from tfdist.bench.commands import main
from tfdist.bench.resume_bench import _first_batch_seconds


def test_quick_resume_bench_measures_every_setting_and_checks_the_positioned_batch(
        tmp_path, capsys):
    out = tmp_path / "resume.json"
    # --quick presets position 40: a position given with it wins.
    assert main(["resume", "--quick", "--position", "30", "--sources", "image_folder,text",
                 "--json-out", str(out)]) == 0
    table = capsys.readouterr().out
    assert "First batch of a resumed run at batch N=30" in table
    report = json.loads(out.read_text())
    assert [row["source"] for row in report["rows"]] == ["image_folder", "text"]
    for row in report["rows"]:
        assert row["same batch"] is True
        assert row["start s"] > 0 and row["positioned s"] > 0 and row["replay s"] > 0
        assert row["positioned - start s"] == pytest.approx(row["positioned s"] - row["start s"])


def test_an_unknown_source_kind_is_refused_by_name(capsys):
    assert main(["resume", "--sources", "shapes,audio"]) == 2
    error = capsys.readouterr().err
    assert "--sources 'shapes,audio'" in error and "image_folder" in error


def test_the_first_batch_time_includes_building_the_pipeline():
    """A positioned pipeline counts a pass while it is built: the figure starts before the build."""
    def slow_build():
        time.sleep(0.3)
        return tf.data.Dataset.range(5)

    assert _first_batch_seconds(slow_build) >= 0.3
    assert _first_batch_seconds(slow_build, drawn=2) >= 0.3
