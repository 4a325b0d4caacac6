"""tfdist: multi-device and multi-machine training of Keras 3 models on TensorFlow.

The package root stays light (no TensorFlow import) so that tools such as the
launcher start instantly. Import what you need from the sub-modules:

    from tfdist.strategy import create_strategy
    from tfdist.training import Trainer
"""

__version__ = "0.1.0"
