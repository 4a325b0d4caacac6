"""tfdist.data image sources: embedded shapes, TFDS (mock_data), ImageNet TFRecords, image folders.

All offline: generated images, real files in tmp_path, tfds.testing.mock_data.
"""

import collections
import json
import math
import os
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds

from helpers import mw
from helpers.replicas import replica_batches
from tfdist.data import (FILE, IMAGE_SCHEMES, RECORD, DatasetNotPreparedError, ImageFolderSource,
                         ImageNetTFRecordSource, ShapesSource, TFDSImageSource,
                         distribute_dataset, make_dataset_fn, make_source, write_image_tfrecords)
from tfdist.data.images import (ImageSource, augment_batch, augment_image, eval_view,
                                generate_shapes, normalize)
from tfdist.data.images.shapes import SHAPE_CLASSES
from tfdist.distribute.strategy_factory import create_strategy

TWO_REPLICAS = ["/cpu:0", "/cpu:1"]


def to_uint8(images, source):
    """Undoes the source's normalisation: float images -> uint8 pixels."""
    images = np.asarray(images, np.float32) * np.array(source.std) + np.array(source.mean)
    return np.clip(np.round(images * 255.0), 0, 255).astype(np.uint8)


def one_epoch(source, batch=8, context=None, **options):
    """(images, labels) of one epoch, numpy; evaluation order unless options say otherwise."""
    options = dict(dict(training=False, deterministic=True), **options)
    fn = make_dataset_fn(source, batch, repeat=False, drop_remainder=False, **options)
    pairs = [(x.numpy(), y.numpy()) for x, y in fn(context)]
    return np.concatenate([p[0] for p in pairs]), np.concatenate([p[1] for p in pairs])


def shape_ids(images, source):
    """Index in `source.images` of every (unaugmented) pipeline image; -1 if none matches."""
    index_of = {image.tobytes(): i for i, image in enumerate(source.images)}
    return [index_of.get(image.tobytes(), -1) for image in to_uint8(images, source)]


@pytest.fixture
def policy():
    """Sets a Keras global dtype policy for one test and restores the previous one."""
    previous = keras.mixed_precision.dtype_policy()
    yield keras.mixed_precision.set_global_policy
    keras.mixed_precision.set_global_policy(previous)


# --- embedded shapes ------------------------------------------------------------------------

def test_shapes_are_deterministic_balanced_and_splits_independent():
    images, labels = generate_shapes(203, 32, seed=4)
    assert images.shape == (203, 32, 32, 3) and images.dtype == np.uint8
    assert labels.dtype == np.int32
    counts = np.bincount(labels, minlength=len(SHAPE_CLASSES))
    assert counts.max() - counts.min() <= 1                              # balanced classes
    again, same_labels = generate_shapes(203, 32, seed=4)
    np.testing.assert_array_equal(images, again)
    np.testing.assert_array_equal(labels, same_labels)
    assert not np.array_equal(images, generate_shapes(203, 32, seed=5)[0])
    assert not np.array_equal(images, generate_shapes(203, 32, seed=4, split="validation")[0])
    assert len({image.tobytes() for image in images}) == 203            # no duplicates
    assert images.std() > 40                                            # not blank


def test_shapes_source_chance_level_and_errors():
    source = ShapesSource(16)
    assert (source.num_classes, source.image_size) == (8, (32, 32, 3))
    assert source.class_names == SHAPE_CLASSES
    assert source.chance().accuracy == pytest.approx(1 / 8)
    assert source.chance().loss == pytest.approx(math.log(8))
    with pytest.raises(ValueError, match=r"'hexagon'.*circle, square"):
        ShapesSource(16, classes=("circle", "hexagon"))
    with pytest.raises(ValueError, match=r"'dev'.*train, validation, test"):
        ShapesSource(16, split="dev")
    with pytest.raises(ValueError, match="image_size"):
        ShapesSource(16, image_size=(32, 32, 1))


def test_shapes_evaluation_pipeline_gives_the_normalised_images_in_order():
    source = ShapesSource(20, 16, seed=2)
    images, labels = one_epoch(source)
    assert images.dtype == np.float32 and labels.dtype == np.int32
    assert images.shape == (20, 16, 16, 3)
    assert -1.0 <= images.min() and images.max() <= 1.0                # mean = std = 0.5
    np.testing.assert_array_equal(to_uint8(images, source), source.images)
    np.testing.assert_array_equal(labels, source.labels)


def test_a_tiny_conv_net_learns_the_shapes_far_above_chance():
    keras.utils.set_random_seed(0)
    train = make_source("shapes", num_examples=2048, image_size=16, split="train")
    valid = make_source("shapes", num_examples=512, image_size=16, split="validation")
    model = keras.Sequential([
        keras.Input(train.image_size), keras.layers.Conv2D(16, 3, activation="relu"),
        keras.layers.MaxPooling2D(), keras.layers.Conv2D(32, 3, activation="relu"),
        keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(train.num_classes)])
    model.compile(keras.optimizers.Adam(3e-3),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    history = model.fit(make_dataset_fn(train, 64, seed=1, deterministic=True)(None),
                        steps_per_epoch=32, epochs=4, verbose=0, shuffle=False,
                        validation_data=make_dataset_fn(valid, 128, training=False)(None))
    chance = valid.chance()
    assert history.history["val_accuracy"][-1] > 2.4 * chance.accuracy   # > 0.3
    assert history.history["val_loss"][-1] < chance.loss - 0.3


# --- exactly once across replicas and pipelines ---------------------------------------------

@pytest.fixture(scope="module")
def labelled_tfrecords(tmp_path_factory):
    """30 shape images in 6 JPEG TFRecord files, stored label = id + 1 (1-based)."""
    directory = tmp_path_factory.mktemp("imagenet")
    images, _ = generate_shapes(30, 16, seed=9)
    paths = write_image_tfrecords(images, range(30), str(directory / "train"), num_files=6)
    assert len(paths) == 6
    return str(directory / "train-*.tfrecord"), images


def ids_across_two_replicas(source, id_of):
    """Ids of one training epoch under a real 2-replica MirroredStrategy, per replica."""
    strategy = create_strategy("mirrored", devices=TWO_REPLICAS)
    dataset = distribute_dataset(strategy, source, 6, training=True, seed=3, repeat=False,
                                 drop_remainder=False)
    per_replica = [[], []]
    for replica, x, y in replica_batches(strategy, dataset):
        per_replica[replica] += id_of(x.numpy(), y.numpy())
    return per_replica


def assert_exactly_once(per_part, expected):
    assert all(per_part), "a replica/pipeline got no examples"
    seen = collections.Counter(i for part in per_part for i in part)
    assert sorted(seen) == sorted(expected) and set(seen.values()) == {1}


def test_shapes_exactly_once_per_epoch_across_two_replicas_and_two_pipelines():
    source = ShapesSource(30, 16, seed=7, train_crop="none", flip=False)  # no augment: pixel ids
    per_replica = ids_across_two_replicas(source, lambda x, y: shape_ids(x, source))
    assert_exactly_once(per_replica, range(30))
    fn = make_dataset_fn(source, 2, training=True, seed=1, repeat=False, drop_remainder=False)
    per_pipeline = [shape_ids(np.concatenate([x.numpy() for x, _ in fn(
        tf.distribute.InputContext(2, index, 2))]), source) for index in range(2)]
    assert [fn.plans[i].mode for i in range(2)] == [RECORD, RECORD]
    assert_exactly_once(per_pipeline, range(30))


def test_tfrecord_exactly_once_per_epoch_across_two_replicas_and_two_pipelines(
        labelled_tfrecords):
    pattern, _ = labelled_tfrecords
    source = ImageNetTFRecordSource(pattern, num_classes=30, image_size=16)
    assert source.num_files == 6
    per_replica = ids_across_two_replicas(source, lambda x, y: y.tolist())
    assert_exactly_once(per_replica, range(30))
    fn = make_dataset_fn(source, 2, training=True, seed=1, repeat=False, drop_remainder=False)
    per_pipeline = [[int(label) for _, y in fn(tf.distribute.InputContext(2, index, 2))
                     for label in y.numpy()] for index in range(2)]
    assert [fn.plans[i].mode for i in range(2)] == [FILE, FILE]
    assert fn.plans[0].files == source.files[0::2]
    assert_exactly_once(per_pipeline, range(30))


# --- ImageNet-style TFRecords ---------------------------------------------------------------

def test_tfrecord_decode_and_label_offset(tmp_path):
    images, labels = generate_shapes(12, 16, seed=1)
    write_image_tfrecords(images, labels, str(tmp_path / "png"), num_files=2, label_offset=1,
                          image_format="png")
    for offset, expected in ((1, labels), (0, labels + 1)):
        source = make_source(f"imagenet_tfrecord:{tmp_path}/png-*", num_classes=9,
                             image_size=16, label_offset=offset, mean=0.5, std=0.5)
        decoded, got = one_epoch(source, batch=4)
        assert sorted(got.tolist()) == sorted(expected.tolist())
        assert decoded.shape == (12, 16, 16, 3) and decoded.dtype == np.float32
    # PNG is lossless: every decoded image is exactly one of the written ones, with its label.
    by_pixels = {image.tobytes(): int(label) for image, label in zip(images, labels, strict=True)}
    source = ImageNetTFRecordSource(str(tmp_path / "png-*"), num_classes=8, image_size=16,
                                    mean=0.5, std=0.5)
    decoded, got = one_epoch(source, batch=4)
    assert [by_pixels[image.tobytes()] for image in to_uint8(decoded, source)] == got.tolist()


def test_tfrecord_jpeg_round_trip_and_a_wrong_label_offset_is_named(labelled_tfrecords):
    pattern, images = labelled_tfrecords
    source = ImageNetTFRecordSource(pattern, num_classes=30, image_size=16, mean=0.5, std=0.5)
    decoded, labels = one_epoch(source, batch=5)
    distance = np.abs(to_uint8(decoded, source)[:, None].astype(int)
                      - images[None].astype(int)).mean(axis=(2, 3, 4))
    np.testing.assert_array_equal(distance.argmin(axis=1), labels)     # lossy, yet closest
    wrong = ImageNetTFRecordSource(pattern, num_classes=30, image_size=16, label_offset=0)
    with pytest.raises(tf.errors.InvalidArgumentError, match="label_offset=0"):
        one_epoch(wrong, batch=5)                                       # label 30 >= 30


def test_tfrecord_large_images_get_the_imagenet_views(tmp_path):
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (4, 60, 90, 3), dtype=np.uint8)
    write_image_tfrecords(images, [0, 1, 2, 3], str(tmp_path / "big"))
    source = ImageNetTFRecordSource(str(tmp_path / "big-*"), num_classes=4, image_size=72)
    assert (source.train_crop, source.crop_fraction) == ("resized", 0.875)
    for training in (False, True):
        x, y = one_epoch(source, batch=2, training=training, seed=1)
        assert x.shape == (4, 72, 72, 3) and sorted(y.tolist()) == [0, 1, 2, 3]


# --- compute dtype, augmentation, cache -----------------------------------------------------

@pytest.mark.parametrize("name, dtype", [("mixed_bfloat16", tf.bfloat16),
                                         ("mixed_float16", tf.float16), ("float32", tf.float32)])
def test_images_are_cast_to_the_policy_compute_dtype_at_build_time(policy, name, dtype):
    source = ShapesSource(8, 16)
    policy(name)
    fn = make_dataset_fn(source, 4, training=True, seed=0)
    images, labels = next(iter(fn(None)))
    assert images.dtype == dtype and labels.dtype == tf.int32
    evaluation = make_dataset_fn(source, 8, training=False)(None)
    policy("float32")
    assert next(iter(evaluation))[0].dtype == dtype                    # fixed when built


@pytest.mark.parametrize("mean, std", [(0.5, 0.5), ([0.25] * 3, [0.3] * 3),
                                       ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))],
                         ids=["one_number", "equal_channels", "per_channel"])
def test_normalize_is_the_float32_arithmetic_of_each_channel_to_the_bit(mean, std):
    """`(x / 255 - mean) / std` in float32, rounded once to the dtype, whether
    the channels share their mean and std (computed with scalars) or not."""
    pixels = np.arange(256 * 3, dtype=np.int64).reshape(16, 16, 3) % 256
    pixels = pixels.astype(np.uint8)
    expected = ((pixels.astype(np.float32) / np.float32(255))
                - np.asarray(mean, np.float32)) / np.asarray(std, np.float32)
    for dtype in ("float32", "bfloat16"):
        got = normalize(tf.constant(pixels), mean, std, dtype)
        np.testing.assert_array_equal(
            got.numpy().astype(np.float32),
            tf.cast(tf.constant(expected), dtype).numpy().astype(np.float32))


def test_augment_image_is_deterministic_per_seed_and_a_shifted_or_flipped_copy():
    image = tf.constant(generate_shapes(1, 16, seed=3)[0][0], tf.float32)
    a = augment_image(image, tf.constant([1, 2]), padding=3)
    np.testing.assert_array_equal(a, augment_image(image, tf.constant([1, 2]), padding=3))
    outputs = [augment_image(image, tf.constant([s, 0]), padding=3).numpy() for s in range(12)]
    assert len({o.tobytes() for o in outputs}) > 4                     # seeds matter
    padded = np.pad(image.numpy(), [(3, 3), (3, 3), (0, 0)])
    candidates = [padded[dy:dy + 16, dx:dx + 16] for dy in range(7) for dx in range(7)]
    candidates += [c[:, ::-1] for c in candidates]
    for output in outputs:                                              # a crop of the padding,
        assert any(np.array_equal(output, c) for c in candidates)       # maybe flipped
    resized = augment_image(image, tf.constant([4, 5]), crop="resized")
    assert resized.shape == image.shape and resized.dtype == image.dtype


def windows(image, padding, size):
    """Every crop of `image` padded with `padding` zeros, unflipped then flipped."""
    padded = np.pad(image, [(padding, padding), (padding, padding), (0, 0)])
    span = 2 * padding + 1
    crops = [padded[dy:dy + size, dx:dx + size] for dy in range(span) for dx in range(span)]
    return crops + [c[:, ::-1] for c in crops]


def test_augment_batch_crops_and_flips_each_image_by_its_own_seed():
    """Each image is one of the 2 x 7 x 7 windows of itself padded by 3, chosen
    by its seed alone: the same in any batch, in any order; over 400 seeds
    every window position and both flips occur."""
    images = tf.constant(generate_shapes(400, 16, seed=4)[0], tf.float32)
    seeds = tf.stack([tf.fill([400], 9), tf.range(400)], axis=1)
    out = augment_batch(images, seeds, padding=3).numpy()
    assert out.shape == images.shape
    chosen = []
    for image, result in zip(images.numpy(), out, strict=True):
        matches = [index for index, crop in enumerate(windows(image, 3, 16))
                   if np.array_equal(crop, result)]
        assert matches, "not a window of the padded image"
        chosen.append(matches[0])
    flips = sum(index >= 49 for index in chosen)
    assert 140 <= flips <= 260
    assert len({index % 49 for index in chosen}) == 49
    order = np.random.default_rng(0).permutation(400)[:37]
    again = augment_batch(tf.gather(images, order), tf.gather(seeds, order), padding=3)
    np.testing.assert_array_equal(again, out[order])
    moved = augment_batch(images[:37], seeds[:37] + [0, 1], padding=3).numpy()
    assert sum(not np.array_equal(a, b) for a, b in zip(moved, out[:37], strict=True)) > 20
    flipped_only = augment_batch(images[:50], seeds[:50], crop="none").numpy()
    for image, result in zip(images.numpy()[:50], flipped_only, strict=True):
        assert np.array_equal(result, image) or np.array_equal(result, image[:, ::-1])
    with pytest.raises(ValueError, match="not 'resized'; augment each image with augment_image"):
        augment_batch(images, seeds, crop="resized")


def test_a_seeded_pipeline_augments_pad_crops_a_batch_at_a_time_and_resized_crops_per_image():
    """Both give windows of the right size, the same at a resume; the batch path
    is only for the crops augment_batch does."""
    pad = ShapesSource(64, 16, seed=1, cache_decoded=False)
    assert callable(pad.augment_batch_with_seeds)
    resized = ShapesSource(64, 16, seed=1, train_crop="resized", cache_decoded=False)
    assert resized.augment_batch_with_seeds is None
    for source in (pad, resized):
        fn = make_dataset_fn(source, 8, seed=5)
        whole = [images.numpy() for images, _ in fn(None).take(12)]
        later = [images.numpy() for images, _ in fn.positioned(9)(None).take(3)]
        for a, b in zip(whole[9:], later, strict=True):
            np.testing.assert_array_equal(a, b)
    # (whole is the resized source's now) most pad-source images were cropped or flipped:
    images = np.concatenate([b.numpy() for b, _ in make_dataset_fn(pad, 8, seed=5)(None).take(8)])
    assert sum(i == -1 for i in shape_ids(images, pad)) > 32


def test_augmentation_runs_in_training_only():
    source = ShapesSource(16, 16, seed=1)
    evaluation = [one_epoch(source)[0] for _ in range(2)]
    np.testing.assert_array_equal(evaluation[0], evaluation[1])         # no randomness
    np.testing.assert_array_equal(to_uint8(evaluation[0], source), source.images)
    trained, labels = one_epoch(source, training=True, seed=2)
    assert sorted(labels.tolist()) == sorted(source.labels.tolist())
    assert sum(i == -1 for i in shape_ids(trained, source)) > 8        # most were augmented
    plain = ShapesSource(16, 16, seed=1, train_crop="none", flip=False)
    assert plain.augment is None
    assert sorted(shape_ids(one_epoch(plain, training=True, seed=2)[0], plain)) == list(range(16))


DETERMINISM_SCRIPT = """
import json, numpy as np, tensorflow as tf
tf.config.experimental.enable_op_determinism()   # process-wide: hence a separate process
from tfdist.data import ShapesSource, make_dataset_fn

def two_epochs(augment_seed):
    source = ShapesSource(32, 16, augment_seed=augment_seed)
    batches = iter(make_dataset_fn(source, 32, training=True, seed=1, deterministic=True)(None))
    return [np.sort(next(batches)[0].numpy().reshape(32, -1), axis=0) for _ in range(2)]

a, b, c = two_epochs(3), two_epochs(3), two_epochs(4)
print(json.dumps({"same_seed_equal": all(np.array_equal(x, y) for x, y in zip(a, b, strict=True)),
                  "other_seed_differs": not np.array_equal(a[0], c[0]),
                  "epochs_differ": not np.array_equal(a[0], a[1])}))
"""


def test_whole_training_pipeline_is_reproducible_under_op_determinism():
    result = subprocess.run([sys.executable, "-c", DETERMINISM_SCRIPT], cwd=mw.REPO_ROOT,
                            env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"), timeout=180,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert result.returncode == 0, result.stdout[-3000:]
    assert json.loads(result.stdout.strip().splitlines()[-1]) == {
        "same_seed_equal": True, "other_seed_differs": True, "epochs_differ": True}


class CountingSource(ImageSource):
    """Counts its decode calls (a Python side effect), so caching is observable."""

    def __init__(self, cache_decoded):
        super().__init__(2, (4, 4, 3), cache_decoded=cache_decoded, train_crop="none",
                         flip=False)
        self.decoded = 0

    def read_all(self):
        return tf.data.Dataset.range(6)

    def _count(self, record):
        self.decoded += 1
        return np.full([4, 4, 3], int(record), np.uint8)

    def decode_example(self, record):
        image = tf.py_function(self._count, [record], tf.uint8)
        return tf.ensure_shape(image, [4, 4, 3]), record % 2


def test_decoded_images_are_cached_when_asked():
    for cache, decodes in ((True, 6), (False, 12)):
        source = CountingSource(cache)
        dataset = make_dataset_fn(source, 6, training=False, deterministic=True)(None)
        epochs = [next(iter(dataset))[1].numpy().tolist() for _ in range(2)]
        assert epochs == [[0, 1, 0, 1, 0, 1]] * 2
        assert source.decoded == decodes                       # two epochs, 6 images each


def test_eval_view_resizes_the_shorter_side_and_crops_the_centre():
    image = np.zeros([40, 80, 3], np.uint8)
    image[:, 12:68] = 255                                               # a white centre band
    view = eval_view(tf.constant(image), (20, 20)).numpy()
    assert view.shape == (20, 20, 3) and view.min() == 255             # only the centre is kept
    unchanged = tf.constant(image[:20, :20])
    assert eval_view(unchanged, (20, 20)) is unchanged


# --- image folders --------------------------------------------------------------------------

COLOURS = {"zebra": (250, 10, 10), "ant": (10, 250, 10), "cat": (10, 10, 250)}


def write_folder(root, per_class=3):
    for name, colour in COLOURS.items():
        (root / name).mkdir(parents=True)
        for i in range(per_class):
            image = np.full([12 + i, 20, 3], colour, np.uint8)
            encoded = tf.io.encode_png(image) if i % 2 else tf.io.encode_jpeg(image, quality=98)
            tf.io.write_file(str(root / name / f"{i}.{'png' if i % 2 else 'JPG'}"), encoded)
    (root / "ant" / "notes.txt").write_text("not an image")


def test_image_folder_classes_are_sorted_names_and_labels_follow_the_folders(tmp_path):
    write_folder(tmp_path)
    source = make_source(f"image_folder:{tmp_path}", image_size=8, mean=0.5, std=0.5)
    assert source.class_names == ("ant", "cat", "zebra") and source.num_classes == 3
    assert source.num_examples == 9 and source.train_crop == "pad"
    images, labels = one_epoch(source, batch=3)
    assert images.shape == (9, 8, 8, 3)
    for image, label in zip(to_uint8(images, source), labels, strict=True):
        colour = COLOURS[source.class_names[label]]
        np.testing.assert_allclose(image.reshape(-1, 3).mean(axis=0), colour, atol=4)
    assert sorted(labels.tolist()) == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    fn = make_dataset_fn(source, 1, training=True, seed=0, repeat=False)
    parts = [[int(y[0]) for _, y in fn(tf.distribute.InputContext(2, index, 1))]
             for index in range(2)]
    assert fn.plans[0].mode == FILE and fn.plans[1].files == source.files[1::2]
    assert sorted(parts[0] + parts[1]) == [0, 0, 0, 1, 1, 1, 2, 2, 2] and all(parts)


def test_image_folder_errors_name_the_problem(tmp_path):
    with pytest.raises(FileNotFoundError, match="not a directory"):
        ImageFolderSource(str(tmp_path / "missing"))
    (tmp_path / "empty_class").mkdir()
    with pytest.raises(ValueError, match="empty_class"):
        ImageFolderSource(str(tmp_path))
    for index in range(1000):  # ImageNet's class folders, none filled yet: one short line
        (tmp_path / f"n{index:08d}").mkdir()
    with pytest.raises(ValueError) as error:
        ImageFolderSource(str(tmp_path))
    message = str(error.value)
    assert "1001 of 1001 class folder(s) hold no image" in message
    assert message.endswith("empty_class, n00000000, n00000001, n00000002, n00000003 and 996 more.")


# --- TFDS -----------------------------------------------------------------------------------

@pytest.mark.parametrize("name, size, crop", [("cifar10", (32, 32, 3), "pad"),
                                              ("mnist", (28, 28, 1), "pad")])
def test_tfds_image_datasets_load_through_the_pipeline_with_mock_data(name, size, crop):
    with tfds.testing.mock_data(num_examples=10):
        # Under mock_data, download_and_prepare is a no-op: this is the offline path.
        source = make_source(f"tfds_images:{name}", download=True)
        assert isinstance(source, TFDSImageSource)
        assert source.image_size == size and source.train_crop == crop
        assert source.num_classes == 10 and len(source.class_names) == 10
        images, labels = one_epoch(source, batch=5)
        trained, _ = one_epoch(source, batch=5, training=True, seed=1)
    assert images.shape == (10,) + size and images.dtype == np.float32
    assert trained.shape == images.shape
    assert labels.dtype == np.int32 and 0 <= labels.min() and labels.max() < 10
    pixels = to_uint8(images, source)
    assert pixels.std() > 20                                          # decoded, not blank


NUM_TFDS_IMAGES = 23


class TfdistTestImages(tfds.core.GeneratorBasedBuilder):
    """A tiny real TFDS image dataset, generated locally: image i has label i."""

    VERSION = tfds.core.Version("1.0.0")

    def _info(self):
        return tfds.core.DatasetInfo(builder=self, supervised_keys=("picture", "label"),
                                     features=tfds.features.FeaturesDict({
                                         "picture": tfds.features.Image(shape=(16, 16, 3)),
                                         "label": tfds.features.ClassLabel(
                                             num_classes=NUM_TFDS_IMAGES)}))

    def _split_generators(self, dl_manager):
        return {"train": self._generate_examples(seed=2),
                "validation": self._generate_examples(seed=3, count=4)}

    def _generate_examples(self, seed, count=NUM_TFDS_IMAGES):
        images, _ = generate_shapes(count, 16, seed=seed)
        for i, image in enumerate(images):
            yield i, {"picture": image, "label": i}


@pytest.mark.parametrize("pipelines, mode", [(2, FILE), (5, RECORD)])
def test_prepared_tfds_images_are_partitioned_across_pipelines(tmp_path, pipelines, mode):
    TfdistTestImages(data_dir=str(tmp_path)).download_and_prepare(
        download_config=tfds.download.DownloadConfig(num_shards=4))
    source = make_source("tfds_images:tfdist_test_images", data_dir=str(tmp_path))
    assert (source.image_key, source.label_key, source.num_files) == ("picture", "label", 4)
    fn = make_dataset_fn(source, 1, training=True, seed=0, repeat=False, drop_remainder=False)
    parts = [[int(y[0]) for _, y in fn(tf.distribute.InputContext(pipelines, index, 1))]
             for index in range(pipelines)]
    assert fn.plans[0].mode == mode
    assert_exactly_once(parts, range(NUM_TFDS_IMAGES))


def test_tfds_image_size_can_be_changed():
    with tfds.testing.mock_data(num_examples=4):
        source = TFDSImageSource("mnist", download=True, image_size=(20, 20, 3))
        images, _ = one_epoch(source, batch=4)
    assert images.shape == (4, 20, 20, 3) and source.mean == (0.1307,) * 3


def test_unprepared_tfds_image_dataset_is_an_error_that_says_how_to_prepare_it(tmp_path):
    with pytest.raises(DatasetNotPreparedError) as caught:
        make_source("tfds_images:cifar10", data_dir=str(tmp_path))
    assert f"tfds build cifar10 --data_dir {tmp_path}" in str(caught.value)
    assert "download=True" in str(caught.value)
    with pytest.raises(DatasetNotPreparedError, match="manual download"):
        TFDSImageSource("imagenet2012", data_dir=str(tmp_path))
    assert not list(tmp_path.iterdir())                               # nothing written


def test_tfds_dataset_without_images_is_named():
    with tfds.testing.mock_data(num_examples=2):
        with pytest.raises(ValueError, match=r"image features: none.*text, label"):
            TFDSImageSource("imdb_reviews", download=True)


# --- factory --------------------------------------------------------------------------------

def test_factory_image_schemes_and_errors(tmp_path):
    assert set(IMAGE_SCHEMES) == {"shapes", "tfds_images", "imagenet_tfrecord", "image_folder"}
    source = make_source("shapes", num_examples=16, split="validation", seed=None)
    assert isinstance(source, ShapesSource) and source.split == "validation"
    with pytest.raises(ValueError, match=r"Unknown dataset scheme 'pictures'.*shapes, "
                                         r"tfds_images, imagenet_tfrecord, image_folder"):
        make_source("pictures:/data")
    with pytest.raises(ValueError, match="needs a directory"):
        make_source("image_folder:")
    with pytest.raises(ValueError, match="takes no argument"):
        make_source("shapes:circles")
    with pytest.raises(TypeError, match="Bad option for dataset 'shapes'"):
        make_source("shapes", sequence_length=8)
    # Its class count comes from its classes (it was Python's "got multiple values").
    with pytest.raises(TypeError, match=r"Bad option for dataset 'shapes' \(ShapesSource\): "
                                        r"num_classes is set by the source itself; drop it\."):
        make_source("shapes", num_classes=3)
    with pytest.raises(FileNotFoundError, match="No files match"):
        make_source(f"imagenet_tfrecord:{tmp_path}/none-*")
    with pytest.raises(ValueError, match=r"train_crop 'zoom'.*auto, pad, resized, none"):
        ShapesSource(8, train_crop="zoom")


# --- two workers ----------------------------------------------------------------------------

@pytest.mark.multiworker
def test_two_workers_see_every_image_exactly_once(tmp_path):
    data_dir, out = tmp_path / "data", tmp_path / "out"
    out.mkdir()
    images, _ = generate_shapes(27, 16, seed=11)
    write_image_tfrecords(images, range(27), str(data_dir / "many"), num_files=5)
    write_image_tfrecords(images[:13], range(13), str(data_dir / "one"), num_files=1)
    result = mw.launch(["tests/helpers/workers/data_image_shard_worker.py", "--data-dir", str(data_dir),
                        "--out", str(out), "--global-batch-size", "4", "--shapes-examples", "21"],
                       workers=2, timeout=200, startup_timeout=150)
    assert result.returncode == 0, result.stdout[-4000:]
    files = sorted(out.glob("worker-*.json"))
    assert [f.name for f in files] == ["worker-0.json", "worker-1.json"], result.stdout[-4000:]
    results = [json.loads(f.read_text()) for f in files]
    assert all(r["replicas"] == 2 for r in results)
    for name, ids, mode in (("many_files", range(27), "file"), ("one_file", range(13), "record"),
                            ("shapes", range(21), "record")):
        per_worker = [r["sources"][name] for r in results]
        assert [w["modes"] for w in per_worker] == [[mode], [mode]], name
        assert_exactly_once([w["ids"] for w in per_worker], ids)
        assert per_worker[0]["steps"] == per_worker[1]["steps"]


def test_cnn_validation_on_tfds_reads_the_held_out_split(tmp_path):
    import argparse

    from tensorflow_datasets.core.utils import file_utils

    from tfdist.recipes.cnn import build_data

    TfdistTestImages(data_dir=str(tmp_path)).download_and_prepare()
    config = argparse.Namespace(dataset="tfds_images:tfdist_test_images",
                                validation_dataset="tfds_images:tfdist_test_images",
                                image_size=None, num_classes=None, num_examples=64, seed=0,
                                global_batch_size=8)
    tfds.core.add_data_dir(str(tmp_path))  # the recipe passes no data_dir: TFDS searches here
    try:
        data = build_data(config)
    finally:
        file_utils.clear_registered_data_dirs()
    assert (data.train.split, data.validation.split) == ("train", "validation")
    assert data.validation.num_examples == 4


def test_validation_sources_read_held_out_splits_unless_told():
    from tfdist.data import make_validation_source

    assert make_validation_source("shapes", num_examples=16).split == "validation"
    assert make_validation_source("shapes", num_examples=16, split="test").split == "test"
    assert make_validation_source("embedded:copy", num_examples=16).split == "validation"
    with tfds.testing.mock_data(num_examples=4):
        assert make_validation_source("tfds_images:cifar10", download=True).split == "test"


def test_a_resume_counts_image_records_file_after_file_and_lands_where_the_stream_is(tmp_path):
    """An ImageNet-style source of 3 files (4, 3 and 3 records), one pipeline
    sharding by file: a positioned pipeline counts a pass through
    `read_in_any_order`, which reads the files one after another (cheaper
    than the pass's parallel interleave) and gives the records `read` gives;
    positioned inside the first pass and two passes later, the pipeline
    yields what the whole stream yields there."""
    images, labels = generate_shapes(10, 16, seed=3)
    write_image_tfrecords(images, labels, str(tmp_path / "train"), num_files=3,
                          image_format="png")
    source = ImageNetTFRecordSource(str(tmp_path / "train-*"), num_classes=len(SHAPE_CLASSES),
                                    image_size=16, cache_decoded=False)
    fn = make_dataset_fn(source, 2, seed=4)
    whole = list(fn(None).take(16))  # 5 batches a pass
    plan = fn.plans[0]
    assert plan.mode == FILE and len(plan.files) == 3
    counted = [record.numpy() for record in source.read_in_any_order(plan)]
    file_by_file = [record.numpy() for path in plan.files
                    for record in tf.data.TFRecordDataset(path)]
    assert counted == file_by_file
    assert sorted(counted) == sorted(record.numpy() for record in source.read(plan))
    assert counted != [record.numpy() for record in source.read(plan)]  # read interleaves

    counting_reads = []
    read_in_any_order = source.read_in_any_order
    source.read_in_any_order = lambda plan: counting_reads.append(plan) or read_in_any_order(plan)
    for start in (3, 12):  # 6 examples into the first pass; 2 into the third
        later = list(fn.positioned(start)(None).take(4))
        for (their_images, their_labels), (our_images, our_labels) in zip(
                whole[start:start + 4], later, strict=True):
            np.testing.assert_array_equal(our_images, their_images)
            np.testing.assert_array_equal(our_labels, their_labels)
    assert len(counting_reads) == 2
