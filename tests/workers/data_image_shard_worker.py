"""Multi-worker test worker for the image sources' sharding.

Builds MultiWorkerMirroredStrategy from TF_CONFIG, creates TFDIST_READY_FILE,
then for each image source iterates one training epoch of
`distribute_dataset` (no repeat, partial last batch kept) and records the
example ids its replicas received and the shard mode the pipeline logged.
Writes `{out}/worker-{rank}.json`.

Example ids: the TFRecord sources store `label = id` (1-based on disk,
`label_offset=1`); the shapes source is identified by its pixels (no crop,
no flip), looked up among the images it generated.

Usage: data_image_shard_worker.py --data-dir DIR --out DIR --shapes-examples 21
"""

import argparse
import json
import logging
import os
import threading

threading.Timer(200, lambda: os._exit(98)).start()  # never outlive the test

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from tfdist.data import ImageNetTFRecordSource, ShapesSource, distribute_dataset  # noqa: E402


class ModeRecorder(logging.Handler):
    """Keeps the shard modes announced on the tfdist.data logger."""

    def __init__(self):
        super().__init__(logging.INFO)
        self.modes = []

    def emit(self, record):
        message = record.getMessage()
        for mode in ("FILE", "RECORD"):
            if f"sharding by {mode}" in message:
                self.modes.append(mode.lower())


def pixels_to_uint8(images, source):
    """Undoes the source's normalisation: float images -> uint8 pixels."""
    images = np.asarray(images, np.float32) * np.array(source.std) + np.array(source.mean)
    return np.clip(np.round(images * 255.0), 0, 255).astype(np.uint8)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--data-dir", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--global-batch-size", type=int, default=4)
    parser.add_argument("--shapes-examples", type=int, default=21)
    args = parser.parse_args()

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    if os.environ.get("TFDIST_READY_FILE"):
        open(os.environ["TFDIST_READY_FILE"], "w").close()
    rank = strategy.cluster_resolver.task_id

    recorder = ModeRecorder()
    logger = logging.getLogger("tfdist.data")
    logger.setLevel(logging.INFO)
    logger.addHandler(recorder)

    shapes = ShapesSource(args.shapes_examples, 16, seed=5, train_crop="none", flip=False)
    index_of = {image.tobytes(): i for i, image in enumerate(shapes.images)}
    sources = {
        "many_files": ImageNetTFRecordSource(os.path.join(args.data_dir, "many-*.tfrecord"),
                                             num_classes=1000, image_size=16),
        "one_file": ImageNetTFRecordSource(os.path.join(args.data_dir, "one-*.tfrecord"),
                                           num_classes=1000, image_size=16),
        "shapes": shapes,
    }
    results = {"rank": rank, "replicas": strategy.num_replicas_in_sync, "sources": {}}
    for name, source in sources.items():
        recorder.modes.clear()
        dataset = distribute_dataset(strategy, source, args.global_batch_size, training=True,
                                     seed=rank + 1, repeat=False, drop_remainder=False)
        ids, steps = [], 0
        for images, labels in dataset:
            steps += 1
            local_images = strategy.experimental_local_results(images)
            local_labels = strategy.experimental_local_results(labels)
            for batch_images, batch_labels in zip(local_images, local_labels):
                if name == "shapes":
                    ids.extend(index_of.get(image.tobytes(), -1)
                               for image in pixels_to_uint8(batch_images, source))
                else:
                    ids.extend(int(label) for label in batch_labels.numpy())
        results["sources"][name] = {"ids": ids, "modes": list(recorder.modes), "steps": steps}
        print(f"worker {rank}: {name}: {len(ids)} examples in {steps} steps, "
              f"modes {recorder.modes}", flush=True)

    path = os.path.join(args.out, f"worker-{rank}.json")
    with open(path + ".tmp", "w") as handle:
        json.dump(results, handle)
    os.replace(path + ".tmp", path)
    os._exit(0)


if __name__ == "__main__":
    main()
