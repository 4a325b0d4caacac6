"""Multi-worker test worker for the image sources' sharding.

Builds MultiWorkerMirroredStrategy with tfdist.distribute.strategy_factory.create_strategy (which
signals the launcher), then for each image source iterates one training epoch of
`distribute_dataset` (no repeat, partial last batch kept) and records the
example ids its replicas received and the shard mode the pipeline logged.
Writes `{out}/worker-{rank}.json`.

Example ids: the TFRecord sources store `label = id` (1-based on disk,
`label_offset=1`); the shapes source is identified by its pixels (no crop,
no flip), looked up among the images it generated.

Usage: data_image_shard_worker.py --data-dir DIR --out DIR --shapes-examples 21
"""

import os

import numpy as np

from shard_common import run, shard_arguments
from tfdist.data import ImageNetTFRecordSource, ShapesSource


def pixels_to_uint8(images, source):
    """Undoes the source's normalisation: float images -> uint8 pixels."""
    images = np.asarray(images, np.float32) * np.array(source.std) + np.array(source.mean)
    return np.clip(np.round(images * 255.0), 0, 255).astype(np.uint8)


def main():
    args = shard_arguments(shapes_examples=21)
    index_of = {}

    def sources():
        shapes = ShapesSource(args.shapes_examples, 16, seed=5, train_crop="none", flip=False)
        index_of.update({image.tobytes(): i for i, image in enumerate(shapes.images)})
        return {
            "many_files": ImageNetTFRecordSource(os.path.join(args.data_dir, "many-*.tfrecord"),
                                                 num_classes=1000, image_size=16),
            "one_file": ImageNetTFRecordSource(os.path.join(args.data_dir, "one-*.tfrecord"),
                                               num_classes=1000, image_size=16),
            "shapes": shapes,
        }

    def batch_ids(name, source, element):
        images, labels = element
        if name == "shapes":
            return [index_of.get(image.tobytes(), -1) for image in pixels_to_uint8(images, source)]
        return [int(label) for label in labels.numpy()]

    run(sources, batch_ids, args.out, args.global_batch_size)


if __name__ == "__main__":
    from tfdist.runtime.quick_exit import skip_exit_garbage_collection

    skip_exit_garbage_collection()  # the test waits for this process to end
    main()
