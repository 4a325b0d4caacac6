"""Models and data shared by the model-parallel tests and their worker script.

Weights and data come from numpy `RandomState`s, so the test process and a
worker process build exactly the same models and batches.
"""

import keras
import numpy as np

from tfdist.models import (MaskedAccuracy, MaskedSparseCategoricalCrossentropy, build_decoder_lm,
                           transformer_config)

try:  # imported as helpers.workers.model_parallel_common (the test process)
    from helpers.workers import train_common
except ImportError:  # imported beside a worker script (the workers directory is on sys.path)
    import train_common

dataset, weights_of = train_common.dataset, train_common.weights_of

VOCAB = 24
SEQ = 8


def seeded_weights(model, seed=0, scale=0.2):
    """Overwrites every weight with `scale` * N(0, 1) from a fixed RandomState
    (LayerNorm scales around 1, so the Transformer stays well conditioned)."""
    rs = np.random.RandomState(seed)
    values = []
    for weight in model.weights:
        value = scale * rs.standard_normal(weight.shape)
        if weight.path.endswith("gamma"):
            value = 1.0 + value
        values.append(value.astype(keras.backend.standardize_dtype(weight.dtype)))
    model.set_weights(values)
    return model


def transformer(strategy, num_layers=2, seed=0):
    """The tiny decoder LM (vocab `VOCAB`, length `SEQ`), compiled with SGD and a masked loss."""
    with strategy.scope():
        model = build_decoder_lm(transformer_config("tiny", VOCAB, SEQ, num_layers=num_layers,
                                                    d_model=32, num_heads=2, d_ff=64))
        model.compile(keras.optimizers.SGD(0.5), MaskedSparseCategoricalCrossentropy(),
                      metrics=[MaskedAccuracy(name="accuracy")])
    return seeded_weights(model, seed)


def transformer_with_adam(strategy, num_layers=2, seed=0):
    """The tiny decoder LM of `transformer`, compiled with Adam (epsilon 1e-5, so that the
    rounding of gradients that are zero in exact arithmetic stays below 1e-5)."""
    model = transformer(strategy, num_layers=num_layers, seed=seed)
    with strategy.scope():
        model.compile(keras.optimizers.Adam(1e-3, epsilon=1e-5),
                      MaskedSparseCategoricalCrossentropy(),
                      metrics=[MaskedAccuracy(name="accuracy")])
    return model


def token_arrays(n=46, seed=3):
    """Padded token sequences (0 = padding, lengths 1..SEQ: uneven masks) and next-token targets."""
    return train_common.token_arrays(n, seed, vocab=VOCAB, seq=SEQ)
