"""Image classification sources for the tfdist.data pipeline (see `base` for the flow).

    from tfdist.data import make_source, distribute_dataset

    train = make_source("shapes", split="train")                 # embedded, no download
    # or "tfds_images:cifar10", "imagenet_tfrecord:/data/train-*", "image_folder:/data/train"
    dataset = distribute_dataset(strategy, train, global_batch_size=128)
    model = build_resnet("resnet_tiny", train.num_classes, train.image_size)
"""

from tfdist.data.images.augment import (BATCH_CROPS, CROPS, augment_batch, augment_image,
                                        compute_dtype, eval_view, normalize, pad_and_random_crop,
                                        random_resized_crop)
from tfdist.data.images.base import IMAGENET_MEAN, IMAGENET_STD, ImageSource
from tfdist.data.images.folder import IMAGE_EXTENSIONS, ImageFolderSource
from tfdist.data.images.imagenet_tfrecord import ImageNetTFRecordSource, write_image_tfrecords
from tfdist.data.images.shapes import SHAPE_CLASSES, ShapesSource, generate_shapes
from tfdist.data.images.tfds_images import TFDSImageSource

__all__ = [
    "BATCH_CROPS", "CROPS", "IMAGENET_MEAN", "IMAGENET_STD", "IMAGE_EXTENSIONS", "ImageFolderSource",
    "ImageNetTFRecordSource", "ImageSource", "SHAPE_CLASSES", "ShapesSource", "TFDSImageSource",
    "augment_batch", "augment_image", "compute_dtype", "eval_view", "generate_shapes", "normalize",
    "pad_and_random_crop", "random_resized_crop", "write_image_tfrecords",
]
