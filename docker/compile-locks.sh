#!/usr/bin/env bash
# Compiles the image's pinned, hashed dependency sets with pip-compile
# (pip-tools) from setup.cfg and the .in file of each variant:
#   gpu: setup.cfg with the cuda, datasets, bench extras + requirements-gpu.in
#   cpu: setup.cfg with the datasets, bench extras    + requirements-cpu.in
# into docker/requirements-gpu.txt and docker/requirements-cpu.txt, for the
# image's platform: Python 3.11 on Linux x86_64, so run it there. Pins already
# in a .txt are kept while they still fit; extra arguments go to pip-compile,
# e.g. `--upgrade-package keras` or `--upgrade`. The resolution uses the
# package index alone, not this machine's pip configuration (local wheel
# folders, extra indexes).
#
# Run it after a requirement changes in setup.cfg or a .in file;
# tests/test_container.py fails while a lock misses one of them or pins a
# version outside its range.
set -euo pipefail
cd "$(dirname "$0")/.."

python=${PYTHON:-python3.11}
platform=$("$python" -c 'import platform, sys; print(f"{sys.version_info[0]}.{sys.version_info[1]} {platform.system()} {platform.machine()}")')
if [[ "$platform" != "3.11 Linux x86_64" ]]; then
    echo "compile-locks.sh: the image runs Python 3.11 on Linux x86_64, this is $platform ($python); set PYTHON=..." >&2
    exit 2
fi

tools=$(mktemp -d)
trap 'rm -rf "$tools"' EXIT
"$python" -m venv "$tools/venv"
export PIP_CONFIG_FILE=/dev/null
unset PIP_FIND_LINKS PIP_INDEX_URL PIP_EXTRA_INDEX_URL
"$tools/venv/bin/pip" install --quiet pip==26.3 pip-tools==7.6.2

compile() {
    local variant=$1; shift
    CUSTOM_COMPILE_COMMAND="docker/compile-locks.sh" "$tools/venv/bin/pip-compile" \
        --quiet --generate-hashes --allow-unsafe --strip-extras \
        --no-emit-index-url --no-emit-find-links \
        --output-file "docker/requirements-$variant.txt" "$@" \
        setup.cfg "docker/requirements-$variant.in"
}
compile gpu --extra cuda --extra datasets --extra bench "$@"
compile cpu --extra datasets --extra bench "$@"
