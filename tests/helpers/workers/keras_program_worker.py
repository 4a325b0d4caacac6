"""One worker running the Keras programs of tests/helpers/keras_programs.py (under tfdist.launch).

Creates a `MultiWorkerMirroredStrategy` from TF_CONFIG, signals readiness and
runs each program with the README's one-line change, `Trainer(model).fit(...)`,
then `evaluate` (as a dict and as Keras's list) and `predict` on the same
arrays, trains `shuffled_rows` with shuffle=True, fine-tunes in two phases on
one Trainer (`fine_tuning`), predicts a ragged output, then records what is
refused. Writes
`<out>/rank<R>_<program>.npz` (final weights) and `.json` (history, evaluation
and a checksum of the predictions) for the test to compare with one-device
Keras `fit`.

Usage: python tests/helpers/workers/keras_program_worker.py --out DIR [--programs a,b]
"""

import argparse
import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# tests/ on the path (run as a script, only this folder is): the shared helpers.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from helpers import keras_programs as programs  # noqa: E402
from tfdist.training import Trainer  # noqa: E402


def rank():
    return json.loads(os.environ["TF_CONFIG"])["task"]["index"]


def run(name, strategy, out):
    model, arguments = programs.PROGRAMS[name](strategy)
    trainer = Trainer(model)
    history = trainer.fit(verbose=0, **arguments)
    evaluation = trainer.evaluate(arguments["x"], arguments["y"], batch_size=arguments["batch_size"],
                                  return_dict=True, verbose=0)
    evaluation_list = trainer.evaluate(arguments["x"], arguments["y"],
                                       batch_size=arguments["batch_size"], verbose=0)
    predictions = trainer.predict(arguments["x"], batch_size=arguments["batch_size"], verbose=0)
    first = np.asarray(tf.nest.flatten(predictions)[0])
    np.savez(os.path.join(out, f"rank{rank()}_{name}.npz"),
             *[np.array(w) for w in model.get_weights()])
    with open(os.path.join(out, f"rank{rank()}_{name}.json"), "w") as f:
        json.dump({"history": history.history, "evaluation": evaluation,
                   "evaluation_list": evaluation_list,
                   "predictions_rows": int(first.shape[0]),
                   "predictions_sum": float(np.sum(first))}, f)


def shuffled(strategy, out):
    """Trains `shuffled_rows` with shuffle=True; the metric proves each row was used once."""
    model, arguments = programs.shuffled_rows(strategy)
    history = Trainer(model).fit(verbose=0, **arguments)
    with open(os.path.join(out, f"rank{rank()}_shuffled.json"), "w") as f:
        json.dump(history.history, f)


def fine_tuning(strategy, out):
    """keras-io's two-phase fine-tuning on one Trainer (recompiled in between)."""
    weights, histories = programs.tfdist_fine_tune(strategy)
    np.savez(os.path.join(out, f"rank{rank()}_fine_tuning.npz"), *weights)
    with open(os.path.join(out, f"rank{rank()}_fine_tuning.json"), "w") as f:
        json.dump(histories, f)


def ragged(strategy, out):
    """predict() of a model with a ragged output: a tf.RaggedTensor, as in Keras."""
    model, arguments = programs.ragged_scorer(strategy)
    predictions = Trainer(model).predict(verbose=0, **arguments)
    with open(os.path.join(out, f"rank{rank()}_ragged.json"), "w") as f:
        json.dump({"type": type(predictions).__name__,
                   "row_lengths": predictions.row_lengths().numpy().tolist(),
                   "values": predictions.flat_values.numpy().tolist()}, f)


def refusals(strategy, out):
    """What tfdist refuses under several workers, with the message it gives."""
    messages = {}
    model, arguments = programs.class_weights(strategy)
    with strategy.scope():
        model.compile(model.optimizer, model.loss, run_eagerly=True)
    try:
        Trainer(model)
    except ValueError as error:
        messages["run_eagerly"] = str(error)
    model, arguments = programs.class_weights(strategy)

    def batches():
        yield arguments["x"][:8], arguments["y"][:8]

    try:
        Trainer(model).fit(batches(), verbose=0)
    except ValueError as error:
        messages["generator"] = str(error)
    with open(os.path.join(out, f"rank{rank()}_refusals.json"), "w") as f:
        json.dump(messages, f)


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", required=True)
    parser.add_argument("--programs", default=",".join(sorted(programs.PROGRAMS)))
    args = parser.parse_args()
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    ready = os.environ.get("TFDIST_READY_FILE")
    if ready:
        open(ready, "a").close()
    for name in args.programs.split(","):
        run(name, strategy, args.out)
    shuffled(strategy, args.out)
    fine_tuning(strategy, args.out)
    ragged(strategy, args.out)
    refusals(strategy, args.out)
    print(f"worker {rank()} done", flush=True)


if __name__ == "__main__":
    from tfdist.runtime.quick_exit import skip_exit_garbage_collection

    skip_exit_garbage_collection()  # the test waits for this process to end
    main()
