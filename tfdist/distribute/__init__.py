"""tfdist.distribute: strategies, cluster specs, start-up and cross-worker decisions.

Nothing here imports TensorFlow at package import; the modules that need it
import it themselves. The strategy factory:

    from tfdist.distribute.strategy import create_strategy
    strategy = create_strategy("mirrored")
"""
