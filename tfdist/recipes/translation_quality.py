"""How good a translation model's output is: batched decoding of a held-out split,
corpus BLEU and chrF (sacreBLEU), example translations, and the Keras callback
the translation recipe runs them in.

Decoding runs under the training strategy: with several replicas
(`mirrored`, `multi_worker_mirrored`, their GPU forms) each call decodes
`batch_size` sentences on every replica (`strategy.run`, each replica its
own slice, reading its own copy of the weights) and gathers the outputs
on every worker (`strategy.gather`, one all-gather), so N replicas decode
N times as many sentences per call. Every worker of a multi-worker run
takes part (the gather is a collective); the chief alone scores and
prints. With one replica, and under `ParameterServerStrategy` (whose
workers do not run the loop's callbacks), the chief decodes on its
default device in the cross-replica context (the parameter servers' values
of the variables). The outputs are the same either way: a sentence's
decode does not depend on the other sentences of its batch.

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


def decoding_replicas(strategy):
    """How many replicas decode in parallel under `strategy`: its replica count,
    or 1 for None, one replica and `ParameterServerStrategy` (the chief decodes alone).

    Example:

    >>> decoding_replicas(tf.distribute.MirroredStrategy(["cpu:0", "cpu:1"]))
    2
    """
    import tensorflow as tf

    if strategy is None or isinstance(strategy, tf.distribute.experimental.ParameterServerStrategy):
        return 1
    return int(strategy.num_replicas_in_sync)


class SentenceDecoder:
    """Source id rows `[rows_per_call, S]` to output ids `[rows_per_call, max_length]`:
    greedy for `beam_size` 1, else beam search; traced once, reused every call.

    With a `strategy` of several replicas (`decoding_replicas`) each replica
    decodes `batch_size` of the rows and every worker gets all the outputs
    (see the module docstring); every worker of the strategy must make the
    same calls.

    Example:

    >>> decoder = SentenceDecoder(model, max_length=19, beam_size=4, batch_size=64)
    >>> decoder(source_ids[:decoder.rows_per_call]).shape
    (64, 19)
    """

    def __init__(self, model, max_length, beam_size=4, length_penalty=0.6,
                 batch_size=DECODE_BATCH_SIZE, strategy=None):
        import tensorflow as tf

        from tfdist.models import beam_search_decode, greedy_decode

        self.max_length = max_length
        self.batch_size = batch_size
        self.replicas = decoding_replicas(strategy)
        self.rows_per_call = batch_size * self.replicas
        if beam_size == 1:
            def decode(source):
                return greedy_decode(model, source, max_length)
        else:
            def decode(source):
                return beam_search_decode(model, source, beam_size=beam_size,
                                          length_penalty=length_penalty, max_length=max_length)
        if self.replicas == 1:
            self._strategy = None
            self._decode = tf.function(decode)
        else:
            self._strategy = strategy
            self._decode = tf.function(
                lambda source: strategy.gather(strategy.run(decode, args=(source,)), axis=0))

    def __call__(self, rows):
        """Decodes `rows_per_call` source rows (numpy int32); returns numpy `[rows, max_length]`."""
        import tensorflow as tf

        rows = np.asarray(rows, np.int32)
        if len(rows) != self.rows_per_call:
            raise ValueError(f"SentenceDecoder decodes {self.rows_per_call} rows a call, "
                             f"not {len(rows)}; pad the batch (decode_sentences does).")
        if self._strategy is None:
            return self._decode(tf.constant(rows)).numpy()
        size = self.batch_size
        shares = self._strategy.experimental_distribute_values_from_function(
            lambda context: tf.constant(rows[context.replica_id_in_sync_group * size:][:size]))
        return self._decode(shares).numpy()


def sentence_decoder(model, num_sentences, max_length, beam_size=4, length_penalty=0.6,
                     batch_size=DECODE_BATCH_SIZE, strategy=None):
    """A `SentenceDecoder` sized for `num_sentences`: `batch_size` rows per replica
    a call, fewer when the sentences fill less (so a few sentences are not padded
    to a full batch). Keep it to decode again without tracing again.

    Example:

    >>> decoder = sentence_decoder(model, 3, max_length=19, beam_size=4)
    >>> decoder.rows_per_call, decode_sentences(model, source_ids[:3], 19, decoder=decoder).shape
    (3, (3, 19))
    """
    replicas = decoding_replicas(strategy)
    per_replica = max(1, min(batch_size, -(-num_sentences // replicas)))
    return SentenceDecoder(model, max_length, beam_size, length_penalty, per_replica, strategy)


def decode_sentences(model, source_ids, max_length, beam_size=4, length_penalty=0.6,
                     batch_size=DECODE_BATCH_SIZE, decoder=None, strategy=None):
    """Decodes source id rows in batches: greedy for `beam_size` 1, else beam search.

    Each call decodes `batch_size` rows per replica of `strategy` (see the
    module docstring; one device when None); the last call is padded (fewer
    rows when there are fewer sentences) so the decoder is traced once.
    Every worker of a multi-worker strategy must call it with the same rows.

    Args:
        model: an encoder-decoder (`tfdist.models.build_seq2seq`).
        source_ids: int array `[N, source_length]`, padded with 0.
        max_length: output tokens at most (EOS included).
        beam_size: 1 (greedy) or more.
        length_penalty: the GNMT alpha (beam search only).
        batch_size: sentences per replica and decoder call.
        decoder: a `SentenceDecoder` of these settings to reuse (its
            `batch_size` and strategy then apply), or None for a new one.
        strategy: the strategy whose replicas decode, or None.

    Returns:
        int32 array `[N, max_length]` of output ids (EOS, then pads).

    Example:

    >>> decode_sentences(model, validation.source_ids[:3], max_length=31).shape
    (3, 31)
    """
    source_ids = np.asarray(source_ids, np.int32)
    if decoder is None:
        decoder = sentence_decoder(model, len(source_ids), max_length, beam_size, length_penalty,
                                   batch_size, strategy)
    rows_per_call = decoder.rows_per_call
    outputs = []
    for start in range(0, len(source_ids), rows_per_call):
        rows = source_ids[start:start + rows_per_call]
        padded = np.zeros([rows_per_call, source_ids.shape[1]], np.int32)
        padded[:len(rows)] = rows
        padded[len(rows):, 0] = rows[0, 0]  # a one-word filler, never an empty source
        outputs.append(decoder(padded)[:len(rows)])
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

        Decoding runs under the model's strategy (see the module
        docstring): with several replicas every worker decodes its share
        and gets all the outputs; the chief alone scores and prints. The
        values go into the chief's epoch logs before the loggers after this
        callback (CSV, TensorBoard, History, the progress bar) see them. At
        the end of training the chief prints `examples` translations of the
        last decode beside their references.

        Args:
            model: the encoder-decoder being trained.
            source: the held-out `TranslationTaskSource` (its first
                `num_sentences` pairs are decoded).
            beam_size, length_penalty: as `decode_sentences`.
            num_sentences: sentences decoded (all of the split's if None).
            is_chief: whether this process scores and prints.
            examples: translations printed at the end.
            print_fn: where lines go (default `print`).
            strategy: the strategy whose replicas decode (default: the
                one `model` was built under).

        Example:

        >>> callback = TranslationQuality(model, validation, beam_size=4, length_penalty=0.6)
        """

        def __init__(self, model, source, beam_size=4, length_penalty=0.6, num_sentences=None,
                     is_chief=True, examples=3, print_fn=print, strategy=None):
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
            self.strategy = strategy or getattr(model, "distribute_strategy", None)
            self.baseline = None
            self.last = None  # (scores, hypotheses as word lists); scores None off the chief
            self.decoder = None  # traced once, reused every epoch

        def decodes_here(self):
            """Whether this process decodes: the chief, and every worker when the
            strategy's replicas decode together."""
            return self.is_chief or decoding_replicas(self.strategy) > 1

        def evaluate(self):
            """Decodes the sentences and returns `(scores, hypotheses)` (scores
            None off the chief, which alone scores)."""
            source, count = self.source, self.num_sentences
            if self.decoder is None:
                self.decoder = sentence_decoder(self.translation_model, count,
                                                source.target_length + 1, self.beam_size,
                                                self.length_penalty, strategy=self.strategy)
            outputs = decode_sentences(self.translation_model, source.source_ids[:count],
                                       self.decoder.max_length, decoder=self.decoder)
            hypotheses = [source.vocabulary.decode(row) for row in outputs]
            if not self.is_chief:
                return None, hypotheses
            references = list(source.pairs.target_words[:count])
            return corpus_scores(hypotheses, references), hypotheses

        def on_epoch_end(self, epoch, logs=None):
            if not self.decodes_here():
                return
            start = time.perf_counter()
            scores, hypotheses = self.evaluate()
            seconds = time.perf_counter() - start
            self.last = (scores, hypotheses)
            if not self.is_chief:
                return
            if logs is not None:
                logs["val_bleu"] = scores["bleu"]
                logs["val_chrf"] = scores["chrf"]
            if self.baseline is None:
                self.baseline = copy_baseline_scores(self.source, self.num_sentences)
            how = ("greedy" if self.beam_size == 1
                   else f"beam {self.beam_size}, length penalty {self.length_penalty:g}")
            replicas = self.decoder.replicas
            where = f" on {replicas} replicas" if replicas > 1 else ""
            self.print_fn(
                f"  epoch {epoch + 1}: BLEU {scores['bleu']:.1f}, chrF {scores['chrf']:.1f} on "
                f"{self.num_sentences} validation sentences ({how}; copying the source: BLEU "
                f"{self.baseline['bleu']:.1f}, chrF {self.baseline['chrf']:.1f}), decoded in "
                f"{seconds:.1f} s{where}")

        def on_train_end(self, logs=None):
            if not self.examples or not self.decodes_here():
                return
            if self.last is None:  # no epoch ended in this run (e.g. resumed after the last)
                self.last = self.evaluate()  # every worker that decodes takes part
            if not self.is_chief:
                return
            _, hypotheses = self.last
            count = min(self.examples, len(hypotheses))
            self.print_fn(f"Example translations ({count} of the validation sentences):\n"
                          + example_lines(self.source.pairs.source_words, hypotheses,
                                          self.source.pairs.target_words, count))

    return TranslationQuality
