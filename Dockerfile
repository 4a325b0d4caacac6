# tfdist GPU image: TensorFlow 2.21 with its CUDA wheels, Keras 3, tfdist.
#   docker build -t tfdist .
#   docker run --gpus all --rm tfdist                                   # Transformer recipe, all GPUs
#   docker run --gpus all --rm tfdist tfdist cnn --strategy mirrored     # another recipe
#   docker run --gpus all --rm -e TF_CONFIG="$TF_CONFIG" --network host tfdist \
#       tfdist transformer --strategy multi_worker_mirrored             # one worker of a cluster
FROM python:3.11.7-slim-bookworm

ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
# TensorFlow's C++ logging is quiet by default in tfdist's commands; pass
# -e TF_CPP_MIN_LOG_LEVEL=0 (or a recipe's --tf-log-level 0) to see it.

WORKDIR /workspace
# Dependencies first, so that code changes do not rebuild the CUDA layer.
COPY pyproject.toml setup.cfg README.md ./
COPY tfdist/__init__.py tfdist/__init__.py
RUN pip install ".[cuda,datasets]" && pip uninstall -y tfdist

COPY tfdist tfdist
COPY recipes recipes
# The YAML recipes ship inside the package (--config transformer_tiny); mount
# your own folder of YAML files and name it in TFDIST_RECIPES_DIR to add more.
RUN pip install --no-deps . && tfdist transformer --config transformer_tiny --print-config >/dev/null

# Checkpoints and TensorBoard logs: mount a volume here.
VOLUME /workspace/runs
ENTRYPOINT []
CMD ["tfdist", "transformer", "--strategy", "auto", "--model-dir", "/workspace/runs/transformer"]
