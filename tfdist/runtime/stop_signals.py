"""SIGTERM and SIGINT as requests to stop, seen at step boundaries.

Clusters preempt a job with SIGTERM and a grace period (Kubernetes, SLURM,
spot VMs); a person stops it with Ctrl-C (SIGINT). tfdist turns both into
"save a backup at the next step every worker agrees on, then exit with a
restartable code" (see `tfdist.callbacks.PreemptionGuard`). For that the
signal must be *seen*, and two things in TensorFlow get in the way:

* `MultiWorkerMirroredStrategy` installs TensorFlow's own SIGTERM handler
  (its preemption notifier) while it connects to its peers, after which a
  Python handler never runs.
* While TensorFlow waits for peers (and in some other long calls) it holds
  Python's interpreter lock, so no Python code runs at all: a Python signal
  handler, or a thread, cannot react until the call returns.

Two ways to receive the signals, with one interface (`pending()`,
`training_started()`, `close()`):

* `BlockedStopSignals` (what the recipes use): from the start of the
  process, before TensorFlow creates its threads, SIGTERM and SIGINT are
  blocked in every thread, so no handler (TensorFlow's included) consumes
  them; they wait as pending signals, and the training loop takes them at
  each step boundary (`pending()`). Until the first training step ends
  there is nothing to save, so a small watchdog process reads the pending
  signals of this process from /proc (it needs no interpreter lock) and,
  when one arrives, prints one line and stops this process at once
  (SIGKILL, exit status 137), even in the middle of TensorFlow's start-up.
* `HandlerStopSignals` (for your own program): Python handlers that note
  the signal; simple, but deaf while TensorFlow holds the interpreter lock.

Example:

    signals = BlockedStopSignals.install("my_app")   # first thing, before TensorFlow
    ...
    if signals.pending():
        ...  # save, then exit
"""

import os
import signal
import subprocess
import sys
import threading

from tfdist.runtime import exit_codes

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)

PREEMPTED_EXIT_CODE = exit_codes.PREEMPTED
"""The exit code of a run stopped by SIGTERM/SIGINT after saving its backup:
128 + SIGTERM, as TensorFlow's own preemption handler uses, and in the range
Kubernetes' `restartPolicy: ExitCode` treats as restartable."""


class Preempted(Exception):
    """Training stopped because a worker got SIGTERM or SIGINT; the backup is written.

    Raised by `tfdist.callbacks.PreemptionGuard` out of `fit`.

    Attributes:
        signal_name: `"SIGTERM"` or `"SIGINT"` (as the worker that got it reported).
        epoch: the epoch (0-based) training stopped in.
        step: the steps finished in that epoch.
        backup: the `BackupInfo` written at the stop, or None without a backup.

    Example:

    >>> try:
    ...     trainer.fit(data, epochs=3, callbacks=[backup, PreemptionGuard(backup)])
    ... except Preempted:
    ...     sys.exit(PREEMPTED_EXIT_CODE)
    """

    def __init__(self, message, signal_name=None, epoch=None, step=None, backup=None):
        super().__init__(message)
        self.signal_name = signal_name
        self.epoch = epoch
        self.step = step
        self.backup = backup

# The watchdog: reads the parent's pending signals from /proc every 0.1 s and,
# on SIGTERM or SIGINT, prints one line and SIGKILLs the parent. It ignores
# SIGTERM/SIGINT itself (a launcher signals the whole process group) and
# exits when the parent is gone or closes the pipe it holds.
_WATCHDOG = r"""
import os, select, signal, sys
signal.signal(signal.SIGTERM, signal.SIG_IGN)
signal.signal(signal.SIGINT, signal.SIG_IGN)
pid, prefix = int(sys.argv[1]), sys.argv[2]
names = {int(signal.SIGTERM): "SIGTERM", int(signal.SIGINT): "SIGINT"}
while True:
    ready, _, _ = select.select([sys.stdin], [], [], 0.1)
    if ready or os.getppid() != pid:
        sys.exit(0)
    try:
        with open(f"/proc/{pid}/status") as status:
            lines = status.read().splitlines()
    except OSError:
        sys.exit(0)
    bits = 0
    for line in lines:
        if line.startswith(("ShdPnd:", "SigPnd:")):
            bits |= int(line.split()[1], 16)
    for number, name in names.items():
        if bits & (1 << (number - 1)):
            sys.stderr.write(
                f"{prefix}: {name} before the first training step ended (nothing to save "
                "yet): stopping now. Rerun the same command to start again.\n")
            sys.stderr.flush()
            os.kill(pid, signal.SIGKILL)
            sys.exit(0)
"""


class BlockedStopSignals:
    """SIGTERM/SIGINT blocked in every thread, taken at step boundaries.

    Create it with `install()` as the first thing a program does, before
    TensorFlow is imported (threads inherit the blocked set from the thread
    that creates them). Child processes started afterwards inherit it too:
    start them with `subprocess.Popen(..., preexec_fn=unblock)` if they must
    receive these signals.

    Attributes:
        received: the name of the first signal taken (`"SIGTERM"`), or None.

    Example:

    >>> signals = BlockedStopSignals.install("python -m my_app")
    >>> signals.pending()     # None until a SIGTERM or SIGINT arrives
    >>> signals.training_started()   # the watchdog stops; signals wait for pending()
    """

    def __init__(self, prefix):
        self.prefix = prefix
        self.received = None
        self._watchdog = None
        self._blocked_before = frozenset(STOP_SIGNALS)  # what close() leaves blocked

    @classmethod
    def install(cls, prefix, watchdog=True):
        """Blocks SIGTERM and SIGINT in this thread (and every thread created
        after) and starts the start-up watchdog.

        Args:
            prefix: how the watchdog names this program in its one line.
            watchdog: start the watchdog that stops the process at once on a
                signal before `training_started()`.

        Raises:
            RuntimeError: not called from the main thread.

        Example:

        >>> signals = BlockedStopSignals.install("tfdist transformer")
        """
        if threading.current_thread() is not threading.main_thread():
            raise RuntimeError("BlockedStopSignals.install() must be called from the main thread.")
        signals = cls(prefix)
        if watchdog:
            # Started before blocking, so that it has the default signal mask.
            signals._watchdog = subprocess.Popen(
                [sys.executable, "-c", _WATCHDOG, str(os.getpid()), prefix],
                stdin=subprocess.PIPE, stdout=subprocess.DEVNULL)
        previous = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
        signals._blocked_before = frozenset(previous) & frozenset(STOP_SIGNALS)
        return signals

    def pending(self):
        """Takes a pending SIGTERM or SIGINT, if any; returns its name or None.

        Once one was taken, keeps returning its name.

        Example:

        >>> signals.pending()
        'SIGTERM'
        """
        if self.received is None:
            taken = signal.sigtimedwait(STOP_SIGNALS, 0)
            if taken is not None:
                self.received = signal.Signals(taken.si_signo).name
        return self.received

    def discard_pending(self):
        """Takes every SIGTERM and SIGINT still pending and returns their names,
        without noting them as `received`: for the end of a run, when a stop
        request that arrives after the outcome is settled has nothing left to
        stop (and would otherwise be delivered by `close()`).

        Example:

        >>> signals.discard_pending()
        []
        """
        names = []
        while (taken := signal.sigtimedwait(STOP_SIGNALS, 0)) is not None:
            names.append(signal.Signals(taken.si_signo).name)
        return names

    def training_started(self):
        """From now on a signal waits for `pending()`: stops the watchdog."""
        watchdog, self._watchdog = self._watchdog, None
        if watchdog is not None:
            watchdog.stdin.close()
            watchdog.wait(timeout=10)

    def close(self):
        """Stops the watchdog and gives this thread back the signal mask it had
        before `install()`: SIGTERM and SIGINT are unblocked unless they were
        blocked already (a pending one is then delivered as usual). A program
        that runs a recipe as a function (`RECIPE.main(argv)`) gets its
        Ctrl-C back, and the processes it starts later receive SIGTERM.

        Example:

        >>> signals = BlockedStopSignals.install("my_app", watchdog=False)
        >>> signals.close()
        >>> signal.pthread_sigmask(signal.SIG_BLOCK, [])   # as before install()
        set()
        """
        self.training_started()
        unblock = frozenset(STOP_SIGNALS) - self._blocked_before
        if unblock:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, unblock)
        self._blocked_before = frozenset(STOP_SIGNALS)  # a second close() changes nothing


class HandlerStopSignals:
    """Python handlers for SIGTERM and SIGINT that note the signal.

    For programs that cannot block the signals from their start. A Python
    handler runs only when the interpreter is free: not while TensorFlow
    connects to its peers or holds the interpreter lock otherwise, and
    `MultiWorkerMirroredStrategy` replaces a SIGTERM handler installed
    before it starts (install this one after creating the strategy).

    Example:

    >>> signals = HandlerStopSignals.install()
    >>> signals.pending()
    >>> signals.close()   # the previous handlers are back
    """

    def __init__(self):
        self.received = None
        self._previous = {}

    @classmethod
    def install(cls):
        """Installs the handlers (main thread only); returns the object."""
        signals = cls()
        for number in STOP_SIGNALS:
            signals._previous[number] = signal.signal(number, signals._note)
        return signals

    def _note(self, number, frame):
        if self.received is None:
            self.received = signal.Signals(number).name

    def pending(self):
        """The name of the first signal received, or None."""
        return self.received

    def training_started(self):
        """Nothing to do for handlers."""

    def close(self):
        """Puts back the handlers that were there before (the default action
        where a handler installed from C, such as TensorFlow's, was)."""
        for number, previous in self._previous.items():
            signal.signal(number, previous if previous is not None else signal.SIG_DFL)
        self._previous = {}


def unblock():
    """Unblocks SIGTERM and SIGINT in the calling thread (a `preexec_fn` for children).

    Example:

    >>> subprocess.Popen(["sleep", "60"], preexec_fn=unblock)
    """
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
