"""Real translation data: sentence pairs from line-aligned text files or TFDS, as a `Source`
of subword ids (`tfdist.data.subword`).

    text:SRC_FILE,TGT_FILE       line i of SRC_FILE translates to line i of TGT_FILE
    tfds:wmt14_translate/de-en   a TFDS translation dataset; its supervised keys
                                 (`de`, `en`) are the source and target fields

The text is tokenised ONCE, when the source is built, into padded int32
arrays held in memory (`SubwordPairsSource`), not inside tf.data with
`tf.py_function`: SentencePiece is Python, and a `py_function` runs in the
Python interpreter, cannot be serialised with the dataset, and holds the
GIL in the input pipeline. Arrays read with `from_tensor_slices` are the
same for every reader, so the pipeline stays deterministic and positionable
(an iterator checkpoint or `skip(n)` lands on the same example after a
resume), exactly like the embedded task. The cost is memory: about
`4 * (source_length + 2 * (target_length + 1))` bytes a pair (WMT14 de-en's
4.5 million pairs at 64 tokens: about 3.5 GB); cap it with `limit`.

Example:

    sources, targets = read_text_pairs("train.de", "train.en")
    tokenizer = load_or_train_tokenizer("runs/x/tokenizer", sources + targets, 8000)
    train = SubwordPairsSource(sources, targets, tokenizer, 64, 64, split="train")
"""

import os

from tfdist.data.translation_task import PaddedPairsSource, SentencePairs


def read_text_pairs(source_file, target_file):
    """The lines of two line-aligned files (line ends removed), as two lists.

    Raises:
        FileNotFoundError: a file is missing (it is named).
        ValueError: the files differ in line count (both files and counts are named).

    Example:

    >>> sources, targets = read_text_pairs("train.de", "train.en")
    """
    sides = []
    for side, path in (("source", source_file), ("target", target_file)):
        if not os.path.isfile(path):
            raise FileNotFoundError(f"the {side} file {path} does not exist (text:SOURCE_FILE,"
                                    "TARGET_FILE names two line-aligned local files).")
        with open(path, encoding="utf-8") as stream:
            sides.append([line.rstrip("\r\n") for line in stream])
    sources, targets = sides
    if len(sources) != len(targets):
        raise ValueError(f"{source_file} has {len(sources)} lines but {target_file} has "
                         f"{len(targets)}; line-aligned translation files have one line per "
                         "sentence on each side.")
    return sources, targets


def read_tfds_pairs(name, split="train", data_dir=None, download=False, limit=None):
    """The source and target sentences of a TFDS translation dataset's split.

    The fields are the dataset's supervised keys (`wmt14_translate/de-en`:
    `de` -> `en`).

    Args:
        name: TFDS name with its language-pair config.
        split: a split (expression); `validation` falls back to `test`.
        data_dir: TFDS data directory (default TFDS's).
        download: download and prepare when missing.
        limit: read at most this many pairs (None: all).

    Returns:
        `(sources, targets, (source_key, target_key))`.

    Raises:
        DatasetNotPreparedError: not prepared and `download=False`.
        ValueError: the dataset has no (source, target) supervised keys.

    Example:

    >>> sources, targets, keys = read_tfds_pairs("wmt14_translate/de-en", limit=1000)
    """
    from tfdist.data.tfds_common import EVALUATION_SPLIT, prepared_builder, resolve_split

    builder = prepared_builder(name, data_dir=data_dir, download=download)
    keys = builder.info.supervised_keys
    if not keys or len(keys) != 2 or not all(isinstance(key, str) for key in keys):
        raise ValueError(f"TFDS dataset {name!r} has no (source, target) text fields as its "
                         f"supervised keys ({keys!r}); use a translation dataset such as "
                         "wmt14_translate/de-en.")
    if split == "validation" and builder.info.splits.keys() and \
            "validation" not in builder.info.splits.keys():
        split = EVALUATION_SPLIT
    dataset = builder.as_dataset(split=resolve_split(builder, split, name), shuffle_files=False)
    if limit is not None:
        dataset = dataset.take(limit)
    sources, targets = [], []
    for example in dataset.as_numpy_iterator():
        sources.append(example[keys[0]].decode("utf-8"))
        targets.append(example[keys[1]].decode("utf-8"))
    return sources, targets, tuple(keys)


class SubwordPairsSource(PaddedPairsSource):
    """Sentence pairs tokenised once into padded subword id arrays (see the module docstring).

    Each example is `((source_ids, target_input_ids), target_output_ids)`
    like `tfdist.data.TranslationTaskSource`'s: `[BOS] + target` and
    `target + [EOS]`, padded with 0. Pairs with an empty side are dropped;
    pairs longer than the lengths are dropped (`drop_long`, for training) or
    cut to them (for validation: every sentence keeps its full reference text).

    Args:
        sources, targets: lists of strings, as many.
        tokenizer: a `tfdist.data.subword.SubwordTokenizer`.
        source_length: source tokens at most.
        target_length: target tokens at most (the decoder sees one more).
        split: a name for messages.
        drop_long: drop (True) or cut (False) over-long pairs.
        name: where the pairs came from, for `describe`.

    Attributes:
        pairs: a `SentencePairs` whose `source_words`/`target_words` are the
            sentences as text (what BLEU compares); `vocabulary`: the tokenizer.
        dropped: pairs dropped (empty or too long).

    Example:

    >>> train = SubwordPairsSource(["hallo welt"], ["hello world"], tokenizer, 16, 16)
    >>> train.num_examples
    1
    """

    def __init__(self, sources, targets, tokenizer, source_length, target_length, split="train",
                 drop_long=True, name="pairs"):
        if len(sources) != len(targets):
            raise ValueError(f"Got {len(sources)} source and {len(targets)} target sentences; "
                             "pass one target per source.")
        self.vocabulary = tokenizer
        self.vocab_size = self.source_vocab_size = self.target_vocab_size = tokenizer.vocab_size
        self.source_length = int(source_length)
        self.target_length = int(target_length)
        self.split = split
        self.name = name
        kept_sources, kept_targets, source_ids, target_ids = [], [], [], []
        for source, target in zip(sources, targets, strict=True):
            if not source.strip() or not target.strip():
                continue
            source_row, target_row = tokenizer.encode(source), tokenizer.encode(target)
            too_long = len(source_row) > self.source_length or len(target_row) > self.target_length
            if too_long and drop_long:
                continue
            kept_sources.append(source)
            kept_targets.append(target)
            source_ids.append(source_row[:self.source_length])
            target_ids.append(target_row[:self.target_length])
        self.dropped = len(sources) - len(kept_sources)
        if not kept_sources:
            raise ValueError(
                f"No {split} pair of {name} is left: all {len(sources)} are empty or longer than "
                f"{self.source_length} source / {self.target_length} target tokens; raise "
                "--max-tokens.")
        self.pairs = SentencePairs(tuple(kept_sources), tuple(kept_targets), tuple(source_ids),
                                   tuple(target_ids))
        self.pad_pairs()

    def describe(self):
        return (f"SubwordPairsSource({self.name}, split={self.split!r}, {self.num_examples} pairs"
                f" ({self.dropped} dropped), vocab_size={self.vocab_size}, source_length="
                f"{self.source_length}, target_length={self.target_length})")
