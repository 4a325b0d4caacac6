"""A run over the recipes' token sources, stopped mid-pass and resumed from its
backup, ends with the uninterrupted run's weights, to the bit: the positioned
pipeline (which skips token windows unsplit, packed TFRecords parsed in blocks,
and unpacked token records unparsed) gives the batches the uninterrupted run got.
"""

import keras
import numpy as np
import pytest

from helpers.interrupt import Interrupted, InterruptAfterSteps
from tfdist.callbacks.backup import BackupAndResume
from tfdist.data import TextSource, TFRecordSource, make_dataset_fn, write_token_tfrecords
from tfdist.data.tfrecord import write_text_tfrecords
from tfdist.training import Trainer

SEQUENCE = 6
WORDS = "the quick brown fox jumps over lazy dog".split()


def lines(count, seed):
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, size=5)) for _ in range(count)]


def make_source(kind, folder):
    if kind == "text":
        for index in range(2):
            (folder / f"part{index}.txt").write_text("\n".join(lines(150, index)) + "\n")
        return TextSource(str(folder / "*.txt"), sequence_length=SEQUENCE)
    if kind == "text_tfrecords":
        write_text_tfrecords(lines(300, 5), str(folder / "texts"), num_files=2)
        return TFRecordSource(str(folder / "texts-*"), sequence_length=SEQUENCE, format="text")
    rng = np.random.default_rng(6)
    rows = [rng.integers(4, 40, size=rng.integers(2, 9)).tolist() for _ in range(300)]
    write_token_tfrecords(rows, str(folder / "tokens"), num_files=2)
    return TFRecordSource(str(folder / "tokens-*"), sequence_length=SEQUENCE, vocab_size=40)


def fit(source, callbacks):
    keras.utils.set_random_seed(3)
    model = keras.Sequential([keras.Input((SEQUENCE,), dtype="int32"),
                              keras.layers.Embedding(source.vocab_size, 8),
                              keras.layers.Dense(source.vocab_size)])
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True, ignore_class=0)
    trainer = Trainer(model, keras.optimizers.SGD(0.5), loss, jit_compile=False)
    pipeline = make_dataset_fn(source, 8, seed=2, shuffle_buffer=64)
    assert pipeline.can_position
    trainer.fit(pipeline, epochs=3, steps_per_epoch=6, callbacks=callbacks, verbose=0)
    return [np.array(weight) for weight in model.get_weights()]


@pytest.mark.parametrize("kind", ["text", "text_tfrecords", "token_records"])
def test_a_run_over_a_token_source_resumed_mid_pass_ends_bit_identical(tmp_path, kind):
    """18 steps of 8 examples, all inside the first pass (over 300 of them);
    stopped after 11 steps, resumed from the backup of step 9 (epoch 1, step 3)."""
    source = make_source(kind, tmp_path)
    uninterrupted = fit(source, [])
    first = BackupAndResume(tmp_path / "backup", save_freq=3, verbose=0)
    with pytest.raises(Interrupted):
        fit(source, [first, InterruptAfterSteps(11)])
    saved = first.last_backup
    assert (saved.epoch, saved.step, saved.global_step) == (1, 3, 9)
    second = BackupAndResume(tmp_path / "backup", verbose=0)
    resumed = fit(source, [second])
    assert second.restored == saved and second.exact is True
    for index, (a, b) in enumerate(zip(resumed, uninterrupted, strict=True)):
        assert np.max(np.abs(a - b)) == 0, f"weight array {index}"
