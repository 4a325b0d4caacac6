"""Leaving a process without the interpreter's exit-time garbage collection.

A Python process that has loaded TensorFlow and Keras holds millions of
objects. At exit, after the `atexit` handlers, the interpreter runs full
garbage-collection passes over all of them while it tears its modules down:
measured on a 2-core AMD EPYC (Zen 3, AVX2), 2-7 s after the last line of a
finished 2-device Transformer recipe run (20 steps; 0.2-0.4 s with this
module's handler installed). Nothing needs those passes at exit: every
object is still released by reference counting and the operating system
frees the rest; files the run wrote are closed before its last line.

`skip_exit_garbage_collection()` registers one `atexit` handler that
freezes the objects alive at that point (`gc.freeze`), so the exit-time
passes have nothing left to scan. tfdist's commands (the recipes, `bench`)
install it; a program of your own can call it too:

    from tfdist.runtime.quick_exit import skip_exit_garbage_collection

    skip_exit_garbage_collection()
"""

import atexit
import gc
import threading

_lock = threading.Lock()
_installed = False


def skip_exit_garbage_collection():
    """Makes the interpreter's exit skip its full garbage-collection passes.

    Registers (once per process) an `atexit` handler that moves every
    object alive at that point to the collector's permanent generation
    (`gc.freeze()`), which the exit-time passes do not scan. `atexit`
    handlers run last-registered first, so installed early this handler runs
    after the handlers registered later (TensorFlow's, a user's). Objects
    are still freed by reference counting as modules are cleared; only
    reference cycles still alive at exit are left to the operating system
    (Python does not promise to finalise those at exit either), so close
    files and writers before the program ends, as tfdist's callbacks do at
    the end of training.

    Returns:
        True when this call installed the handler, False when it already was.

    Example:

    >>> skip_exit_garbage_collection()
    True
    >>> skip_exit_garbage_collection()
    False
    """
    global _installed
    with _lock:
        if _installed:
            return False
        atexit.register(gc.freeze)
        _installed = True
        return True
