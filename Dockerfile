# tfdist image (linux/amd64): TensorFlow 2.21, Keras 3, tfdist, every
# third-party package pinned and hash-checked (docker/requirements-*.txt).
#   docker build -t tfdist .                                # GPU: CUDA and cuDNN from pip wheels
#   docker build --build-arg VARIANT=cpu -t tfdist:cpu .    # CPU: plain TensorFlow, no CUDA libraries
#   docker run --gpus all --rm tfdist                       # the Transformer recipe on every GPU
# README.md's Docker section has the rest: volumes, SIGTERM, clusters.
FROM python:3.11.7-slim-bookworm

# gpu (default) or cpu: which pinned set docker/requirements-VARIANT.txt to install.
ARG VARIANT=gpu

# TF_CPP_MIN_LOG_LEVEL=3 keeps TensorFlow's C++ logging quiet in any Python
# program; tfdist respects an explicit value, so `-e TF_CPP_MIN_LOG_LEVEL=0`
# (or a recipe's --tf-log-level 0) shows it. MPLCONFIGDIR is writable for any
# user (`docker run --user`), so `tfdist bench` draws its figures silently.
ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore \
    TF_CPP_MIN_LOG_LEVEL=3 \
    MPLCONFIGDIR=/tmp/matplotlib

# tini runs as PID 1: it hands SIGTERM (docker stop, Kubernetes, SLURM) to
# tfdist, which backs up at one step and exits 143, and it reaps zombies.
RUN apt-get update \
    && apt-get install -y --no-install-recommends tini=0.19.0-1+b3 \
    && rm -rf /var/lib/apt/lists/*

# The third-party layer (several GB with CUDA) comes from the lock file
# alone, so changes to tfdist's code or README.md keep it cached.
WORKDIR /opt/tfdist
COPY docker/requirements-${VARIANT}.txt docker/
RUN pip install --require-hashes --requirement "docker/requirements-${VARIANT}.txt"

# tfdist itself: no dependency resolution and no index, so nothing unpinned
# can come in; pip check fails the build if the lock misses a requirement.
COPY pyproject.toml setup.cfg README.md ./
COPY tfdist tfdist
RUN pip install --no-deps --no-index --no-build-isolation . \
    && pip check \
    && tfdist --version \
    && tfdist transformer --config transformer_tiny --print-config >/dev/null

# An unprivileged user (tfdist, uid 1000) owns the working folder; checkpoints,
# backups and TensorBoard logs go to the volume (--model-dir /workspace/runs/...).
# USER is numeric so that Kubernetes' runAsNonRoot can verify it.
RUN useradd --create-home --uid 1000 --user-group tfdist \
    && mkdir -p /workspace/runs \
    && chown -R tfdist:tfdist /workspace
WORKDIR /workspace
VOLUME /workspace/runs
USER 1000:1000

ENTRYPOINT ["/usr/bin/tini", "--"]
CMD ["tfdist", "transformer", "--strategy", "auto", "--model-dir", "/workspace/runs/transformer"]
