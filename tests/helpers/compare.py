"""Comparing two trainings: their weights and what they logged.

    from helpers.compare import assert_same_training, assert_same_weights

    assert_same_training((weights, history.history), (reference_weights, reference))
    assert_same_final_checkpoint(uninterrupted_dir, resumed_dir)   # two recipe runs
"""

import glob

import h5py
import numpy as np


def assert_same_weights(actual, expected, rtol=1e-5, atol=1e-6):
    """Two lists of weight arrays have the same length and agree elementwise.

    Example: `assert_same_weights(model.get_weights(), reference.get_weights())`
    """
    actual, expected = list(actual), list(expected)
    assert len(actual) == len(expected), \
        f"{len(actual)} weight arrays where {len(expected)} were expected"
    for index, (got, want) in enumerate(zip(actual, expected, strict=True)):
        np.testing.assert_allclose(got, want, rtol=rtol, atol=atol,
                                   err_msg=f"weight array {index}")


def assert_same_training(actual, expected, rtol=1e-5, atol=1e-6, keys=None):
    """Two `(weights, history dict)` pairs agree: every weight array, and every
    logged value of `keys` (default: every key the expected history has).

    Example: `assert_same_training((weights, history.history), (ref_weights, ref_history))`
    """
    (weights, history), (reference_weights, reference_history) = actual[:2], expected[:2]
    assert_same_weights(weights, reference_weights, rtol=rtol, atol=atol)
    for key in reference_history if keys is None else keys:
        assert key in history, f"{key!r} is missing from the logs: {sorted(history)}"
        np.testing.assert_allclose(history[key], reference_history[key], rtol=rtol, atol=atol,
                                   err_msg=key)


def final_checkpoint_weights(model_dir):
    """Every array of a recipe run's final epoch weights file
    (`model_dir/checkpoints/*.weights.h5`), by name.

    Example: `final_checkpoint_weights(tmp_path / "run")["layers/dense/vars/0"]`
    """
    path = sorted(glob.glob(str(model_dir / "checkpoints" / "*.weights.h5")))[-1]
    arrays = {}
    with h5py.File(path, "r") as stream:
        stream.visititems(lambda name, item: arrays.__setitem__(name, item[()])
                          if isinstance(item, h5py.Dataset) else None)
    return arrays


def assert_same_final_checkpoint(expected_dir, actual_dir):
    """Two recipe runs ended with the same final weights, to the bit.

    Example: `assert_same_final_checkpoint(uninterrupted_dir, resumed_dir)`
    """
    expected = final_checkpoint_weights(expected_dir)
    actual = final_checkpoint_weights(actual_dir)
    assert expected.keys() == actual.keys() and expected
    worst = max(float(np.max(np.abs(expected[k].astype(np.float64) - actual[k].astype(np.float64))))
                for k in expected if expected[k].size)
    assert worst == 0.0, f"final weights differ from the uninterrupted run's by up to {worst}"
