"""Batched greedy and beam-search decoding for encoder-decoder models such as `build_seq2seq`.

Both decoders take a model that maps `(source_ids [B, S], target_input_ids
[B, T])` to logits `[B, T, V]` with causal target attention, feed it BOS
(`tfdist.data.tokens.BOS_ID`) first and stop a sequence at EOS. They run
the WHOLE model on the whole fixed-length target buffer at every step (no
key/value cache: simple and exact, and `max_length` times the work of one
forward pass), inside a `tf.while_loop` over tensors of fixed shapes, so
they can be wrapped in `tf.function` and run under a `tf.distribute`
strategy (`strategy.run`).

Outputs are int32 `[B, max_length]` ids WITHOUT the BOS, each row ending
with its EOS (unless `max_length` ran out first) and padded with 0 after
it; `tfdist.data.translation_task.strip_to_tokens` turns them into token
lists. Scores are summed natural-log probabilities of the output tokens
(EOS included) divided by the GNMT length penalty `((5 + length) / 6) **
alpha` (Wu et al. 2016); `alpha = 0` gives the plain log-probability.

Example:

    model = build_seq2seq(config)           # trained
    ids = greedy_decode(model, source_ids, max_length=31)
    ids, scores = beam_search_decode(model, source_ids, beam_size=4, length_penalty=0.6,
                                     max_length=31, return_scores=True)
"""

import tensorflow as tf

from tfdist.data.tokens import BOS_ID, EOS_ID, PAD_ID
from tfdist.runtime.argtypes import check_int_at_least, check_number

_NEGATIVE = -1e9  # a log-probability that never wins; finite, so no inf - inf NaNs


def gnmt_length_penalty(length, alpha):
    """The GNMT length penalty `((5 + length) / 6) ** alpha` (Wu et al. 2016, eq. 14).

    Args:
        length: number of output tokens (EOS included), int or tensor.
        alpha: strength; 0 disables the penalty (always 1).

    Example:

    >>> float(gnmt_length_penalty(7, 1.0))
    2.0
    """
    length = tf.cast(length, tf.float32)
    return tf.pow((5.0 + length) / 6.0, tf.cast(alpha, tf.float32))


def _check_model(model):
    if not callable(model):
        raise TypeError(f"model must be an encoder-decoder Keras model (build_seq2seq), got "
                        f"{model!r}.")


def _check_arguments(model, max_length, beam_size=1, length_penalty=0.0):
    _check_model(model)
    check_int_at_least("max_length", max_length, 1)
    check_int_at_least("beam_size", beam_size, 1)
    check_number("length_penalty (alpha)", length_penalty, at_least=0,
                 hint="0 disables it, 0.6 is GNMT's choice")
    positions = _target_positions(model)
    if positions is not None and max_length > positions:
        raise ValueError(
            f"max_length={max_length} is longer than the model's {positions} target "
            f"positions; decode at most {positions} tokens or build the model with a larger "
            f"target_max_len.")


def _layer_number(model, names, attribute):
    """`attribute` of the first of the layers `names` the model has, else None (another model)."""
    for name in names:
        try:
            return int(getattr(model.get_layer(name), attribute))
        except (ValueError, AttributeError, TypeError):
            continue
    return None


def _target_positions(model):
    return _layer_number(model, ("target_positions",), "max_len")


def _token_ids(name, ids, model, side):
    """`ids` as an int32 `[batch, length]` tensor, checked against the model's `side`
    ("source" or "target") positions and vocabulary where the model names them (a
    `build_seq2seq` model does): out of range, TensorFlow fails deep inside the model on
    a CPU, and a GPU's gather reads zeros without a word."""
    ids = tf.convert_to_tensor(ids, tf.int32)
    if ids.shape.rank is not None and ids.shape.rank != 2:
        raise ValueError(f"{name} must be token ids of shape [batch, length], got shape "
                         f"{ids.shape.as_list()}.")
    positions = _layer_number(model, (f"{side}_positions",), "max_len")
    length = ids.shape[1]
    if positions is not None and length is not None and length > positions:
        raise ValueError(f"{name} has {length} positions, more than the model's {positions} "
                         f"{side} positions: cut it to {positions}, or build the model with "
                         f"{side}_max_len >= {length}.")
    vocab = _layer_number(model, (f"{side}_embedding", "shared_embedding"), "vocab_size")
    if vocab is not None and tf.executing_eagerly() and tf.size(ids) > 0:
        low, high = int(tf.reduce_min(ids)), int(tf.reduce_max(ids))
        if low < 0 or high >= vocab:
            raise ValueError(f"{name} holds {low if low < 0 else high}, not a token id of the "
                             f"model's {side} vocabulary [0, {vocab}).")
    return ids


def _step_log_probs(model, source_ids, decoder_input, t):
    """Log-probabilities `[batch, vocab]` of the token after position t."""
    logits = model((source_ids, decoder_input), training=False)
    step = tf.gather(tf.cast(logits, tf.float32), t, axis=1)
    return tf.nn.log_softmax(step, axis=-1)


def greedy_decode(model, source_ids, max_length, return_scores=False):
    """Decodes a batch greedily: at each step the most probable token (never pad).

    Runs the whole model at every step (no key/value cache); `tf.function`
    compatible (a `tf.while_loop` over fixed shapes) and stops early once
    every sequence has produced EOS.

    Args:
        model: an encoder-decoder Keras model (`build_seq2seq`).
        source_ids: int `[batch, source_len]`, padded with 0.
        max_length: most tokens to produce (EOS included); at most the
            model's `target_max_len`.
        return_scores: also return each sequence's log-probability.

    Returns:
        int32 `[batch, max_length]` ids (no BOS; EOS kept; 0 after it), and
        with `return_scores` a float32 `[batch]` of summed log-probabilities.

    Example:

    >>> ids = greedy_decode(model, np.array([[9, 12, 7, 0]]), max_length=12)
    >>> ids.shape
    TensorShape([1, 12])
    """
    _check_arguments(model, max_length)
    source_ids = _token_ids("source_ids", source_ids, model, "source")
    batch = tf.shape(source_ids)[0]
    positions = tf.range(max_length)

    def body(t, decoder_input, outputs, finished, scores):
        log_probs = _step_log_probs(model, source_ids, decoder_input, t)
        log_probs = tf.where(tf.equal(tf.range(tf.shape(log_probs)[-1]), PAD_ID)[None],
                             _NEGATIVE, log_probs)
        token = tf.argmax(log_probs, axis=-1, output_type=tf.int32)
        token = tf.where(finished, PAD_ID, token)
        gained = tf.reduce_max(log_probs, axis=-1)
        scores = scores + tf.where(finished, 0.0, gained)
        outputs = outputs + tf.cast(tf.equal(positions, t), tf.int32)[None] * token[:, None]
        decoder_input = (decoder_input
                         + tf.cast(tf.equal(positions, t + 1), tf.int32)[None] * token[:, None])
        return t + 1, decoder_input, outputs, finished | tf.equal(token, EOS_ID), scores

    def cond(t, decoder_input, outputs, finished, scores):
        return tf.logical_and(t < max_length, tf.logical_not(tf.reduce_all(finished)))

    decoder_input = tf.concat([tf.fill([batch, 1], BOS_ID),
                               tf.zeros([batch, max_length - 1], tf.int32)], axis=1)
    initial = (tf.constant(0), decoder_input, tf.zeros([batch, max_length], tf.int32),
               tf.zeros([batch], tf.bool), tf.zeros([batch], tf.float32))
    _, _, outputs, _, scores = tf.while_loop(cond, body, initial)
    return (outputs, scores) if return_scores else outputs


def beam_search_decode(model, source_ids, beam_size=4, length_penalty=0.6, max_length=None,
                       return_scores=False):
    """Decodes a batch with beam search and the GNMT length penalty.

    Keeps `beam_size` hypotheses per sentence, ranked by log-probability
    divided by `((5 + length) / 6) ** length_penalty`; a hypothesis that
    produced EOS stays in its beam with its score (continuing with pad at no
    cost) until better ones push it out. Stops when every kept hypothesis
    has ended or after `max_length` tokens, and returns the best one.
    Runs the whole model on `batch * beam_size` rows at every step (no
    key/value cache); `tf.function` compatible (fixed shapes).
    `beam_size=1` gives exactly `greedy_decode`'s output.

    Args:
        model: an encoder-decoder Keras model (`build_seq2seq`).
        source_ids: int `[batch, source_len]`, padded with 0.
        beam_size: hypotheses kept per sentence, >= 1.
        length_penalty: alpha >= 0 (0: plain log-probability; GNMT uses 0.6).
        max_length: most tokens to produce (EOS included), required.
        return_scores: also return the best hypotheses' penalised scores.

    Returns:
        int32 `[batch, max_length]` ids (no BOS; EOS kept; 0 after it), and
        with `return_scores` a float32 `[batch]` of their scores.

    Example:

    >>> ids, scores = beam_search_decode(model, source_ids, beam_size=4, length_penalty=0.6,
    ...                                  max_length=31, return_scores=True)
    """
    if max_length is None:
        raise ValueError("beam_search_decode needs max_length (most tokens to produce, EOS "
                         "included), e.g. the data's target_length + 1.")
    _check_arguments(model, max_length, beam_size, length_penalty)
    source_ids = _token_ids("source_ids", source_ids, model, "source")
    batch = tf.shape(source_ids)[0]
    k = beam_size
    positions = tf.range(max_length)
    repeated_source = tf.repeat(source_ids, k, axis=0)  # row b * k + j is sentence b

    def body(t, decoder_input, outputs, finished, log_probs, lengths):
        step = _step_log_probs(model, repeated_source,
                               tf.reshape(decoder_input, [batch * k, max_length]), t)
        vocab = tf.shape(step)[-1]
        step = tf.reshape(step, [batch, k, vocab])
        is_pad = tf.equal(tf.range(vocab), PAD_ID)[None, None]
        alive_step = tf.where(is_pad, _NEGATIVE, step)
        ended_step = tf.where(is_pad, 0.0, _NEGATIVE) + tf.zeros_like(step)
        step = tf.where(finished[..., None], ended_step, alive_step)
        candidates = log_probs[..., None] + step                       # [B, K, V]
        new_lengths = lengths + tf.where(finished, 0, 1)                # [B, K]
        ranked = candidates / gnmt_length_penalty(new_lengths, length_penalty)[..., None]
        _, top = tf.math.top_k(tf.reshape(ranked, [batch, k * vocab]), k=k)
        beam, token = top // vocab, top % vocab
        log_probs = tf.gather(tf.reshape(candidates, [batch, k * vocab]), top, batch_dims=1)
        lengths = tf.gather(new_lengths, beam, batch_dims=1)
        finished = tf.gather(finished, beam, batch_dims=1) | tf.equal(token, EOS_ID)
        outputs = (tf.gather(outputs, beam, batch_dims=1)
                   + tf.cast(tf.equal(positions, t), tf.int32)[None, None] * token[..., None])
        decoder_input = (tf.gather(decoder_input, beam, batch_dims=1)
                         + tf.cast(tf.equal(positions, t + 1), tf.int32)[None, None]
                         * token[..., None])
        return t + 1, decoder_input, outputs, finished, log_probs, lengths

    def cond(t, decoder_input, outputs, finished, log_probs, lengths):
        return tf.logical_and(t < max_length, tf.logical_not(tf.reduce_all(finished)))

    decoder_input = tf.concat([tf.fill([batch, k, 1], BOS_ID),
                               tf.zeros([batch, k, max_length - 1], tf.int32)], axis=2)
    first_beam_only = tf.concat([tf.zeros([batch, 1]), tf.fill([batch, k - 1], _NEGATIVE)], 1)
    initial = (tf.constant(0), decoder_input, tf.zeros([batch, k, max_length], tf.int32),
               tf.zeros([batch, k], tf.bool), first_beam_only, tf.zeros([batch, k], tf.int32))
    _, _, outputs, _, log_probs, lengths = tf.while_loop(cond, body, initial)
    scores = log_probs / gnmt_length_penalty(lengths, length_penalty)
    best = tf.argmax(scores, axis=1, output_type=tf.int32)
    best_outputs = tf.gather(outputs, best, batch_dims=1)
    return (best_outputs, tf.gather(scores, best, batch_dims=1)) if return_scores else best_outputs


def sequence_scores(model, source_ids, output_ids, length_penalty=0.0):
    """Scores given outputs by teacher forcing: summed log-probability / length penalty.

    The score the decoders return for their own outputs, for any outputs
    (e.g. to compare greedy and beam-search results, or rank references).

    Args:
        model: an encoder-decoder Keras model.
        source_ids: int `[batch, source_len]`.
        output_ids: int `[batch, length]` in the decoders' format (no BOS,
            pads after the end).
        length_penalty: alpha >= 0.

    Returns:
        float32 `[batch]`.

    Example:

    >>> ids, scores = beam_search_decode(model, src, 4, 0.6, 31, return_scores=True)
    >>> np.allclose(sequence_scores(model, src, ids, 0.6), scores, atol=1e-4)
    True
    """
    _check_model(model)
    check_number("length_penalty (alpha)", length_penalty, at_least=0)
    source_ids = _token_ids("source_ids", source_ids, model, "source")
    output_ids = _token_ids("output_ids", output_ids, model, "target")
    rows = (source_ids.shape[0], output_ids.shape[0])
    if None not in rows and rows[0] != rows[1]:
        raise ValueError(f"source_ids has {rows[0]} rows and output_ids {rows[1]}: one output "
                         "per source sentence.")
    batch = tf.shape(output_ids)[0]
    decoder_input = tf.concat([tf.fill([batch, 1], BOS_ID), output_ids[:, :-1]], axis=1)
    logits = tf.cast(model((source_ids, decoder_input), training=False), tf.float32)
    token_log_probs = -tf.nn.sparse_softmax_cross_entropy_with_logits(labels=output_ids,
                                                                      logits=logits)
    real = tf.not_equal(output_ids, PAD_ID)
    total = tf.reduce_sum(tf.where(real, token_log_probs, 0.0), axis=1)
    lengths = tf.reduce_sum(tf.cast(real, tf.int32), axis=1)
    return total / gnmt_length_penalty(lengths, length_penalty)
