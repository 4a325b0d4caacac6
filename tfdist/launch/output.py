"""Multiplexes the output of several processes into shared streams, one whole
line at a time, each line prefixed with where it came from.

One thread reads every pipe through a selector, so lines from different
workers can never interleave mid-line.
"""

import os
import selectors
import time

MAX_LINE_BYTES = 1 << 20
"""A line longer than this (no newline yet) is written out in pieces."""


class Sink:
    """A text stream that survives its reader going away.

    Every `write_line` writes one complete line and flushes, so a line is never
    split by another stream's output. When the stream is closed or its pipe is
    broken (e.g. `| head`), further lines are dropped instead of raising.

    Args:
        stream: a text stream such as `sys.stdout` or an `io.StringIO`.

    Example:

    >>> import io
    >>> out = io.StringIO(); Sink(out).write_line("[worker 0] hi")
    >>> out.getvalue()
    '[worker 0] hi\\n'
    """

    def __init__(self, stream):
        self.stream = stream
        self.broken = False

    def write_line(self, text):
        """Writes `text` plus a newline and flushes.

        Args:
            text: the line, without its newline.

        Example:

        >>> import sys; Sink(sys.stdout).write_line("hello")
        hello
        """
        if self.broken:
            return
        line = text + "\n"
        try:
            try:
                self.stream.write(line)
            except UnicodeEncodeError:
                encoding = getattr(self.stream, "encoding", None) or "ascii"
                self.stream.write(line.encode(encoding, "replace").decode(encoding))
            flush = getattr(self.stream, "flush", None)
            if flush is not None:
                flush()
        except (OSError, ValueError):  # broken pipe, closed file
            self.broken = True


class OutputPump:
    """Reads the pipes of several processes and writes each complete line,
    prefixed, to a `Sink`.

    Register each pipe with `add`, call `poll` in the supervising loop (it
    doubles as the loop's sleep), and `drain` at the end. A final line without
    a newline is written at end of file.

    Example:

    >>> import subprocess, sys
    >>> proc = subprocess.Popen(["echo", "hi"], stdout=subprocess.PIPE)
    >>> pump = OutputPump(); pump.add(proc.stdout, "[worker 0] ", Sink(sys.stdout))
    >>> pump.drain(timeout=5); proc.wait()
    [worker 0] hi
    True
    0
    """

    def __init__(self):
        self._selector = selectors.DefaultSelector()
        self._pending = {}

    def add(self, pipe, prefix, sink):
        """Starts reading `pipe` (a binary file object with a fileno).

        Args:
            pipe: e.g. `Popen.stdout`.
            prefix: text put before every line, e.g. "[worker 1] ".
            sink: the `Sink` that receives the lines.

        Example:

        >>> import subprocess, sys
        >>> proc = subprocess.Popen(["true"], stdout=subprocess.PIPE)
        >>> OutputPump().add(proc.stdout, "[worker 0] ", Sink(sys.stdout))
        """
        self._selector.register(pipe, selectors.EVENT_READ, (prefix, sink))
        self._pending[pipe] = b""

    @property
    def open_pipes(self):
        """The number of pipes not yet at end of file."""
        return len(self._pending)

    def poll(self, timeout):
        """Waits up to `timeout` seconds for output and writes what arrived.

        Args:
            timeout: seconds to wait at most; also slept when no pipe is open.

        Example:

        >>> OutputPump().poll(0.01)
        """
        if not self._pending:
            time.sleep(timeout)
            return
        for key, _ in self._selector.select(timeout):
            pipe = key.fileobj
            prefix, sink = key.data
            data = os.read(pipe.fileno(), 65536)
            if not data:
                self._finish(pipe, prefix, sink)
                continue
            buffered = self._pending[pipe] + data
            *lines, rest = buffered.split(b"\n")
            while len(rest) > MAX_LINE_BYTES:
                lines.append(rest[:MAX_LINE_BYTES])
                rest = rest[MAX_LINE_BYTES:]
            self._pending[pipe] = rest
            for line in lines:
                sink.write_line(prefix + line.decode("utf-8", "replace"))

    def drain(self, timeout):
        """Writes output until every pipe is at end of file or `timeout`
        seconds have passed.

        Args:
            timeout: seconds to wait at most.

        Returns:
            True when every pipe reached end of file.

        Example:

        >>> OutputPump().drain(timeout=1)
        True
        """
        deadline = time.monotonic() + timeout
        while self._pending:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            self.poll(min(remaining, 0.1))
        return True

    def close(self):
        """Writes any partial lines, then closes every pipe and the selector.

        Example:

        >>> OutputPump().close()
        """
        for key in list(self._selector.get_map().values()):
            prefix, sink = key.data
            self._finish(key.fileobj, prefix, sink)
        self._selector.close()

    def _finish(self, pipe, prefix, sink):
        rest = self._pending.pop(pipe, b"")
        if rest:
            sink.write_line(prefix + rest.decode("utf-8", "replace"))
        self._selector.unregister(pipe)
        pipe.close()
