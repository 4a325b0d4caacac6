"""Teaching errors for what the distributed step cannot do correctly."""

import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf

from tfdist.training import Trainer
from helpers.workers import train_common as common

DATA = common.dataset(common.regression_arrays(n=32), 16)


def sgd_in(strategy, **kwargs):
    with strategy.scope():
        return keras.optimizers.SGD(0.1, **kwargs)


def test_model_built_outside_the_scope_is_refused():
    strategy = common.mirrored(2)
    model = common.dense_model(tf.distribute.get_strategy())
    with pytest.raises(ValueError, match="built outside the scope.*MirroredStrategy"):
        Trainer(model, sgd_in(strategy), "mse", strategy=strategy)


def test_optimizer_created_outside_the_scope_is_refused():
    strategy = common.mirrored(2)
    with pytest.raises(ValueError, match="optimizer 'sgd.*' was created outside the scope"):
        Trainer(common.dense_model(strategy), keras.optimizers.SGD(0.1), "mse", strategy=strategy)


def test_trainer_outside_the_scope_without_strategy_argument_uses_the_models_strategy():
    strategy = common.mirrored(2)
    model = common.dense_model(strategy)
    assert Trainer(model, sgd_in(strategy), "mse").strategy is strategy


def test_a_model_built_under_another_strategy_is_refused():
    strategy = common.mirrored(2)
    model = common.dense_model(strategy)
    other = common.mirrored(2)
    with other.scope():
        optimizer = keras.optimizers.SGD(0.1)
    with pytest.raises(ValueError, match="pass strategy="):
        Trainer(model, optimizer, "mse", strategy=other)


def test_strategy_is_taken_from_the_active_scope():
    strategy = common.mirrored(2)
    model = common.dense_model(strategy)
    optimizer = sgd_in(strategy)
    with strategy.scope():
        trainer = Trainer(model, optimizer, "mse")
    assert trainer.strategy is strategy


def test_keras_gradient_accumulation_is_refused_with_the_replacement():
    strategy = common.mirrored(2)
    with pytest.raises(ValueError, match=r"Trainer\(grad_accum_steps=4\)"):
        Trainer(common.dense_model(strategy), sgd_in(strategy, gradient_accumulation_steps=4),
                "mse", strategy=strategy)


def test_periodic_moving_average_overwrite_is_refused_under_mirrored():
    strategy = common.mirrored(2)
    with pytest.raises(ValueError, match="Drop ema_overwrite_frequency"):
        Trainer(common.dense_model(strategy),
                sgd_in(strategy, use_ema=True, ema_overwrite_frequency=2), "mse",
                strategy=strategy)


def test_two_clippings_are_refused():
    strategy = common.mirrored(2)
    with pytest.raises(ValueError, match="choose one"):
        Trainer(common.dense_model(strategy), sgd_in(strategy, clipnorm=1.0), "mse",
                strategy=strategy, clip_norm=1.0)


@pytest.mark.parametrize("kwargs,message", [
    ({"grad_accum_steps": 0}, "grad_accum_steps must be an integer >= 1, got 0"),
    ({"steps_per_execution": 1.5}, "steps_per_execution must be an integer >= 1, got 1.5"),
    ({"clip_norm": -1.0}, r"clip_norm must be a finite number > 0 or None \(no clipping\), got -1.0"),
    # an infinite norm would scale every gradient by inf * 0 = NaN
    ({"clip_norm": float("inf")}, r"clip_norm must be a finite number > 0 or None \(no clipping\), got inf"),
    ({"jit_compile": "yes"}, "jit_compile must be True, False or None, got 'yes'"),
])
def test_bad_arguments_name_the_value(kwargs, message):
    strategy = tf.distribute.get_strategy()
    with pytest.raises(ValueError, match=message):
        Trainer(common.dense_model(strategy), sgd_in(strategy), "mse", **kwargs)


def test_an_optimizer_name_is_resolved_by_keras_compile_inside_the_scope():
    strategy = common.mirrored(2)
    trainer = Trainer(common.dense_model(strategy), "sgd", "mse", strategy=strategy)
    assert isinstance(trainer.optimizer, keras.optimizers.SGD)
    assert strategy.extended.variable_created_in_scope(trainer.optimizer.iterations.value)


def test_bad_inputs_name_what_is_allowed():
    strategy = common.mirrored(2)
    trainer = Trainer(common.dense_model(strategy), sgd_in(strategy), "mse", strategy=strategy)
    with pytest.raises(TypeError, match="must be numpy arrays.*got str"):
        trainer.fit("train.csv")
    with pytest.raises(ValueError, match="no targets"):
        trainer.fit(np.zeros((4, common.FEATURES), "float32"), verbose=0)
    with pytest.raises(ValueError, match="no targets"):
        trainer.fit(DATA.map(lambda x, y: x), verbose=0)
    with pytest.raises(ValueError, match="verbose must be one of"):
        trainer.fit(DATA, verbose="loud")
    with pytest.raises(ValueError, match="epochs must be an integer >= 0"):
        trainer.fit(DATA, epochs=-1)


@pytest.mark.parametrize("kwargs, message", [
    # Keras's fit trains nothing and says nothing
    (dict(epochs=2, initial_epoch=5), r"^initial_epoch=5 is past epochs=2, so fit would train "
                                      r"nothing: .*To train 2 more epochs from epoch 5, pass "
                                      r"epochs=7\.$"),
    (dict(initial_epoch=-1), r"^initial_epoch must be an integer >= 0, got -1\.$"),
    # Keras's fit skipped the validation silently
    (dict(validation_split=0.25, validation_steps=0),
     r"^validation_steps must be an integer >= 1, got 0\.$"),
    # Keras's fit: AttributeError: 'int' object has no attribute 'set_model'
    (dict(callbacks=[keras.callbacks.History(), 1]),
     r"^callbacks\[1\] is not a keras.callbacks.Callback: got int: 1\.$"),
    (dict(callbacks=[keras.callbacks.EarlyStopping]),
     r"^callbacks\[0\] is not a keras.callbacks.Callback \(a class: pass an instance"),
    (dict(callbacks="early_stopping"),
     r"^callbacks must be a list of keras.callbacks.Callback \(or one\), got str"),
    # Keras's fit trains on a NaN loss
    (dict(class_weight={0: 1.0, 1: float("nan")}),
     r"^class_weight\[1\] must be a finite number >= 0, got nan; a class's weight multiplies"),
    (dict(class_weight={0: -1.0}), r"^class_weight\[0\] must be a finite number >= 0, got -1.0"),
    (dict(sample_weight=np.r_[np.ones(12), np.nan, np.inf, np.ones(2)]),
     r"^sample_weight must hold finite weights >= 0; 2 row\(s\) do not, the first is row 12: "
     r"nan\. A NaN"),
    (dict(sample_weight=-np.ones(16)), r"^sample_weight must hold .* the first is row 0: -1.0\."),
])
def test_fit_arguments_keras_lets_through_are_refused_by_name(kwargs, message):
    strategy = common.mirrored(2)
    trainer = Trainer(common.dense_model(strategy), sgd_in(strategy),
                      "sparse_categorical_crossentropy" if "class_weight" in kwargs else "mse",
                      strategy=strategy)
    x = np.ones((16, common.FEATURES), "float32")
    y = (np.arange(16) % 2 if "class_weight" in kwargs
         else np.ones((16, common.TARGETS), "float32"))
    with pytest.raises(ValueError, match=message):
        trainer.fit(x, y, batch_size=4, verbose=0, **kwargs)


def test_evaluate_refuses_nan_sample_weights_and_says_how_big_an_array_was():
    strategy = common.mirrored(2)
    trainer = Trainer(common.dense_model(strategy), sgd_in(strategy), "mse", strategy=strategy)
    x, y = np.ones((16, common.FEATURES), "float32"), np.ones((16, common.TARGETS), "float32")
    with pytest.raises(ValueError, match=r"^sample_weight must hold finite weights >= 0"):
        trainer.evaluate(x, y, sample_weight=np.full(16, np.nan), verbose=0)
    # predict's second argument is batch_size, as in Keras: the array is shown by its shape
    with pytest.raises(ValueError, match=r"^predict takes no targets: its second argument is "
                                         r"batch_size \(as in Keras\), got ndarray of shape "
                                         r"\(16, 3\)\. Call predict\(x\)"):
        trainer.predict(x, y)


def test_unbuilt_model_is_built_inside_the_scope():
    strategy = common.mirrored(2)
    with strategy.scope():
        model = keras.Sequential([keras.layers.Dense(common.TARGETS)])
        optimizer = keras.optimizers.SGD(0.1)
    trainer = Trainer(model, optimizer, "mse", strategy=strategy)
    history = trainer.fit(DATA, epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"][0])
    assert all(strategy.extended.variable_created_in_scope(v.value) for v in model.variables)
    assert all(isinstance(v.value, tf.distribute.DistributedValues)
               for v in model.trainable_variables)


def test_validation_steps_without_validation_data_warns_naming_it():
    """Keras's fit ignores it silently; the Trainer runs the fit and says so."""
    strategy = common.mirrored(2)
    trainer = Trainer(common.dense_model(strategy), sgd_in(strategy), "mse", strategy=strategy)
    with pytest.warns(UserWarning, match=r"^validation_steps=2 has no effect: this fit has no "
                                         r"validation data\. Pass validation_data="):
        history = trainer.fit(DATA, epochs=1, validation_steps=2, verbose=0)
    assert "loss" in history.history and "val_loss" not in history.history


def test_a_fit_that_ends_inside_an_accumulation_warns_and_the_next_fit_adds_to_it():
    strategy = common.mirrored(2)
    trainer = Trainer(common.dense_model(strategy), sgd_in(strategy), "mse", strategy=strategy,
                      grad_accum_steps=4)
    data = DATA.repeat()
    with pytest.warns(UserWarning, match=r"^fit ended between two optimizer updates "
                                         r"\(grad_accum_steps=4\): the gradients of the "
                                         r"micro-batches since the last update are held"):
        trainer.fit(data, epochs=1, steps_per_epoch=6, verbose=0)
    assert int(trainer.model.optimizer.iterations.numpy()) == 1
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(data, epochs=1, steps_per_epoch=2, verbose=0)  # 8 micro-batches in all
    assert int(trainer.model.optimizer.iterations.numpy()) == 2
    assert not [w for w in caught if "between two optimizer updates" in str(w.message)]
