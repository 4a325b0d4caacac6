"""tfdist: multi-device and multi-machine training of Keras 3 models on TensorFlow.

The package root stays light (no TensorFlow import) so that tools such as the
launcher start instantly; importing it makes the program's first
`import tensorflow` quiet (`tfdist.runtime.tf_logging.quiet_tensorflow_import`).
Import what you need from the sub-modules:

    from tfdist.distribute.strategy import create_strategy
    from tfdist.training import Trainer
"""

from tfdist.runtime.tf_logging import quiet_tensorflow_import

__version__ = "0.1.0"

# TensorFlow's C++ start-up lines stay hidden when it is imported after tfdist
# (TF_CPP_MIN_LOG_LEVEL=0 shows them); see tfdist.runtime.tf_logging.
quiet_tensorflow_import()
