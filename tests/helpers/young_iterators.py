"""The tf.data iterators a test leaves alive, collected while they are young.

An iterator that outlives its test in a reference cycle is freed only at a
later full garbage collection, often minutes and many tests later. TensorFlow
2.21 then sometimes blocks in the iterator's destructor
(`RootDataset::Iterator::~Iterator`) until the iterator's autotune thread ends
its current sleep, a period that doubles up to 60 s: in this suite, stalls of
22-87 s inside unrelated quick tests. The usual cycle: a test catches an error
raised out of a training loop (`pytest.raises`); the traceback keeps the
loop's frames and their iterators, and the frame that caught it holds
pytest's `ExceptionInfo`, which holds the traceback.

`YoungIterators` watches every eager tf.data iterator made in the test process
(`tf.data` iterators and the multi-device iterators of `tf.distribute`). After
a test, if one made since the last check is still alive, it runs one full
collection (0.1-0.4 s in a test process) while the iterator is seconds old;
one still alive after that is held on purpose (by a module's fixture, say) and
is checked again only when its module ends. Tests that leave no iterator
alive pay nothing. tests/conftest.py runs it after every test.

    from helpers.young_iterators import YoungIterators

    watcher = YoungIterators()
    watcher.watch()                                  # iterators made from now on
    ...                                              # a test
    watcher.collect_if_left_alive(module_ends=False) # True if it collected
    watcher.unwatch()
"""

import functools
import gc
import time
import weakref

_watchers = []  # the YoungIterators told of every new iterator
_wrapped = set()  # the iterator classes whose __init__ is wrapped


def _iterator_classes():
    """The classes of eager tf.data iterators: what `iter(dataset)` returns, and
    the multi-device iterator a `tf.distribute` input iterator builds."""
    from tensorflow.python.data.ops import iterator_ops, multi_device_iterator_ops

    return [iterator_ops.OwnedIterator, multi_device_iterator_ops.OwnedMultiDeviceIterator]


def _tell_watchers_on_init(cls):
    """Wraps `cls.__init__` (once) so every new instance is told to the watchers."""
    if cls in _wrapped:
        return
    own_init = cls.__init__

    @functools.wraps(own_init)
    def init(self, *args, **kwargs):
        own_init(self, *args, **kwargs)
        for watcher in _watchers:
            watcher.saw(self)

    _wrapped.add(cls)
    cls.__init__ = init


class YoungIterators:
    """Collects, after a test, the reference cycles that keep the tf.data
    iterators it made alive, so they are freed young (see the module's text).

    Example:

        watcher = YoungIterators()
        watcher.watch()
        watcher.collect_if_left_alive(module_ends=True)
    """

    def __init__(self):
        self._new = []    # weak references to iterators made since the last check
        self._held = []   # alive after a collection: checked again when a module ends
        self.collections = []  # (why, seconds) of every collection it ran

    def watch(self):
        """Starts watching the iterators made from now on in this process."""
        for cls in _iterator_classes():
            _tell_watchers_on_init(cls)
        if self not in _watchers:
            _watchers.append(self)

    def unwatch(self):
        """Stops watching (the wrapped `__init__` stays, telling no one)."""
        if self in _watchers:
            _watchers.remove(self)

    def saw(self, iterator):
        """Notes a new iterator (called by the wrapped `__init__`)."""
        self._new.append(weakref.ref(iterator))

    def made_and_alive(self):
        """The iterators made since the last check that are alive now.

        Example: `[type(it).__name__ for it in watcher.made_and_alive()]`
        """
        return [ref() for ref in _alive(self._new)]

    def collect_if_left_alive(self, module_ends, why="a test"):
        """After a test: one full collection if an iterator made since the last
        check is alive, or, when a module ends, if one held before is. Returns
        whether it collected.

        Example: `watcher.collect_if_left_alive(module_ends=False)`
        """
        new = _alive(self._new)
        self._new = []
        held = _alive(self._held) if module_ends else []
        if not new and not held:
            return False
        start = time.perf_counter()
        gc.collect()
        self.collections.append((why, time.perf_counter() - start))
        # Alive after a collection: held on purpose. Those are checked again
        # when their module ends; those that outlive a module's end live for
        # the session and are not checked again.
        self._held = [] if module_ends else _alive(self._held) + _alive(new)
        return True


def _alive(references):
    return [ref for ref in references if ref() is not None]
