"""An image folder: `root/CLASS_NAME/*.jpg|png|...`, one class per subdirectory.

Classes are the subdirectories sorted by name (label = position); files are
listed sorted, so the order is the same in every worker. Each image file is
one example: with at least as many images as input pipelines, each pipeline
reads its own files (file sharding), otherwise records are sharded.
"""

import os

import tensorflow as tf

from tfdist.data import sharding
from tfdist.data.files import first_few
from tfdist.data.images.base import IMAGENET_MEAN, IMAGENET_STD, ImageSource

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".gif")
"""File endings read by `ImageFolderSource` (case-insensitive); other files are ignored."""


def list_image_folder(root, extensions=IMAGE_EXTENSIONS):
    """Lists `(class_names, paths, labels)` of an image folder.

    Args:
        root: directory with one subdirectory per class (any `tf.io.gfile`
            filesystem).
        extensions: file endings to keep (case-insensitive).

    Raises:
        FileNotFoundError: `root` is not a directory.
        ValueError: no class subdirectory, or a class without images (named).

    Example:

    >>> names, paths, labels = list_image_folder("/data/flowers/train")
    >>> names[:2], paths[0], labels[0]
    (('daisy', 'roses'), '/data/flowers/train/daisy/001.jpg', 0)
    """
    root = str(root)
    if not tf.io.gfile.isdir(root):
        raise FileNotFoundError(f"Image folder {root!r} is not a directory.")
    extensions = tuple(e.lower() for e in extensions)
    names = sorted(entry.rstrip("/") for entry in tf.io.gfile.listdir(root)
                   if tf.io.gfile.isdir(os.path.join(root, entry.rstrip("/"))))
    if not names:
        raise ValueError(f"Image folder {root!r} has no class subdirectories; expected "
                         f"{root}/CLASS_NAME/image.jpg.")
    paths, labels, empty = [], [], []
    for label, name in enumerate(names):
        directory = os.path.join(root, name)
        files = sorted(f for f in tf.io.gfile.listdir(directory)
                       if f.lower().endswith(extensions)
                       and not tf.io.gfile.isdir(os.path.join(directory, f)))
        if not files:
            empty.append(name)
        paths += [os.path.join(directory, f) for f in files]
        labels += [label] * len(files)
    if empty:
        raise ValueError(f"Image folder {root!r}: {len(empty)} of {len(names)} class folder(s) "
                         f"hold no image ({', '.join(extensions)}): {first_few(empty)}.")
    return tuple(names), tuple(paths), tuple(labels)


class ImageFolderSource(ImageSource):
    """Images in `root/CLASS_NAME/` folders (see the module docstring).

    Images are decoded with `tf.io.decode_image(channels=C,
    expand_animations=False)` (the first frame of a GIF), whatever their size.

    Args:
        root: the directory holding one subdirectory per class.
        image_size: output size; default 224x224x3.
        extensions: file endings to read.
        mean, std: per-channel normalisation (default ImageNet's).
        **image_options: other `ImageSource` options (`train_crop`,
            `padding`, `crop_fraction`, `flip`, `cache_decoded` (default
            "auto": cache up to 1 GiB of decoded images), `augment_seed`).

    Raises:
        FileNotFoundError, ValueError: see `list_image_folder`.

    Example:

    >>> source = ImageFolderSource("/data/flowers/train", image_size=128)
    >>> source.class_names
    ('daisy', 'dandelion', 'roses', 'sunflowers', 'tulips')
    """

    def __init__(self, root, *, image_size=224, extensions=IMAGE_EXTENSIONS, mean=IMAGENET_MEAN,
                 std=IMAGENET_STD, **image_options):
        names, self.files, self.labels = list_image_folder(root, extensions)
        self.root = str(root)
        self._label_of = dict(zip(self.files, self.labels))
        super().__init__(len(names), image_size, class_names=names, mean=mean, std=std,
                         **image_options)

    @property
    def num_examples(self):
        return len(self.files)

    def read(self, plan, *, shuffle_files=False, seed=None, file_order=None):
        if plan.mode == sharding.FILE:
            paths = list(plan.files)
            labels = [self._label_of[path] for path in paths]
            if file_order is not None:
                return tf.data.Dataset.from_tensor_slices(
                    (tf.gather(paths, file_order), tf.gather(labels, file_order)))
            dataset = tf.data.Dataset.from_tensor_slices((paths, labels))
            if shuffle_files and len(paths) > 1:
                dataset = dataset.shuffle(len(paths), seed=seed, reshuffle_each_iteration=True)
            return dataset
        if plan.mode == sharding.RECORD:
            return self.read_all().shard(plan.count, plan.index)
        raise ValueError(f"Unknown shard mode {plan.mode!r}; expected one of {sharding.MODES}.")

    def read_all(self):
        return tf.data.Dataset.from_tensor_slices((list(self.files), list(self.labels)))

    def decode_example(self, record):
        path, label = record
        image = tf.io.decode_image(tf.io.read_file(path), channels=self.image_size[2],
                                   expand_animations=False)
        return image, label

    def describe(self):
        return f"{super().describe()[:-1]}, root={self.root!r})"
