"""How good a translation model's output is: batched decoding of a held-out split,
corpus BLEU and chrF (sacreBLEU), example translations, and the Keras callback
the translation recipe runs them in.

Decoding runs on the chief's default device, outside `strategy.run`: the
model is called in the strategy's cross-replica context, which reads each
variable's value (the first replica's copy of a mirrored variable, the
parameter servers' value under `ParameterServerStrategy`) and runs the
whole decode (`tfdist.models.greedy_decode` or `beam_search_decode`, one
`tf.function` per batch shape) on that one device. The other workers of a
multi-worker run do not decode; the scores are computed once, by the chief.

Scores are computed on words: the ids are decoded to words with the task's
vocabulary and joined with spaces (the embedded task's words are already
"detokenised": lower-case words, no punctuation), and sacreBLEU's corpus
BLEU (13a tokenisation) and chrF are computed against one reference per
sentence.

Example:

    quality = TranslationQuality(model, validation_source, beam_size=4, length_penalty=0.6)
    trainer.fit(..., callbacks=[quality])   # logs val_bleu and val_chrf each epoch
"""

import time

import numpy as np

DECODE_BATCH_SIZE = 128
"""Sentences decoded together (the last batch is padded to this size, so one trace serves all)."""


def corpus_scores(hypotheses, references):
    """Corpus BLEU and chrF (sacreBLEU) of word-list hypotheses against one reference each.

    Args:
        hypotheses: list of word lists (or strings).
        references: list of word lists (or strings), as many.

    Returns:
        `{"bleu": float, "chrf": float}`, both 0..100.

    Raises:
        ValueError: the lists differ in length (both counts are named).

    Example:

    >>> corpus_scores([["the", "big", "dog", "runs", "today"]],
    ...               [["the", "big", "dog", "runs", "today"]])
    {'bleu': 100.0, 'chrf': 100.0}
    """
    import sacrebleu

    if len(hypotheses) != len(references):
        raise ValueError(f"Got {len(hypotheses)} hypotheses for {len(references)} references; "
                         "pass one hypothesis per reference.")
    hypotheses = [_text(words) for words in hypotheses]
    references = [_text(words) for words in references]
    bleu = sacrebleu.corpus_bleu(hypotheses, [references])
    chrf = sacrebleu.corpus_chrf(hypotheses, [references])
    return {"bleu": float(bleu.score), "chrf": float(chrf.score)}


def _text(words):
    return words if isinstance(words, str) else " ".join(words)


def sentence_decoder(model, max_length, beam_size=4, length_penalty=0.6):
    """A `tf.function` from source ids `[B, S]` to output ids `[B, max_length]`: greedy
    for `beam_size` 1, else beam search. Keep it to decode again without tracing again.

    Example:

    >>> decoder = sentence_decoder(model, max_length=19, beam_size=4)
    >>> decode_sentences(model, source_ids, 19, decoder=decoder).shape[1]
    19
    """
    import tensorflow as tf

    from tfdist.models import beam_search_decode, greedy_decode

    if beam_size == 1:
        return tf.function(lambda source: greedy_decode(model, source, max_length))
    return tf.function(lambda source: beam_search_decode(
        model, source, beam_size=beam_size, length_penalty=length_penalty,
        max_length=max_length))


def decode_sentences(model, source_ids, max_length, beam_size=4, length_penalty=0.6,
                     batch_size=DECODE_BATCH_SIZE, decoder=None):
    """Decodes source id rows in batches: greedy for `beam_size` 1, else beam search.

    Runs where it is called (see the module docstring); each batch is
    padded to `batch_size` rows (fewer when there are fewer sentences) so
    the decoder is traced once.

    Args:
        model: an encoder-decoder (`tfdist.models.build_seq2seq`).
        source_ids: int array `[N, source_length]`, padded with 0.
        max_length: output tokens at most (EOS included).
        beam_size: 1 (greedy) or more.
        length_penalty: the GNMT alpha (beam search only).
        batch_size: sentences per decoder call.
        decoder: a `sentence_decoder` of these settings to reuse, or None
            for a new one.

    Returns:
        int32 array `[N, max_length]` of output ids (EOS, then pads).

    Example:

    >>> decode_sentences(model, validation.source_ids[:3], max_length=31).shape
    (3, 31)
    """
    import tensorflow as tf

    decode = decoder or sentence_decoder(model, max_length, beam_size, length_penalty)
    source_ids = np.asarray(source_ids, np.int32)
    batch_size = max(1, min(batch_size, len(source_ids)))
    outputs = []
    for start in range(0, len(source_ids), batch_size):
        rows = source_ids[start:start + batch_size]
        padded = np.zeros([batch_size, source_ids.shape[1]], np.int32)
        padded[:len(rows)] = rows
        padded[len(rows):, 0] = rows[0, 0]  # a one-word filler, never an empty source
        outputs.append(decode(tf.constant(padded)).numpy()[:len(rows)])
    return np.concatenate(outputs) if outputs else np.zeros([0, max_length], np.int32)


def copy_baseline_scores(source, count=None):
    """BLEU and chrF of copying each source sentence as its translation (the trivial baseline).

    Args:
        source: a `tfdist.data.TranslationTaskSource` (its pairs' words).
        count: score the first `count` sentences only (all if None).

    Example:

    >>> copy_baseline_scores(TranslationTaskSource(300, split="validation"))["bleu"] < 5
    True
    """
    return corpus_scores(list(source.pairs.source_words[:count]),
                         list(source.pairs.target_words[:count]))


def example_lines(source_words, hypotheses, references, count=3):
    """Lines showing `count` translations beside their sources and references.

    Example:

    >>> print(example_lines([["bob", "runs"]], [["bob", "runs'"]], [["bob", "runs'"]]))
      source     bob runs
      output     bob runs'
      reference  bob runs'
    """
    lines = []
    for words, output, reference in zip(source_words[:count], hypotheses[:count],
                                        references[:count], strict=True):
        lines += [f"  source     {_text(words)}", f"  output     {_text(output)}",
                  f"  reference  {_text(reference)}"]
    return "\n".join(lines)


def translation_callback_class():
    """The `TranslationQuality` Keras callback class (built on first use: Keras loads then).

    Example:

    >>> TranslationQuality = translation_callback_class()
    """
    import keras

    class TranslationQuality(keras.callbacks.Callback):
        """Decodes a held-out split at each epoch end and logs `val_bleu` and `val_chrf`.

        Only where `is_chief` (once per epoch, on that process's default
        device); the values go into the epoch's logs before the loggers
        after this callback (CSV, TensorBoard, History, the progress bar)
        see them. At the end of training it prints `examples` translations
        of the last decode beside their references.

        Args:
            model: the encoder-decoder being trained.
            source: the held-out `TranslationTaskSource` (its first
                `num_sentences` pairs are decoded).
            beam_size, length_penalty: as `decode_sentences`.
            num_sentences: sentences decoded (all of the split's if None).
            is_chief: whether this process decodes and prints.
            examples: translations printed at the end.
            print_fn: where lines go (default `print`).

        Example:

        >>> callback = TranslationQuality(model, validation, beam_size=4, length_penalty=0.6)
        """

        def __init__(self, model, source, beam_size=4, length_penalty=0.6, num_sentences=None,
                     is_chief=True, examples=3, print_fn=print):
            super().__init__()
            self.translation_model = model
            self.source = source
            self.beam_size = beam_size
            self.length_penalty = length_penalty
            count = len(source.pairs) if num_sentences is None else min(num_sentences,
                                                                        len(source.pairs))
            self.num_sentences = count
            self.is_chief = is_chief
            self.examples = examples
            self.print_fn = print_fn
            self.baseline = None
            self.last = None  # (scores, hypotheses as word lists)
            self.decoder = None  # traced once, reused every epoch

        def evaluate(self):
            """Decodes the sentences and returns `(scores, hypotheses)`."""
            source, count = self.source, self.num_sentences
            max_length = source.target_length + 1
            if self.decoder is None:
                self.decoder = sentence_decoder(self.translation_model, max_length,
                                                self.beam_size, self.length_penalty)
            outputs = decode_sentences(self.translation_model, source.source_ids[:count],
                                       max_length, self.beam_size, self.length_penalty,
                                       decoder=self.decoder)
            hypotheses = [source.vocabulary.decode(row) for row in outputs]
            references = list(source.pairs.target_words[:count])
            return corpus_scores(hypotheses, references), hypotheses

        def on_epoch_end(self, epoch, logs=None):
            if not self.is_chief:
                return
            start = time.perf_counter()
            scores, hypotheses = self.evaluate()
            seconds = time.perf_counter() - start
            self.last = (scores, hypotheses)
            if logs is not None:
                logs["val_bleu"] = scores["bleu"]
                logs["val_chrf"] = scores["chrf"]
            if self.baseline is None:
                self.baseline = copy_baseline_scores(self.source, self.num_sentences)
            how = ("greedy" if self.beam_size == 1
                   else f"beam {self.beam_size}, length penalty {self.length_penalty:g}")
            self.print_fn(
                f"  epoch {epoch + 1}: BLEU {scores['bleu']:.1f}, chrF {scores['chrf']:.1f} on "
                f"{self.num_sentences} validation sentences ({how}; copying the source: BLEU "
                f"{self.baseline['bleu']:.1f}, chrF {self.baseline['chrf']:.1f}), decoded in "
                f"{seconds:.1f} s")

        def on_train_end(self, logs=None):
            if not self.is_chief or not self.examples:
                return
            if self.last is None:  # no epoch ended in this run (e.g. resumed after the last)
                self.last = self.evaluate()
            _, hypotheses = self.last
            count = min(self.examples, len(hypotheses))
            self.print_fn(f"Example translations ({count} of the validation sentences):\n"
                          + example_lines(self.source.pairs.source_words, hypotheses,
                                          self.source.pairs.target_words, count))

    return TranslationQuality
