"""The split model saved as the whole model: what Keras's saving writes for a split run.

`Trainer(model, tensor_parallel=K, ...)` trains a split copy of `model`
(`trainer.model`), whose layers hold shards that only a split copy on K
devices can read. Keras callbacks (`ModelCheckpoint`) and users call
`trainer.model.save(...)` / `save_weights(...)`: `save_as_whole` makes both
write `model` instead, with the trained weights gathered from their shards
and the optimizer's state gathered too (each slot variable the
concatenation of its shards' slots, as the weights are), so the file loads
into the model as built, on any number of devices, and equals what one
device would have written. `trainer.model.load_weights(...)` reads such a
file into `model` and cuts it into the shards.

Example:

    save_as_whole(split, model)
    split.save("model.keras")            # writes model, gathered
    keras.saving.load_model("model.keras")
"""

import contextlib

import numpy as np

from tfdist.training.tensor_parallel.split import gather_weights, scatter_weights


def save_as_whole(split, model, build_optimizer=None):
    """Makes `split.save`, `split.save_weights` and `split.load_weights` act on `model`.

    Args:
        split: the split copy (`trainer.model` with tensor_parallel > 1).
        model: the model it was split from (`trainer.source_model`).
        build_optimizer: builds `split`'s optimizer (its slots next to the shards), so that
            `load_weights` before any training keeps the file's optimizer state.

    Example:

    >>> save_as_whole(trainer.model, model)
    >>> trainer.model.save_weights("model.weights.h5")   # model's weights, gathered
    """

    @contextlib.contextmanager
    def gathered():
        kept = model.optimizer
        if kept is not None and kept.built:
            model.optimizer = gathered_optimizer(split, model)
        gather_weights(split, model)
        try:
            yield
        finally:
            model.optimizer = kept

    def save(filepath, *args, **kwargs):
        with gathered():
            return model.save(filepath, *args, **kwargs)

    def save_weights(filepath, *args, **kwargs):
        with gathered():
            return model.save_weights(filepath, *args, **kwargs)

    def load_weights(filepath, *args, **kwargs):
        if build_optimizer is not None and split.optimizer is not None:
            if not split.optimizer.built:
                build_optimizer()
        with gathered():
            result = model.load_weights(filepath, *args, **kwargs)
            if model.optimizer is not None and model.optimizer is not split.optimizer:
                scatter_optimizer(model.optimizer, split, model)
        scatter_weights(model, split)
        return result

    for method in (save, save_weights, load_weights):
        method.__doc__ = (f"`{method.__name__}` of the model this copy was split from, its "
                          "weights gathered from (or cut into) the shards.")
        setattr(split, method.__name__, method)


def gathered_optimizer(split, model):
    """A new optimizer for `model` holding the state of `split`'s built optimizer: every
    slot variable gathered from its shards' slots, the other variables (iterations,
    learning rate) copied. `model` is used as scratch space and left holding the
    split's weights, gathered.

    Example:

    >>> whole = gathered_optimizer(trainer.model, model)
    >>> int(whole.iterations) == int(trainer.model.optimizer.iterations)
    True
    """
    shared = split.optimizer
    whole = shared.__class__.from_config(shared.get_config())
    whole.build(model.trainable_variables)
    _move_state(split, model, whole, gather=True)
    return whole


def scatter_optimizer(whole, split, model):
    """Writes the state of `whole`, an optimizer built for `model`, into `split`'s optimizer
    (each slot cut into its shards' slots): the reverse of `gathered_optimizer`. The
    split copy is left holding `model`'s weights.

    Example:

    >>> model.load_weights("model.weights.h5")     # the weights and model.optimizer's state
    >>> scatter_optimizer(model.optimizer, trainer.model, model)
    """
    _move_state(split, model, whole, gather=False)


def _move_state(split, model, whole, *, gather):
    """Copies optimizer state from `split.optimizer` to `whole` (gather) or back: slots
    through the weights' own gathering or scattering, the other variables as they are."""
    shared = split.optimizer
    split_slots, split_others = slots_by_variable(shared, split.trainable_variables)
    whole_slots, whole_others = slots_by_variable(whole, model.trainable_variables)
    for mine, theirs in zip(whole_others, split_others, strict=True):
        if mine.name != theirs.name or tuple(mine.shape) != tuple(theirs.shape):
            raise ValueError(f"Cannot move the state of the optimizer {shared.name!r}: its "
                             f"variable {theirs.name!r} has no counterpart in the whole "
                             f"model's optimizer ({mine.name!r}).")
        if gather:
            mine.assign(theirs)
        else:
            theirs.assign(mine)
    source, target = (split, model) if gather else (model, split)
    source_slots, target_slots = (split_slots, whole_slots) if gather else (whole_slots,
                                                                            split_slots)
    kept = [np.asarray(variable) for variable in source.trainable_variables]
    kinds = sorted({kind for slots in split_slots.values() for kind in slots})
    try:
        for kind in kinds:
            # The slots take their variables' place, so moving the weights moves them.
            for variable in source.trainable_variables:
                slot = source_slots.get(variable.path, {}).get(kind)
                if slot is not None:
                    variable.assign(slot)
            (gather_weights if gather else scatter_weights)(source, target)
            for variable in target.trainable_variables:
                slot = target_slots.get(variable.path, {}).get(kind)
                if slot is not None:
                    slot.assign(variable)
    finally:
        for variable, value in zip(source.trainable_variables, kept, strict=True):
            variable.assign(value)
        (gather_weights if gather else scatter_weights)(source, target)


def slots_by_variable(optimizer, variables):
    """`({variable path: {slot kind: slot variable}}, [the optimizer's other variables])`.

    Keras names a slot variable after the path of the variable it belongs to
    and its kind (`dense_kernel_momentum` for `dense/kernel`); the longest
    matching path wins, so `dense/kernel_1`'s slots are not taken for
    `dense/kernel`'s.

    Example:

    >>> slots, others = slots_by_variable(model.optimizer, model.trainable_variables)
    >>> sorted(slots["up/kernel"]), [v.name for v in others]
    (['momentum', 'velocity'], ['iteration', 'learning_rate'])
    """
    prefixes = sorted(((variable.path.replace("/", "_") + "_", variable.path)
                       for variable in variables), key=lambda pair: -len(pair[0]))
    slots, others = {}, []
    for candidate in optimizer.variables:
        for prefix, path in prefixes:
            if candidate.name.startswith(prefix):
                slots.setdefault(path, {})[candidate.name[len(prefix):]] = candidate
                break
        else:
            others.append(candidate)
    return slots, others
