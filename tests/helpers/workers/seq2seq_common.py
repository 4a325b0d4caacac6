"""The smallest encoder-decoder of the translation recipe, its data and its trainer,
shared by the translation equivalence/resume tests and the multi-worker worker script.

Weights come from a numpy `RandomState` (not Keras's initialisers), so a worker
process and the test process build exactly the same model.

    from helpers.workers import seq2seq_common as s2s

    source = s2s.translation_source(36)
    model, trainer = s2s.seq2seq_trainer(strategy, source)
"""

import functools

import keras
import numpy as np
import tensorflow as tf

from tfdist.data import TranslationTaskSource
from tfdist.models import MaskedSparseCategoricalCrossentropy, build_seq2seq, seq2seq_config
from tfdist.training import Trainer

MAX_SOURCE_WORDS = 6  # sentences of 4..6 source words: padded rows of uneven length
GLOBAL_BATCH = 8
LEARNING_RATE = 0.5
LABEL_SMOOTHING = 0.1  # the recipe's default


def translation_source(num_examples, seed=0):
    """The embedded language pair's training split, short sentences.

    Example: `translation_source(36).read_all()` gives `((source, target_in), target_out)`.
    """
    return TranslationTaskSource(num_examples, seed=seed, split="train",
                                 max_source_words=MAX_SOURCE_WORDS)


def seq2seq_model(strategy, source, seed=0):
    """The 1+1-layer, d_model 16, dropout 0, tied-embedding encoder-decoder for
    `source`, built in `strategy.scope()` with deterministic weights.

    Example: `model = seq2seq_model(tf.distribute.get_strategy(), translation_source(8))`
    """
    config = seq2seq_config("tiny", source.vocab_size, source.vocab_size, source.source_length,
                            source.target_length + 1, num_encoder_layers=1,
                            num_decoder_layers=1, d_model=16, num_heads=2, d_ff=32,
                            dropout=0.0, tie_embeddings=True)
    with strategy.scope():
        model = build_seq2seq(config)
    rs = np.random.RandomState(seed)
    values = []
    for variable in model.weights:
        noise = rs.standard_normal(variable.shape).astype("float32")
        values.append(1.0 + 0.1 * noise if variable.path.endswith("gamma")
                      else 0.1 * noise if len(variable.shape) == 1 else 0.3 * noise)
    model.set_weights(values)
    return model


def seq2seq_trainer(strategy, source, seed=0, jit_loss=True, **trainer_kwargs):
    """`(model, Trainer)`: SGD and the recipe's label-smoothed masked loss (its
    per-token loss compiled with XLA on its own, as in the recipe, unless `jit_loss=False`).

    Example: `model, trainer = seq2seq_trainer(common.mirrored(2), translation_source(36))`
    """
    model = seq2seq_model(strategy, source, seed)
    with strategy.scope():
        optimizer = keras.optimizers.SGD(LEARNING_RATE)
    loss = MaskedSparseCategoricalCrossentropy(label_smoothing=LABEL_SMOOTHING,
                                               jit_compile=jit_loss)
    return model, Trainer(model, optimizer, loss, strategy=strategy, jit_compile=False,
                          **trainer_kwargs)


EQUIVALENCE_EXAMPLES = 32  # 4 global batches of 8 (a short last batch would trace again)
EQUIVALENCE_SEED = 1  # a sample whose 2 replicas hold different token counts in every batch


class StepLosses(keras.callbacks.Callback):
    """Records the logged loss at every training batch end, in `losses`.

    Example: `trainer.fit(data, callbacks=[recorder := StepLosses()]); recorder.losses`
    """

    def __init__(self):
        super().__init__()
        self.losses = []

    def on_train_batch_end(self, batch, logs=None):
        self.losses.append(float(logs["loss"]))


def equivalence_run(strategy, epochs=2):
    """`(per-step losses, final weights)` of the seq2seq trained under `strategy` on the
    equivalence sample's global batches, in order (what one device, 2 replicas and 2
    workers must agree on).

    Example: `losses, weights = equivalence_run(tf.distribute.get_strategy())`
    """
    source = translation_source(EQUIVALENCE_EXAMPLES, EQUIVALENCE_SEED)
    model, trainer = seq2seq_trainer(strategy, source)
    recorder = StepLosses()
    trainer.fit(source.read_all().batch(GLOBAL_BATCH), epochs=epochs, callbacks=[recorder],
                verbose=0)
    return recorder.losses, [np.array(w) for w in model.get_weights()]


def decode_validation(strategy, weights, beam_size=2):
    """Decodes 11 validation sentences with the equivalence model's `weights`, split over
    `strategy`'s replicas (3 sentences per replica and call: the last call padded);
    every worker of a multi-worker strategy must call it. Returns the output ids.

    Example: `outputs = decode_validation(tf.distribute.get_strategy(), weights)`
    """
    from tfdist.recipes.translation_quality import decode_sentences

    source = TranslationTaskSource(11, seed=0, split="validation",
                                   max_source_words=MAX_SOURCE_WORDS)
    model = seq2seq_model(strategy, translation_source(EQUIVALENCE_EXAMPLES, EQUIVALENCE_SEED))
    model.set_weights(weights)
    return decode_sentences(model, source.source_ids, source.target_length + 1,
                            beam_size=beam_size, batch_size=3, strategy=strategy)


@functools.lru_cache(maxsize=1)
def one_device_equivalence_run():
    """`equivalence_run` on the default strategy (one device), run once per process:
    the 2-replica and the 2-worker tests compare with it (do not modify what it returns).

    Example: `reference_losses, reference_weights = one_device_equivalence_run()`
    """
    return equivalence_run(tf.distribute.get_strategy())
