"""The model's random state that a backup holds besides its weights: the states
of its seed generators (each Keras `Dropout`'s, for one).

A Keras 3 model's `tf.train.Checkpoint` holds its weights but not its seed
generators' states, so a run resumed from one would start every generator
over and draw the first steps' dropout masks again: its final weights
would differ from an uninterrupted run's (by up to 0.013 after 40 steps of
the Transformer recipe with `--dropout 0.1`). `BackupAndResume` saves
these states as `random_seeds` and restores them with the weights.

Example:

    tf.train.Checkpoint(model=model, random_seeds=random_seed_states(model))
"""


def random_seed_states(model):
    """The state variables of every seed generator in `model`, in Keras's layer order.

    Keras's `model.variables` is the model's weights plus these states
    (metric variables are in neither), so they are the variables that are
    not weights.

    Example:

    >>> model = keras.Sequential([keras.Input((4,)), keras.layers.Dropout(0.5)])
    >>> [v.path for v in random_seed_states(model)]
    ['seed_generator/seed_generator_state']
    """
    weights = {id(weight) for weight in model.weights}
    return [variable for variable in model.variables if id(variable) not in weights]
