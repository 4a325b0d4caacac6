"""Translation recipe: the original encoder-decoder Transformer under any strategy.

    python -m tfdist.recipes.translation --strategy mirrored
    tfdist translation --config translation_base --strategy mirrored --devices 2
    python -m tfdist.launch --workers 2 -- \\
        python -m tfdist.recipes.translation --strategy multi_worker_mirrored

With no `--dataset` it trains on the embedded synthetic language pair
(`tfdist.data.translation_task`: its own words, verb-final word order,
adjectives after nouns, postpositions, agreement), which needs no
download. The model is `tfdist.models.build_seq2seq` (pre-layer-norm,
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

import sys

from tfdist.recipes.config import ConfigError, Option
from tfdist.recipes.recipe_runner import Recipe
from tfdist.recipes.recipe_types import RecipeData

MODEL_SIZES = ("tiny", "small", "base", "big")
EMBEDDED_DATASETS = ("embedded", "embedded:translation")

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
           minimum=1, changes_step_speed=False),
    Option("max_source_words", int, 12,
           "Longest source sentence of the embedded task (the target bound is 1.5 times it).",
           minimum=4),
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
    """Refuses what this recipe cannot do, before TensorFlow starts: `--model-parallel` > 1
    and datasets other than the embedded task.

    Raises:
        ConfigError: naming the flag and the way out.

    Example:

    >>> check_config(parse_config(["--model-parallel", "2"], RECIPE.all_options()))
    Traceback (most recent call last):
    ConfigError: --model-parallel 2 splits a stack of blocks into pipeline stages, ...
    """
    if config.model_parallel > 1:
        raise ConfigError(MODEL_PARALLEL_REASON.format(k=config.model_parallel))
    if config.dataset not in EMBEDDED_DATASETS:
        raise ConfigError(
            f"--dataset {config.dataset}: the translation recipe reads the embedded language "
            "pair only (--dataset embedded); TFDS and text-file data are not built yet.")


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
    """The embedded language pair's training and validation splits, and the BLEU/chrF
    of copying the source on the decoded validation sentences (the trivial baseline)."""
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


def build_model(config, data):
    """The encoder-decoder sized by `--model-size` for the data, its label-smoothed
    masked loss and masked token accuracy (`tfdist.models.builders.build_translation_model`)."""
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
    """Training sentence pairs, known before reading any data."""
    return config.num_examples


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
