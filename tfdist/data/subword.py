"""A trainable subword tokenizer (SentencePiece) for real translation data, saved with the run.

The translation recipe trains ONE joint source+target SentencePiece model
(unigram or BPE, `vocab_size` pieces) on the training split's text, once,
and saves it in the run directory:

    MODEL_DIR/tokenizer/subword.model   the SentencePiece model
    MODEL_DIR/tokenizer/subword.json    how it was trained (vocabulary size
                                        asked for, model type, a SHA-256 of
                                        the training text), written last

A resumed run and `tfdist translate` load it from there and never train
again: when both files exist and `subword.json` matches the run's settings
and training text, the model is reused (one line says so); when they do not
match, it is an error naming the file (a new `--model-dir` trains anew). In
a multi-worker run only the chief trains; the other workers wait for
`subword.json` until a deadline and then fail naming the file.

The ids are tfdist's (`tfdist.data.tokens`): pad 0, BOS 1, EOS 3; id 2
(tfdist's SEP, unused by translation) is SentencePiece's unknown piece.

Example:

    tokenizer = load_or_train_tokenizer("runs/wmt/tokenizer", sentences, vocab_size=8000)
    ids = tokenizer.encode("Das ist gut.")          # int32, no BOS/EOS
    tokenizer.decode([1, *ids, 3, 0])               # 'Das ist gut.'
"""

import hashlib
import json
import os
import tempfile
import time

import numpy as np

from tfdist.data.tokens import BOS_ID, EOS_ID, PAD_ID, SEP_ID

TOKENIZER_DIR = "tokenizer"
"""The tokenizer's directory inside a run's MODEL_DIR."""
MODEL_FILE = "subword.model"
META_FILE = "subword.json"
MODEL_TYPES = ("unigram", "bpe")
META_FORMAT = 1
UNKNOWN_ID = SEP_ID
WAIT_SECONDS = 900.0
"""How long a non-chief worker waits for the chief's tokenizer by default."""


class SubwordTokenizer:
    """A trained SentencePiece model with tfdist's reserved ids.

    Args:
        model_path: a `subword.model` written by `train_subword_tokenizer`.

    Attributes:
        vocab_size: pieces in the model (the shared id space's size).
        model_path: where it was loaded from.

    Example:

    >>> tokenizer = SubwordTokenizer("runs/wmt/tokenizer/subword.model")
    >>> tokenizer.decode(tokenizer.encode("hello world"))
    'hello world'
    """

    def __init__(self, model_path):
        import sentencepiece

        self.model_path = model_path
        self.processor = sentencepiece.SentencePieceProcessor(model_file=model_path)
        self.vocab_size = int(self.processor.get_piece_size())

    def encode(self, text):
        """The int32 ids of `text` (no BOS/EOS added).

        Example:

        >>> tokenizer.encode("hello").dtype
        dtype('int32')
        """
        return np.asarray(self.processor.encode(text), np.int32)

    def decode(self, ids):
        """The detokenised text of ids, stopping at EOS and skipping pad and BOS.

        Example:

        >>> tokenizer.decode([1, *tokenizer.encode("hello"), 3, 0])
        'hello'
        """
        pieces = []
        for token in np.asarray(ids).reshape(-1).tolist():
            if token == EOS_ID:
                break
            if token not in (PAD_ID, BOS_ID):
                pieces.append(int(token))
        return self.processor.decode(pieces)

    def __repr__(self):
        return f"SubwordTokenizer({self.model_path!r}, vocab_size={self.vocab_size})"


def text_fingerprint(sentences):
    """SHA-256 (hex) of the sentences, one per line: what a saved tokenizer was trained on.

    Example:

    >>> text_fingerprint(["a", "b"]) == text_fingerprint(["a", "b"])
    True
    """
    digest = hashlib.sha256()
    for sentence in sentences:
        digest.update(sentence.encode("utf-8"))
        digest.update(b"\n")
    return digest.hexdigest()


def tokenizer_settings(sentences, vocab_size, model_type):
    """What `subword.json` records and a reuse must match.

    Example:

    >>> tokenizer_settings(["a"], 100, "bpe")["model_type"]
    'bpe'
    """
    if model_type not in MODEL_TYPES:
        raise ValueError(f"Subword model type {model_type!r} is not one of "
                         f"{', '.join(MODEL_TYPES)}.")
    return {"format": META_FORMAT, "requested_vocab_size": int(vocab_size),
            "model_type": model_type, "training_text_sha256": text_fingerprint(sentences),
            "training_sentences": len(sentences)}


def train_subword_tokenizer(sentences, directory, vocab_size=8000, model_type="unigram"):
    """Trains a SentencePiece model on `sentences` into `directory` and returns it.

    The model file is moved into place whole, then `subword.json` is
    written (also whole): a reader that sees `subword.json` sees a complete
    model. `vocab_size` is an upper bound (SentencePiece's soft limit): a
    small corpus gives fewer pieces.

    Args:
        sentences: the training split's text, source and target sentences
            together (a list of strings).
        directory: where `subword.model` and `subword.json` go (created).
        vocab_size: pieces at most, reserved ids included.
        model_type: "unigram" or "bpe".

    Raises:
        ValueError: no sentences, or a setting SentencePiece refuses (its
            message is kept).

    Example:

    >>> tokenizer = train_subword_tokenizer(["hello world"] * 50, "runs/x/tokenizer", 64)
    """
    import sentencepiece

    settings = tokenizer_settings(sentences, vocab_size, model_type)
    if not sentences:
        raise ValueError(f"No training sentences to train the subword tokenizer in {directory} "
                         "on; check --dataset.")
    os.makedirs(directory, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=directory, prefix=".training-") as scratch:
        prefix = os.path.join(scratch, "subword")
        try:
            sentencepiece.SentencePieceTrainer.train(
                sentence_iterator=iter(sentences), model_prefix=prefix,
                vocab_size=int(vocab_size), model_type=model_type, pad_id=PAD_ID,
                bos_id=BOS_ID, unk_id=UNKNOWN_ID, eos_id=EOS_ID, character_coverage=1.0,
                hard_vocab_limit=False, input_sentence_size=2_000_000,
                shuffle_input_sentence=True, minloglevel=2)
        except RuntimeError as error:
            raise ValueError(f"SentencePiece could not train a {model_type} model of "
                             f"{vocab_size} pieces on {len(sentences)} sentences: {error} "
                             "(try another --subword-vocab-size).") from error
        os.replace(prefix + ".model", os.path.join(directory, MODEL_FILE))
    tokenizer = SubwordTokenizer(os.path.join(directory, MODEL_FILE))
    settings["vocab_size"] = tokenizer.vocab_size
    _write_json(os.path.join(directory, META_FILE), settings)
    return tokenizer


def load_or_train_tokenizer(directory, sentences, vocab_size=8000, model_type="unigram",
                            is_chief=True, wait_seconds=WAIT_SECONDS, say=print,
                            clock=time.monotonic, sleep=time.sleep):
    """The run's tokenizer: reused from `directory` when saved there, else trained once.

    * `subword.json` and `subword.model` exist and match (`tokenizer_settings`
      of these sentences): loaded, never retrained (one line says so).
    * They exist and do not match: `ValueError` naming the file.
    * They do not exist: the chief trains (`train_subword_tokenizer`); any
      other worker waits for the chief's `subword.json` for `wait_seconds`.

    Args:
        directory: MODEL_DIR/tokenizer.
        sentences: the training split's source and target sentences.
        vocab_size, model_type: as `train_subword_tokenizer`.
        is_chief: whether this process may train.
        wait_seconds: how long a non-chief waits.
        say: where the one-line notes go (`print`).

    Raises:
        ValueError: a saved tokenizer of other settings or other text.
        TimeoutError: a non-chief waited `wait_seconds` in vain (the file is named).

    Example:

    >>> tokenizer = load_or_train_tokenizer("runs/wmt/tokenizer", sentences, 8000)
    """
    meta_path = os.path.join(directory, META_FILE)
    model_path = os.path.join(directory, MODEL_FILE)
    settings = tokenizer_settings(sentences, vocab_size, model_type)
    if not os.path.exists(meta_path):
        if is_chief:
            say(f"Training a {model_type} subword tokenizer ({vocab_size} pieces at most) on "
                f"{len(sentences)} training sentences into {model_path}")
            return train_subword_tokenizer(sentences, directory, vocab_size, model_type)
        deadline = clock() + wait_seconds
        while not os.path.exists(meta_path):
            if clock() > deadline:
                raise TimeoutError(
                    f"Waited {wait_seconds:g} s for the chief to write the subword tokenizer "
                    f"{meta_path} (and {MODEL_FILE} beside it); it is trained by the chief "
                    "only. Check the chief's log, or that every worker sees the same --model-dir.")
            sleep(0.5)
    with open(meta_path, encoding="utf-8") as stream:
        saved = json.load(stream)
    differing = sorted(key for key in settings if saved.get(key) != settings[key])
    if differing:
        raise ValueError(
            f"The subword tokenizer saved in {meta_path} was trained with other "
            f"{', '.join(differing)} than this run has ({', '.join(str(saved.get(k)) for k in differing)}"
            f" vs {', '.join(str(settings[k]) for k in differing)}); a run keeps its tokenizer. "
            "Use a new --model-dir to train another one.")
    if not os.path.exists(model_path):
        raise ValueError(f"{meta_path} exists but {model_path} does not; the run directory is "
                         "damaged: use a new --model-dir.")
    tokenizer = SubwordTokenizer(model_path)
    say(f"Reusing the subword tokenizer {model_path} ({tokenizer.vocab_size} pieces, saved with "
        "the run; not retrained)")
    return tokenizer


def _write_json(path, value):
    with open(path + ".tmp", "w", encoding="utf-8") as stream:
        json.dump(value, stream, indent=1)
    os.replace(path + ".tmp", path)
