"""Keras programs run unchanged but for `Trainer(model).fit(...)` train exactly like
one-device Keras `fit` (SGD, same weights, same global batch), under 2 replicas.

The programs are in tests/helpers/keras_programs.py; the same ones run on 2 worker
processes in tests/test_keras_programs_multiworker.py.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

from helpers import keras_programs as programs
from tfdist.training import Trainer
from helpers.workers.train_common import mirrored


@pytest.mark.parametrize("name", sorted(programs.PROGRAMS))
def test_two_replicas_train_like_one_device_keras_fit(name):
    expected = programs.keras_fit(name)
    actual = programs.tfdist_fit(name, mirrored(2))
    programs.assert_same_training(actual, expected)


def test_xla_from_compile_on_two_replicas_trains_like_keras_fit():
    expected = programs.keras_fit("two_outputs", jit_compile=True)
    model, arguments = programs.two_outputs(mirrored(2), jit_compile=True)
    trainer = Trainer(model)
    assert trainer.jit_compile is True
    history = trainer.fit(verbose=0, **arguments)
    programs.assert_same_training(([np.array(w) for w in model.get_weights()],
                                   history.history), expected)


def test_the_programs_would_train_differently_if_a_setting_were_dropped():
    """The comparisons above can fail: without loss_weights, class_weight or the
    custom step, the weights end elsewhere."""
    def moved(a, b):
        return max(float(np.max(np.abs(x - y))) for x, y in zip(a, b, strict=True))

    reference, _ = programs.keras_fit("two_outputs")
    strategy = mirrored(2)
    model, arguments = programs.two_outputs(strategy)
    with strategy.scope():
        model.compile(keras.optimizers.SGD(0.1), loss=model.loss)  # loss_weights dropped
    Trainer(model).fit(verbose=0, **arguments)
    assert moved([np.array(w) for w in model.get_weights()], reference) > 1e-3

    reference, _ = programs.keras_fit("class_weights")
    model, arguments = programs.class_weights(mirrored(2))
    del arguments["class_weight"]
    Trainer(model).fit(verbose=0, **arguments)
    assert moved([np.array(w) for w in model.get_weights()], reference) > 1e-3

    reference, _ = programs.keras_fit("custom_train_step")
    model, arguments = programs.custom_train_step()
    plain = keras.Model(model.inputs, model.outputs)  # same layers, Keras's own step
    plain.compile(keras.optimizers.SGD(0.1), loss="mse")
    plain.fit(verbose=0, **arguments)
    assert moved([np.array(w) for w in model.get_weights()], reference) > 1e-3


def test_compile_settings_reach_the_trainer_and_overrides_keep_the_rest():
    strategy = mirrored(2)
    with strategy.scope():
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
        model.compile(keras.optimizers.SGD(0.1), "mse", loss_weights=0.2,
                      steps_per_execution=4, jit_compile=True)
    trainer = Trainer(model, model.optimizer, model.loss)  # the natural rewrite
    assert (trainer.steps_per_execution, trainer.jit_compile) == (4, True)
    assert model._compile_config.config["loss_weights"] == 0.2
    x = np.ones((8, 3), "float32")
    y = np.zeros((8, 1), "float32")
    loss = trainer.evaluate(x, y, batch_size=8, verbose=0)
    assert loss == pytest.approx(0.2 * float(np.mean(model.predict(x, verbose=0) ** 2)),
                                 rel=1e-5)
    assert Trainer(model, steps_per_execution=2, jit_compile=False).steps_per_execution == 2


def test_an_uncompiled_model_without_an_optimizer_is_refused_with_the_way_out():
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    with pytest.raises(ValueError, match=r"not compiled.*model.compile\(optimizer="):
        Trainer(model)


def test_a_masked_loss_among_several_is_refused_on_two_replicas():
    strategy = mirrored(2)
    with strategy.scope():
        tokens = keras.Input((4,), dtype="int32")
        embedded = keras.layers.Embedding(9, 4, mask_zero=True)(tokens)
        model = keras.Model(tokens, [keras.layers.Dense(9, name="next")(embedded),
                                     keras.layers.Dense(1, name="score")(embedded)])
        model.compile(keras.optimizers.SGD(0.1),
                      loss=[keras.losses.SparseCategoricalCrossentropy(from_logits=True), "mse"])
    x = np.array([[1, 2, 0, 0], [3, 4, 5, 0]] * 4, "int32")
    y = [x, np.zeros((8, 4, 1), "float32")]
    with pytest.raises(ValueError, match="output 'next'.*a Keras mask"):
        Trainer(model).fit(x, y, batch_size=8, verbose=0)


def test_own_train_step_refuses_what_it_would_bypass():
    strategy = mirrored(2)
    model, _ = programs.custom_train_step(strategy)
    with pytest.raises(ValueError, match=r"grad_accum_steps=2.*HalfGradientModel.train_step"):
        Trainer(model, grad_accum_steps=2)
    with pytest.raises(ValueError, match=r"clip_norm=1.0.*global_clipnorm"):
        Trainer(model, clip_norm=1.0)
    with pytest.raises(ValueError, match=r"jit_compile=True.*MirroredStrategy"):
        Trainer(model, jit_compile=True)


def test_run_eagerly_from_compile_runs_eagerly_and_trains_the_same():
    expected = programs.keras_fit("class_weights")
    model, arguments = programs.class_weights(mirrored(2))
    model.compile(model.optimizer, model.loss, metrics=["accuracy"], run_eagerly=True)
    trainer = Trainer(model)
    assert trainer.run_eagerly
    history = trainer.fit(verbose=0, **arguments)
    programs.assert_same_training(([np.array(w) for w in model.get_weights()],
                                   history.history), expected)


@pytest.mark.parametrize("arguments,message", [
    (dict(y=np.zeros(4)), "y cannot be used when x is a"),
    (dict(batch_size=4), "batch_size cannot be used when x is a"),
    (dict(validation_split=0.5), "validation_split cannot be used"),
    (dict(validation_freq=0), "validation_freq must be an integer >= 1"),
])
def test_array_arguments_with_a_dataset_are_refused_by_name(arguments, message):
    strategy = mirrored(2)
    with strategy.scope():
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
        model.compile(keras.optimizers.SGD(0.1), "mse")
    data = tf.data.Dataset.from_tensor_slices((np.ones((4, 3), "float32"),
                                               np.ones((4, 1), "float32"))).batch(2)
    with pytest.raises(ValueError, match=message):
        Trainer(model).fit(data, verbose=0, **arguments)


def test_validation_split_and_validation_data_together_are_refused():
    model, arguments = programs.class_weights(mirrored(2))
    arguments["validation_data"] = (arguments["x"][:5], arguments["y"][:5])
    with pytest.raises(ValueError, match="Both validation_split=0.25 and validation_data"):
        Trainer(model).fit(verbose=0, **arguments)


def test_positional_x_y_and_validation_freq_like_keras():
    expected_model, arguments = programs.class_weights()
    del arguments["validation_split"]
    expected = expected_model.fit(arguments.pop("x"), arguments.pop("y"), verbose=0,
                                  validation_data=(programs._features(3)[:20],
                                                   np.zeros(20, "int32")),
                                  validation_freq=2, epochs=3,
                                  **{k: v for k, v in arguments.items() if k != "epochs"})
    model, arguments = programs.class_weights(mirrored(2))
    del arguments["validation_split"]
    history = Trainer(model).fit(arguments.pop("x"), arguments.pop("y"), verbose=0,
                                 validation_data=(programs._features(3)[:20],
                                                  np.zeros(20, "int32")),
                                 validation_freq=2, epochs=3,
                                 **{k: v for k, v in arguments.items() if k != "epochs"})
    assert len(history.history["loss"]) == 3 and len(history.history["val_loss"]) == 1
    np.testing.assert_allclose(history.history["val_loss"], expected.history["val_loss"],
                               rtol=1e-5)


def test_shuffled_arrays_use_every_row_once_per_epoch_on_two_replicas():
    model, arguments = programs.shuffled_rows(mirrored(2))
    history = Trainer(model).fit(verbose=0, **arguments).history
    y = arguments["y"][:, 0]
    assert history["targets_sum"] == pytest.approx([float(np.sum(y))] * 2, rel=1e-6)
    assert history["targets_squares"] == pytest.approx([float(np.sum(y ** 2))] * 2, rel=1e-6)


def test_a_model_without_any_loss_is_refused_when_training_starts():
    strategy = mirrored(2)
    with strategy.scope():
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
        model.compile(keras.optimizers.SGD(0.1))
    with pytest.raises(ValueError, match="No loss to compute.*Pass loss= to model.compile"):
        Trainer(model).fit(np.ones((4, 3), "float32"), np.ones((4, 1), "float32"),
                           batch_size=4, verbose=0)


def test_add_loss_only_trains_like_keras_fit():
    def build(strategy=None):
        with programs._scope(strategy):
            features = keras.Input((programs.FEATURES,))
            output = keras.layers.Dense(2)(features)
            output = keras.layers.ActivityRegularization(l1=0.05, l2=0.1)(output)  # add_loss
            model = keras.Model(features, output)
            programs._initialise(model)
            model.compile(keras.optimizers.SGD(0.1))
        return model

    x = programs._features()
    expected = build()
    expected.fit(x, batch_size=16, epochs=2, shuffle=False, verbose=0)
    model = build(mirrored(2))
    Trainer(model).fit(x, batch_size=16, epochs=2, shuffle=False, verbose=0)
    for got, want in zip(model.get_weights(), expected.get_weights(), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_a_gan_trains_on_x_only_with_its_own_compile_and_optimizers():
    model, arguments = programs.gan(mirrored(2))
    before = [np.array(w) for w in model.generator.get_weights()]
    history = Trainer(model).fit(verbose=0, **arguments).history
    assert set(history) >= {"d_loss", "g_loss"} and len(history["d_loss"]) == 2
    assert all(np.isfinite(history["d_loss"] + history["g_loss"]))
    assert any(np.any(a != b) for a, b in zip(model.generator.get_weights(), before, strict=True))


def test_a_gan_whose_optimizers_are_not_built_is_refused_with_the_way_out():
    model, arguments = programs.gan(mirrored(2), build_optimizers=False)
    with pytest.raises(ValueError, match=r"d_optimizer, g_optimizer.*build it first"):
        Trainer(model).fit(verbose=0, **arguments)


def test_a_zero_batch_size_is_refused_not_replaced_by_the_default():
    model, arguments = programs.class_weights(mirrored(2))
    trainer = Trainer(model)
    with pytest.raises(ValueError, match="batch_size must be an integer >= 1, got 0"):
        trainer.evaluate(arguments["x"], arguments["y"], batch_size=0, verbose=0)
    with pytest.raises(ValueError, match="batch_size must be an integer >= 1, got 0"):
        trainer.fit(arguments["x"], arguments["y"], batch_size=8, validation_batch_size=0,
                    validation_data=(arguments["x"], arguments["y"]), verbose=0)
