"""Small Keras programs, written as a Keras user writes them, for the equivalence tests.

Each program builds and compiles a model (inside a strategy's scope when one
is given), with fixed initial weights, and names the arguments of its `fit`.
`keras_fit` runs it with Keras's own `fit` on one device (the reference);
`tfdist_fit` runs the same program with the one-line change the README shows,
`Trainer(model).fit(...)`. Used in-process (MirroredStrategy on logical CPUs)
and by tests/helpers/workers/keras_program_worker.py (several worker processes).
"""

import contextlib

import keras
import numpy as np
import tensorflow as tf
from keras import ops

from tfdist.training import Trainer
from helpers.compare import assert_same_training  # noqa: F401 (programs.assert_same_training)

ROWS = 70
FEATURES = 5
BATCH = 16


def _initialise(model, seed=0):
    rs = np.random.RandomState(seed)
    model.set_weights([(0.5 * rs.standard_normal(w.shape)).astype(w.dtype)
                       for w in model.get_weights()])


def _scope(strategy):
    return strategy.scope() if strategy is not None else contextlib.nullcontext()


def _features(seed=1):
    return np.random.RandomState(seed).standard_normal((ROWS, FEATURES)).astype("float32")


# --------------------------------------------------------------- the programs
def two_outputs(strategy=None, jit_compile=False):
    """Functional model, two named outputs, a loss dict, loss_weights, metrics per output."""
    with _scope(strategy):
        features = keras.Input((FEATURES,), name="features")
        hidden = keras.layers.Dense(8, activation="tanh",
                                    kernel_regularizer=keras.regularizers.L2(0.01))(features)
        score = keras.layers.Dense(1, name="score")(hidden)
        kind = keras.layers.Dense(3, activation="softmax", name="kind")(hidden)
        model = keras.Model(features, {"score": score, "kind": kind})
        _initialise(model)
        model.compile(optimizer=keras.optimizers.SGD(0.1),
                      loss={"score": "mse", "kind": "sparse_categorical_crossentropy"},
                      loss_weights={"score": 1.0, "kind": 0.2},
                      metrics={"kind": ["accuracy"], "score": ["mae"]},
                      jit_compile=jit_compile)
    rs = np.random.RandomState(2)
    x = _features()
    y = {"score": rs.standard_normal((ROWS, 1)).astype("float32"),
         "kind": rs.randint(0, 3, ROWS)}
    return model, dict(x=x, y=y, batch_size=BATCH, epochs=2, shuffle=False,
                       validation_split=0.2)


def list_outputs(strategy=None):
    """Two unnamed outputs with a loss list and loss_weights as a list, y as a list."""
    with _scope(strategy):
        features = keras.Input((FEATURES,))
        hidden = keras.layers.Dense(8, activation="relu")(features)
        model = keras.Model(features, [keras.layers.Dense(2, name="offset")(hidden),
                                       keras.layers.Dense(1, activation="sigmoid",
                                                          name="flag")(hidden)])
        _initialise(model, seed=3)
        model.compile(keras.optimizers.SGD(0.05), loss=["mae", "binary_crossentropy"],
                      loss_weights=[0.5, 2.0], steps_per_execution=3)
    rs = np.random.RandomState(4)
    y = [rs.standard_normal((ROWS, 2)).astype("float32"),
         rs.randint(0, 2, (ROWS, 1)).astype("float32")]
    return model, dict(x=_features(), y=y, batch_size=BATCH, epochs=2, shuffle=False)


def class_weights(strategy=None):
    """Sequential classifier on numpy arrays with validation_split and class_weight."""
    with _scope(strategy):
        model = keras.Sequential([keras.Input((FEATURES,)),
                                  keras.layers.Dense(6, activation="relu"),
                                  keras.layers.Dense(2, activation="softmax")])
        _initialise(model, seed=5)
        model.compile(keras.optimizers.SGD(0.1), "sparse_categorical_crossentropy",
                      metrics=["accuracy"])
    y = np.random.RandomState(6).randint(0, 2, (ROWS,))
    return model, dict(x=_features(), y=y, batch_size=BATCH, epochs=2, shuffle=False,
                       validation_split=0.25, class_weight={0: 1.0, 1: 3.0})


def sample_weights(strategy=None):
    """Regression with sample_weight arrays and validation_data as a tuple of arrays."""
    with _scope(strategy):
        model = keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(4, "tanh"),
                                  keras.layers.Dense(1)])
        _initialise(model, seed=7)
        model.compile(keras.optimizers.SGD(0.1), "mse", weighted_metrics=["mae"])
    rs = np.random.RandomState(8)
    y = rs.standard_normal((ROWS, 1)).astype("float32")
    weights = rs.uniform(0, 2, ROWS).astype("float32")
    val_x = rs.standard_normal((20, FEATURES)).astype("float32")
    val_y = rs.standard_normal((20, 1)).astype("float32")
    return model, dict(x=_features(), y=y, sample_weight=weights, batch_size=BATCH, epochs=2,
                       shuffle=False, validation_data=(val_x, val_y), validation_batch_size=8)


class MeanSquaredPlusModel(keras.Model):
    """Keras's documented `compute_loss` override, with a metric updated inside it."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.loss_tracker = keras.metrics.Mean(name="custom_loss")

    def compute_loss(self, x, y, y_pred, sample_weight, training=True):
        loss = ops.mean(ops.square(y_pred - y)) + 0.01 * ops.mean(ops.abs(y_pred))
        loss += ops.sum(self.losses)
        self.loss_tracker.update_state(loss)
        return loss


def custom_compute_loss(strategy=None):
    """A model whose own `compute_loss` gives the loss (no loss in compile)."""
    with _scope(strategy):
        features = keras.Input((FEATURES,))
        hidden = keras.layers.Dense(8, activation="tanh",
                                    kernel_regularizer=keras.regularizers.L2(0.01))(features)
        model = MeanSquaredPlusModel(features, keras.layers.Dense(1)(hidden))
        _initialise(model, seed=9)
        model.compile(keras.optimizers.SGD(0.1))
    y = np.random.RandomState(10).standard_normal((ROWS, 1)).astype("float32")
    return model, dict(x=_features(), y=y, batch_size=BATCH, epochs=2, shuffle=False)


class HalfGradientModel(keras.Model):
    """The "customizing what happens in fit" train_step, halving the gradient."""

    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            y_pred = self(x, training=True)
            loss = self.compute_loss(y=y, y_pred=y_pred)
        gradients = tape.gradient(loss, self.trainable_variables)
        self.optimizer.apply([0.5 * g for g in gradients], self.trainable_variables)
        for metric in self.metrics:
            if metric.name == "loss":
                metric.update_state(loss)
            else:
                metric.update_state(y, y_pred)
        return {m.name: m.result() for m in self.metrics}


def custom_train_step(strategy=None):
    """A model with its own `train_step` (the rows split evenly across 2 replicas)."""
    with _scope(strategy):
        features = keras.Input((FEATURES,))
        hidden = keras.layers.Dense(8, activation="tanh")(features)
        model = HalfGradientModel(features, keras.layers.Dense(1)(hidden))
        _initialise(model, seed=11)
        model.compile(keras.optimizers.SGD(0.1), loss="mse", metrics=["mae"])
    y = np.random.RandomState(12).standard_normal((ROWS, 1)).astype("float32")
    # 70 rows in batches of 14: every replica of 2 (or of 2 workers) gets 7 rows.
    return model, dict(x=_features(), y=y, batch_size=14, epochs=2, shuffle=False)


class GAN(keras.Model):
    """Keras's GAN guide in miniature: own compile, two optimizers, fit on x only."""

    def __init__(self, discriminator, generator, latent_dim):
        super().__init__()
        self.discriminator, self.generator, self.latent_dim = discriminator, generator, latent_dim

    def compile(self, d_optimizer, g_optimizer, loss_fn):
        super().compile()
        self.d_optimizer, self.g_optimizer, self.loss_fn = d_optimizer, g_optimizer, loss_fn
        self.d_loss_tracker = keras.metrics.Mean(name="d_loss")
        self.g_loss_tracker = keras.metrics.Mean(name="g_loss")

    @property
    def metrics(self):
        return [self.d_loss_tracker, self.g_loss_tracker]

    def train_step(self, real):
        batch = ops.shape(real)[0]
        noise = tf.random.normal((batch, self.latent_dim))
        images = ops.concatenate([self.generator(noise), real], axis=0)
        labels = ops.concatenate([ops.ones((batch, 1)), ops.zeros((batch, 1))], axis=0)
        with tf.GradientTape() as tape:
            d_loss = self.loss_fn(labels, self.discriminator(images))
        grads = tape.gradient(d_loss, self.discriminator.trainable_weights)
        self.d_optimizer.apply(grads, self.discriminator.trainable_weights)
        with tf.GradientTape() as tape:
            g_loss = self.loss_fn(ops.zeros((batch, 1)), self.discriminator(self.generator(noise)))
        grads = tape.gradient(g_loss, self.generator.trainable_weights)
        self.g_optimizer.apply(grads, self.generator.trainable_weights)
        self.d_loss_tracker.update_state(d_loss)
        self.g_loss_tracker.update_state(g_loss)
        return {"d_loss": self.d_loss_tracker.result(), "g_loss": self.g_loss_tracker.result()}


def gan(strategy=None, build_optimizers=True):
    """A GAN as the Keras guide writes it (its optimizers built up front when asked)."""
    with _scope(strategy):
        discriminator = keras.Sequential([keras.Input((FEATURES,)),
                                          keras.layers.Dense(8, activation="relu"),
                                          keras.layers.Dense(1)])
        generator = keras.Sequential([keras.Input((3,)), keras.layers.Dense(FEATURES)])
        model = GAN(discriminator, generator, 3)
        model.compile(keras.optimizers.Adam(1e-3), keras.optimizers.Adam(1e-3),
                      keras.losses.BinaryCrossentropy(from_logits=True))
        if build_optimizers:
            model.d_optimizer.build(discriminator.trainable_variables)
            model.g_optimizer.build(generator.trainable_variables)
    return model, dict(x=_features(), batch_size=BATCH, epochs=2)


PROGRAMS = {
    "two_outputs": two_outputs,
    "list_outputs": list_outputs,
    "class_weights": class_weights,
    "sample_weights": sample_weights,
    "custom_compute_loss": custom_compute_loss,
    "custom_train_step": custom_train_step,
}


class TargetMoments(keras.metrics.Metric):
    """Sums y and y**2 over the targets seen: equal to the data's sums only when
    every example was used exactly once (a missing or repeated row changes them)."""

    def __init__(self, name="targets", **kwargs):
        super().__init__(name=name, **kwargs)
        self.total = self.add_variable((), initializer="zeros", name="total")
        self.squares = self.add_variable((), initializer="zeros", name="squares")

    def update_state(self, y_true, y_pred, sample_weight=None):
        y_true = ops.cast(y_true, "float32")
        self.total.assign_add(ops.sum(y_true))
        self.squares.assign_add(ops.sum(ops.square(y_true)))

    def result(self):
        return {"targets_sum": self.total, "targets_squares": self.squares}


def shuffled_rows(strategy=None, rows=37):
    """Shuffled arrays (a partial last batch): which rows each epoch used."""
    with _scope(strategy):
        model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)])
        _initialise(model, seed=13)
        model.compile(keras.optimizers.SGD(0.01), "mse", metrics=[TargetMoments()])
    x = np.arange(rows, dtype="float32")[:, None]
    return model, dict(x=x, y=x + 1.0, batch_size=8, epochs=2, shuffle=True)


# ------------------------------------------------------------------ running
def keras_fit(name, **options):
    """One-device Keras `fit` of program `name`; returns `(weights, history)`."""
    model, fit_arguments = PROGRAMS[name](**options)
    history = model.fit(verbose=0, **fit_arguments)
    return [np.array(w) for w in model.get_weights()], history.history


def tfdist_fit(name, strategy, **options):
    """The same program under `strategy` through tfdist: `Trainer(model).fit(...)`."""
    model, fit_arguments = PROGRAMS[name](strategy, **options)
    history = Trainer(model).fit(verbose=0, **fit_arguments)
    return [np.array(w) for w in model.get_weights()], history.history


# ------------------------------------------------- fine-tuning (two phases)
def fine_tuning(strategy=None):
    """keras-io's transfer-learning guide in miniature: a "pretrained" base frozen
    under a new head (base(x, training=False)), trained; then the base made
    trainable and the model compiled again with a lower learning rate, trained
    again. Returns `(model, fit arguments, unfreeze)`; `unfreeze(model)` is the
    second phase's set-up, done in the strategy's scope as the guide says."""
    with _scope(strategy):
        base = keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(6, "tanh"),
                                 keras.layers.Dense(4, "tanh")], name="base")
        features = keras.Input((FEATURES,))
        head = keras.layers.Dense(1, name="head")(base(features, training=False))
        model = keras.Model(features, head)
        _initialise(model, seed=14)
        base.trainable = False
        model.compile(keras.optimizers.SGD(0.1), "mse", metrics=["mae"])
    y = np.random.RandomState(15).standard_normal((ROWS, 1)).astype("float32")

    def unfreeze(model):
        with _scope(strategy):
            model.get_layer("base").trainable = True
            model.compile(keras.optimizers.SGD(0.01), "mse", metrics=["mae"])

    return model, dict(x=_features(), y=y, batch_size=BATCH, epochs=2, shuffle=False), unfreeze


def keras_fine_tune():
    """Both phases with Keras's own `fit` on one device; returns `(weights, histories)`."""
    model, arguments, unfreeze = fine_tuning()
    first = model.fit(verbose=0, **arguments).history
    unfreeze(model)
    second = model.fit(verbose=0, **arguments).history
    return [np.array(w) for w in model.get_weights()], {"first": first, "second": second}


def tfdist_fine_tune(strategy):
    """Both phases on one `Trainer` under `strategy`; returns `(weights, histories)`."""
    model, arguments, unfreeze = fine_tuning(strategy)
    trainer = Trainer(model)
    first = trainer.fit(verbose=0, **arguments).history
    unfreeze(model)
    second = trainer.fit(verbose=0, **arguments).history
    return [np.array(w) for w in model.get_weights()], {"first": first, "second": second}


def assert_same_fine_tuning(actual, expected, rtol=1e-5, atol=1e-6):
    """Weights and both phases' logs agree."""
    (weights, histories), (reference_weights, reference_histories) = actual, expected
    for phase in ("first", "second"):
        assert_same_training((weights, histories[phase]),
                             (reference_weights, reference_histories[phase]), rtol, atol)


# ------------------------------------------------------------ ragged outputs
class RaggedScorer(keras.Model):
    """Scores every element of ragged sequences: a ragged input gives a ragged output."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.score = keras.layers.Dense(1)

    def call(self, x):
        return tf.ragged.map_flat_values(lambda values: self.score(values[:, None])[:, 0], x)


def ragged_scorer(strategy=None):
    """A model on ragged sequences (13 rows of 1-4 values, batches of 4: the last
    batch has one row, so under 2 replicas one replica gets none)."""
    rs = np.random.RandomState(16)
    x = tf.ragged.constant([rs.standard_normal(rs.randint(1, 5)).astype("float32").tolist()
                            for _ in range(13)], dtype=tf.float32)
    with _scope(strategy):
        model = RaggedScorer()
        model(x[:1])
        _initialise(model, seed=17)
        model.compile(keras.optimizers.SGD(0.1), "mse")
    return model, dict(x=x, batch_size=4)
