"""The translation recipe's encoder-decoder meets the language model's correctness bar:
2 replicas train like one device (SGD, float32, the label-smoothed masked loss over
padded sentences of uneven length), and a run stopped mid-epoch and resumed from its
backup ends with the uninterrupted run's weights, to the bit.

(2 workers equal one device: tests/training/test_training_multiworker.py, phase "seq2seq".)
"""

import numpy as np
import pytest
import tensorflow as tf

from helpers.compare import assert_same_weights
from helpers.interrupt import Interrupted, InterruptAfterSteps
from helpers.workers import seq2seq_common as s2s
from helpers.workers import train_common as common
from tfdist.callbacks.backup import BackupAndResume
from tfdist.data import make_dataset_fn


def test_two_replicas_train_the_seq2seq_like_one_device():
    source = s2s.translation_source(s2s.EQUIVALENCE_EXAMPLES, s2s.EQUIVALENCE_SEED)
    # The two replicas of each full batch hold different numbers of real target tokens,
    # so a per-replica mean (instead of the global one) would train differently.
    counts = (source.target_output_ids != 0).reshape(4, 2, 4, -1).sum(axis=(2, 3))
    assert np.all(counts[:, 0] != counts[:, 1]), counts
    one_losses, one_weights = s2s.one_device_equivalence_run()
    two_losses, two_weights = s2s.equivalence_run(common.mirrored(2))
    assert len(one_losses) == 8
    np.testing.assert_allclose(two_losses, one_losses, rtol=1e-5, atol=1e-6)
    assert_same_weights(two_weights, one_weights)
    # The run moved the weights far beyond the tolerance (the comparison can fail).
    initial = common.weights_of(s2s.seq2seq_model(tf.distribute.get_strategy(), source))
    assert max(np.max(np.abs(a - b)) for a, b in zip(one_weights, initial, strict=True)) > 1e-2
    assert one_losses[-1] < one_losses[0]


def test_seq2seq_resumed_mid_epoch_from_the_translation_pipeline_ends_bit_identical(tmp_path):
    """The recipe's input (`make_dataset_fn` over a `TranslationTaskSource`, shuffled with
    a seed, repeated; one device, to keep the three fits short): stopped after 8 steps,
    resumed from the backup of step 6 (epoch 1 step 1), the run ends with the uninterrupted run's weights (max diff 0)."""
    source = s2s.translation_source(40)
    pipeline = make_dataset_fn(source, s2s.GLOBAL_BATCH, training=True, seed=0)
    assert pipeline.can_position

    def fit(callbacks):
        model, trainer = s2s.seq2seq_trainer(tf.distribute.get_strategy(), source)
        trainer.fit(pipeline, epochs=3, steps_per_epoch=5, callbacks=callbacks, verbose=0)
        return common.weights_of(model)

    uninterrupted = fit([])
    backup_dir = tmp_path / "backup"
    first = BackupAndResume(backup_dir, save_freq=3, verbose=0)
    with pytest.raises(Interrupted):
        fit([first, InterruptAfterSteps(8)])
    saved = first.last_backup
    assert (saved.epoch, saved.step, saved.global_step) == (1, 1, 6)
    second = BackupAndResume(backup_dir, verbose=0)
    resumed = fit([second])
    assert second.restored == saved and second.exact is True
    for index, (a, b) in enumerate(zip(resumed, uninterrupted, strict=True)):
        assert np.max(np.abs(a - b)) == 0, f"weight array {index}"
