"""Flags and YAML configs shared by every recipe.

Each option is declared once, as an `Option`; the same declaration builds the
command-line flag, validates the YAML config file and documents `--help`.
Precedence, lowest first: the recipe's defaults, the `--config` YAML file,
flags given on the command line.

Example:

    options = COMMON_OPTIONS + [Option("model_size", str, "tiny", "Model size.")]
    config = parse_config(["--strategy", "mirrored"], options, prog="my_recipe")
    config.strategy   # 'mirrored'
"""

import argparse
import dataclasses
import math
import os
from typing import Callable

import yaml

from tfdist.autotune import AUTOTUNE_ENV, AUTOTUNE_MODES, CACHE_ENV
from tfdist.distribute.device_limits import MAX_DEVICES_PER_WORKER, check_device_count
from tfdist.runtime.gpu_memory import DEFAULT_GPU_MEMORY, GPU_MEMORY_FORMS, check_gpu_memory
from tfdist.precision import PRECISION_ALIASES, PRECISIONS, canonical_precision
from tfdist.distribute.strategy_names import CLUSTER_RESOLVER_NAMES, STRATEGY_NAMES, check_strategy_name
from tfdist.runtime.tf_logging import TF_LOG_LEVELS
from tfdist.schedules.choices import OPTIMIZER_NAMES, SCHEDULE_NAMES
from tfdist.xla import XLA_MODES

OPTIMIZERS = OPTIMIZER_NAMES
"""`--optimizer` values: `tfdist.schedules.choices.OPTIMIZER_NAMES`."""
SCHEDULES = SCHEDULE_NAMES
"""`--schedule` values: `tfdist.schedules.choices.SCHEDULE_NAMES`."""
CLUSTER_RESOLVERS = CLUSTER_RESOLVER_NAMES
"""`--cluster-resolver` values: `tfdist.distribute.strategy_names.CLUSTER_RESOLVER_NAMES`."""
MAX_SEED = 2 ** 32 - 1
"""The largest `--seed` (NumPy's and tf.data's seeds are 32-bit)."""
CONFIG_DIRS_ENV = "TFDIST_RECIPES_DIR"
PACKAGED_CONFIGS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "configs")


class ConfigError(ValueError):
    """A recipe option or config file is invalid; the message says which and why.

    Example:

        try:
            config = parse_config(["--epochs", "none"], COMMON_OPTIONS, "demo")
        except ConfigError as error:
            print(error)  # names --epochs and what it takes
    """


@dataclasses.dataclass(frozen=True)
class Option:
    """One recipe option: a command-line flag and a YAML key.

    Args:
        name: the key, with underscores (`global_batch_size`); the flag is
            the same with dashes (`--global-batch-size`).
        type: `int`, `float`, `str` or `bool`.
        default: the value when neither the config file nor a flag sets it.
        help: one sentence for `--help`.
        choices: the allowed values, or None for any value of `type`.
        minimum: the smallest allowed number, for `int`/`float` options.
        above: a number the value must be above (excluded), for `float`
            options that must be positive (`learning_rate`: above 0.0).
        maximum: the largest allowed number, for `int`/`float` options.
            A `float` option is always finite (no nan or inf).
        normalize: called with the converted value, returns the canonical
            one (e.g. an alias to its name) or raises `ValueError` with a
            message that teaches; None to keep the value.
        metavar: how `--help` shows the value (default: the choices, or
            the type's name).
        changes_step_speed: False for an option that changes only how long
            the run is, what it learns or where it writes (epochs, seed,
            model_dir, ...), never how fast one training step runs: an
            autotune decision cached for one value is reused for another.
        environment: an environment variable whose value, when set and not
            empty, replaces `default` (checked as a flag's value is, and
            refused naming the variable); a flag or the config file still
            overrides it.
        for_datasets: the `--dataset` schemes whose data reads the option
            (`("embedded",)`), or None for every dataset. Set for another
            dataset, the option is refused before TensorFlow starts
            (`tfdist.recipes.preflight.check_options_for_the_dataset`).

    Example:

    >>> Option("epochs", int, 1, "Number of epochs.", minimum=1).flag
    '--epochs'
    """

    name: str
    type: type
    default: object
    help: str
    choices: tuple = None
    minimum: float = None
    above: float = None
    maximum: float = None
    normalize: Callable = None
    metavar: str = None
    changes_step_speed: bool = True
    environment: str = None
    for_datasets: tuple = None

    @property
    def flag(self):
        """The command-line spelling of the option."""
        return "--" + self.name.replace("_", "-")

    def convert(self, value, source):
        """Converts and validates `value` (from `source`, for the error)."""
        if value is None:
            return None
        try:
            if self.type is bool:
                value = _to_bool(value)
            elif self.type is int and isinstance(value, float) and not value.is_integer():
                raise ValueError(value)
            else:
                value = self.type(value)
        except (TypeError, ValueError):
            raise ConfigError(
                f"{source}: {self.name} must be {self.type.__name__}, got {value!r}.") from None
        if self.normalize is not None:
            try:
                value = self.normalize(value)
            except ValueError as error:
                raise ConfigError(f"{source}: {error}") from None
        if self.choices is not None and value not in self.choices:
            raise ConfigError(
                f"{source}: {self.name}={value!r} is not allowed. Choose one of: "
                f"{', '.join(map(str, self.choices))}.")
        if self.type is float and not math.isfinite(value):
            raise ConfigError(f"{source}: {self.name} must be a finite number, got {value!r}.")
        if self.minimum is not None and value < self.minimum:
            raise ConfigError(
                f"{source}: {self.name} must be >= {self.minimum}, got {value!r}.")
        if self.above is not None and not value > self.above:
            raise ConfigError(
                f"{source}: {self.name} must be > {self.above}, got {value!r}.")
        if self.maximum is not None and value > self.maximum:
            raise ConfigError(
                f"{source}: {self.name} must be <= {self.maximum}, got {value!r}.")
        return value


def _to_bool(value):
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise ValueError(value)


COMMON_OPTIONS = [
    Option("strategy", str, "auto",
           f"Distribution strategy: {', '.join(STRATEGY_NAMES)}.", normalize=check_strategy_name),
    Option("devices", int, None,
           "Devices per worker (GPUs; on a machine without GPUs the CPU is split into this many "
           f"logical devices), at most {MAX_DEVICES_PER_WORKER}. Default: all GPUs, or one CPU "
           "device.", minimum=1, normalize=check_device_count),
    Option("cluster_resolver", str, "tf_config",
           "Where a multi-worker run finds its cluster (--strategy multi_worker_mirrored or auto): "
           "tf_config ($TF_CONFIG, as Kubeflow's TFJob and tfdist.launch set it) or slurm "
           "(SlurmClusterResolver, inside an srun job step).", choices=CLUSTER_RESOLVERS,
           normalize=lambda text: text.strip().lower().replace("-", "_"),
           changes_step_speed=False),
    Option("gpu_memory", str, DEFAULT_GPU_MEMORY,
           "How TensorFlow takes GPU memory: preallocate (its default: nearly all of every GPU up "
           "front), growth (as needed), or limit:MB (at most MB per GPU, e.g. limit:4096). No "
           "effect without a GPU.", normalize=check_gpu_memory,
           metavar="{" + ",".join(GPU_MEMORY_FORMS) + "}", changes_step_speed=False),
    Option("all_reduce", str, None,
           "All-reduce implementation: nccl, hierarchical_copy, reduction_to_one_device (mirrored); "
           "auto, ring, nccl (multi_worker_mirrored). Default: TensorFlow's choice."),
    Option("global_batch_size", int, 64,
           "Examples per step across all replicas; must divide evenly by the replica count.", minimum=1),
    Option("epochs", int, 1, "Number of epochs.", minimum=1, changes_step_speed=False),
    Option("steps_per_epoch", int, None,
           "Batches per epoch (optimizer steps times --grad-accum-steps; default: one pass over "
           "the training data).", minimum=1,
           changes_step_speed=False),
    Option("validation_steps", int, None, "Validation steps after each epoch (default: the whole split).",
           minimum=1, changes_step_speed=False),
    Option("precision", str, "auto",
           "auto (bfloat16 on AMX/AVX512-BF16 CPUs and Ampere+ GPUs, float16 on compute capability 7.x, "
           "else float32), float32, mixed_float16, mixed_bfloat16; aliases: "
           f"{', '.join(PRECISION_ALIASES)}.", choices=PRECISIONS, normalize=canonical_precision),
    Option("xla", str, "auto", "XLA compilation of the replica step: auto, on, off.", choices=XLA_MODES),
    Option("autotune", str, "on",
           "How --precision auto / --xla auto decide: on (time the candidate settings on this "
           "model and batch for a few steps each and keep the fastest whose loss agrees with "
           "float32; the decision is cached per model, hardware, TensorFlow version and tfdist "
           "code), refresh (time them again, replacing a cached decision), off (fixed rules "
           "from the hardware). "
           f"Default: ${AUTOTUNE_ENV} when set, else on.", choices=AUTOTUNE_MODES,
           normalize=lambda text: text.strip().lower(), changes_step_speed=False,
           environment=AUTOTUNE_ENV),
    Option("autotune_cache", str, None,
           f"File of cached autotune decisions (default: ${CACHE_ENV}, else "
           "~/.cache/tfdist/autotune.json).", changes_step_speed=False),
    Option("autotune_budget", float, 120.0,
           "Seconds after which the autotune trial starts no new round of timed steps (compiling "
           "each setting and one round always run).", minimum=1.0, changes_step_speed=False),
    Option("optimizer", str, "adamw",
           "Optimizer; adam and adamw are Keras's, each variable's update run as one "
           "TensorFlow kernel (ResourceApplyAdam).", choices=OPTIMIZERS),
    Option("learning_rate", float, 1e-3, "Peak learning rate (after warmup).", above=0.0,
           changes_step_speed=False),
    Option("schedule", str, "cosine", "Learning-rate decay after warmup.", choices=SCHEDULES,
           changes_step_speed=False),
    Option("warmup_steps", int, 0,
           "Linear warmup steps; not shorter than the run's optimizer steps is an error (the "
           "recipe's default is cut to fit a shorter run, and the header says so).", minimum=0,
           changes_step_speed=False),
    Option("weight_decay", float, 0.0, "Decoupled weight decay (adamw, lion, lamb, sgd).", minimum=0.0),
    Option("adam_beta1", float, None,
           "Decay of the first-moment average, below 1 (adam, adamw, lamb, lion; default "
           "Keras's 0.9).", minimum=0.0, changes_step_speed=False),
    Option("adam_beta2", float, None,
           "Decay of the second-moment average, below 1 (adam, adamw, lamb, lion; default "
           "Keras's 0.999, lion's 0.99; the Transformer paper's 0.98).", minimum=0.0,
           changes_step_speed=False),
    Option("adam_epsilon", float, None,
           "Epsilon added to the second-moment root (adam, adamw, lamb; default Keras's 1e-7, "
           "lamb's 1e-6; the Transformer paper's 1e-9).", above=0.0,
           changes_step_speed=False),
    Option("clip_norm", float, None, "Clip gradients by their global norm across all replicas.",
           above=0.0),
    Option("grad_accum_steps", int, 1, "Micro-batches accumulated per optimizer step.", minimum=1),
    Option("model_parallel", int, 1,
           "Split the model's layers into K pipeline stages on K devices of every worker (K GPUs, "
           "or the CPU split into K logical devices); data parallelism then runs across workers.",
           minimum=1, normalize=lambda count: check_device_count(count, "--model-parallel")),
    Option("tensor_parallel", int, 1,
           "Split the model's large layers themselves over K devices of this worker (K GPUs, or "
           "the CPU split into K logical devices) by the recipe's layout: the transformer's "
           "attention by heads, MLP by channels, token embedding and output projection by "
           "vocabulary (when K divides it), the ResNet's last-stage convolutions by "
           "output channels; one replica per worker: data parallelism then runs across workers "
           "(float32 or mixed, accumulation allowed), no XLA so far.",
           minimum=1, normalize=lambda count: check_device_count(count, "--tensor-parallel")),
    Option("micro_batches", int, None,
           "Micro-batches per step with --model-parallel K > 1 (GPipe; default 2K).", minimum=1),
    Option("steps_per_execution", int, 1, "Training steps run inside one tf.function call.", minimum=1),
    Option("dataset", str, None, "Data source (see the recipe's --help for the forms)."),
    Option("skip_corrupt_records", bool, False,
           "TFRecord data (tfrecord:, imagenet_tfrecord:, uncompressed): read a damaged file up to "
           "its last readable record and skip the rest, instead of stopping with an error naming "
           "the file; what was skipped is printed at the end.", changes_step_speed=False),
    Option("model_dir", str, None,
           "Folder for the run's record (config.yaml), CSV and TensorBoard logs and checkpoints "
           "(default: none written).", changes_step_speed=False),
    Option("log_every", int, 100,
           "Write training scalars to TensorBoard every N steps, besides every epoch (needs "
           "--model-dir).", minimum=1, changes_step_speed=False),
    Option("profile_steps", str, None,
           "Capture a profiler trace of steps A-B (e.g. 20-25) into MODEL_DIR/tensorboard, for "
           "TensorBoard's Profile tab (needs --model-dir).", normalize=lambda text: parse_step_range(text)[2],
           changes_step_speed=False),
    Option("backup_dir", str, None,
           "Folder for step-level backups; a relaunched run resumes at the exact step of the last "
           "one (default: MODEL_DIR/backup when --model-dir is given, else none).",
           changes_step_speed=False),
    Option("backup_every", int, None,
           "Back up every N steps, besides every epoch end (default: epoch ends only).", minimum=1,
           changes_step_speed=False),
    Option("backup_keep", int, 2, "Backups kept.", minimum=1, changes_step_speed=False),
    Option("divergence_factor", float, 10.0,
           "Stop with an error when the loss is above this many times its recent level (the median "
           "of the last 20 checked steps) at 3 checks in a row, judged after max(20 steps, the "
           "learning-rate warmup); the last backup confirmed healthy is kept besides the "
           "--backup-keep newest, and a rerun resumes from it. 0 turns the check off.",
           normalize=lambda value: check_divergence_factor(value), changes_step_speed=False),
    Option("seed", int, 42, "Random seed for weights and data order.", minimum=0,
           maximum=MAX_SEED, changes_step_speed=False),
    Option("deterministic", bool, False, "Deterministic data order and ops (slower)."),
    Option("verbose", int, None,
           "0: silent, 1: progress bar, 2: one line per epoch, 3: as 2 plus how the input is "
           "sharded (default: 1 on a terminal, else 2).", choices=(0, 1, 2, 3),
           changes_step_speed=False),
    Option("tf_log_level", int, None,
           "TensorFlow's own C++ logging: 0 everything, 1 warnings, 2 errors, 3 nothing (default: "
           "$TF_CPP_MIN_LOG_LEVEL when set, else 3).", choices=TF_LOG_LEVELS,
           changes_step_speed=False),
]


def parse_step_range(text):
    """Parses a step range `A-B` (1 <= A <= B) for `--profile-steps`.

    Returns:
        `(first, last, canonical_text)`.

    Raises:
        ValueError: not of the form `A-B` with 1 <= A <= B.

    Example:

    >>> parse_step_range("20-25")
    (20, 25, '20-25')
    """
    parts = str(text).split("-")
    try:
        first, last = (int(part) for part in parts)
    except ValueError:
        first = last = None
    if first is None or not 1 <= first <= last:
        raise ValueError(f"profile_steps must be a step range A-B with 1 <= A <= B, such as 20-25; "
                         f"got {text!r}.")
    return first, last, f"{first}-{last}"


def check_divergence_factor(value):
    """Checks a `--divergence-factor`: 0 (off) or a finite number > 1.

    Returns:
        The value, as a float.

    Raises:
        ValueError: naming the value and the allowed ones.

    Example:

    >>> check_divergence_factor(10)
    10.0
    """
    value = float(value)
    if value == 0 or (value > 1 and value != float("inf")):
        return value
    raise ValueError(
        f"divergence_factor must be 0 (off) or a number > 1 (stop when the loss is above that "
        f"many times its recent level), such as 10; got {value:g}.")


def find_config_file(name_or_path, search_dirs=None):
    """Finds a recipe YAML by path, or by name among the shipped and your own recipes.

    Args:
        name_or_path: a path to a YAML file, or a recipe name such as
            `transformer_tiny` (looked up as `transformer_tiny.yaml`).
        search_dirs: folders to look in for names; default: the folders in
            `$TFDIST_RECIPES_DIR` (separated by `:`), then the recipes that
            ship inside the package (`tfdist/recipes/configs/`), so names work
            from any directory and from a wheel install.

    Returns:
        The path of an existing file.

    Raises:
        ConfigError: nothing found; the message lists where it looked.

    Example:

    >>> find_config_file("my_run.yaml")
    'my_run.yaml'
    >>> os.path.basename(find_config_file("transformer_tiny"))
    'transformer_tiny.yaml'
    """
    if os.path.isfile(name_or_path):
        return name_or_path
    if search_dirs is None:
        search_dirs = [*recipes_dirs_from_environment(), PACKAGED_CONFIGS]
    tried = [name_or_path]
    for folder in search_dirs:
        for candidate in (name_or_path, name_or_path + ".yaml", name_or_path + ".yml"):
            path = os.path.join(folder, candidate)
            if path not in tried:  # an absolute name is the same path in every folder
                tried.append(path)
            if os.path.isfile(path):
                return path
    shipped = ", ".join(shipped_configs()) or "none"
    raise ConfigError(f"Config file {name_or_path!r} not found. Looked at: {', '.join(tried)}. "
                      f"The shipped configs: {shipped}; your own by name: put their folder in "
                      f"${CONFIG_DIRS_ENV}.")


def recipes_dirs_from_environment():
    """The folders `$TFDIST_RECIPES_DIR` lists (`:`-separated; empty entries skipped).

    A listed folder that does not exist is refused rather than skipped: a
    misspelt one would otherwise let a shipped recipe of the same name stand
    in, silently, for the user's own.

    Raises:
        ConfigError: an entry that is not a folder, named with the way out.

    Example:

    >>> os.environ["TFDIST_RECIPES_DIR"] = "/srv/recipes"
    >>> recipes_dirs_from_environment()
    ['/srv/recipes']
    """
    folders = [d for d in os.environ.get(CONFIG_DIRS_ENV, "").split(os.pathsep) if d]
    for folder in folders:
        if not os.path.isdir(folder):
            what = "is a file, not a folder" if os.path.exists(folder) else "does not exist"
            raise ConfigError(
                f"${CONFIG_DIRS_ENV} lists {folder!r}, which {what}: a "
                f"recipe of the same name would be taken from the next folder or the "
                f"shipped ones instead of yours. Fix the path, or remove it from "
                f"${CONFIG_DIRS_ENV} (unset it to use the shipped recipes only).")
    return folders


def yaml_error_line(error):
    """One line from a PyYAML parse error: where in the file, then what is wrong there.

    PyYAML's own message spans several lines (a context, the problem, a quoted
    position); a refused config file is reported on one.

    Example:

    >>> try:
    ...     yaml.safe_load("epochs: [1,\n")
    ... except yaml.YAMLError as error:
    ...     yaml_error_line(error)
    "line 2, column 1: expected the node content, but found '<stream end>' (while parsing a flow node)"
    """
    problem = getattr(error, "problem", None)
    if not problem:
        return " ".join(str(error).split())
    mark = getattr(error, "problem_mark", None)
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
    context = getattr(error, "context", None)
    return f"{where}{problem}" + (f" ({context})" if context else "")


def load_config_file(path, options):
    """Reads a YAML recipe file into a dict of validated option values.

    Args:
        path: the YAML file: a mapping from option names (underscores or
            dashes) to values.
        options: the recipe's `Option` list.

    Returns:
        A dict from option name to converted value.

    Raises:
        ConfigError: unreadable YAML, not a mapping, an unknown key (the
            message lists the valid ones) or a bad value; an empty value
            (`key:` or `key: null`) only for an option whose default is None
            (there it means that default).

    Example:

    >>> load_config_file(find_config_file("transformer_tiny"), COMMON_OPTIONS + extra)
    {'strategy': 'mirrored', ...}
    """
    by_name = {option.name: option for option in options}
    try:
        with open(path) as stream:
            raw = yaml.safe_load(stream)
    except OSError as error:
        raise ConfigError(f"Cannot read config file {path}: {error}") from None
    except yaml.YAMLError as error:
        raise ConfigError(f"Config file {path} is not valid YAML: {yaml_error_line(error)}. Fix "
                          f"the file (`--print-config` without `--config` prints a valid one).") from None
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ConfigError(
            f"Config file {path} must hold a mapping of option: value, got {type(raw).__name__}.")
    values = {}
    for key, value in raw.items():
        name = str(key).replace("-", "_")
        if name not in by_name:
            raise ConfigError(
                f"Config file {path}: unknown option {key!r}. Valid options: {', '.join(sorted(by_name))}.")
        option = by_name[name]
        if value is None and option.default is not None:
            raise ConfigError(
                f"Config file {path}: {key} is empty (null), but it needs a value "
                f"({option.type.__name__}; the default is {option.default!r}): give one, or "
                "remove the line for the default.")
        values[name] = option.convert(value, f"config file {path}")
    return values


def shipped_configs():
    """Names of the YAML recipes that ship inside the package.

    Example:

    >>> "transformer_tiny" in shipped_configs()
    True
    """
    try:
        names = os.listdir(PACKAGED_CONFIGS)
    except OSError:
        return []
    return sorted(name[:-5] for name in names if name.endswith(".yaml"))


def build_parser(options, prog, description, epilog=None):
    """Builds the argparse parser for a recipe from its `Option` list.

    Defaults are kept out of the parser (so that flags given by the user can
    be told apart from defaults) and shown in the help text instead.

    Example:

    >>> parser = build_parser(COMMON_OPTIONS, "demo", "A demo recipe.")
    >>> parser.parse_args(["--epochs", "3"]).epochs
    3
    """
    parser = argparse.ArgumentParser(
        prog=prog, description=description, epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter, argument_default=argparse.SUPPRESS)
    parser.add_argument(
        "--config", metavar="FILE",
        help="YAML recipe: a path, or the name of a shipped recipe (" + ", ".join(shipped_configs())
             + f") or of one in ${CONFIG_DIRS_ENV}; flags override it.")
    parser.add_argument(
        "--print-config", action="store_true",
        help="Print the configuration this run would use (after --config, flags and the auto "
             "choices) as YAML, and exit.")
    for option in options:
        metavar = option.metavar or (
            "{" + ",".join(map(str, option.choices)) + "}" if option.choices
            else option.type.__name__.upper())
        extra = {"nargs": "?", "const": "true"} if option.type is bool else {}
        parser.add_argument(
            option.flag, dest=option.name, metavar=metavar,
            help=f"{option.help} (default: {option.default})", **extra)
    return parser


def parse_config(argv, options, prog, description="", epilog=None):
    """Parses flags and the optional `--config` file into one namespace.

    Args:
        argv: command-line arguments (without the program name).
        options: the recipe's `Option` list (usually `COMMON_OPTIONS + own`).
        prog, description, epilog: for `--help`.

    Returns:
        An `argparse.Namespace` holding every option's final value, plus
        `config_file` (the YAML used, or None), `explicit` (the set of
        option names set by a flag or the file), `from_flags` (those set by
        a flag) and `print_config`.

    Raises:
        ConfigError: a bad flag value, config file or unknown key.
        SystemExit: from argparse, for `--help` and unknown flags.

    Example:

    >>> parse_config(["--epochs", "2"], COMMON_OPTIONS, "demo").epochs
    2
    """
    names = [option.name for option in options]
    if len(set(names)) != len(names):
        raise ValueError(f"Duplicate option names in {names}.")
    parser = build_parser(options, prog, description, epilog)
    flags = vars(parser.parse_args(argv))
    config_file = flags.pop("config", None)
    print_config = flags.pop("print_config", False)
    values = {option.name: option.default for option in options}
    explicit = set()
    if config_file is not None:
        config_file = find_config_file(config_file)
        from_file = load_config_file(config_file, options)
        values.update(from_file)
        explicit.update(from_file)
    from_flags = set()
    for option in options:
        if option.name in flags:
            values[option.name] = option.convert(flags[option.name], f"flag {option.flag}")
            from_flags.add(option.name)
    for option in options:
        setting = os.environ.get(option.environment, "") if option.environment else ""
        if setting.strip() and option.name not in explicit | from_flags:
            values[option.name] = option.convert(setting, f"${option.environment}")
    return argparse.Namespace(**values, config_file=config_file, explicit=explicit | from_flags,
                              from_flags=from_flags, print_config=print_config)
