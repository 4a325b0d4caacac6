"""Tests of the embedded translation task: a synthetic language pair, its source and baselines."""

import numpy as np
import pytest

from tfdist.data import TranslationTaskSource
from tfdist.data.tokens import BOS_ID, EOS_ID, NUM_RESERVED, PAD_ID
from tfdist.data.translation_task import (DETERMINERS, INTRANSITIVE_VERBS, NAMES, NOUNS,
                                          TRANSITIVE_VERBS, TRANSLATION_VOCABULARY, copy_source_baseline,
                                          generate_sentence_pairs, most_frequent_words_baseline,
                                          strip_to_tokens, token_accuracy)


def test_generation_is_deterministic_and_splits_are_independent():
    first = generate_sentence_pairs(200, seed=3, split="train")
    again = generate_sentence_pairs(200, seed=3, split="train")
    assert first.source_words == again.source_words and first.target_words == again.target_words
    validation = generate_sentence_pairs(200, seed=3, split="validation")
    other_seed = generate_sentence_pairs(200, seed=4, split="train")
    for other in (validation, other_seed):
        same = sum(a == b for a, b in zip(first.source_words, other.source_words, strict=True))
        assert same < 20, f"{same} of 200 sentences identical at the same place"
    # The language does not depend on the seed: a sentence drawn in two
    # streams has the same translation in both.
    translations = dict(zip(first.source_words, first.target_words, strict=True))
    for source, target in zip(validation.source_words, validation.target_words, strict=True):
        if source in translations:
            assert translations[source] == target


def test_target_is_a_translation_not_a_copy_or_reversal():
    pairs = generate_sentence_pairs(500, seed=0)
    vocab = TRANSLATION_VOCABULARY
    differs = sum(s != t for s, t in zip(pairs.source_words, pairs.target_words, strict=True))
    reversed_copies = sum(tuple(reversed(s)) == t
                          for s, t in zip(pairs.source_words, pairs.target_words, strict=True))
    assert differs == 500 and reversed_copies == 0
    different_lengths = sum(len(s) != len(t)
                            for s, t in zip(pairs.source_words, pairs.target_words, strict=True))
    assert different_lengths > 250
    # Only names are spelled alike; everything else comes from the other vocabulary.
    for source, target in zip(pairs.source_words, pairs.target_words, strict=True):
        assert set(source) <= vocab.source_words and set(target) <= vocab.target_words
        assert set(source) & set(target) <= set(NAMES)
    lengths = [len(s) for s in pairs.source_words]
    assert min(lengths) >= 4 and max(lengths) <= 20 and len(set(lengths)) > 10
    assert 100 <= len(vocab.source_words) <= 200
    assert sum(len(words) == 2 for words in vocab.lexicon.values()) >= 5
    assert all(vocab.lexicon[w] != (w,) for w in vocab.source_words - set(NAMES) - {"-s"})


def test_word_order_follows_the_target_grammar():
    """Subject first (noun before determiner, `ta` before a plural noun), verb last
    with `ru` after a plural subject, `wo` right before the verb of a transitive clause."""
    lexicon = TRANSLATION_VOCABULARY.lexicon
    pairs = generate_sentence_pairs(400, seed=1)
    checked = transitive = 0
    for source, target in zip(pairs.source_words, pairs.target_words, strict=True):
        if "and" in source or "but" in source:
            continue
        if source[0] not in DETERMINERS or source[1] not in NOUNS:
            continue
        determiner, noun = source[0], source[1]
        plural = source[2] == "-s"
        subject = (["ta"] if plural else []) + list(lexicon[noun]) + list(lexicon[determiner])
        assert list(target[:len(subject)]) == subject, (source, target)
        verb = next(w for w in source if w in TRANSITIVE_VERBS or w in INTRANSITIVE_VERBS)
        ending = list(lexicon[verb]) + (["ru"] if plural else [])
        assert list(target[-len(ending):]) == ending, (source, target)
        if verb in TRANSITIVE_VERBS:
            assert target[-len(ending) - 1] == "wo"
            transitive += 1
        checked += 1
    assert checked >= 40 and transitive >= 20


def test_source_examples_are_padded_and_shifted():
    source = TranslationTaskSource(num_examples=32, seed=0, split="validation",
                                   max_source_words=10)
    assert source.num_examples == 32 and source.source_length == 10
    assert source.target_length == 15
    assert source.vocab_size == source.source_vocab_size == source.target_vocab_size == 237
    rows = list(source.read_all().as_numpy_iterator())
    assert len(rows) == 32
    for ((src, tgt_in), tgt_out), words, target in zip(
            rows, source.pairs.source_words, source.pairs.target_ids, strict=True):
        assert src.dtype == tgt_in.dtype == tgt_out.dtype == np.int32
        assert src.shape == (10,) and tgt_in.shape == tgt_out.shape == (16,)
        assert TRANSLATION_VOCABULARY.decode(src) == list(words)
        n = len(target)
        assert tgt_in[0] == BOS_ID and tgt_in[1:n + 1].tolist() == target.tolist()
        assert tgt_out[:n].tolist() == target.tolist() and tgt_out[n] == EOS_ID
        assert (tgt_in[n + 1:] == PAD_ID).all() and (tgt_out[n + 1:] == PAD_ID).all()
        assert (src[len(words):] == PAD_ID).all() and (src[:len(words)] >= NUM_RESERVED).all()


def test_baselines_and_accuracy():
    train = TranslationTaskSource(num_examples=500, seed=0)
    validation = TranslationTaskSource(num_examples=200, seed=0, split="validation")
    references = [t.tolist() for t in validation.pairs.target_ids]
    copied = copy_source_baseline(validation.source_ids)
    assert [len(c) for c in copied] == [len(s) for s in validation.pairs.source_words]
    frequent = most_frequent_words_baseline(validation.source_ids, train.pairs.target_ids)
    top = frequent[int(np.argmax([len(f) for f in frequent]))]
    assert len(set(top)) == len(top) and top[0] in TRANSLATION_VOCABULARY.encode(["wo", "na", "ke"])
    for baseline in (copied, frequent):
        assert token_accuracy(baseline, references) < 0.2
    assert token_accuracy(references, references) == 1.0
    assert strip_to_tokens(np.array([[BOS_ID, 9, 8, EOS_ID, 7]])) == [[9, 8]]


@pytest.mark.parametrize("kwargs, message", [
    (dict(num_pairs=0), r"num_pairs must be an integer >= 1, got 0"),
    (dict(num_pairs=2, split="dev"), r"Unknown split 'dev'; valid splits: train, validation"),
    (dict(num_pairs=2, max_source_words=3), r"max_source_words must be an integer >= 4, got 3"),
    (dict(num_pairs=2, seed=-1), r"seed must be an integer >= 0, got -1"),
])
def test_bad_arguments_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        generate_sentence_pairs(**kwargs)


def test_unknown_words_are_named():
    with pytest.raises(ValueError, match=r"\['zebra'\] are not in"):
        TRANSLATION_VOCABULARY.encode(["the", "zebra"])


def test_source_feeds_the_distributed_input_pipeline():
    import tensorflow as tf

    from tfdist.data import distribute_dataset

    source = TranslationTaskSource(num_examples=64, seed=0, max_source_words=10)
    dataset = distribute_dataset(tf.distribute.get_strategy(), source, global_batch_size=16,
                                 seed=0)
    (source_ids, target_input_ids), target_output_ids = next(iter(dataset))
    assert tuple(source_ids.shape) == (16, 10)
    assert tuple(target_input_ids.shape) == tuple(target_output_ids.shape) == (16, 16)
