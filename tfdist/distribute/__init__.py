"""tfdist.distribute: strategies, cluster specs, start-up and cross-worker decisions.

Nothing here imports TensorFlow at package import; the modules that need it
import it themselves, and the names below load on first use (PEP 562):

    from tfdist.distribute import create_strategy, describe_strategy, is_chief
    strategy = create_strategy("mirrored")
    print(describe_strategy(strategy).num_replicas, is_chief(strategy))

The modules, one job each: `strategy_factory` (create_strategy,
choose_strategy), `introspection` (describe_strategy, task_info,
num_workers, ...), `startup` (start-up deadline, ready file), `slurm` (the
SLURM resolver), `collectives` (every cross-worker decision: agree, gather,
broadcast, barrier, is_chief, agreed_seed), `names`, `tf_config`,
`ps_cluster`, `devices`, `ports`, `device_limits`.
"""

from tfdist.runtime.lazy_exports import lazy_exports

_EXPORTS = {
    "create_strategy": "tfdist.distribute.strategy_factory",
    "choose_strategy": "tfdist.distribute.strategy_factory",
    "StrategyInfo": "tfdist.distribute.introspection",
    "describe_strategy": "tfdist.distribute.introspection",
    "task_info": "tfdist.distribute.introspection",
    "num_workers": "tfdist.distribute.introspection",
    "is_multi_worker": "tfdist.distribute.introspection",
    "is_parameter_server": "tfdist.distribute.introspection",
    "is_chief": "tfdist.distribute.collectives",
}

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
