import logging
import os
import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf
from tensorflow.tsl.profiler.protobuf import xplane_pb2

from tfdist.callbacks.profiler import ProfilerWindow

STEPS = 4  # batches per epoch


def tiny_fit(callbacks, epochs=3, steps_per_execution=1):
    x = np.random.default_rng(0).normal(size=(8 * STEPS, 4)).astype("float32")
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse", steps_per_execution=steps_per_execution)
    return model.fit(x, x[:, :1], batch_size=8, epochs=epochs, verbose=0, callbacks=callbacks)


def profiles(log_dir):
    """The .xplane.pb files under log_dir/plugins/profile/<run>/."""
    root = os.path.join(log_dir, "plugins", "profile")
    if not os.path.isdir(root):
        return []
    return sorted(os.path.join(root, run, name) for run in os.listdir(root)
                  for name in os.listdir(os.path.join(root, run)) if name.endswith(".xplane.pb"))


def traced_steps(path):
    """step_num of every "train" step marker recorded in an XSpace profile."""
    space = xplane_pb2.XSpace()
    with open(path, "rb") as f:
        space.ParseFromString(f.read())
    steps = []
    for plane in space.planes:
        for line in plane.lines:
            for event in line.events:
                if plane.event_metadata[event.metadata_id].name != "train":
                    continue
                for stat in event.stats:
                    if plane.stat_metadata[stat.metadata_id].name == "step_num":
                        steps.append(stat.int64_value)
    return sorted(steps)


def test_only_the_asked_window_is_profiled(tmp_path):
    log_dir = str(tmp_path / "logs")
    window = ProfilerWindow(log_dir, start_step=5, stop_step=7)
    tiny_fit([window])
    files = profiles(log_dir)
    assert len(files) == 1, files
    assert traced_steps(files[0]) == [5, 6]
    assert window.profiled_steps == (5, 6)
    assert os.listdir(log_dir) == ["plugins"]


def test_a_window_past_the_end_of_training_is_stopped_and_saved(tmp_path):
    log_dir = str(tmp_path / "logs")
    window = ProfilerWindow(log_dir, start_step=10, stop_step=100)
    tiny_fit([window])  # 12 steps
    files = profiles(log_dir)
    assert len(files) == 1 and traced_steps(files[0]) == [10, 11]
    assert window.profiled_steps == (10, 11)
    # The profiler is not left running: another session can start and stop.
    tf.profiler.experimental.start(str(tmp_path / "again"))
    tf.profiler.experimental.stop()
    assert len(profiles(str(tmp_path / "again"))) == 1


def test_a_window_that_is_never_reached_warns_and_writes_nothing(tmp_path):
    log_dir = str(tmp_path / "logs")
    window = ProfilerWindow(log_dir, start_step=50, stop_step=60)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tiny_fit([window])
    assert any("never reached" in str(w.message) for w in caught)
    assert not os.path.exists(log_dir) and window.profiled_steps is None


def test_with_steps_per_execution_the_window_grows_to_whole_groups(tmp_path):
    log_dir = str(tmp_path / "logs")
    window = ProfilerWindow(log_dir, start_step=3, stop_step=5)
    tiny_fit([window], epochs=2, steps_per_execution=2)  # groups [0,1] [2,3] [4,5] [6,7]
    files = profiles(log_dir)
    assert len(files) == 1 and traced_steps(files[0]) == [2, 4]
    assert window.profiled_steps == (2, 5)


def test_a_profiler_already_running_is_reported_and_training_goes_on(tmp_path, caplog):
    log_dir = str(tmp_path / "logs")
    tf.profiler.experimental.start(str(tmp_path / "other"))
    try:
        with caplog.at_level(logging.ERROR, logger="tfdist.callbacks.profiler"):
            history = tiny_fit([ProfilerWindow(log_dir, start_step=1, stop_step=3)], epochs=1)
    finally:
        tf.profiler.experimental.stop()
    assert len(history.history["loss"]) == 1
    assert "could not start the profiler" in caplog.text
    assert profiles(log_dir) == []


@pytest.mark.parametrize("args, match", [
    (("logs", 5, 5), "stop_step must be greater than start_step.*start_step=5, stop_step=5"),
    (("logs", 7, 3), "start_step=7, stop_step=3"),
    (("logs", -1, 3), "start_step must be an integer >= 0, got -1"),
    (("logs", 1, 2.5), "stop_step must be an integer >= 0, got 2.5"),
    (("logs", True, 3), "start_step"),
    (("", 1, 3), "log_dir"),
])
def test_bad_windows_are_refused_with_the_values(args, match):
    with pytest.raises(ValueError, match=match):
        ProfilerWindow(*args)


def test_get_config_round_trips():
    window = ProfilerWindow("logs", 3, 9)
    assert ProfilerWindow(**window.get_config()).get_config() == window.get_config()


def test_a_fit_that_raises_in_the_window_saves_the_steps_before_and_frees_the_profiler(tmp_path):
    """Keras calls no callback when fit raises; tfdist's Trainer calls on_fit_error,
    which stops the open window: the steps before the error are saved, and the
    next profiler starts."""
    from tfdist.training import Trainer

    class FailsAtStep2(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if batch == 2:
                raise RuntimeError("a callback failed")

    log_dir = str(tmp_path / "logs")
    window = ProfilerWindow(log_dir, start_step=1, stop_step=10)
    x = np.random.default_rng(0).normal(size=(8 * STEPS, 4)).astype("float32")
    data = tf.data.Dataset.from_tensor_slices((x, x[:, :1])).batch(8)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    with pytest.raises(RuntimeError, match="a callback failed"):
        Trainer(model, keras.optimizers.SGD(0.1), "mse").fit(
            data, epochs=3, callbacks=[window, FailsAtStep2()], verbose=0)
    assert window.profiled_steps == (1, 2)
    (saved,) = profiles(log_dir)
    assert traced_steps(saved) == [1, 2]
    again = ProfilerWindow(str(tmp_path / "again"), start_step=0, stop_step=1)
    tiny_fit([again], epochs=1)
    assert again.profiled_steps == (0, 0) and len(profiles(str(tmp_path / "again"))) == 1
