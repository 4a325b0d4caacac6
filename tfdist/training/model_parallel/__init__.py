"""tfdist.training.model_parallel: a model split over the devices of a worker.

Pipeline (GPipe) stages and their placement on devices; used through
`Trainer(model, model_parallel=K)`:

    from tfdist.training import Trainer
    trainer = Trainer(model, model_parallel=2, micro_batches=4)
"""
