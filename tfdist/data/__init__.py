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


from tfdist.runtime.lazy_exports import lazy_exports

# Names load on first use, so `import tfdist.data.specs` (the TensorFlow-free
# scheme names the recipes check before TensorFlow starts) stays light.
_EXPORTS = {
    "ArraySource": "tfdist.data.source",
    "BOS_ID": "tfdist.data.tokens",
    "ByteVocabulary": "tfdist.data.tokens",
    "Chance": "tfdist.data.embedded",
    "CorruptDataError": "tfdist.data.corruption",
    "DatasetFn": "tfdist.data.input_pipeline",
    "DatasetNotPreparedError": "tfdist.data.tfds_common",
    "EOS_ID": "tfdist.data.tokens",
    "EmbeddedTaskSource": "tfdist.data.embedded",
    "FILE": "tfdist.data.sharding",
    "IMAGE_SCHEMES": "tfdist.data.specs",
    "ImageFolderSource": "tfdist.data.images",
    "ImageNetTFRecordSource": "tfdist.data.images",
    "ImageSource": "tfdist.data.images",
    "NUM_RESERVED": "tfdist.data.tokens",
    "NoExamplesError": "tfdist.data.files",
    "PAD_ID": "tfdist.data.tokens",
    "RECORD": "tfdist.data.sharding",
    "SCHEMES": "tfdist.data.specs",
    "SEP_ID": "tfdist.data.tokens",
    "SequenceSource": "tfdist.data.source",
    "ShapesSource": "tfdist.data.images",
    "ShardPlan": "tfdist.data.sharding",
    "SkippedRecords": "tfdist.data.corruption",
    "Source": "tfdist.data.source",
    "TASKS": "tfdist.data.embedded",
    "TFDSImageSource": "tfdist.data.images",
    "TFDSSource": "tfdist.data.tfds_source",
    "TFRECORD_SCHEMES": "tfdist.data.specs",
    "TFRecordSource": "tfdist.data.tfrecord",
    "TRANSLATION_VOCABULARY": "tfdist.data.translation_task",
    "TextSource": "tfdist.data.text",
    "TranslationTaskSource": "tfdist.data.translation_task",
    "check_holds_examples": "tfdist.data.files",
    "check_tfrecord_tails": "tfdist.data.corruption",
    "count_examples": "tfdist.data.input_pipeline",
    "dataset_scheme": "tfdist.data.specs",
    "describe_epoch_passes": "tfdist.data.input_pipeline",
    "distribute_dataset": "tfdist.data.input_pipeline",
    "expand_files": "tfdist.data.files",
    "explain_data_loss": "tfdist.data.corruption",
    "find_corrupt_tfrecords": "tfdist.data.corruption",
    "find_cut_tfrecords": "tfdist.data.corruption",
    "generate_sentence_pairs": "tfdist.data.translation_task",
    "language_model_pair": "tfdist.data.tokens",
    "make_dataset_fn": "tfdist.data.input_pipeline",
    "make_source": "tfdist.data.source_factory",
    "make_validation_source": "tfdist.data.source_factory",
    "pack_windows": "tfdist.data.tokens",
    "pad_or_truncate": "tfdist.data.tokens",
    "per_replica_batch_size": "tfdist.data.input_pipeline",
    "plan_sharding": "tfdist.data.sharding",
    "prepared_builder": "tfdist.data.tfds_common",
    "read_tfrecords": "tfdist.data.corruption",
    "skip_corrupt_option": "tfdist.data.source_factory",
    "write_image_tfrecords": "tfdist.data.images",
    "write_text_tfrecords": "tfdist.data.tfrecord",
    "write_token_tfrecords": "tfdist.data.tfrecord",
}

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

__all__ = sorted(_EXPORTS)
