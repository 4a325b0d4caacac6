"""The autotune trial: a few training steps of each candidate setting, alternating.

Each candidate gets its own model, optimizer and step, built under its
precision policy from the same seed (so all start from the same weights)
and fed the same batch replayed from memory (so input work does not blur
the comparison). The first steps (tracing, XLA compilation) are timed apart
as compile time; then every candidate runs `steps` steps in turn, for
`rounds` rounds, the order reversed every other round, as the machine's
speed drifts. Before training, each candidate's own evaluation step computes
the loss of the batch from the shared initial weights (inference mode: no
dropout, whose random draws differ under XLA), to check that each setting
computes what float32 does.

Example:

    def build(candidate):                  # called with its policy in force
        ...
        return trainer, dataset
    timings = run_trial(candidates, build, seed=42, rounds=3, steps=3)
    timings[0].median_step_seconds
"""

import dataclasses
import logging
import math
import statistics
import time

import keras

from tfdist.runtime.argtypes import check_int_at_least

logger = logging.getLogger("tfdist")


class TrialClock(keras.callbacks.Callback):
    """Records each training step's wall time and logged loss within one `fit` call.

    A step's time is the interval between consecutive `on_train_batch_end`
    calls, the first measured from `on_train_begin` (it includes creating the
    data iterator: leave it out with `skip`).

    Args:
        skip: steps at the start of the call whose times are left out.

    Example:

    >>> clock = TrialClock(skip=1)
    >>> trainer.fit(dataset, steps_per_epoch=4, callbacks=[clock], verbose=0)
    >>> len(clock.step_times), len(clock.losses)
    (3, 4)
    """

    def __init__(self, skip=0):
        super().__init__()
        self.skip = skip
        self.step_times = []
        self.losses = []
        self._last = None
        self._seen = 0

    def on_train_begin(self, logs=None):
        self._last = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):
        now = time.perf_counter()
        elapsed, self._last = now - self._last, now
        self._seen += 1
        if self._seen > self.skip:
            self.step_times.append(elapsed)
        if logs and "loss" in logs:
            self.losses.append(float(logs["loss"]))


@dataclasses.dataclass
class CandidateTiming:
    """What the trial measured of one candidate.

    Attributes:
        candidate: the `tfdist.autotune.Candidate`.
        compile_seconds: wall time of the first (unmeasured) steps: tracing,
            XLA compilation and the first run.
        step_times: measured step times in seconds, pooled over rounds.
        first_loss: the candidate's evaluation loss of the batch from the
            shared initial weights (inference mode), or None.
        finite: whether every logged loss was finite.
        error: why the candidate could not run (it is then left out), or None.

    Example:

    >>> CandidateTiming(Candidate("float32", False), 1.0, [0.2, 0.4, 0.3], 2.3).median_step_seconds
    0.3
    """

    candidate: object
    compile_seconds: float = 0.0
    step_times: list = dataclasses.field(default_factory=list)
    first_loss: float = None
    finite: bool = True
    error: str = None

    @property
    def median_step_seconds(self):
        """The median measured step time (None before any step)."""
        return statistics.median(self.step_times) if self.step_times else None

    def throughput(self, global_batch_size):
        """Examples per second at the median step time (None before any step).

        Example:

        >>> CandidateTiming(Candidate("float32", True), step_times=[0.5]).throughput(32)
        64.0
        """
        median = self.median_step_seconds
        return global_batch_size / median if median else None


def _record_losses(timing, losses):
    if any(not math.isfinite(loss) for loss in [timing.first_loss, *losses]):
        timing.finite = False


def _describe_error(error):
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0][:200] if text else ''}"


MAX_STEPS_PER_ROUND = 50


def steps_per_round(steps, step_seconds, min_round_seconds):
    """Measured steps of one candidate per round: at least `steps`, more for fast
    steps so that a round lasts about `min_round_seconds` (at most
    `MAX_STEPS_PER_ROUND`), as a timer over a few milliseconds is mostly noise.

    Args:
        steps: the fewest steps.
        step_seconds: an estimate of one step (the last warm-up step), or None.
        min_round_seconds: the shortest round worth timing.

    Example:

    >>> steps_per_round(3, 0.05, 0.5), steps_per_round(3, 1.0, 0.5), steps_per_round(3, None, 0.5)
    (10, 3, 3)
    """
    if not step_seconds or step_seconds <= 0:
        return steps
    return max(steps, min(MAX_STEPS_PER_ROUND, math.ceil(min_round_seconds / step_seconds)))


def _same_start(model, initial):
    """Gives `model` the weights of the first candidate built (when it has the
    same shapes), so that every candidate starts from them; returns the
    weights to use from now on."""
    weights = [variable.numpy() for variable in model.weights]
    if initial is None:
        return weights
    if [w.shape for w in weights] == [w.shape for w in initial]:
        model.set_weights(initial)
    return initial


def run_trial(candidates, build, *, seed=None, rounds=3, steps=3, warmup_steps=2,
              max_seconds=120.0, min_round_seconds=0.5, log=None):
    """Times each candidate setting on the actual model and batch.

    Args:
        candidates: the `Candidate`s (see `candidate_grid`).
        build: `candidate -> (trainer, dataset)`: a `tfdist.training.Trainer`
            for the model built for that candidate (its `jit_compile` as the
            candidate says) and a dataset that replays one batch. It is
            called with the candidate's policy as the Keras global policy.
            Every candidate's model then gets the first one's initial
            weights (float32 variables in every policy).
        seed: when given, `keras.utils.set_random_seed(seed)` runs before
            each build (for builders that draw random numbers of their own);
            it sets the global seeds of Python, NumPy, TensorFlow and Keras,
            so leave it None unless the caller seeds again afterwards.
        rounds: alternating rounds of measured steps, >= 1.
        steps: measured steps per candidate and round, >= 1.
        warmup_steps: unmeasured first steps per candidate (compilation), >= 1.
        max_seconds: no new round starts once the trial has run this long
            (the first round always runs), so the cost is bounded.
        min_round_seconds: fast steps are run more often per round (see
            `steps_per_round`).
        log: called with one progress line at a time, or None.

    Returns:
        A list of `CandidateTiming`, in the order of `candidates`. The global
        Keras policy is left as it was.

    Example:

    >>> timings = run_trial(grid, build, seed=0, rounds=2, steps=2)
    >>> [t.candidate.label for t in timings]
    ['float32, XLA off', 'float32, XLA on']
    """
    for name, value, low in (("rounds", rounds, 1), ("steps", steps, 1),
                             ("warmup_steps", warmup_steps, 1)):
        check_int_at_least(name, value, low)
    log = log or (lambda line: None)
    started = time.perf_counter()
    previous = keras.mixed_precision.dtype_policy()
    timings = [CandidateTiming(candidate) for candidate in candidates]
    built = {}
    initial = None
    try:
        for timing in timings:
            keras.mixed_precision.set_global_policy(timing.candidate.policy)
            if seed is not None:
                keras.utils.set_random_seed(seed)
            begin = time.perf_counter()
            try:
                trainer, dataset = build(timing.candidate)
                initial = _same_start(trainer.model, initial)
                # The agreement check: the candidate's own evaluation step on the
                # batch, from the shared initial weights, in inference mode (no
                # dropout, batch norm on its initial statistics), so that only
                # the arithmetic differs between candidates.
                logs = trainer.evaluate(dataset, steps=1, verbose=0, return_dict=True)
                timing.first_loss = float(logs["loss"])
                clock = TrialClock()
                trainer.fit(dataset, epochs=1, steps_per_epoch=warmup_steps, callbacks=[clock],
                            verbose=0)
            except Exception as error:  # a setting this model cannot run is left out, said
                timing.error = _describe_error(error)
                log(f"  autotune: {timing.candidate.label} cannot run: {timing.error}")
                continue
            timing.compile_seconds = time.perf_counter() - begin
            _record_losses(timing, clock.losses)
            estimate = clock.step_times[-1] if warmup_steps > 1 else None
            built[id(timing)] = (trainer, dataset,
                                 steps_per_round(steps, estimate, min_round_seconds))
            log(f"  autotune: {timing.candidate.label} compiled and ran {warmup_steps} steps in "
                f"{timing.compile_seconds:.1f} s")
        runnable = [timing for timing in timings if id(timing) in built]
        for round_index in range(rounds):
            if round_index and time.perf_counter() - started > max_seconds:
                log(f"  autotune: stopped after {round_index} round(s): the trial's "
                    f"{max_seconds:g} s budget is spent")
                break
            order = runnable if round_index % 2 == 0 else runnable[::-1]
            for timing in order:
                trainer, dataset, count = built[id(timing)]
                clock = TrialClock(skip=1)  # the first step also creates the iterator
                trainer.fit(dataset, epochs=1, steps_per_epoch=count + 1, callbacks=[clock],
                            verbose=0)
                timing.step_times.extend(clock.step_times)
                _record_losses(timing, clock.losses)
    finally:
        keras.mixed_precision.set_global_policy(previous)
        built.clear()
    return timings
