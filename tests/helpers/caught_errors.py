"""What a test that catches an error out of a training loop leaves behind.

A test that catches an error raised inside `fit` (`pytest.raises`) keeps the
error's traceback, and with it every frame of the loop and the tf.data
iterators those frames hold, in a reference cycle: the frame that caught it
is on the traceback and holds pytest's `ExceptionInfo`, which holds the
traceback. Python frees such a cycle only at a later full collection, often
minutes and many tests later. TensorFlow 2.21 then sometimes blocks in the
iterator's destructor (`RootDataset::Iterator::~Iterator`) until the
iterator's autotune thread ends its current sleep, a period that doubles up
to 60 s: in this suite, stalls of 22-87 s inside unrelated quick tests, in 4
of 5 whole runs. Collected at the end of the test that made it, the iterator
is seconds old and that sleep is short.

    from helpers.caught_errors import free_what_caught_errors_hold

    free_what_caught_errors_hold()   # what the `frees_caught_training_errors` fixture runs
"""

import gc


def free_what_caught_errors_hold():
    """Collects reference cycles now (a full collection: 0.1-0.4 s in a test
    process), so the iterators a caught error held are freed while young.

    Example: `free_what_caught_errors_hold()`
    """
    gc.collect()
