"""Translation recipe: the original encoder-decoder Transformer under any strategy.

    python -m tfdist.recipes.translation --strategy mirrored
    tfdist translation --config translation_base --strategy mirrored --devices 2
    python -m tfdist.launch --workers 2 -- \\
        python -m tfdist.recipes.translation --strategy multi_worker_mirrored

With no `--dataset` it trains on the embedded synthetic language pair
(`tfdist.data.translation_task`: its own words, verb-final word order,
adjectives after nouns, postpositions, agreement), which needs no
download; `--dataset text:SRC_FILE,TGT_FILE` and `tfds:NAME` read real
pairs, tokenised by a SentencePiece model trained once on the training split
and saved with the run (`tfdist.data.subword`, `tfdist.data.translation_pairs`).
The model is `tfdist.models.build_seq2seq` (pre-layer-norm,
source/target/output embeddings tied by default), trained with a
label-smoothed cross-entropy over the non-pad target tokens and the
inverse-square-root schedule with warmup; the metric is the masked token
accuracy (teacher forced).

At the end of each epoch the chief decodes the validation sentences
(batched beam search, `--beam-size`, `--length-penalty`; greedy with
`--beam-size 1`) on its default device, outside `strategy.run` (see
`tfdist.recipes.translation_quality`), and prints corpus BLEU and chrF
(sacreBLEU, on words) beside those of copying the source; they are logged
as `val_bleu` and `val_chrf` (CSV, TensorBoard, the results block, the run
record in MODEL_DIR/runs/). The end of the run prints example translations
beside their references; its scores are the last epoch's (the same weights,
not decoded twice). `tfdist translate --model-dir DIR` translates new
sentences with a run (`tfdist.recipes.translate`).

Every strategy of the language-model recipe runs through the same runner;
`--model-parallel` (GPipe stages) is refused with the reason.
"""

import os
import sys

from tfdist.data.specs import PAIR_SCHEMES, dataset_scheme, parse_pair_spec
from tfdist.recipes.config import ConfigError, Option
from tfdist.recipes.preflight import check_model_dir_entries
from tfdist.recipes.recipe_runner import Recipe
from tfdist.recipes.recipe_types import RecipeData
from tfdist.recipes.translate import SETUP_FILE

MODEL_SIZES = ("tiny", "small", "base", "big")
EMBEDDED_DATASETS = ("embedded", "embedded:translation")
TOKENIZER_FOLDER = "tokenizer"
"""`tfdist.data.subword.TOKENIZER_DIR`, whose module imports TensorFlow, named here for the
checks made before it starts."""

def below_one(flag, value):
    """`value` if it is below 1, else a ValueError naming `flag`.

    Example:

    >>> below_one("--label-smoothing", 0.1)
    0.1
    """
    if value >= 1.0:
        raise ValueError(f"{flag} {value:g} leaves nothing for the reference token; use a value "
                         "in [0, 1) (0.1 is the Transformer's).")
    return value


OPTIONS = [
    Option("model_size", str, "tiny",
           "Model size: tiny (128 s on 2 busy CPU cores to BLEU 68), small, base (the paper's base: "
           "6+6 layers, d=512), big.", choices=MODEL_SIZES),
    Option("dropout", float, None, "Dropout rate (default: the model size's; 0 for tiny).",
           minimum=0.0),
    Option("label_smoothing", float, 0.1,
           "Label smoothing of the cross-entropy over non-pad target tokens, in [0, 1).",
           minimum=0.0, normalize=lambda value: below_one("--label-smoothing", value),
           changes_step_speed=False),
    Option("tie_embeddings", bool, True,
           "One embedding table for source, target and the output projection "
           "(--tie-embeddings false: three)."),
    Option("num_examples", int, 6144, "Training sentence pairs of the embedded task.",
           minimum=1, changes_step_speed=False, for_datasets=("embedded",)),
    Option("max_source_words", int, 12,
           "Longest source sentence of the embedded task (the target bound is 1.5 times it).",
           minimum=4, for_datasets=("embedded",)),
    Option("validation_sentences", int, 256,
           "Validation sentence pairs: the validation loss and the BLEU/chrF decoding.",
           minimum=1, changes_step_speed=False),
    Option("bleu_sentences", int, None,
           "Validation sentences decoded for BLEU/chrF at each epoch end (default: all "
           "--validation-sentences; 0: no decoding, no scores, no example translations).",
           minimum=0, changes_step_speed=False),
    Option("beam_size", int, 4, "Beam width of the BLEU decoding; 1 decodes greedily.",
           minimum=1, changes_step_speed=False),
    Option("length_penalty", float, 0.6,
           "GNMT length penalty alpha of the beam search; 0 turns it off.", minimum=0.0,
           changes_step_speed=False),
    Option("validation_dataset", str, None,
           "Validation pairs of text:/tfds: data, text:SRC_FILE,TGT_FILE or tfds:NAME (default: "
           "the TFDS dataset's validation split; for text files the last "
           "--validation-sentences training pairs, held out)."),
    Option("subword_vocab_size", int, 8000,
           "Pieces of the joint source+target SentencePiece tokenizer of text:/tfds: data "
           "(at most; trained once on the training split, saved in MODEL_DIR/tokenizer/).",
           minimum=8, for_datasets=PAIR_SCHEMES),
    Option("subword_model", str, "unigram", "SentencePiece model type of text:/tfds: data.",
           choices=("unigram", "bpe"), for_datasets=PAIR_SCHEMES),
    Option("max_tokens", int, 64,
           "Longest source and target sentence of text:/tfds: data in subword tokens (longer "
           "training pairs are skipped, longer validation sentences cut).", minimum=2,
           for_datasets=PAIR_SCHEMES),
    Option("max_train_pairs", int, None,
           "Read at most this many training pairs of text:/tfds: data (default: all).",
           minimum=1, changes_step_speed=False, for_datasets=PAIR_SCHEMES),
    Option("download", bool, False,
           "Download and prepare a tfds: --dataset that is not prepared yet (into TFDS's "
           "data_dir, $TFDS_DATA_DIR or ~/tensorflow_datasets); off: a clear error saying "
           "how to prepare it.", changes_step_speed=False),
]

DEFAULTS = {
    "dataset": "embedded",
    "global_batch_size": 64,
    "epochs": 2,
    "learning_rate": 3e-3,
    "warmup_steps": 40,
    "schedule": "inverse_sqrt",
    "optimizer": "adam",
    # Off by default: the measured figures in docs/translation.md are without XLA.
    # --xla on compiles the step once (about 15 s here) and then halves the tiny
    # model's step time on 2 CPU cores (112 vs 232 ms).
    "xla": "off",
}

EPILOG = """\
datasets (--dataset):
  embedded              the synthetic language pair, no download (default)
  text:SRC_FILE,TGT_FILE
                        line-aligned source and target sentences (UTF-8, one per line)
  tfds:NAME             a prepared TFDS translation dataset, e.g. tfds:wmt14_translate/de-en
                        (its supervised keys are source and target)
  text: and tfds: data are tokenised by a SentencePiece model trained once on the
  training split and saved in MODEL_DIR/tokenizer/ (reused on resume and by
  `tfdist translate`).

decoding and scores:
  each epoch the chief decodes --validation-sentences sentences with beam search
  (--beam-size, --length-penalty) and prints sacreBLEU's BLEU and chrF beside copying
  the source; the end of the run prints example translations.

examples:
  python -m tfdist.recipes.translation
  python -m tfdist.recipes.translation --strategy mirrored --devices 2
  python -m tfdist.recipes.translation --config translation_base --model-dir runs/base
  python -m tfdist.launch --workers 2 -- python -m tfdist.recipes.translation --strategy multi_worker_mirrored
"""

MODEL_PARALLEL_REASON = (
    "--model-parallel {k} splits a stack of blocks into pipeline stages, which the language-"
    "model recipe's decoder supports; the encoder-decoder's two stacks joined by "
    "cross-attention are not split into stages yet. Drop --model-parallel and use data "
    "parallelism (--strategy mirrored, multi_worker_mirrored or parameter_server).")


def check_config(config):
    """Refuses what this recipe cannot do, before TensorFlow starts: `--model-parallel` > 1,
    datasets other than embedded, `text:SRC,TGT` and `tfds:NAME`, fewer
    `--validation-sentences` than one global batch, `--download` without tfds:
    data, and a `--validation-dataset` beside the embedded task.

    Raises:
        ConfigError: naming the flag and the way out.

    Example:

    >>> check_config(parse_config(["--model-parallel", "2"], RECIPE.all_options()))
    Traceback (most recent call last):
    ConfigError: --model-parallel 2 splits a stack of blocks into pipeline stages, ...
    """
    if config.model_parallel > 1:
        raise ConfigError(MODEL_PARALLEL_REASON.format(k=config.model_parallel))
    if config.model_dir and os.path.isdir(config.model_dir):
        check_model_dir_entries(config.model_dir, folders=[TOKENIZER_FOLDER], files=[SETUP_FILE])

    for flag, spec in (("--dataset", config.dataset),
                       ("--validation-dataset", config.validation_dataset)):
        if spec and spec not in EMBEDDED_DATASETS:
            try:
                parse_pair_spec(spec)  # the files themselves: preflight.check_dataset_paths
            except ValueError as error:
                raise ConfigError(f"{flag}: {error}") from error
    if config.validation_sentences < config.global_batch_size:
        raise ConfigError(
            f"--validation-sentences {config.validation_sentences} is fewer than one global "
            f"batch (--global-batch-size {config.global_batch_size}): the validation loss "
            "would run no batch and report 0. Use --validation-sentences "
            f"{config.global_batch_size} or more (--bleu-sentences sets how many are decoded), "
            "or a smaller --global-batch-size.")
    if "download" in getattr(config, "explicit", ()) and config.download and not any(
            spec and dataset_scheme(spec) == "tfds"
            for spec in (config.dataset, config.validation_dataset)):
        raise ConfigError(f"--download prepares tfds: data, but this run reads --dataset "
                          f"{config.dataset}"
                          + (f" and --validation-dataset {config.validation_dataset}"
                             if config.validation_dataset else "")
                          + ": there is nothing to download. Drop the flag.")
    if config.validation_dataset and config.dataset in EMBEDDED_DATASETS:
        raise ConfigError(f"--validation-dataset {config.validation_dataset}: the embedded "
                          "task has its own validation split; drop the flag or give a "
                          "text:/tfds: --dataset.")


def task_options(config):
    """The `TranslationTaskSource` arguments the flags set (besides size and split).

    Example:

    >>> task_options(parse_config([], RECIPE.all_options()))
    {'seed': 0, 'max_source_words': 12}
    """
    return {"seed": config.seed, "max_source_words": config.max_source_words}


def bleu_sentence_count(config):
    """Validation sentences decoded for BLEU/chrF: `--bleu-sentences`, at most (and by
    default) `--validation-sentences`; 0 turns the decoding off.

    Example:

    >>> bleu_sentence_count(parse_config(["--bleu-sentences", "500"], RECIPE.all_options()))
    256
    """
    if config.bleu_sentences is None:
        return config.validation_sentences
    return min(config.bleu_sentences, config.validation_sentences)


def build_data(config):
    """The training and validation splits (the embedded language pair, or text:/tfds: data
    through `build_pair_data`), and the BLEU/chrF of copying the source on the decoded
    validation sentences (the trivial baseline).

    Example:

    >>> data = build_data(config)  # config: the recipe's parsed flags
    >>> sorted(data.info)[:2]
    ['source_length', 'target_length']
    """
    if config.dataset not in EMBEDDED_DATASETS:
        return build_pair_data(config)
    from tfdist.data import TranslationTaskSource
    from tfdist.recipes.translation_quality import copy_baseline_scores

    train = TranslationTaskSource(config.num_examples, split="train", **task_options(config))
    validation = TranslationTaskSource(config.validation_sentences, split="validation",
                                       **task_options(config))
    count = bleu_sentence_count(config)
    chance = copy_baseline_scores(validation, count) if count else {}
    return RecipeData(
        train=train, validation=validation, description=train.describe(),
        tokens_per_example=train.source_length + train.target_length + 1,
        chance=chance,
        info={"vocab_size": train.vocab_size, "source_length": train.source_length,
              "target_length": train.target_length + 1})


def read_pairs(spec, split, limit, download=False):
    """`(sources, targets, name)` of a `text:SRC,TGT` or `tfds:NAME` dataset string
    (`download`: prepare a TFDS dataset that is not prepared yet).

    Example:

    >>> sources, targets, name = read_pairs("text:train.de,train.en", "train", None)
    """
    from tfdist.data.translation_pairs import read_text_pairs, read_tfds_pairs

    scheme, argument = parse_pair_spec(spec)
    if scheme == "text":
        sources, targets = read_text_pairs(*argument)
        return sources[:limit], targets[:limit], ",".join(argument)
    sources, targets, _ = read_tfds_pairs(argument, split, download=download, limit=limit)
    return sources, targets, f"{argument}[{split}]"


def tokenizer_directory(config, say):
    """MODEL_DIR/tokenizer, or a temporary directory (not kept) for a run without
    --model-dir, which a multi-worker run refuses (its workers read the chief's tokenizer).

    Example:

    >>> tokenizer_directory(parse_config(["--model-dir", "runs/x"], RECIPE.all_options()), print)
    'runs/x/tokenizer'
    """
    import tempfile

    from tfdist.data.subword import TOKENIZER_DIR
    from tfdist.distribute.tf_config import parse_tf_config

    if config.model_dir:
        return os.path.join(config.model_dir, TOKENIZER_DIR)
    cluster = parse_tf_config()
    if cluster is not None and cluster.num_workers > 1:
        raise ConfigError(
            f"--dataset {config.dataset} in a multi-worker run needs --model-dir on storage every "
            "worker sees: the chief trains the subword tokenizer into MODEL_DIR/tokenizer/ and "
            "the other workers read it from there.")
    directory = tempfile.mkdtemp(prefix="tfdist-tokenizer-")
    say(f"No --model-dir: the subword tokenizer is trained into {directory} and not kept "
        "with a run")
    return directory


def build_pair_data(config):
    """text:/tfds: data: reads the pairs, loads or trains the run's subword tokenizer
    (`tfdist.data.subword.load_or_train_tokenizer`: the chief trains it once on the
    training split, the other workers wait for its file) and tokenises both splits once.

    Example:

    >>> data = build_pair_data(parse_config(["--dataset", "text:train.de,train.en",
    ...                                      "--model-dir", "runs/x"], RECIPE.all_options()))
    """
    from tfdist.data.subword import load_or_train_tokenizer
    from tfdist.data.translation_pairs import SubwordPairsSource
    from tfdist.distribute.tf_config import parse_tf_config
    from tfdist.recipes.translation_quality import copy_baseline_scores

    cluster = parse_tf_config()
    is_chief = cluster is None or cluster.is_chief
    say = print if is_chief else (lambda *args, **kwargs: None)
    count = config.validation_sentences
    download = config.download
    sources, targets, name = read_pairs(config.dataset, "train", config.max_train_pairs,
                                        download)
    if config.validation_dataset:
        valid_sources, valid_targets, valid_name = read_pairs(
            config.validation_dataset, "validation", count, download)
    elif parse_pair_spec(config.dataset)[0] == "tfds":
        valid_sources, valid_targets, valid_name = read_pairs(config.dataset, "validation", count,
                                                              download)
    else:
        if len(sources) <= count:
            raise ConfigError(
                f"--dataset {config.dataset}: {len(sources)} pairs leave none for training after "
                f"holding out --validation-sentences {count}; give --validation-dataset "
                "text:SRC_FILE,TGT_FILE or fewer --validation-sentences.")
        valid_sources, valid_targets = sources[-count:], targets[-count:]
        sources, targets = sources[:-count], targets[:-count]
        valid_name = f"{name} (the last {count} pairs, held out)"
    directory = tokenizer_directory(config, say)
    tokenizer = load_or_train_tokenizer(directory, sources + targets, config.subword_vocab_size,
                                        config.subword_model, is_chief=is_chief, say=say)
    length = config.max_tokens
    train = SubwordPairsSource(sources, targets, tokenizer, length, length, split="train",
                               name=name)
    validation = SubwordPairsSource(valid_sources[:count], valid_targets[:count], tokenizer,
                                    length, length, split="validation", drop_long=False,
                                    name=valid_name)
    bleu_count = bleu_sentence_count(config)
    chance = copy_baseline_scores(validation, bleu_count) if bleu_count else {}
    tokenizer_path = os.path.relpath(tokenizer.model_path, config.model_dir) \
        if config.model_dir else None
    return RecipeData(
        train=train, validation=validation, description=train.describe(),
        tokens_per_example=train.source_length + train.target_length + 1, chance=chance,
        info={"vocab_size": train.vocab_size, "source_length": train.source_length,
              "target_length": train.target_length + 1, "tokenizer": tokenizer_path})


def build_model(config, data):
    """The encoder-decoder sized by `--model-size` for the data, its label-smoothed
    masked loss and masked token accuracy (`tfdist.models.builders.build_translation_model`).

    Example:

    >>> with strategy.scope():
    ...     built = build_model(config, build_data(config))
    >>> type(built.model).__name__
    'Functional'
    """
    from tfdist.models.builders import build_translation_model

    info = data.info
    return build_translation_model(
        config.model_size, info["vocab_size"], info["source_length"], info["target_length"],
        dropout=config.dropout,
        label_smoothing=config.label_smoothing, tie_embeddings=config.tie_embeddings)


def quality_callbacks(config, data, built, info):
    """The `TranslationQuality` callback: BLEU/chrF each epoch on the chief, examples at the
    end (none with `--bleu-sentences 0`); and, on the chief of a run with a `--model-dir`,
    the writer of `translation.json` for `tfdist translate` (`tfdist.recipes.translate`)."""
    from tfdist.recipes.translate import setup_writer_class, translation_setup
    from tfdist.recipes.translation_quality import translation_callback_class

    callbacks = []
    if config.model_dir and info.is_chief:
        writer = setup_writer_class()
        callbacks.append(writer(config.model_dir, translation_setup(config, data.info)))
    count = bleu_sentence_count(config)
    if count:
        quality = translation_callback_class()
        callbacks.append(quality(built.model, data.validation, beam_size=config.beam_size,
                                 length_penalty=config.length_penalty, num_sentences=count,
                                 is_chief=info.is_chief))
    return callbacks


def train_examples(config):
    """Training sentence pairs of the embedded task, known before reading any data
    (None for text:/tfds: data).

    Example:

    >>> train_examples(config)  # the embedded pair: --num-examples
    6144
    """
    return config.num_examples if config.dataset in EMBEDDED_DATASETS else None


RECIPE = Recipe(
    name="translation",
    description="Train an encoder-decoder Transformer translation model under any "
                "tf.distribute strategy; report BLEU and chrF.",
    options=OPTIONS, defaults=DEFAULTS, build_data=build_data, build_model=build_model,
    train_examples=train_examples, epilog=EPILOG, check_config=check_config,
    callbacks=quality_callbacks)

main = RECIPE.main


if __name__ == "__main__":
    sys.exit(main())
