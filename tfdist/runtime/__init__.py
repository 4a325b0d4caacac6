"""tfdist.runtime: process concerns that know no training.

Stop signals, TensorFlow's logging, GPU memory, NVML, argument types, exit
codes and the model-dir lock. Importing this package imports no TensorFlow:

    from tfdist.runtime.exit_codes import BAD_INPUT
"""
