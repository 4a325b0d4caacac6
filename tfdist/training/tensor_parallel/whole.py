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
file into `model` and cuts it into the shards. `model`'s own `save`,
`save_weights` and `load_weights` do the same while it shares its optimizer
with the split copy, and its `set_weights` cuts the weights into the shards.

Example:

    save_as_whole(split, model)
    split.save("model.keras")            # writes model, gathered
    keras.saving.load_model("model.keras")
"""

import contextlib

import numpy as np

from tfdist.training.model_parallel.placement import outside_strategy_scopes, plain_variables
from tfdist.training.tensor_parallel.split import gather_weights, scatter_weights


def save_as_whole(split, model, build_optimizer=None):
    """Makes `save`, `save_weights` and `load_weights` of `split` and of `model` act on the
    model as built, the split copy's weights and optimizer state gathered or cut into it.

    On `split` (what Keras callbacks see): the weights are gathered into
    `model` and `model` is saved, with an optimizer holding the gathered
    state. On `model`, as long as it shares its optimizer with `split` (the
    Trainer's arrangement): saving writes the gathered optimizer state, not
    the shards', and `load_weights` also reaches the shards, so a model
    loaded after the Trainer was built trains from what was loaded; so does
    `model.set_weights(...)` (Keras's way to copy weights between models).

    Args:
        split: the split copy (`trainer.model` with tensor_parallel > 1).
        model: the model it was split from (`trainer.source_model`).
        build_optimizer: builds `split`'s optimizer (its slots next to the shards), so that
            `load_weights` before any training keeps the file's optimizer state.

    Example:

    >>> save_as_whole(trainer.model, model)
    >>> trainer.model.save_weights("model.weights.h5")   # model's weights, gathered
    """
    whole_class = type(model)

    def split_current():
        return model.optimizer is not None and model.optimizer is split.optimizer

    @contextlib.contextmanager
    def gathered(weights):
        kept = model.optimizer
        if split_current() and kept.built:
            model.optimizer = gathered_optimizer(split, model)
        if weights:
            gather_weights(split, model)
        try:
            yield
        finally:
            model.optimizer = kept

    def saver(method, weights):
        def save(filepath, *args, **kwargs):
            with gathered(weights):
                return method(model, filepath, *args, **kwargs)
        return save

    def load_weights(filepath, *args, **kwargs):
        # Once `model` is compiled again, its optimizer is no longer the split copy's:
        # then only the weights are cut into the shards.
        current = split_current()
        if current and build_optimizer is not None and not split.optimizer.built:
            build_optimizer()
        with gathered(weights=False):
            result = whole_class.load_weights(model, filepath, *args, **kwargs)
            if current and model.optimizer is not split.optimizer:
                scatter_optimizer(model.optimizer, split, model)
        scatter_weights(model, split)
        return result

    def set_weights(weights):
        """`keras.Model.set_weights` of the model as built, the weights also cut into the
        shards of its tensor-parallel split copy (the optimizer's state is left as it is)."""
        whole_class.set_weights(model, weights)
        scatter_weights(model, split)

    for target, weights in ((split, True), (model, False)):
        methods = [("save", saver(whole_class.save, weights)),
                   ("save_weights", saver(whole_class.save_weights, weights)),
                   ("load_weights", load_weights)]
        if target is model:  # the split copy's own set_weights takes its shards' list
            methods.append(("set_weights", set_weights))
        for name, method in methods:
            method.__name__ = name
            method.__doc__ = method.__doc__ or (
                f"`keras.Model.{name}` of the model as built, its weights and optimizer state "
                "gathered from, or cut into, the shards of its tensor-parallel split copy.")
            setattr(target, name, method)


def gathered_optimizer(split, model):
    """A new optimizer for `model` holding the state of `split`'s built optimizer: every
    slot variable gathered from its shards' slots, the other variables (iterations,
    learning rate) copied. `model` is used as scratch space; both models keep their
    weights.

    Example:

    >>> whole = gathered_optimizer(trainer.model, model)
    >>> int(whole.iterations) == int(trainer.model.optimizer.iterations)
    True
    """
    shared = split.optimizer
    with outside_strategy_scopes(), plain_variables():  # as the shards' (a save may run in fit)
        whole = shared.__class__.from_config(shared.get_config())
        whole.build(model.trainable_variables)
    _move_state(split, model, whole, gather=True)
    return whole


def scatter_optimizer(whole, split, model):
    """Writes the state of `whole`, an optimizer built for `model`, into `split`'s optimizer
    (each slot cut into its shards' slots): the reverse of `gathered_optimizer`. Both
    models keep their weights.

    Example:

    >>> model.load_weights("model.weights.h5")     # the weights and model.optimizer's state
    >>> scatter_optimizer(model.optimizer, trainer.model, model)
    """
    _move_state(split, model, whole, gather=False)


def _move_state(split, model, whole, *, gather):
    """Copies optimizer state from `split.optimizer` to `whole` (gather) or back: slots
    through the weights' own gathering or scattering (the models' weights stand in for
    the slots meanwhile, and are put back), the other variables as they are."""
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
    kept = {id(each): [np.asarray(v) for v in each.weights] for each in (split, model)}
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
        for each in (split, model):
            for variable, value in zip(each.weights, kept[id(each)], strict=True):
                variable.assign(value)


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
