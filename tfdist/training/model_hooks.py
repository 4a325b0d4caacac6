"""Which of a model's own Keras hooks tfdist must honour, and how.

Keras lets a model customise training by overriding `train_step`,
`test_step`, `predict_step` or `compute_loss` ("customizing what happens in
fit"). tfdist's engine honours each one:

* `compute_loss`: the engine calls it in its own step, for each replica's
  slice of the batch, and treats the value as that slice's *mean* loss (as
  Keras defines it): replicas are weighted by their number of examples, so N
  replicas equal one device for any loss that is a mean over examples. While
  it runs, Keras's division of every loss by the number of replicas is
  switched off (`keras_losses_unscaled`): tfdist does the weighting itself.
* `train_step` / `test_step` / `predict_step`: the model's own step runs on
  each replica through `strategy.run`, exactly as Keras's `fit` runs it under
  a strategy (Keras's losses divided by the number of replicas, the
  optimizer summing gradients across replicas).

Overrides that Keras itself or the keras-hub / keras-nlp / keras-cv
libraries make (for example keras-hub's `Task`, which only adds its
preprocessor) are not the user's: the engine's step is used for them.
"""

import contextlib

from tfdist.seam import keras_loss_scaling_disabled

HOOKS = ("train_step", "test_step", "predict_step", "compute_loss")
"""The `keras.Model` methods a model may override to customise training."""

LIBRARY_PACKAGES = ("keras", "keras_hub", "keras_nlp", "keras_cv", "tensorflow", "tf_keras")
"""Top-level packages whose overrides are library code, not the user's."""


def own_hooks(model):
    """Returns `{hook: class}` for each hook the model's own code overrides.

    A hook counts when the first class in the model's MRO that defines it is
    not from one of `LIBRARY_PACKAGES`.

    Args:
        model: a `keras.Model`.

    Example:

    >>> class GAN(keras.Model):
    ...     def train_step(self, data): ...
    >>> own_hooks(GAN())
    {'train_step': <class 'GAN'>}
    """
    found = {}
    for hook in HOOKS:
        for cls in type(model).__mro__:
            if hook in vars(cls):
                package = (cls.__module__ or "").split(".")[0]
                if package not in LIBRARY_PACKAGES:
                    found[hook] = cls
                break
    return found


def hook_name(model, hook, classes):
    """Returns `"Class.hook"` for error messages.

    Example:

    >>> hook_name(gan, "train_step", own_hooks(gan))
    'GAN.train_step'
    """
    return f"{classes[hook].__qualname__}.{hook}"


@contextlib.contextmanager
def keras_losses_unscaled():
    """Switches off Keras's division of losses by the number of replicas.

    In a replica context Keras 3 divides every `keras.losses.Loss` value and
    every `add_loss` term by `num_replicas_in_sync`, expecting the optimizer
    to sum the replicas' gradients. tfdist weighs the replicas itself, so
    while a model's own `compute_loss` is traced inside tfdist's step the
    values are left as the replica's own mean. Only the Python tracing of
    the step runs inside this context; nothing changes outside it.

    Example:

    >>> with keras_losses_unscaled():
    ...     value = model.compute_loss(x, y, y_pred)  # the replica's own mean
    """
    with keras_loss_scaling_disabled():
        yield
