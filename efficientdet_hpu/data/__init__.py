"""The data library: the detection TFRecord format (tfrecord_format, tfrecord_framing,
record_parser), record and shard checks, label maps, COCO annotations, image encoding, the boxes
of a dataset and their anchor coverage, and the tf.data input pipeline (dataloader)."""
