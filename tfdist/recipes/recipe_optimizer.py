"""The run's optimizer from the recipe flags, and the number of its steps.

Example:

    with strategy.scope():
        optimizer = build_recipe_optimizer(config, optimizer_steps(config, 100), built)
"""

import math


def build_recipe_optimizer(config, total_steps, built):
    """The run's optimizer and learning-rate schedule from the recipe flags, prepared
    for the model `built` (e.g. weight decay exclusions); call in the strategy scope.

    Example:

    >>> with strategy.scope():
    ...     optimizer = build_recipe_optimizer(config, 1000, built)
    """
    from tfdist.schedules.optimizers import build_optimizer

    optimizer = build_optimizer(
        config.optimizer, config.learning_rate, schedule=config.schedule,
        warmup_steps=config.warmup_steps, total_steps=total_steps,
        weight_decay=config.weight_decay, beta_1=config.adam_beta1, beta_2=config.adam_beta2,
        epsilon=config.adam_epsilon)
    if built.prepare_optimizer is not None:
        built.prepare_optimizer(optimizer)
    return optimizer


def optimizer_steps(config, steps_per_epoch):
    """Optimizer steps of the whole run (micro-batches grouped by --grad-accum-steps).

    Example:

    >>> optimizer_steps(argparse.Namespace(epochs=3, grad_accum_steps=4), 10)
    8
    """
    return math.ceil(steps_per_epoch * config.epochs / config.grad_accum_steps)
