"""Two worker processes (MultiWorkerMirroredStrategy) train like one process.

One launch of tests/helpers/workers/train_worker.py through tfdist.launch runs every
phase; the tests compare what the workers wrote with single-process runs here.
"""

import os

import keras
import numpy as np
import pytest
import tensorflow as tf

from helpers.compare import assert_same_weights
from helpers.mw import launch
from tfdist.training import Trainer
from helpers.workers import train_common as common
from helpers.workers import seq2seq_common, train_worker
from helpers.paths import WORKERS_DIR  # noqa: E402

pytestmark = pytest.mark.multiworker

WORKER = os.path.join(WORKERS_DIR, "train_worker.py")


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("train_mw")
    result = launch([WORKER, "--out", str(out)], workers=2, timeout=400, startup_timeout=180)
    assert result.returncode == 0, result.stdout[-5000:]
    return out, result.stdout


def single_process_sgd(clip=True):
    strategy = tf.distribute.get_strategy()
    model, trainer = train_worker.sgd_trainer(strategy, jit_compile=False)
    if not clip:
        trainer = Trainer(model, keras.optimizers.SGD(0.2), model.loss)
    data = common.dataset(common.regression_arrays(weighted=True), train_worker.GLOBAL_BATCH)
    history = trainer.fit(data, epochs=train_worker.EPOCHS, verbose=0)
    return common.weights_of(model), history.history


def test_train_on_batch_on_two_workers_equals_keras_on_one_process(run):
    """Each worker trains on its rows of every global batch; the weights, the figures of
    each call and the predictions are Keras's own `*_on_batch` on one process."""
    out, _ = run
    model = common.dense_model(tf.distribute.get_strategy())
    model.compile(optimizer=keras.optimizers.SGD(0.2),
                  loss=keras.losses.MeanSquaredError(reduction="mean_with_sample_weight"))
    trained, tested, predicted = train_worker.on_batch_run(model, model)
    for r in (0, 1):
        arrays = common.load_weights(out / f"rank{r}_on_batch.npz")
        for ours, theirs in zip(arrays, common.weights_of(model) + [predicted], strict=True):
            np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-6)
        figures = common.load_json(out / f"rank{r}_on_batch.json")
        for ours, theirs in zip(figures["trained"], trained, strict=True):
            assert ours["loss"] == pytest.approx(theirs["loss"], rel=1e-5)
        assert figures["tested"]["loss"] == pytest.approx(tested["loss"], rel=1e-5)
    assert trained[0]["loss"] != pytest.approx(trained[-1]["loss"], rel=1e-3)  # it learns


def test_both_workers_finish(run):
    _, output = run
    assert "worker 0 done" in output and "worker 1 done" in output


def test_two_workers_match_one_process_and_each_other(run):
    out, _ = run
    reference_weights, reference_history = single_process_sgd()
    rank0, rank1 = (common.load_weights(out / f"rank{r}_sgd.npz") for r in (0, 1))
    for a, b in zip(rank0, rank1, strict=True):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(rank0, reference_weights, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    for r in (0, 1):
        np.testing.assert_allclose(common.load_json(out / f"rank{r}_sgd.json")["loss"],
                                   reference_history["loss"], rtol=1e-5)
    # The clipping in these runs binds: without it the weights end elsewhere.
    unclipped, _ = single_process_sgd(clip=False)
    assert max(np.max(np.abs(a - b))
               for a, b in zip(unclipped, reference_weights, strict=True)) > 1e-2


def test_xla_matches_no_xla_on_two_workers(run):
    out, _ = run
    for r in (0, 1):
        np.testing.assert_allclose(common.load_json(out / f"rank{r}_xla.json")["loss"],
                                   common.load_json(out / f"rank{r}_sgd.json")["loss"], rtol=1e-5)
        for a, b in zip(common.load_weights(out / f"rank{r}_xla.npz"),
                        common.load_weights(out / f"rank{r}_sgd.npz"), strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def test_two_workers_train_the_seq2seq_like_one_process(run):
    """The translation recipe's encoder-decoder, its label-smoothed masked loss over
    padded sentence pairs (uneven token counts per worker), 2 workers vs one device;
    then its BLEU decoding split over the 2 workers vs one device."""
    out, _ = run
    reference_losses, reference_weights = seq2seq_common.one_device_equivalence_run()
    for r in (0, 1):
        log = common.load_json(out / f"rank{r}_seq2seq.json")
        assert log["replicas"] == 2
        np.testing.assert_allclose(log["loss"], reference_losses, rtol=1e-5, atol=1e-6)
        assert_same_weights(common.load_weights(out / f"rank{r}_seq2seq.npz"),
                            reference_weights)
    # Each worker decoded its replica's share and gathered all: one device's outputs.
    decoded = seq2seq_common.decode_validation(tf.distribute.get_strategy(), reference_weights)
    assert len({tuple(row) for row in decoded.tolist()}) > 1
    for r in (0, 1):
        assert np.load(out / f"rank{r}_seq2seq_decoded.npy").tolist() == decoded.tolist()


def test_standard_callbacks_on_two_workers(run):
    out, output = run
    logs = [common.load_json(out / f"rank{r}_callbacks.json") for r in (0, 1)]
    assert logs[0]["history"] == logs[1]["history"]  # global metrics on every worker
    for log in logs:
        assert log["train_batches"] == [1, 3] * 3  # 4 batches, 2 per call
        assert log["test_batches"] == [1, 2] * 3  # 3 validation batches, 2 per call
        for epoch in log["epochs"]:
            assert epoch["has_model"]
            assert {"loss", "mae", "val_loss", "val_mae", "learning_rate"} <= set(epoch)
    assert output.count("Epoch 1/3") == 1  # progress bar on the chief only
    # The end of fit woke both workers' stop-step watchers (PreemptionGuard): none
    # waited out its poll of the coordination service (up to 1 s) after the last step.
    assert [log["watch_ended_by"] for log in logs] == ["fit ended", "fit ended"]
    final = common.load_weights(out / "rank0_callbacks_weights.npz")
    # Keras's checkpoint, CSV and TensorBoard callbacks write on the chief only
    # (the Trainer wraps them: tfdist.callbacks.worker_safe), even at per-rank paths.
    assert os.listdir(out / "rank1") == []
    model = common.dense_model(tf.distribute.get_strategy(), seed=3)
    model.load_weights(str(out / "rank0" / "last.weights.h5"))
    for a, b in zip(model.get_weights(), final, strict=True):
        np.testing.assert_array_equal(a, b)
    best = keras.saving.load_model(str(out / "rank0" / "best.keras"), compile=False)
    assert len(best.get_weights()) == len(final)
    assert (out / "rank0" / "log.csv").read_text().count("\n") == 4  # header + 3 epochs


def test_a_second_fit_with_a_new_guard_stops_every_worker_at_one_step(run):
    """A second fit in the worker processes with a new PreemptionGuard: worker 1's
    SIGTERM after batch 0 stops both workers after batch 1, the step it names,
    instead of reading the first fit's "fit ended" mark as its own."""
    out, _ = run
    logs = [common.load_json(out / f"rank{r}_second_fit.json") for r in (0, 1)]
    stop = {"epoch": 0, "step": 2, "signal": "SIGTERM"}
    assert [log["stopped"] for log in logs] == [stop, stop]
    assert [log["watch_ended_by"] for log in logs] == ["stop step", "stop step"]


def test_predict_and_evaluate_on_two_workers(run):
    out, _ = run
    model = common.dense_model(tf.distribute.get_strategy())
    model.set_weights(common.load_weights(out / "rank0_callbacks_weights.npz"))
    x, y = common.regression_arrays(n=35, seed=5)  # 3 batches of 16: 16, 16, 3
    expected = model(x).numpy()
    for r in (0, 1):
        np.testing.assert_allclose(np.load(out / f"rank{r}_predictions.npy"), expected,
                                   rtol=1e-5, atol=1e-6)
    trainer = Trainer(model, keras.optimizers.SGD(0.1), "mse", metrics=["mae"])
    reference = trainer.evaluate(common.dataset((x, y), train_worker.GLOBAL_BATCH),
                                 return_dict=True, verbose=0)
    for r in (0, 1):
        evaluation = common.load_json(out / f"rank{r}_callbacks.json")["evaluate"]
        for name, value in reference.items():
            assert evaluation[name] == pytest.approx(value, rel=1e-5)
