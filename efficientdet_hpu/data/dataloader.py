"""Input pipeline: detection TFRecords -> (images, labels) for the Estimator.

The record schema and the output layout are docs/CONTRACTS.md's. Per example, all in TF ops:

    parse -> decode (JPEG, PNG, ...) -> [train: random horizontal flip]
          -> fit keeping the aspect ratio into image_size * m, m ~ U(jitter_min, jitter_max)
             in training, m = 1 in eval; [train: keep a random image_size window of it]
          -> bilinear resize -> normalise -> pad bottom/right with 0 (the mean colour)
          -> anchor targets (anchors.AnchorLabeler) + ground-truth rows in original pixels

Geometry (fit_window): the original pixels [crop_offset, crop_offset + crop_size) are resized
to resized_size ~= crop_size * scale, so network pixel = (original pixel - crop_offset) *
resized_size / crop_size per axis. The window is cropped before resizing, so a 2x jitter
costs no more than 1x. `image_scales` = 1 / scale: exact for eval (crop = whole image, no
flip); in training the crop offset and the flip are not part of it (a scalar cannot carry
them) and nothing needs them, as `groundtruth_data` is made from the unaugmented boxes.

Crowd boxes: with `skip_crowd_during_training=true` (the default, as google/automl's
dataloader) training drops them from the targets entirely. Eval and
`skip_crowd_during_training=false` label them as ordinary boxes (`crowd_anchors: positive`, as
automl) or ignore the anchors on them (`crowd_anchors: ignore`). `groundtruth_data` always
keeps them (COCO eval needs them). Boxes are clipped to image_size - 1 as automl clips them
(`clip_boxes_to_last_pixel`; false: to the resized image's edge).
"""
import collections
import os
import random

import numpy as np
import tensorflow as tf

from efficientdet_hpu.config import hparams_config
from efficientdet_hpu.data import record_parser
from efficientdet_hpu.data import tfrecord_framing as framing
from efficientdet_hpu.data.record_parser import CONVERTER_HINT
from efficientdet_hpu.ops import anchors

AUTOTUNE = tf.data.AUTOTUNE


# ----------------------------------------------------------------------------- geometry

class Window(collections.namedtuple('Window', 'scale crop_offset crop_size resized_size')):
    """Where an image lands in the network input: the original pixels
    [crop_offset, crop_offset + crop_size) (int32 [2], (y, x)) are resized to resized_size
    (int32 [2], <= the output size) at the top left of the output; the rest is padding.
    scale (float32 scalar) is the nominal resize factor, resized ~= crop * scale per axis."""


def fit_window(image_height, image_width, output_size, scale_multiplier=1.0,
               crop_fraction=(0.0, 0.0)):
    """Fits the image into output_size * scale_multiplier keeping its aspect ratio.

    Where the scaled image is larger than the output, only the part that lands in it is
    kept: a crop of round(output / scale) original pixels starting at crop_fraction of the
    spare room. Cropping before resizing makes the resize cost the output's size, not the
    (up to jitter_max^2 times larger) scaled image's. An axis kept whole is resized to
    int32(size * scale), truncated as google/automl does (a 640x427 image into 512 px: 341
    rows, not 342), so evaluation sees automl's pixels; a cropped axis fills the output.

    Args:
        image_height, image_width: int32 scalars, original image size.
        output_size: (height, width) of the network input, Python ints.
        scale_multiplier: float32 scalar (1 in eval, U(jitter_min, jitter_max) in training).
        crop_fraction: float32 [2] in [0, 1), (y, x).

    Returns:
        A Window.
    """
    output = tf.constant(output_size, tf.float32)
    original = tf.cast(tf.stack([image_height, image_width]), tf.float32)
    scale = tf.reduce_min(output * scale_multiplier / original)
    crop = tf.maximum(tf.minimum(tf.round(output / scale), original), 1.0)
    offset = tf.floor((original - crop) * tf.convert_to_tensor(crop_fraction, tf.float32))
    # automl's set_scale_factors_to_output_size: tf.cast(size * scale, tf.int32). A cropped
    # axis is rounded: crop * scale ~= output, and the window should fill it.
    resized = tf.where(crop < original, tf.round(crop * scale), tf.floor(original * scale))
    resized = tf.clip_by_value(resized, 1.0, output)
    return Window(scale, tf.cast(offset, tf.int32), tf.cast(crop, tf.int32),
                  tf.cast(resized, tf.int32))


def crop_resize_pad(image, window, output_size, mean_rgb, stddev_rgb):
    """uint8/float [H, W, 3] -> float32 [out_h, out_w, 3]: the window's crop, bilinearly
    resized, normalised by mean_rgb / stddev_rgb (0..255 units), zero (= mean) padded
    bottom/right."""
    offset, size = window.crop_offset, window.crop_size
    image = image[offset[0]:offset[0] + size[0], offset[1]:offset[1] + size[1]]
    image = tf.image.resize(image, window.resized_size, method=tf.image.ResizeMethod.BILINEAR)
    image = (image - tf.constant(mean_rgb, tf.float32)) / tf.constant(stddev_rgb, tf.float32)
    out_h, out_w = output_size
    image = tf.image.pad_to_bounding_box(image, 0, 0, out_h, out_w)
    image.set_shape([out_h, out_w, 3])
    return image


def boxes_to_network_pixels(boxes_normalized, original_size, window, last_pixel_of=None):
    """Normalised [N, 4] boxes of an image of original_size (int32 [2]) -> (float32 [N, 4]
    network-input pixels clipped to the resized crop, bool [N] whether any of the box is
    left in it). Boxes are [ymin, xmin, ymax, xmax]. last_pixel_of: the output (height, width)
    to clip to height - 1 and width - 1 as well, as automl's input pipeline does."""
    original = tf.tile(tf.cast(original_size, tf.float32), [2])
    offset = tf.tile(tf.cast(window.crop_offset, tf.float32), [2])
    resized = tf.tile(tf.cast(window.resized_size, tf.float32), [2])
    # The exact per-axis factor of the resize, not the nominal scale: targets match pixels.
    factor = resized / tf.tile(tf.cast(window.crop_size, tf.float32), [2])
    boxes = (boxes_normalized * original - offset) * factor
    if last_pixel_of is not None:
        resized = tf.minimum(resized, tf.tile(tf.cast(last_pixel_of, tf.float32) - 1.0, [2]))
    boxes = tf.minimum(tf.maximum(boxes, 0.0), resized)
    visible = (boxes[:, 2] > boxes[:, 0]) & (boxes[:, 3] > boxes[:, 1])
    return boxes, visible


def flip_left_right(image, boxes_normalized):
    """Mirrors an [H, W, C] image and its normalised [N, 4] boxes."""
    ymin, xmin, ymax, xmax = tf.unstack(boxes_normalized, num=4, axis=1)
    return (tf.image.flip_left_right(image),
            tf.stack([ymin, 1.0 - xmax, ymax, 1.0 - xmin], axis=1))


def training_window(image, boxes_normalized, random_values, output_size, *, hflip,
                    jitter_min, jitter_max):
    """Random flip and scale jitter of one example.

    Args:
        image: [H, W, 3]; boxes_normalized: float32 [N, 4] relative to (H, W).
        random_values: float32 [4] uniform in [0, 1): flip (< 0.5 flips), scale, crop y, x.
        output_size: (height, width); hflip, jitter_min, jitter_max: as in hparams_config.

    Returns:
        (image, boxes_normalized, window): possibly flipped, and fit_window's Window.
    """
    if hflip:
        image, boxes_normalized = tf.cond(
            random_values[0] < 0.5, lambda: flip_left_right(image, boxes_normalized),
            lambda: (image, boxes_normalized))
    multiplier = jitter_min + (jitter_max - jitter_min) * random_values[1]
    shape = tf.shape(image)
    window = fit_window(shape[0], shape[1], output_size, multiplier, random_values[2:4])
    return image, boxes_normalized, window


def preprocess_for_eval(image, config):
    """Eval/inference preprocessing of one decoded image.

    Args:
        image: uint8 [H, W, 3] RGB, any size.
        config: hparams_config.Config or dict with image_size, mean_rgb, stddev_rgb.

    Returns:
        (float32 [h, w, 3] network input, float32 image_scale with network pixels *
        image_scale = original pixels, int32 [2] original (height, width)).
    """
    output_size = hparams_config.parse_image_size(config['image_size'])
    original_size = tf.shape(image)[:2]
    window = fit_window(original_size[0], original_size[1], output_size)
    network_image = crop_resize_pad(image, window, output_size, config['mean_rgb'],
                                    config['stddev_rgb'])
    return network_image, 1.0 / window.scale, original_size


# ----------------------------------------------------------------------------- reader

def _labeler(config, output_size):
    anchor_boxes = anchors.generate_anchor_boxes(
        output_size[0], output_size[1], **hparams_config.anchor_settings(config))
    return anchors.AnchorLabeler(
        anchor_boxes, anchors.level_shapes(output_size[0], output_size[1], config.min_level,
                                           config.max_level),
        hparams_config.anchors_per_location(config),
        match_threshold=config.match_threshold, unmatched_threshold=config.unmatched_threshold)


def _labels_dict(targets, source_id, image_scale, original_size, groundtruth):
    cls_targets, box_targets, num_positives = targets
    labels = {'cls_targets_%d' % level: cls_targets[level] for level in cls_targets}
    labels.update({'box_targets_%d' % level: box_targets[level] for level in box_targets})
    labels.update(num_positives=num_positives, source_ids=source_id,
                  image_scales=tf.cast(image_scale, tf.float32),
                  image_sizes=tf.cast(original_size, tf.int32), groundtruth_data=groundtruth)
    return labels


def list_record_files(file_pattern):
    """Sorted files matching a glob or comma-separated globs, without the converter's JSON
    side files (`train-*` also matches `train-label_map.json` and `train-summary.json`): the
    shards the checker (dataset/verify_tfrecords.py) checks."""
    return framing.list_shards(file_pattern)


class InputReader:
    """Estimator input_fn over detection TFRecords (see the module docstring).

    Args:
        file_pattern: glob, or comma-separated globs, of TFRecord files.
        is_training: augment, shuffle, repeat forever, drop the last partial batch.
            Otherwise every record exactly once across all workers, in a fixed order.
        use_fake_data: one synthetic batch of the right shapes repeated from memory; reads
            no file (input-free benchmarking).
        num_shards, shard_index: this worker's part (input_context overrides them): whole
            files when there are at least num_shards files, else every num_shards-th record.
        deterministic: ordered interleave and map, seeded shuffles (seed None -> 0); two
            runs give identical batches. Augmentation is always stateless, keyed by
            (seed, shard, element index), so it is reproducible whenever the order is.
        seed: base seed; None (non-deterministic mode) draws one.
        max_examples: read only the first max_examples records of the whole (sorted file
            order) dataset, split across workers, e.g. --eval_samples.
        skip: records to leave out (engine.bad_records.SkipList: record indices per shard,
            and where broken shards stop), or None.
        start_batches: training batches this worker already took (a resumed run's step):
            their records are read and dropped, not decoded, so a --deterministic run resumed
            at step N gets the batches an uninterrupted run gets from step N on.
    """

    def __init__(self, file_pattern, is_training, *, use_fake_data=False, num_shards=1,
                 shard_index=0, deterministic=False, seed=None, max_examples=None, skip=None,
                 start_batches=0):
        if not 0 <= shard_index < num_shards:
            raise ValueError('shard_index must be in [0, num_shards=%d), got %d'
                             % (num_shards, shard_index))
        self._file_pattern = file_pattern
        self._is_training = is_training
        self._use_fake_data = use_fake_data
        self._num_shards = num_shards
        self._shard_index = shard_index
        self._deterministic = deterministic
        self._seed = seed
        self._max_examples = max_examples
        self._skip = skip if skip is not None and (skip.bad or skip.readable) else None
        self._start_batches = start_batches if is_training else 0

    def __call__(self, params, input_context=None):
        """Returns a tf.data.Dataset of (images float32 [B, H, W, 3], labels dict); B is the
        run's batch_size, times accumulation_steps when training.

        params: the run's config/settings.Settings (the Estimator's params)."""
        num_shards, shard_index = self._num_shards, self._shard_index
        if input_context is not None:
            num_shards = input_context.num_input_pipelines
            shard_index = input_context.input_pipeline_id
        output_size = hparams_config.parse_image_size(params.config.image_size)
        labeler = _labeler(params.config, output_size)
        if self._use_fake_data:
            dataset = self._fake_batches(params, output_size, labeler)
        else:
            seed = self._seed_for(shard_index)
            dataset = self._records(num_shards, shard_index, seed, params)
            process = self._example_fn(params, output_size, labeler, seed)
            dataset = dataset.enumerate()
            if self._start_batches:  # After enumerate: the augmentation keys stay the same.
                dataset = dataset.skip(self._start_batches * self._batch_size(params))
            dataset = dataset.map(process, num_parallel_calls=AUTOTUNE)
            dataset = dataset.batch(self._batch_size(params), drop_remainder=self._is_training)
        return dataset.prefetch(AUTOTUNE).with_options(self._options())

    def _batch_size(self, params):
        """Images per rank and batch: training reads all micro-batches of an optimizer step
        (per-rank batch x accumulation steps; model_fn cuts them), evaluation its own batch."""
        return params.batch.step_size if self._is_training else params.batch.eval_per_rank

    @property
    def _ordered(self):
        return self._deterministic or not self._is_training or self._max_examples is not None

    def _seed_for(self, shard_index):
        seed = self._seed
        if seed is None:
            seed = 0 if self._deterministic else random.SystemRandom().randrange(2 ** 31)
        # Workers share the base seed; folding the shard in decorrelates their draws.
        return (int(seed) * 1000003 + shard_index) % (2 ** 31 - 1)

    def _list_files(self):
        files = list_record_files(self._file_pattern)
        if not files:
            raise ValueError('no TFRecord files match file_pattern %r (check the path and the '
                             'glob); %s' % (self._file_pattern, CONVERTER_HINT))
        return files

    def _records(self, num_shards, shard_index, seed, params):
        """Serialized examples of this worker's part; shuffled and repeated in training."""
        files = self._list_files()
        if self._max_examples is not None or len(files) < num_shards:
            dataset = (tf.data.Dataset.from_tensor_slices(files).flat_map(self._file_records)
                       if self._skip else tf.data.TFRecordDataset(files))
            if self._max_examples is not None:
                dataset = dataset.take(self._max_examples)
            dataset = dataset.shard(num_shards, shard_index)
        else:
            files = files[shard_index::num_shards]
            dataset = tf.data.Dataset.from_tensor_slices(files)
            if self._is_training:
                dataset = dataset.shuffle(len(files), seed=seed + 1)
            dataset = dataset.interleave(
                self._file_records if self._skip else tf.data.TFRecordDataset,
                cycle_length=min(len(files), max(2, os.cpu_count())),
                num_parallel_calls=AUTOTUNE, deterministic=self._ordered)
        if self._is_training:
            dataset = dataset.shuffle(params.config.shuffle_buffer, seed=seed).repeat()
        return dataset

    def _file_records(self, path):
        """One shard's records without the skipped ones (`skip`): a broken shard is read up to
        its break, and bad records are left out by index."""
        readable = [(p, n) for p, n in sorted(self._skip.readable.items())]
        keys = ['%s#%d' % (p, i) for p, indices in sorted(self._skip.bad.items())
                for i in indices]
        records = tf.data.TFRecordDataset(path)
        if readable:
            counts = tf.constant([n for _, n in readable], tf.int64)
            found = tf.equal(tf.constant([p for p, _ in readable]), path)
            records = records.take(tf.reduce_min(tf.where(found, counts, tf.int64.max)))
        if not keys:
            return records
        bad_keys = tf.constant(keys)

        def keep(index, _):
            key = tf.strings.join([path, '#', tf.strings.as_string(index)])
            return tf.logical_not(tf.reduce_any(tf.equal(bad_keys, key)))
        return records.enumerate().filter(keep).map(lambda _, record: record)

    def _example_fn(self, params, output_size, labeler, seed):
        """(element index, serialized Example) -> (image, labels) of one example."""
        training = self._is_training

        @tf.autograph.experimental.do_not_convert
        def process(index, serialized):
            record = record_parser.parse_record(serialized, self._file_pattern,
                                                params.config.num_classes)
            image = record_parser.decode_image(record['encoded'])
            original_size = tf.shape(image)[:2]
            boxes = record['boxes']
            if training:
                random_values = tf.random.stateless_uniform(
                    [4], seed=tf.stack([tf.constant(seed, tf.int64), index]))
                image, boxes, window = training_window(
                    image, boxes, random_values, output_size, hflip=params.config.input_rand_hflip,
                    jitter_min=params.config.jitter_min, jitter_max=params.config.jitter_max)
            else:
                window = fit_window(original_size[0], original_size[1], output_size)
            network_image = crop_resize_pad(image, window, output_size, params.config.mean_rgb,
                                            params.config.stddev_rgb)
            network_boxes, visible = boxes_to_network_pixels(
                boxes, original_size, window,
                last_pixel_of=output_size if params.config.clip_boxes_to_last_pixel else None)
            keep = visible
            if training and params.config.skip_crowd_during_training:
                keep &= tf.equal(record['is_crowd'], 0)
            classes = tf.where(keep, record['labels'] - 1, -1)
            ignore_crowd = params.config.crowd_anchors == 'ignore'
            targets = labeler.label(network_boxes, classes, record['is_crowd'] if ignore_crowd
                                    else tf.zeros_like(record['is_crowd']))
            groundtruth = record_parser.groundtruth_rows(record, original_size,
                                           params.config.max_instances_per_image, truncate=training)
            return network_image, _labels_dict(targets, record['source_id'], 1.0 / window.scale,
                                               original_size, groundtruth)
        return process

    def _fake_batches(self, params, output_size, labeler):
        """One plausible batch, computed once, cached and repeated (no file, no decode)."""
        height, width = output_size
        boxes = np.array([[0.1, 0.1, 0.5, 0.4], [0.3, 0.5, 0.9, 0.9]], np.float32) * [
            height, width, height, width]
        labels = np.array([1, min(2, params.config.num_classes)], np.float32)
        area = (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])
        rows = np.full([params.config.max_instances_per_image, 7], -1.0, np.float32)
        real = np.concatenate([boxes, np.zeros([2, 1]), area[:, None], labels[:, None]], 1)
        rows[:len(real)] = real[:len(rows)]

        @tf.autograph.experimental.do_not_convert  # As process: ~0.6 s CPU of conversion (D0).
        def example(_):
            image = tf.random.stateless_normal([height, width, 3], seed=[7, 11])
            targets = labeler.label(boxes, labels.astype(np.int32) - 1, np.zeros([2], np.int32))
            return image, _labels_dict(targets, tf.constant(1, tf.int64), 1.0, [height, width],
                                       tf.constant(rows))
        batch_size = self._batch_size(params)
        return (tf.data.Dataset.range(batch_size).map(example)
                .batch(batch_size, drop_remainder=True).cache().repeat())

    def _options(self):
        options = tf.data.Options()
        options.deterministic = self._ordered
        # One thread per op: the parallel map already spreads examples over the cores, and
        # intra-op threads on a small machine only contend with it (tf.data guide).
        options.threading.max_intra_op_parallelism = 1
        options.experimental_optimization.map_parallelization = True
        options.experimental_optimization.parallel_batch = True
        # No autotuning: in TensorFlow 2.15 an autotuned iterator's destruction waits for its
        # tuning thread, which at times sleeps out its period (up to a minute) instead of
        # waking; train_and_eval replaces its evaluation iterator at every evaluation and
        # closes the training one at its end. AUTOTUNE then means min(16, cores) parallel
        # calls, tf.data's default.
        options.autotune.enabled = False
        return options
