"""The pieces of the training loop that every loop shares: running batches
in groups, evaluating, ending an epoch.

`tfdist.training.trainer` (the synchronous loop) and
`tfdist.training.ps_loop` (the parameter-server loop) both use them; this
module sits below both and imports neither. The loops call a step kind's
functions (`tfdist.training.step_kinds`) and drive the callbacks.
"""

import warnings

import tensorflow as tf


def run_batches(function, iterator, steps, callback_list, mode, *, model, steps_per_execution,
                first_step=0, position=None):
    """Runs batches in groups of `steps_per_execution`, from batch `first_step`.

    Args:
        function: a step kind's `train_function` or `test_function`,
            `f(iterator, num_steps) -> (steps_run, logs)`.
        iterator: the (distributed) data iterator.
        steps: batches to run in all (counting from 0), or None: until the
            data runs out.
        callback_list: the run's `CallbackList`; its `on_<mode>_batch_begin`
            / `on_<mode>_batch_end` hooks are called around each group.
        mode: `"train"` or `"test"`.
        model: the `keras.Model` (training stops early when
            `model.stop_training` is set).
        steps_per_execution: batches per compiled call, an int >= 1.
        first_step: the index of the first batch (resuming mid-epoch).
        position: the `tfdist.training.resume.FitPosition` (training only),
            updated before each batch-end hook; or None.

    Returns:
        `(logs, exhausted)`: the logs after the last batch (None if there
        was none) and whether the iterator ran out of data.

    Example:

    >>> logs, exhausted = run_batches(steps.test_function, iter(data), None, callback_list,
    ...                               "test", model=model, steps_per_execution=1)
    """
    begin_hook = getattr(callback_list, f"on_{mode}_batch_begin")
    end_hook = getattr(callback_list, f"on_{mode}_batch_end")
    step, logs, exhausted = first_step, None, False
    while steps is None or step < steps:
        wanted = steps_per_execution if steps is None else min(steps_per_execution, steps - step)
        begin_hook(step)
        ran, step_logs = function(iterator, tf.constant(wanted, tf.int32))
        ran = int(ran)
        if position is not None:
            position.step += ran
            position.iterator_batches += ran
        if ran > 0:
            logs = step_logs
            end_hook(step + ran - 1, logs)
            step += ran
        if ran < wanted:
            exhausted = True
            if steps is not None:
                warnings.warn(
                    f"The input ran out of data after {step} of {steps} {mode} steps; "
                    "stopping this pass early. Make the dataset long enough "
                    "(e.g. .repeat()) or lower the number of steps.", stacklevel=3)
            elif mode == "train" and step == 0:
                warnings.warn(
                    "The training data gave no batch (an empty dataset, or fewer examples than "
                    "one global batch when the last partial batch is dropped): nothing was "
                    "trained in this epoch. Give it at least one full batch.", stacklevel=3)
            break
        if mode == "train" and model.stop_training:
            break
    return logs, exhausted


def run_evaluation(model, test_function, data, steps, callback_list, *, steps_per_execution):
    """Evaluates `model` on `data` with a step kind's `test_function`: resets the
    metrics, calls the test hooks around the batches, returns the logs.

    Args:
        model: the `keras.Model`.
        test_function: `f(iterator, num_steps) -> (steps_run, logs)`.
        data: what to iterate (a dataset or distributed dataset of batches).
        steps: batches to evaluate, or None for all.
        callback_list: the run's `CallbackList`.
        steps_per_execution: batches per compiled call, an int >= 1.

    Returns:
        `{name: float}` logs; `{}` with a warning when the data gave no
        batch (as Keras's `evaluate`: no `val_` metrics rather than the
        metrics' initial zeros).

    Example:

    >>> run_evaluation(model, steps.test_function, val_data, None, callback_list,
    ...                steps_per_execution=1)
    {'loss': 0.31, 'accuracy': 0.9}
    """
    model.reset_metrics()
    callback_list.on_test_begin()
    logs, _ = run_batches(test_function, iter(data), steps, callback_list, "test", model=model,
                          steps_per_execution=steps_per_execution)
    if logs is None and steps != 0:
        warnings.warn(
            "The evaluation data gave no batch (an empty dataset, or fewer examples than one "
            "batch when the last partial batch is dropped): no loss or metric is reported for "
            "it. Give it at least one full batch.", UserWarning, stacklevel=2)
    logs = pythonify(logs) if logs is not None else {}
    callback_list.on_test_end(logs)
    return logs


def end_epoch(epoch, epoch_logs, evaluate, validation_freq, callback_list, optimizer):
    """Ends an epoch: adds the validation logs (`evaluate()` every `validation_freq`
    epochs; None: no validation) and the learning rate to `epoch_logs`, calls
    `on_epoch_end`, and returns the logs.

    Example:

    >>> end_epoch(0, {"loss": 0.5}, None, 1, callback_list, model.optimizer)
    {'loss': 0.5, 'learning_rate': 0.01}
    """
    if evaluate is not None and (epoch + 1) % validation_freq == 0:
        epoch_logs.update({f"val_{name}": value for name, value in evaluate().items()})
    learning_rate = current_learning_rate(optimizer)
    if learning_rate is not None:
        epoch_logs.setdefault("learning_rate", learning_rate)
    callback_list.on_epoch_end(epoch, epoch_logs)
    return epoch_logs


def current_learning_rate(optimizer):
    """The optimizer's current learning rate as a float, or None when it has none
    that reads as a number.

    Example:

    >>> current_learning_rate(keras.optimizers.SGD(0.01))
    0.01
    """
    try:
        value = optimizer.learning_rate
        return float(value.numpy() if hasattr(value, "numpy") else value)
    except (TypeError, ValueError, AttributeError):
        return None


def pythonify(logs):
    """Logs with every value a Python float.

    Example:

    >>> pythonify({"loss": tf.constant(0.5)})
    {'loss': 0.5}
    """
    return {name: float(value) for name, value in logs.items()}
