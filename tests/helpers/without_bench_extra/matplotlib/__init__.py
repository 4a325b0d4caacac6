"""matplotlib as the processes the tests start see it: not installed.

The README's main command installs tfdist without the `bench` extra, so a
user's recipe run has no matplotlib; the test extra installs it for the
scaling-plot tests. Keras imports `matplotlib.pyplot` whenever it is
importable (for its image-gallery plots), which costs each TensorFlow process
0.3-0.7 s of start-up, about 130 times per suite, unless tfdist was imported
first (`tfdist.seam.keras_import` then leaves it for Keras's first plot; the
test scripts and example programs that import Keras first still pay it). tests/conftest.py puts this
folder first on the PYTHONPATH of every process a test worker starts, so those
processes start as in the default install; the pytest workers themselves (the
plot tests) and the `tfdist bench` runs that draw a plot
(`tests/bench/test_bench_cli.py` takes this folder off their path) keep the
real matplotlib.
"""

raise ModuleNotFoundError(
    "No module named 'matplotlib' (hidden from the processes the tests start, as in "
    "tfdist's default install: tests/helpers/without_bench_extra)", name="matplotlib")
