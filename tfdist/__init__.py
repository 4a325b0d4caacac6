"""tfdist: multi-device and multi-machine training of Keras 3 models on TensorFlow.

The package root stays light (no TensorFlow import) so that tools such as the
launcher start instantly; importing it makes the program's first
`import tensorflow` quiet (`tfdist.runtime.tf_logging.quiet_tensorflow_import`),
its CPU tensors come from TensorFlow's memory pool
(`tfdist.runtime.cpu_allocator`), and its first `import keras` leave
matplotlib for Keras's first plot (`tfdist.seam.keras_import`).
The two names most programs need load on first use:

    import tfdist
    strategy = tfdist.create_strategy("mirrored")
    trainer = tfdist.Trainer(model)       # model: any compiled Keras 3 model
"""

from tfdist.runtime.lazy_exports import lazy_exports
from tfdist.old_paths import install_old_paths
from tfdist.runtime.cpu_allocator import pool_cpu_memory
from tfdist.runtime.tf_logging import quiet_tensorflow_import
from tfdist.runtime.first_import import FirstImportHook
from tfdist.seam.keras_import import keras_import_without_matplotlib

__version__ = "0.1.0"

__getattr__, __dir__ = lazy_exports(__name__, {
    "Trainer": "tfdist.training.trainer",
    "create_strategy": "tfdist.distribute.strategy_factory",
})

# TensorFlow's C++ start-up lines stay hidden when it is imported after tfdist
# (TF_CPP_MIN_LOG_LEVEL=0 shows them); see tfdist.runtime.tf_logging.
quiet_tensorflow_import()
# CPU tensors from TensorFlow's pool, not malloc (1.2-1.75x faster steps where
# malloc maps and faults them in every step); TF_CPU_ALLOCATOR_USE_BFC=false
# keeps malloc. See tfdist.runtime.cpu_allocator.
pool_cpu_memory()
# Keras imports matplotlib when it first plots, not when it is imported
# (0.4 s of CPU per process where matplotlib is installed); see tfdist.seam.keras_import.
FirstImportHook("keras", keras_import_without_matplotlib).install()
# `from tfdist.strategy import ...` and the other paths of the last release.
install_old_paths()
