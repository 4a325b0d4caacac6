"""Keras's saving of a tensor-parallel run (`trainer.model` is the split copy).

`ModelCheckpoint` and a user's `trainer.model.save(...)` / `save_weights(...)`
must write the model as built, loadable on one device, with the weights and
the optimizer's state that one device would have written;
`trainer.model.load_weights(...)` must read such a file into the shards, so
training goes on as on one device. Runs on the session's 2 logical CPUs.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

from tfdist.models import decoder_lm_layout_map
from tfdist.training import Trainer
from tfdist.training.tensor_parallel.whole import slots_by_variable
from helpers.tensor_parallel_mlp import BATCH, arrays, layout, mlp
from helpers.workers import model_parallel_common as common

TOLERANCE = dict(rtol=1e-5, atol=1e-6)


def adam():
    return keras.optimizers.Adam(0.01)


def assert_same_state(ours, reference):
    """Weights and optimizer variables (names and values) of two loaded models agree."""
    for a, b in zip(ours.get_weights(), reference.get_weights(), strict=True):
        np.testing.assert_allclose(a, b, **TOLERANCE)
    assert [v.name for v in ours.optimizer.variables] == [
        v.name for v in reference.optimizer.variables]
    for a, b in zip(ours.optimizer.variables, reference.optimizer.variables, strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), err_msg=a.name, **TOLERANCE)


def checkpointed_run(tmp_path, tensor_parallel):
    """Two epochs of the MLP with Adam, `ModelCheckpoint` writing a .keras file and a
    weights file after each, then `model.save` of the model as built; returns the three
    files' paths."""
    model = mlp(adam())
    extra = dict(tensor_parallel=2, layout_map=layout()) if tensor_parallel else {}
    whole = tmp_path / f"tp{tensor_parallel}.keras"
    weights = tmp_path / f"tp{tensor_parallel}.weights.h5"
    x, y = arrays()
    Trainer(model, **extra).fit(
        x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0,
        callbacks=[keras.callbacks.ModelCheckpoint(str(whole)),
                   keras.callbacks.ModelCheckpoint(str(weights), save_weights_only=True)])
    after = tmp_path / f"tp{tensor_parallel}_after.keras"
    model.save(after)
    return whole, weights, after


def loaded_weights(path):
    """A fresh MLP whose optimizer is built, with `path` loaded into it."""
    model = mlp(adam())
    model.optimizer.build(model.trainable_variables)
    model.load_weights(path)
    return model


def test_model_checkpoints_of_a_split_run_load_as_built_and_equal_one_device(tmp_path):
    one_file, one_weights, one_after = checkpointed_run(tmp_path, tensor_parallel=False)
    two_file, two_weights, two_after = checkpointed_run(tmp_path, tensor_parallel=True)
    one, two = keras.saving.load_model(one_file), keras.saving.load_model(two_file)
    assert [layer.__class__.__name__ for layer in two.layers] == [
        layer.__class__.__name__ for layer in one.layers]  # Dense, not ShardedDense
    assert int(two.optimizer.iterations.numpy()) == 8
    assert_same_state(two, one)
    assert_same_state(loaded_weights(two_weights), loaded_weights(one_weights))
    assert_same_state(keras.saving.load_model(two_after), keras.saving.load_model(one_after))


@pytest.mark.parametrize("trained_first, through", [(False, "split copy"), (True, "split copy"),
                                                    (False, "model")],
                         ids=["fresh", "trained", "through the model"])
def test_weights_loaded_into_the_split_copy_train_on_like_one_device(tmp_path, trained_first,
                                                                     through):
    x, y = arrays()
    saved = tmp_path / "after_one_epoch.keras"
    one = mlp(adam())
    one_trainer = Trainer(one)
    one_trainer.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    one.save(saved)
    one_trainer.fit(x, y, batch_size=BATCH, epochs=2, initial_epoch=1, shuffle=False, verbose=0)

    # Another start (trained a little, or not at all: its optimizer not built yet), then the
    # one-device file read into the shards, weights and Adam's moments.
    two = mlp(adam(), seed=11)
    trainer = Trainer(two, tensor_parallel=2, layout_map=layout())
    if trained_first:
        trainer.fit(x[:BATCH], y[:BATCH], batch_size=BATCH, epochs=1, verbose=0)
    (trainer.model if through == "split copy" else two).load_weights(saved)
    assert int(trainer.model.optimizer.iterations.numpy()) == 4
    slots, _ = slots_by_variable(trainer.model.optimizer, trainer.model.trainable_variables)
    for kernel in trainer.model.get_layer("up").kernels:  # each moment next to its shard
        assert {slot.value.device for slot in slots[kernel.path].values()} == {
            kernel.value.device}
    trainer.fit(x, y, batch_size=BATCH, epochs=2, initial_epoch=1, shuffle=False, verbose=0)
    for a, b in zip(two.get_weights(), one.get_weights(), strict=True):
        np.testing.assert_allclose(a, b, **TOLERANCE)


def test_the_split_decoder_lm_saves_as_the_model_it_was_split_from(tmp_path):
    tokens, targets = common.token_arrays(n=24)
    data = common.dataset((tokens, targets), 8)
    mesh = keras.distribution.DeviceMesh((2,), ["model"], devices=["cpu:0", "cpu:1"])
    model = common.transformer(tf.distribute.get_strategy())
    trainer = Trainer(model, optimizer=adam(), tensor_parallel=2,
                      layout_map=decoder_lm_layout_map(mesh))
    trainer.fit(data, epochs=1, verbose=0)
    trainer.model.save(tmp_path / "lm.keras")
    back = keras.saving.load_model(tmp_path / "lm.keras")
    np.testing.assert_allclose(back.predict(tokens, verbose=0), model.predict(tokens, verbose=0),
                               **TOLERANCE)
    slots = [v for v in back.optimizer.variables if v.name.endswith("_velocity")]
    assert len(slots) == len(model.trainable_variables)
    assert all(np.any(np.asarray(slot)) for slot in slots)  # every moment gathered, none lost


def test_set_weights_on_the_model_after_the_trainer_is_built_reaches_the_shards():
    """`model.set_weights(other.get_weights())`, Keras's way to copy weights, after a
    tensor-parallel Trainer was built and trained: training goes on from the new weights
    (and the optimizer's state), as on one device."""
    x, y = arrays()
    donor = mlp(seed=5).get_weights()
    runs = {}
    for extra in ({}, dict(tensor_parallel=2, layout_map=layout())):
        model = mlp(adam(), seed=11)
        trainer = Trainer(model, **extra)
        trainer.fit(x[:BATCH], y[:BATCH], batch_size=BATCH, epochs=1, verbose=0)
        model.set_weights(donor)
        trainer.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0)
        runs[bool(extra)] = model.get_weights()
    for a, b in zip(runs[True], runs[False], strict=True):
        np.testing.assert_allclose(a, b, **TOLERANCE)
