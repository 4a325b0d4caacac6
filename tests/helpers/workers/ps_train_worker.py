"""One task of a parameter-server training test (run under `tfdist.launch --ps`).

Worker and ps tasks serve (`tfdist.distribute.ps_cluster.serve_task`); the chief creates
the strategy with tfdist's factory and trains a small masked token model with
`tfdist.training.Trainer` on a learnable task (the next token is a fixed
function of the current one), then writes what it saw to `<out>/chief.json`.

`--lose worker` / `--lose ps`: after the first epoch the chief creates
`<out>/lose`, and worker 1 / ps 0 then kills itself (SIGKILL), as a machine
that disappears would.

Usage: python tests/helpers/workers/ps_train_worker.py --out DIR [--epochs 3] [--lose worker|ps]
"""

import argparse
import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# tests/ on the path (run as a script, only this folder is): the shared helpers.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from helpers.sigkill import sigkill_self_when_exists  # noqa: E402

VOCAB = 12
SEQ = 8
GLOBAL_BATCH = 32
STEPS_PER_EPOCH = 40


def parse_args():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--lose", choices=("worker", "ps"), default=None)
    return parser.parse_args()


def serve(config, args):
    from tfdist.distribute.ps_cluster import serve_task
    from tfdist.distribute.startup import write_ready_file

    victim = {"worker": ("worker", 1), "ps": ("ps", 0)}.get(args.lose)
    if victim == (config.task_type, config.task_index):
        sigkill_self_when_exists(os.path.join(args.out, "lose"))
    serve_task(config, on_ready=write_ready_file)


def dataset_fn(context):
    """Sequences whose next token is (token * 5 + 1) % VOCAB (0 is padding); sharded by worker."""
    import numpy as np
    import tensorflow as tf

    rs = np.random.RandomState(0)
    tokens = rs.randint(1, VOCAB, size=(4096, SEQ + 1))
    for row in tokens:
        for t in range(1, SEQ + 1):
            row[t] = (row[t - 1] * 5 + 1) % VOCAB or 1
    lengths = rs.randint(SEQ // 2, SEQ + 1, size=len(tokens))
    mask = np.arange(SEQ)[None, :] < lengths[:, None]
    x = np.where(mask, tokens[:, :-1], 0).astype("int32")
    y = np.where(mask, tokens[:, 1:], 0).astype("int32")
    dataset = tf.data.Dataset.from_tensor_slices((x, y))
    if context is not None and getattr(context, "num_input_pipelines", 1) == 1:
        try:
            index = tf.distribute.coordinator.experimental_get_current_worker_index()
            dataset = dataset.shard(2, index)
        except (RuntimeError, ValueError):  # on the chief, for the element spec
            pass
    return dataset.shuffle(1024, seed=1).repeat().batch(GLOBAL_BATCH, drop_remainder=True)


def chief(args):
    import keras
    import numpy as np

    from tfdist.distribute.strategy_factory import create_strategy
    from tfdist.distribute.introspection import describe_strategy
    from tfdist.training import Trainer
    from tfdist.training.ps_loop import ParameterServerLostError

    strategy = create_strategy("parameter_server")
    with strategy.scope():
        model = keras.Sequential([
            keras.Input((SEQ,), dtype="int32"),
            keras.layers.Embedding(VOCAB, 16, mask_zero=True),
            keras.layers.Dense(32, activation="relu"),
            keras.layers.Dense(VOCAB),
        ])
        model.compile(keras.optimizers.SGD(0.5),
                      keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=["accuracy"])
    trainer = Trainer(model)
    lose = args.lose

    class LoseAfterFirstEpoch(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            if lose and epoch == 0:
                open(os.path.join(args.out, "lose"), "w").close()
                time.sleep(1.0)

    validation = dataset_fn(None).take(4)
    refusals = {}
    for name, attempt in (
            ("arrays", lambda: trainer.fit(np.zeros((8, SEQ), "int32"), np.zeros((8, SEQ), "int32"),
                                           batch_size=4, steps_per_epoch=2)),
            ("no_steps_per_epoch", lambda: trainer.fit(dataset_fn, epochs=1)),
            ("grad_accum", lambda: Trainer(model, grad_accum_steps=2).fit(
                dataset_fn, steps_per_epoch=2))):
        try:
            attempt()
        except ValueError as error:
            refusals[name] = str(error)
    try:
        history = trainer.fit(dataset_fn, epochs=args.epochs, steps_per_epoch=STEPS_PER_EPOCH,
                              validation_data=validation, callbacks=[LoseAfterFirstEpoch()],
                              verbose=0)
    except ParameterServerLostError as error:
        print(f"LOST: {error}", flush=True)
        return 141
    result = {
        "strategy": describe_strategy(strategy).name,
        "history": {k: [float(v) for v in vs] for k, vs in history.history.items()},
        "steps_by_worker": {str(k): v for k, v in
                            sorted(trainer.worker_steps.items())},
        "iterations": int(model.optimizer.iterations.numpy()),
        "evaluate": trainer.evaluate(validation, verbose=0, return_dict=True),
        "chance_loss": float(np.log(VOCAB - 1)),
        "refusals": refusals,
        "predict_shape": list(trainer.predict(validation.map(lambda x, y: x), verbose=0).shape),
    }
    with open(os.path.join(args.out, "chief.json"), "w") as f:
        json.dump(result, f)
    print("CHIEF DONE", json.dumps(result["history"]), flush=True)
    return 0


def main():
    args = parse_args()
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__))))))
    from tfdist.distribute.tf_config import parse_tf_config

    config = parse_tf_config()
    if config.task_type in ("worker", "ps"):
        serve(config, args)
        return 0
    return chief(args)


if __name__ == "__main__":
    from tfdist.runtime.quick_exit import skip_exit_garbage_collection

    skip_exit_garbage_collection()  # the test waits for this process to end
    sys.exit(main())
