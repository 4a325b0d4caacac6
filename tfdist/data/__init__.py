"""tfdist.data: sharded input pipelines for multi-device, multi-worker training.

Sources say where examples come from; the pipeline shards them per input
pipeline (by file or by record), batches per replica and hands the result to
the strategy:

    from tfdist.data import make_source, distribute_dataset

    source = make_source("embedded:reverse")          # or tfds:..., tfrecord:..., text:...
    dataset = distribute_dataset(strategy, source, global_batch_size=64, seed=0)
    model = build_model(vocab_size=source.vocab_size, length=source.sequence_length)

Sequence sources yield `(inputs, targets)` int32 vectors of
`source.sequence_length`; targets equal to 0 (pad) must not count in the loss.

Image sources (`shapes`, `tfds_images:`, `imagenet_tfrecord:`, `image_folder:`;
see `tfdist.data.images`) yield `(image, label)`: `[H, W, C]` images in the
Keras policy's compute dtype and int32 labels in `[0, source.num_classes)`.
"""

from tfdist.data.corruption import (CorruptDataError, SkippedRecords, check_tfrecord_tails,
                                     explain_data_loss, find_corrupt_tfrecords, find_cut_tfrecords,
                                     read_tfrecords)
from tfdist.data.embedded import TASKS, Chance, EmbeddedTaskSource
from tfdist.data.source_factory import (IMAGE_SCHEMES, SCHEMES, TFRECORD_SCHEMES, dataset_scheme,
                                  make_source, make_validation_source, skip_corrupt_option)
from tfdist.data.files import NoExamplesError, check_holds_examples, expand_files
from tfdist.data.images import (ImageFolderSource, ImageNetTFRecordSource, ImageSource,
                                ShapesSource, TFDSImageSource, write_image_tfrecords)
from tfdist.data.input_pipeline import (DatasetFn, count_examples, describe_epoch_passes,
                                  distribute_dataset, make_dataset_fn, per_replica_batch_size)
from tfdist.data.sharding import FILE, RECORD, ShardPlan, plan_sharding
from tfdist.data.source import ArraySource, SequenceSource, Source
from tfdist.data.text import TextSource
from tfdist.data.tfds_common import DatasetNotPreparedError, prepared_builder
from tfdist.data.tfds_source import TFDSSource
from tfdist.data.tfrecord import TFRecordSource, write_text_tfrecords, write_token_tfrecords
from tfdist.data.tokens import (BOS_ID, EOS_ID, NUM_RESERVED, PAD_ID, SEP_ID, ByteVocabulary,
                                language_model_pair, pack_windows, pad_or_truncate)

__all__ = [
    "ArraySource", "BOS_ID", "ByteVocabulary", "Chance", "CorruptDataError", "DatasetFn",
    "DatasetNotPreparedError", "SkippedRecords", "TFRECORD_SCHEMES", "explain_data_loss",
    "find_corrupt_tfrecords", "read_tfrecords", "skip_corrupt_option",
    "NoExamplesError", "check_holds_examples", "count_examples", "describe_epoch_passes", "check_tfrecord_tails", "find_cut_tfrecords",
    "EOS_ID", "EmbeddedTaskSource", "FILE", "IMAGE_SCHEMES", "ImageFolderSource",
    "ImageNetTFRecordSource", "ImageSource", "NUM_RESERVED", "PAD_ID", "RECORD", "SCHEMES",
    "ShapesSource", "TFDSImageSource",
    "SEP_ID", "SequenceSource", "ShardPlan", "Source", "TASKS", "TFDSSource", "TFRecordSource",
    "TextSource", "dataset_scheme", "distribute_dataset", "expand_files", "language_model_pair",
    "make_dataset_fn", "make_source", "make_validation_source", "pack_windows", "pad_or_truncate",
    "per_replica_batch_size", "plan_sharding", "prepared_builder", "write_image_tfrecords",
    "write_text_tfrecords",
    "write_token_tfrecords",
]
