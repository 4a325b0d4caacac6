"""BlockedStopSignals leaves the process as it found it: a recipe run as a
function (`RECIPE.main(argv)`) must not leave SIGTERM/SIGINT blocked in the
caller, whose later child processes would inherit the mask, nor its precision
as Keras's global dtype policy."""

import signal
import threading

from tfdist.runtime.stop_signals import BlockedStopSignals

STOP = {signal.SIGTERM, signal.SIGINT}


def blocked():
    return signal.pthread_sigmask(signal.SIG_BLOCK, []) & STOP


def test_close_unblocks_what_install_blocked():
    assert blocked() == set()
    signals = BlockedStopSignals.install("test", watchdog=False)
    assert blocked() == STOP
    signals.close()
    assert blocked() == set()
    signals.close()  # a second close changes nothing
    assert blocked() == set()


def test_close_leaves_blocked_what_the_caller_had_blocked():
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        signals = BlockedStopSignals.install("test", watchdog=False)
        signals.close()
        assert blocked() == {signal.SIGINT}
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def test_discard_pending_takes_a_late_signal_so_close_delivers_nothing():
    signals = BlockedStopSignals.install("test", watchdog=False)
    try:
        signal.pthread_kill(threading.main_thread().ident, signal.SIGTERM)
        assert signals.discard_pending() == ["SIGTERM"]
        assert signals.received is None and signals.discard_pending() == []
    finally:
        signals.close()  # with SIGTERM still pending, this would end the test process
    assert blocked() == set()


def test_a_recipe_run_in_process_gives_the_signals_and_the_dtype_policy_back():
    import keras

    from tfdist.recipes import transformer

    # A batch found not to divide over the replicas once TensorFlow started
    # (exit 2), and a finished run.
    assert transformer.main(["--strategy", "mirrored", "--global-batch-size", "3",
                             "--verbose", "0"]) == 2
    assert blocked() == set()
    assert transformer.main(["--epochs", "1", "--steps-per-epoch", "2", "--warmup-steps", "1",
                             "--verbose", "0", "--precision", "bf16"]) == 0
    assert blocked() == set()
    assert keras.mixed_precision.global_policy().name == "float32"  # not the run's bf16
