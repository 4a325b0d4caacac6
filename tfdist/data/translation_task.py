"""An embedded translation task: a synthetic language pair, generated, needing no download.

The source language is English-like (subject-verb-object); the target
language has its own words and its own grammar. Both sides of a pair are
rendered from one sampled sentence structure, so every source sentence has
exactly one reference translation:

    source: the big dog -s often chases a red cat near this house
    target: ta dog' big' na house' ke near' often' cat' red' wo chases' ru

(primes stand for the target words, see `TRANSLATION_VOCABULARY`). The
grammar of a sentence is one clause, or two joined by a conjunction:

    source clause:  NP [adverb] verb [NP] [preposition NP]
    source NP:      determiner adjective* noun [-s]  |  name
    target clause:  NP [NP postposition] [adverb] [NP wo] verb [ru]
    target NP:      [ta] noun adjective* (reversed) [determiner]  |  name

so the target puts the verb last (SOV), adjectives after their noun and in
the reverse order, a particle `wo` after the object, prepositions after
their noun phrase (postpositions), the plural marker `ta` before the noun
instead of `-s` after it, and a verb agreement marker `ru` when the subject
is plural. The indefinite article `a` has no translation; about a quarter
of the nouns and verbs translate to two tokens (a word and a class marker);
proper names are the same word in both languages.

Ids: ONE shared id space for both languages (so a model may tie its source
and target embeddings): 0..3 are `tfdist.data.tokens`' reserved ids (pad 0,
BOS 1, SEP 2 unused, EOS 3), then the source-only words, then the names
(shared), then the target-only words; `TRANSLATION_VOCABULARY.vocab_size`
is the size of that space. The language itself is fixed (the same in every
process and for every seed); the seed only chooses which sentences are
drawn, and each split draws from its own random stream.

Example:

    source = TranslationTaskSource(num_examples=4096, split="train")
    source.vocab_size, source.source_length, source.target_length  # (237, 20, 30)
    (source_ids, target_input_ids), target_output_ids = next(iter(source.read_all()))
"""

import collections
import dataclasses
import numbers

import numpy as np
import tensorflow as tf

from tfdist.data.source import Source
from tfdist.data.tokens import BOS_ID, EOS_ID, NUM_RESERVED, PAD_ID, RESERVED_NAMES

SPLITS = ("train", "validation", "test")

NOUNS = tuple(("dog cat bird horse fish cow sheep goat mouse lion tiger bear wolf fox rabbit "
         "farmer teacher doctor child king queen baker sailor student friend house tree "
         "river boat car book apple letter garden city table door window stone flower").split())
NAMES = tuple("alice bob carol dave erin frank grace heidi".split())
ADJECTIVES = tuple(("big small red green old young happy sad tall short quick slow brave quiet "
              "bright dark heavy light warm cold").split())
TRANSITIVE_VERBS = tuple(("sees likes finds takes eats holds chases helps visits follows calls "
                    "watches builds carries paints reads opens loves hears meets").split())
INTRANSITIVE_VERBS = tuple("sleeps runs sings waits laughs swims falls dances smiles cries".split())
ADVERBS = tuple("quickly slowly often never today again quietly always".split())
PREPOSITIONS = tuple("in near under behind with from".split())
DETERMINERS = ("the", "a", "this")
CONJUNCTIONS = ("and", "but")
SOURCE_PLURAL = "-s"

TARGET_PLURAL = "ta"
OBJECT_PARTICLE = "wo"
PLURAL_AGREEMENT = "ru"
CLASS_MARKERS = ("po", "ki", "mu", "se")
TARGET_DETERMINERS = {"the": ("na",), "a": (), "this": ("ke",)}
TARGET_CONJUNCTIONS = {"and": ("i",), "but": ("ga",)}

_LANGUAGE_SEED = 20260426  # fixes the target words; not a data seed
_SYLLABLES = tuple(c + v for c in "bdfghklmnprstvz" for v in "aeiou")


class TranslationVocabulary:
    """The shared word <-> id table of the synthetic language pair, and its word mapping.

    Build it once (it is deterministic); use the module's
    `TRANSLATION_VOCABULARY`.

    Attributes:
        words: tuple of all words; `words[i]` is the word of id `i`
            (`<pad>`, `<bos>`, `<sep>`, `<eos>` for the reserved ids).
        vocab_size: `len(words)`.
        source_words: the words a source sentence can hold.
        target_words: the words a target sentence can hold (names are in both).
        lexicon: source word -> tuple of target words (empty for `a`,
            two words for about a quarter of nouns and verbs, the same word
            for names). Grammatical words (`-s`, `wo`, `ru`, `ta`) are
            placed by the grammar, not by the lexicon.

    Example:

    >>> vocab = TranslationVocabulary()
    >>> vocab.decode(vocab.encode(["the", "dog", "sleeps"]))
    ['the', 'dog', 'sleeps']
    """

    def __init__(self):
        rng = np.random.default_rng(_LANGUAGE_SEED)
        content = NOUNS + ADJECTIVES + TRANSITIVE_VERBS + INTRANSITIVE_VERBS + ADVERBS + PREPOSITIONS
        function_target = (TARGET_PLURAL, OBJECT_PARTICLE, PLURAL_AGREEMENT) + CLASS_MARKERS + tuple(
            w for words in (*TARGET_DETERMINERS.values(), *TARGET_CONJUNCTIONS.values())
            for w in words)
        taken = set(function_target) | set(content) | set(NAMES)
        invented = []
        while len(invented) < len(content):
            word = "".join(rng.choice(_SYLLABLES, size=rng.integers(2, 4)))
            if word not in taken:
                taken.add(word)
                invented.append(word)
        lexicon = {}
        for source_word, target_word in zip(content, invented, strict=True):
            lexicon[source_word] = (target_word,)
        for source_word in NOUNS + TRANSITIVE_VERBS + INTRANSITIVE_VERBS:
            if rng.random() < 0.25:
                lexicon[source_word] += (CLASS_MARKERS[rng.integers(len(CLASS_MARKERS))],)
        for name in NAMES:
            lexicon[name] = (name,)
        lexicon.update(TARGET_DETERMINERS)
        lexicon.update(TARGET_CONJUNCTIONS)
        self.lexicon = lexicon

        source_only = (content + DETERMINERS + CONJUNCTIONS
                       + (SOURCE_PLURAL,))
        target_only = tuple(invented) + function_target
        self.words = (tuple(RESERVED_NAMES[i] for i in range(NUM_RESERVED))
                      + source_only + NAMES + target_only)
        self.vocab_size = len(self.words)
        self.source_words = frozenset(source_only + NAMES)
        self.target_words = frozenset(target_only + NAMES)
        self._ids = {word: i for i, word in enumerate(self.words)}

    def encode(self, words):
        """Returns the int32 ids of a list of words (no BOS/EOS added).

        Raises:
            ValueError: a word is not in the vocabulary (it is named).

        Example:

        >>> TRANSLATION_VOCABULARY.encode(["alice"]).dtype
        dtype('int32')
        """
        unknown = [w for w in words if w not in self._ids]
        if unknown:
            raise ValueError(f"Words {unknown[:5]} are not in the synthetic language pair's "
                             f"vocabulary; see TRANSLATION_VOCABULARY.words.")
        return np.array([self._ids[w] for w in words], np.int32)

    def decode(self, ids):
        """Returns the words of ids, stopping at EOS and skipping pad and BOS.

        Args:
            ids: iterable of ints (a 1-D array or tensor too).

        Example:

        >>> vocab = TRANSLATION_VOCABULARY
        >>> vocab.decode([1, *vocab.encode(["bob", "runs"]), 3, 0, 0])
        ['bob', 'runs']
        """
        words = []
        for token in np.asarray(ids).reshape(-1).tolist():
            if token == EOS_ID:
                break
            if token in (PAD_ID, BOS_ID):
                continue
            words.append(self.words[token])
        return words

    def __repr__(self):
        return (f"TranslationVocabulary(vocab_size={self.vocab_size}, "
                f"{len(self.source_words)} source words, {len(self.target_words)} target words)")


TRANSLATION_VOCABULARY = TranslationVocabulary()
"""The one vocabulary of the synthetic language pair (fixed, shared id space)."""


@dataclasses.dataclass(frozen=True)
class SentencePairs:
    """Generated sentence pairs, as words and as unpadded int32 id arrays.

    Example:

    >>> pairs = generate_sentence_pairs(2, seed=0)
    >>> len(pairs), list(pairs.source_words[0]) == TRANSLATION_VOCABULARY.decode(pairs.source_ids[0])
    (2, True)
    """

    source_words: tuple
    target_words: tuple
    source_ids: tuple
    target_ids: tuple

    def __len__(self):
        return len(self.source_words)


def _noun_phrase(rng):
    """Returns (source words, target words, plural) of one noun phrase."""
    lexicon = TRANSLATION_VOCABULARY.lexicon
    if rng.random() < 0.15:
        name = NAMES[rng.integers(len(NAMES))]
        return [name], [name], False
    determiner = DETERMINERS[rng.integers(len(DETERMINERS))]
    adjectives = [ADJECTIVES[i] for i in rng.choice(
        len(ADJECTIVES), size=rng.choice(3, p=[0.5, 0.35, 0.15]), replace=False)]
    noun = NOUNS[rng.integers(len(NOUNS))]
    plural = determiner != "a" and rng.random() < 0.35
    source = [determiner, *adjectives, noun] + ([SOURCE_PLURAL] if plural else [])
    target = (([TARGET_PLURAL] if plural else []) + list(lexicon[noun])
              + [t for a in reversed(adjectives) for t in lexicon[a]]
              + list(lexicon[determiner]))
    return source, target, plural


def _clause(rng):
    """Returns (source words, target words) of one clause."""
    lexicon = TRANSLATION_VOCABULARY.lexicon
    subject_source, subject_target, plural = _noun_phrase(rng)
    adverb = [ADVERBS[rng.integers(len(ADVERBS))]] if rng.random() < 0.3 else []
    if rng.random() < 0.7:
        verb = TRANSITIVE_VERBS[rng.integers(len(TRANSITIVE_VERBS))]
        object_source, object_target, _ = _noun_phrase(rng)
        object_target = object_target + [OBJECT_PARTICLE]
    else:
        verb = INTRANSITIVE_VERBS[rng.integers(len(INTRANSITIVE_VERBS))]
        object_source, object_target = [], []
    place_source, place_target = [], []
    if rng.random() < 0.3:
        preposition = PREPOSITIONS[rng.integers(len(PREPOSITIONS))]
        np_source, np_target, _ = _noun_phrase(rng)
        place_source = [preposition, *np_source]
        place_target = np_target + list(lexicon[preposition])
    source = subject_source + adverb + [verb] + object_source + place_source
    target = (subject_target + place_target + [t for a in adverb for t in lexicon[a]]
              + object_target + list(lexicon[verb])
              + ([PLURAL_AGREEMENT] if plural else []))
    return source, target


def _check_int(name, value, minimum):
    if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}.")


def _check_split(split):
    if split not in SPLITS:
        raise ValueError(f"Unknown split {split!r}; valid splits: {', '.join(SPLITS)}.")


def generate_sentence_pairs(num_pairs, seed=0, split="train", min_source_words=4,
                            max_source_words=20, max_target_words=None):
    """Generates `num_pairs` (source sentence, reference translation) pairs.

    Deterministic: the same arguments always give the same pairs; each split
    draws from its own random stream (`numpy.random.default_rng([seed,
    split index])`), so train, validation and test are independent samples
    (a short sentence may occur in more than one split, as in real corpora).
    Sentences outside the length bounds are drawn again.

    Args:
        num_pairs: number of pairs, >= 1.
        seed: integer seed of the sentence sampling (the language is fixed).
        split: one of `SPLITS`.
        min_source_words: shortest source sentence, >= 1.
        max_source_words: longest source sentence, >= min_source_words.
        max_target_words: longest target sentence; default
            `target_length_bound(max_source_words)`.

    Returns:
        A `SentencePairs`.

    Example:

    >>> pairs = generate_sentence_pairs(3, seed=1, split="validation")
    >>> [len(words) for words in pairs.source_words]  # doctest: +SKIP
    [9, 4, 14]
    """
    _check_int("num_pairs", num_pairs, 1)
    _check_int("seed", seed, 0)
    _check_split(split)
    _check_int("min_source_words", min_source_words, 1)
    _check_int("max_source_words", max_source_words, min_source_words)
    if max_target_words is None:
        max_target_words = target_length_bound(max_source_words)
    _check_int("max_target_words", max_target_words, 1)
    rng = np.random.default_rng([int(seed), SPLITS.index(split)])
    sources, targets = [], []
    attempts = 0
    while len(sources) < num_pairs:
        attempts += 1
        if attempts > 100 * num_pairs + 1000:
            raise ValueError(
                f"Could not draw sentences of {min_source_words}..{max_source_words} source "
                f"and at most {max_target_words} target words; widen the bounds.")
        source, target = _clause(rng)
        if rng.random() < 0.25:
            conjunction = CONJUNCTIONS[rng.integers(len(CONJUNCTIONS))]
            second_source, second_target = _clause(rng)
            source = source + [conjunction] + second_source
            target = target + list(TRANSLATION_VOCABULARY.lexicon[conjunction]) + second_target
        if (min_source_words <= len(source) <= max_source_words
                and len(target) <= max_target_words):
            sources.append(tuple(source))
            targets.append(tuple(target))
    encode = TRANSLATION_VOCABULARY.encode
    return SentencePairs(tuple(sources), tuple(targets), tuple(encode(s) for s in sources),
                         tuple(encode(t) for t in targets))


def target_length_bound(max_source_words):
    """Returns the default longest target sentence for `max_source_words`: `ceil(1.5 * n)`.

    A source word gives at most two target words and a clause adds at most
    two grammatical words (`wo`, `ru`), but long targets are rare: among
    10,000 sentences of at most 20 source words none had more than 26
    target words. The rare pair longer than this bound is drawn again.

    Example:

    >>> target_length_bound(20)
    30
    """
    _check_int("max_source_words", max_source_words, 1)
    return (3 * max_source_words + 1) // 2


def pad_rows(rows, length):
    """Right-pads 1-D int sequences with the pad id 0 into an int32 `[len(rows), length]` array.

    Raises:
        ValueError: a row is longer than `length`.

    Example:

    >>> pad_rows([[5, 6], [7]], 3).tolist()
    [[5, 6, 0], [7, 0, 0]]
    """
    out = np.full([len(rows), length], PAD_ID, np.int32)
    for i, row in enumerate(rows):
        if len(row) > length:
            raise ValueError(f"Row {i} has {len(row)} tokens, more than length={length}.")
        out[i, :len(row)] = row
    return out


class PaddedPairsSource(Source):
    """A `Source` of sentence pairs held as padded int32 id arrays.

    Each example is `((source_ids, target_input_ids), target_output_ids)`:
    the source padded with 0 to `source_length`, `[BOS] + target` and
    `target + [EOS]` padded with 0 to `target_length + 1`. A subclass sets
    `pairs` (a `SentencePairs`), `source_length` and `target_length`, then
    calls `pad_pairs()`.

    Example:

    >>> source = TranslationTaskSource(num_examples=4)
    >>> int(source.target_input_ids[0, 0]) == BOS_ID
    True
    """

    def pad_pairs(self):
        """Sets `source_ids`, `target_input_ids` and `target_output_ids` from `pairs`.

        Example:

        >>> source.pad_pairs()  # in a subclass's __init__, after pairs and lengths
        """
        bos = np.array([BOS_ID], np.int32)
        eos = np.array([EOS_ID], np.int32)
        self.source_ids = pad_rows(self.pairs.source_ids, self.source_length)
        self.target_input_ids = pad_rows(
            [np.concatenate([bos, t]) for t in self.pairs.target_ids], self.target_length + 1)
        self.target_output_ids = pad_rows(
            [np.concatenate([t, eos]) for t in self.pairs.target_ids], self.target_length + 1)

    @property
    def num_examples(self):
        return len(self.pairs)

    def to_example(self, decoded):
        """One record as its example: records are ready padded pairs, so a
        positioned pipeline skips them without running a function on them.

        Example:

        >>> (source_ids, target_inputs), target_outputs = source.to_example(record)
        """
        return decoded

    def read_all(self):
        """Every pair, in the order held, as a `tf.data.Dataset` of padded ids.

        Example:

        >>> TranslationTaskSource(4).read_all().element_spec[1].shape
        TensorShape([31])
        """
        return tf.data.Dataset.from_tensor_slices(
            ((self.source_ids, self.target_input_ids), self.target_output_ids))


class TranslationTaskSource(PaddedPairsSource):
    """The synthetic language pair as an in-memory `Source` of padded id arrays.

    Each example is `((source_ids, target_input_ids), target_output_ids)`,
    int32: `source_ids` is the source sentence padded with 0 to
    `source_length`; `target_input_ids` is `[BOS] + target` and
    `target_output_ids` is `target + [EOS]`, both padded with 0 to
    `target_length + 1`. Train with a loss that ignores target id 0.

    Args:
        num_examples: sentence pairs in the split.
        seed: sampling seed (the language is fixed).
        split: "train", "validation" or "test" (independent streams).
        min_source_words, max_source_words: source length bounds.
        max_target_words: target length bound; default
            `target_length_bound(max_source_words)`.

    Attributes:
        pairs: the `SentencePairs` (words and unpadded ids).
        vocab_size, source_vocab_size, target_vocab_size: all the size of
            the shared id space.
        source_length: `max_source_words`; target_length: `max_target_words`
            (the model's decoder sees `target_length + 1` positions).
        vocabulary: `TRANSLATION_VOCABULARY`.

    Example:

    >>> source = TranslationTaskSource(num_examples=8, split="validation")
    >>> (src, tgt_in), tgt_out = next(iter(source.read_all()))
    >>> src.shape[0] == source.source_length, tgt_in.shape[0] == source.target_length + 1
    (True, True)
    """

    def __init__(self, num_examples=8192, seed=0, split="train", min_source_words=4,
                 max_source_words=20, max_target_words=None):
        if max_target_words is None:
            _check_int("max_source_words", max_source_words, 1)
            max_target_words = target_length_bound(max_source_words)
        self.pairs = generate_sentence_pairs(num_examples, seed, split, min_source_words,
                                             max_source_words, max_target_words)
        self.vocabulary = TRANSLATION_VOCABULARY
        self.vocab_size = self.source_vocab_size = self.target_vocab_size = (
            TRANSLATION_VOCABULARY.vocab_size)
        self.source_length = int(max_source_words)
        self.target_length = int(max_target_words)
        self.seed = seed
        self.split = split
        self.pad_pairs()

    def describe(self):
        return (f"TranslationTaskSource(split={self.split!r}, {self.num_examples} pairs, "
                f"vocab_size={self.vocab_size}, source_length={self.source_length}, "
                f"target_length={self.target_length})")


def copy_source_baseline(source_ids):
    """The "copy the source" baseline: each translation is its source sentence's ids.

    The source ids are read as target ids unchanged, so only words spelled
    the same in both languages (the names) can match the reference.

    Args:
        source_ids: iterable of 1-D int id sequences (padded or not).

    Returns:
        A list of int lists, pads removed.

    Example:

    >>> copy_source_baseline(np.array([[7, 8, 0]]))
    [[7, 8]]
    """
    return [[int(t) for t in np.asarray(row).reshape(-1) if t != PAD_ID] for row in source_ids]


def most_frequent_words_baseline(source_ids, training_target_ids):
    """The "most frequent target words" baseline: ignores the source's words, keeps its length.

    Each translation is the target words most frequent in the training
    targets, most frequent first, as many as the source sentence has words.

    Args:
        source_ids: iterable of 1-D int id sequences (padded or not).
        training_target_ids: iterable of 1-D int target id sequences (pad,
            BOS and EOS are not counted).

    Returns:
        A list of int lists.

    Example:

    >>> most_frequent_words_baseline([[9, 9, 0]], [[5, 6, 5], [5, 7]])
    [[5, 6]]
    """
    counts = collections.Counter(
        int(t) for row in training_target_ids for t in np.asarray(row).reshape(-1)
        if t not in (PAD_ID, BOS_ID, EOS_ID))
    ranked = [token for token, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))]
    lengths = [int(np.count_nonzero(np.asarray(row) != PAD_ID)) for row in source_ids]
    return [[ranked[i % len(ranked)] for i in range(n)] for n in lengths]


def strip_to_tokens(ids):
    """Returns the tokens of id rows up to (not including) EOS, without pad and BOS.

    Args:
        ids: iterable of 1-D int id sequences, e.g. a decoder's output.

    Example:

    >>> strip_to_tokens(np.array([[1, 7, 8, 3, 9, 0]]))
    [[7, 8]]
    """
    rows = []
    for row in ids:
        tokens = []
        for token in np.asarray(row).reshape(-1).tolist():
            if token == EOS_ID:
                break
            if token not in (PAD_ID, BOS_ID):
                tokens.append(token)
        rows.append(tokens)
    return rows


def token_accuracy(hypotheses, references):
    """Fraction of reference tokens that the hypothesis has at the same position.

    A position past the hypothesis's end counts as wrong; extra hypothesis
    tokens past the reference's end are not counted (BLEU punishes them).

    Args:
        hypotheses: list of int (or word) lists.
        references: list of int (or word) lists, as many.

    Example:

    >>> token_accuracy([[5, 6], [7]], [[5, 9], [7, 8]])
    0.5
    """
    if len(hypotheses) != len(references):
        raise ValueError(f"Got {len(hypotheses)} hypotheses for {len(references)} references; "
                         "pass one hypothesis per reference.")
    correct = total = 0
    for hypothesis, reference in zip(hypotheses, references, strict=True):
        total += len(reference)
        correct += sum(h == r for h, r in zip(hypothesis, reference))
    return correct / total if total else 0.0
