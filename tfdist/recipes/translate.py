"""`tfdist translate --model-dir DIR`: translate sentences with a trained translation run.

    tfdist translate --model-dir runs/tiny "the dog sleeps" "alice reads a book"
    echo "the dog sleeps" | python -m tfdist.recipes.translate --model-dir runs/tiny
    tfdist translate --model-dir runs/tiny --beam-size 1 "the dog sleeps"

Everything comes from the run directory alone: the translation recipe writes
`MODEL_DIR/translation.json` when training starts (the model's size and
shape, the task's sentence lengths and the vocabulary, or for text:/tfds:
data the path of the run's subword tokenizer, MODEL_DIR/tokenizer/subword.model,
which encodes the input and detokenises the output), and the weights of
the newest epoch are `MODEL_DIR/checkpoints/epoch_NNN.weights.h5`. The
sentences are the arguments, or the lines of standard input when there are
none; one translation is printed per sentence, in order. Decoding is beam
search with the run's `--beam-size` and `--length-penalty` unless given here
(`--beam-size 1`: greedy), on this process's default device.

Exit codes: 0 translated; 2 (`BAD_INPUT`) with one line on standard error
for a missing directory (checked before TensorFlow starts), a directory
that is not a translation run (no `translation.json`, e.g. a language-model
run or a run made before tfdist wrote it), a run with no epoch
checkpoint yet, or a sentence with a word outside the vocabulary or too many
words.
"""

import argparse
import glob
import json
import os
import sys

from tfdist.runtime.exit_codes import BAD_INPUT

SETUP_FILE = "translation.json"
SETUP_KEYS = ("model_size", "dropout", "tie_embeddings", "vocab_size", "source_length",
              "target_length", "beam_size", "length_penalty", "tokenizer", "vocabulary")
"""What `translate` reads from a setup (`translation_setup` writes each)."""
SETUP_FORMAT = 1
PROG = "tfdist translate"


class NotATranslationRun(ValueError):
    """The model directory cannot be translated with (the message says why and what to do).

    Example:

        try:
            setup = read_translation_setup("runs/lm")
        except NotATranslationRun as error:
            print(error)  # says what the folder is missing and which run writes it
    """


def translation_setup(config, info):
    """What `tfdist translate` needs besides the weights, from the recipe's config and the
    data's `info` (`vocab_size`, `source_length`, `target_length`).

    Example:

    >>> translation_setup(config, data.info)["model_size"]
    'tiny'
    """
    from tfdist.data.translation_task import TRANSLATION_VOCABULARY

    return {"format": SETUP_FORMAT, "recipe": "translation", "dataset": config.dataset,
            "model_size": config.model_size, "dropout": config.dropout,
            "tie_embeddings": config.tie_embeddings, "vocab_size": info["vocab_size"],
            "source_length": info["source_length"], "target_length": info["target_length"],
            "beam_size": config.beam_size, "length_penalty": config.length_penalty,
            "tokenizer": info.get("tokenizer"),
            "vocabulary": None if info.get("tokenizer") else list(TRANSLATION_VOCABULARY.words)}


def write_translation_setup(model_dir, setup):
    """Writes `setup` to `model_dir/translation.json` (whole or not at all).

    Example:

    >>> write_translation_setup("runs/tiny", translation_setup(config, data.info))
    """
    os.makedirs(model_dir, exist_ok=True)
    path = os.path.join(model_dir, SETUP_FILE)
    with open(path + ".tmp", "w", encoding="utf-8") as stream:
        json.dump(setup, stream, indent=1)
    os.replace(path + ".tmp", path)


def setup_writer_class():
    """The Keras callback class that writes `translation.json` when training starts.

    Example:

    >>> SetupWriter = setup_writer_class()
    >>> callback = SetupWriter("runs/tiny", translation_setup(config, data.info))
    """
    import keras

    class TranslationSetupWriter(keras.callbacks.Callback):
        """Writes `translation.json` into the model directory at the start of training."""

        def __init__(self, model_dir, setup):
            super().__init__()
            self.model_dir = model_dir
            self.setup = setup

        def on_train_begin(self, logs=None):
            write_translation_setup(self.model_dir, self.setup)

    return TranslationSetupWriter


def check_translation_run_dir(model_dir):
    """The path of `model_dir`'s `translation.json`, checked to exist and to hold a
    translation setup of this version's format (without TensorFlow).

    Raises:
        NotATranslationRun: `model_dir` is missing or a file, holds no `translation.json`,
            or one that cannot be read or is not a setup of this format.

    Example:

    >>> check_translation_run_dir("runs/tiny")
    'runs/tiny/translation.json'
    """
    path = _setup_path(model_dir)
    _load_setup(path)
    return path


def _setup_path(model_dir):
    """`model_dir`'s `translation.json`, checked to exist (`NotATranslationRun` if not)."""
    if not os.path.isdir(model_dir):
        what = "is a file, not a folder" if os.path.exists(model_dir) else "does not exist"
        raise NotATranslationRun(
            f"{model_dir} {what}: give the --model-dir of a translation run "
            "(`tfdist translation --model-dir DIR` trains one).")
    path = os.path.join(model_dir, SETUP_FILE)
    if not os.path.isfile(path):
        raise NotATranslationRun(
            f"{model_dir} is not a translation run: it has no {SETUP_FILE}, which "
            "`tfdist translation --model-dir DIR` writes when training starts (language-model "
            "and CNN runs, and translation runs of older tfdist versions, have none).")
    return path


def _load_setup(path):
    """The setup in `path` (a dict of this version's format), or `NotATranslationRun`."""
    try:
        with open(path, encoding="utf-8") as stream:
            setup = json.load(stream)
    except (OSError, ValueError) as error:
        raise NotATranslationRun(
            f"{path} cannot be read ({error}): it is damaged; train the run again, or copy its "
            "folder again from where it was trained.") from None
    if (not isinstance(setup, dict) or setup.get("format") != SETUP_FORMAT
            or setup.get("recipe") != "translation"):
        raise NotATranslationRun(f"{path} is not a translation setup of format {SETUP_FORMAT}.")
    missing = [key for key in SETUP_KEYS if key not in setup]
    if missing:
        raise NotATranslationRun(f"{path} lacks {', '.join(missing)}: it is damaged; train the "
                                 "run again, or copy its folder again from where it was trained.")
    return setup


def read_translation_setup(model_dir):
    """The `translation.json` of a run and the newest epoch weights file.

    Raises:
        NotATranslationRun: no such file (or an unknown format or vocabulary),
            or no epoch checkpoint yet.

    Example:

    >>> setup, weights = read_translation_setup("runs/tiny")
    """
    from tfdist.data.translation_task import TRANSLATION_VOCABULARY

    path = _setup_path(model_dir)
    setup = _load_setup(path)
    if setup.get("tokenizer"):
        tokenizer_path = os.path.join(model_dir, setup["tokenizer"])
        if not os.path.isfile(tokenizer_path):
            raise NotATranslationRun(
                f"{model_dir}'s {SETUP_FILE} names the subword tokenizer {tokenizer_path}, which "
                "is missing; copy the run directory whole (tokenizer/ included).")
    elif setup["vocabulary"] != list(TRANSLATION_VOCABULARY.words):
        raise NotATranslationRun(
            f"{path} was written with another vocabulary than this tfdist's embedded "
            "language pair; translate with the tfdist version that trained the run.")
    checkpoints = sorted(glob.glob(os.path.join(model_dir, "checkpoints",
                                                "epoch_*.weights.h5")))
    if not checkpoints:
        raise NotATranslationRun(
            f"{model_dir} has no epoch checkpoint yet (checkpoints/epoch_NNN.weights.h5 is "
            "written at each epoch end); let the run finish an epoch.")
    return setup, checkpoints[-1]


def restore_translation_model(setup, weights_path):
    """The encoder-decoder of a run, with the weights of `weights_path`.

    Example:

    >>> model = restore_translation_model(*read_translation_setup("runs/tiny"))
    """
    from tfdist.models.builders import build_translation_model

    built = build_translation_model(
        setup["model_size"], setup["vocab_size"], setup["source_length"],
        setup["target_length"], dropout=setup["dropout"],
        tie_embeddings=setup["tie_embeddings"])
    built.model.load_weights(weights_path)
    return built.model


def encode_sentences(sentences, source_length, tokenizer=None):
    """Source id rows `[N, source_length]` of sentences given as text: with the run's
    subword `tokenizer` (`tfdist.data.subword.SubwordTokenizer`) for text:/tfds: runs, else
    the embedded task's words (split on spaces, lower-cased).

    Raises:
        NotATranslationRun: a word outside the vocabulary, or too many words.

    Example:

    >>> encode_sentences(["the dog sleeps"], 12).shape
    (1, 12)
    """
    from tfdist.data.translation_task import TRANSLATION_VOCABULARY, pad_rows

    rows = []
    for sentence in sentences:
        if tokenizer is not None:
            ids = tokenizer.encode(sentence)
            if not len(ids) or len(ids) > source_length:
                raise NotATranslationRun(
                    f"cannot translate {sentence!r}: " + (
                        f"{len(ids)} subword tokens, the run's model reads at most "
                        f"{source_length} (its --max-tokens)" if len(ids) else "it is empty"))
            rows.append(ids)
            continue
        words = sentence.lower().split()
        unknown = [word for word in words if word not in TRANSLATION_VOCABULARY.source_words]
        if unknown or not words:
            raise NotATranslationRun(
                f"cannot translate {sentence!r}: " + (
                    f"{unknown[:5]} are not source words of the embedded language pair "
                    "(its sentences look like the run's printed examples)" if unknown
                    else "it has no words"))
        if len(words) > source_length:
            raise NotATranslationRun(
                f"cannot translate {sentence!r}: {len(words)} words, the run's model reads "
                f"at most {source_length} (its --max-source-words).")
        rows.append(TRANSLATION_VOCABULARY.encode(words))
    return pad_rows(rows, source_length)


def translate(model_dir, sentences, beam_size=None, length_penalty=None):
    """Translations (strings) of `sentences` with the run in `model_dir`.

    Args:
        model_dir: a translation run's directory.
        sentences: source sentences (strings).
        beam_size, length_penalty: None for the run's.

    Raises:
        NotATranslationRun: see `read_translation_setup` and `encode_sentences`.

    Example:

    >>> translations = translate("runs/tiny", ["the dog sleeps", "alice reads a book"])
    >>> len(translations)
    2
    """
    from tfdist.data.translation_task import TRANSLATION_VOCABULARY
    from tfdist.recipes.translation_quality import decode_sentences

    setup, weights = read_translation_setup(model_dir)
    tokenizer = None
    if setup.get("tokenizer"):
        from tfdist.data.subword import SubwordTokenizer

        tokenizer = SubwordTokenizer(os.path.join(model_dir, setup["tokenizer"]))
    source_ids = encode_sentences(sentences, setup["source_length"], tokenizer)
    model = restore_translation_model(setup, weights)
    outputs = decode_sentences(
        model, source_ids, setup["target_length"],
        beam_size=setup["beam_size"] if beam_size is None else beam_size,
        length_penalty=setup["length_penalty"] if length_penalty is None else length_penalty)
    if tokenizer is not None:
        return [tokenizer.decode(row) for row in outputs]  # detokenised text
    return [" ".join(TRANSLATION_VOCABULARY.decode(row)) for row in outputs]


def main(argv=None):
    """`tfdist translate`: prints one translation per sentence (arguments, else stdin lines).

    Example:

    >>> main(["--model-dir", "runs/tiny", "the dog sleeps"])  # prints its translation
    """
    parser = argparse.ArgumentParser(
        prog=PROG, description="Translate sentences with a trained translation run "
        "(tokenizer and model restored from its directory alone).",
        epilog="With no sentence arguments, each line of standard input is one sentence. "
               "Exit codes: 0 translated; 2 a missing directory or not a translation run, "
               "no epoch checkpoint yet, "
               "or a sentence the model cannot read (one line on standard error).")
    parser.add_argument("--model-dir", required=True, help="The run's --model-dir.")
    parser.add_argument("--beam-size", type=int, default=None,
                        help="Beam width; 1 decodes greedily (default: the run's --beam-size).")
    parser.add_argument("--length-penalty", type=float, default=None,
                        help="GNMT length penalty alpha (default: the run's).")
    parser.add_argument("sentences", nargs="*", help="Source sentences (words split on spaces).")
    args = parser.parse_args(argv)
    if args.beam_size is not None and args.beam_size < 1:
        parser.error(f"--beam-size {args.beam_size}: use 1 (greedy) or more.")
    if args.length_penalty is not None and not 0 <= args.length_penalty < float("inf"):
        parser.error(f"--length-penalty {args.length_penalty}: use a number >= 0 (0 turns it off).")
    try:
        check_translation_run_dir(args.model_dir)  # before reading stdin or starting TensorFlow
    except NotATranslationRun as error:
        print(f"{PROG}: error: {error}", file=sys.stderr)
        return BAD_INPUT
    sentences = args.sentences or [line.strip() for line in sys.stdin if line.strip()]
    try:
        from tfdist.runtime.tf_logging import import_tensorflow

        import_tensorflow()
        translations = translate(args.model_dir, sentences, args.beam_size,
                                 args.length_penalty)
    except NotATranslationRun as error:
        print(f"{PROG}: error: {error}", file=sys.stderr)
        return BAD_INPUT
    for line in translations:
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
