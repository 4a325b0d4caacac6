"""ImageNet-style TFRecord shards: the TF/TPU reference format, and a small writer for tests.

Each record is a `tf.train.Example` with

    image/encoded      bytes   a JPEG (or PNG) image
    image/class/label  int64   the class id, 1-based in the reference ImageNet shards
                               (`label_offset=1` maps it to [0, 1000))

(plus optional `image/format`, `image/height`, `image/width`, which are
ignored). Files are sharded across input pipelines by file when there are at
least as many files as pipelines (the reference has 1024 train shards).
"""

import tensorflow as tf

from tfdist.data.corruption import check_tfrecord_tails, skipped_records_log
from tfdist.data.files import check_holds_examples, expand_files
from tfdist.data.images.base import IMAGENET_MEAN, IMAGENET_STD, ImageSource
from tfdist.data.tfrecord import TFRecordReading, write_tfrecord_shards

IMAGE_KEY = "image/encoded"
LABEL_KEY = "image/class/label"
FORMATS = ("jpeg", "png")


class ImageNetTFRecordSource(TFRecordReading, ImageSource):
    """Images and class labels in ImageNet-style TFRecord files.

    Args:
        files: glob, comma-separated globs, or list of paths.
        num_classes: number of classes (1000 for ImageNet).
        image_size: output size; default 224x224x3.
        label_offset: subtracted from the stored label (1 for the 1-based
            reference ImageNet shards, 0 for 0-based files). Every label must
            then be in `[0, num_classes)` (checked when decoding).
        image_key, label_key: the feature names.
        class_names: optional names, one per class.
        mean, std: per-channel normalisation (default ImageNet's).
        compression_type: `""`, `"GZIP"` or `"ZLIB"`.
        skip_corrupt_records: whether a damaged file fails the run (False,
            the default) or is read up to its last readable record, the rest
            noted in `self.skipped`; exactly as for `tfdist.data.TFRecordSource`.
        **image_options: other `ImageSource` options (`train_crop`,
            `crop_fraction`, `flip`, `cache_decoded` (default False),
            `augment_seed`).

    Raises:
        FileNotFoundError: the pattern matches no file.
        NoExamplesError: every file is empty (a `ValueError` naming them).
        CorruptDataError: a file ends inside a record (cut short; checked
            for uncompressed files when not skipping corrupt records).
        ValueError: a bad option (naming it).

    Example:

    >>> train = ImageNetTFRecordSource("/data/imagenet/train-*")
    >>> train.num_classes, train.image_size, train.train_crop
    (1000, (224, 224, 3), 'resized')
    """

    def __init__(self, files, *, num_classes=1000, image_size=224, label_offset=1,
                 image_key=IMAGE_KEY, label_key=LABEL_KEY, class_names=None, mean=IMAGENET_MEAN,
                 std=IMAGENET_STD, compression_type="", cache_decoded=False,
                 skip_corrupt_records=False, **image_options):
        if not isinstance(label_offset, int) or isinstance(label_offset, bool):
            raise ValueError(f"label_offset must be an integer, got {label_offset!r}.")
        self.files = expand_files(files)
        self.label_offset = label_offset
        self.image_key = image_key
        self.label_key = label_key
        self.compression_type = compression_type or ""
        self.skipped = skipped_records_log(skip_corrupt_records, self.compression_type)
        check_holds_examples(self.files)
        if self.skipped is None:  # when skipping, reading notes a file cut short
            check_tfrecord_tails(self.files, self.compression_type)
        super().__init__(num_classes, image_size, class_names=class_names, mean=mean, std=std,
                         cache_decoded=cache_decoded, **image_options)

    def decode_example(self, record):
        parsed = tf.io.parse_single_example(record, {
            self.image_key: tf.io.FixedLenFeature([], tf.string),
            self.label_key: tf.io.FixedLenFeature([], tf.int64)})
        image = tf.io.decode_image(parsed[self.image_key], channels=self.image_size[2],
                                   expand_animations=False)
        label = parsed[self.label_key] - self.label_offset
        message = (f"{self.label_key!r} minus label_offset={self.label_offset} must be in "
                   f"[0, num_classes={self.num_classes}): wrong label_offset or num_classes?")
        tf.debugging.assert_non_negative(label, message=message)
        tf.debugging.assert_less(label, tf.constant(self.num_classes, tf.int64), message=message)
        return image, label

    def describe(self):
        return (f"{super().describe()[:-1]}, {len(self.files)} file(s), "
                f"label_offset={self.label_offset}"
                + (", skip_corrupt_records=True" if self.skipped is not None else "") + ")")


def _encode(image, image_format, quality):
    image = tf.convert_to_tensor(image, tf.uint8)
    if image_format == "jpeg":
        return tf.io.encode_jpeg(image, quality=quality).numpy()
    return tf.io.encode_png(image).numpy()


def write_image_tfrecords(images, labels, output_prefix, num_files=1, *, label_offset=1,
                          image_format="jpeg", quality=95):
    """Writes images and labels as ImageNet-style `tf.train.Example`s, round-robin over files.

    Record `i` goes to file `i % num_files`; files are named
    `{output_prefix}-00000-of-0000N.tfrecord`. Stored labels are
    `label + label_offset` (1-based by default, like the reference shards).

    Args:
        images: iterable of uint8 `[h, w, c]` arrays (c = 1 or 3).
        labels: iterable of int class ids (0-based), same length.
        output_prefix: path prefix of the files (directories are created).
        num_files: number of files.
        label_offset: added to each label when stored.
        image_format: "jpeg" (`tf.io.encode_jpeg`, lossy) or "png" (lossless).
        quality: JPEG quality, 1-100.

    Returns:
        The list of written paths.

    Example:

    >>> images, labels = generate_shapes(64, 32)
    >>> write_image_tfrecords(images, labels, "/tmp/shapes/train", num_files=4)[0]
    '/tmp/shapes/train-00000-of-00004.tfrecord'
    """
    if image_format not in FORMATS:
        raise ValueError(f"Unknown image_format {image_format!r}; valid formats: "
                         f"{', '.join(FORMATS)}.")

    def examples():
        for image, label in zip(images, labels, strict=True):
            height, width = int(image.shape[0]), int(image.shape[1])
            features = {
                IMAGE_KEY: tf.train.Feature(bytes_list=tf.train.BytesList(
                    value=[_encode(image, image_format, quality)])),
                "image/format": tf.train.Feature(bytes_list=tf.train.BytesList(
                    value=[image_format.upper().encode()])),
                "image/height": tf.train.Feature(int64_list=tf.train.Int64List(value=[height])),
                "image/width": tf.train.Feature(int64_list=tf.train.Int64List(value=[width])),
                LABEL_KEY: tf.train.Feature(int64_list=tf.train.Int64List(
                    value=[int(label) + label_offset])),
            }
            yield tf.train.Example(features=tf.train.Features(feature=features))
    return write_tfrecord_shards(examples(), output_prefix, num_files)
