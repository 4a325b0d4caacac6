"""tfdist.runtime: process concerns that know no training.

Stop signals, TensorFlow's logging, GPU memory, NVML, argument types, exit
codes, the model-dir lock, and a quick exit (no exit-time garbage
collection). Importing this package imports no TensorFlow:

    from tfdist.runtime.exit_codes import BAD_INPUT
"""
