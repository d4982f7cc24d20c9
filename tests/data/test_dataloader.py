"""dataloader.InputReader on small real TFRecords of real JPEG/PNG images (CPU, seconds)."""
import collections
import io

import numpy as np
import pytest
import tensorflow as tf

from efficientdet_hpu.config import hparams_config
from efficientdet_hpu.config import settings
from efficientdet_hpu.data import dataloader
from efficientdet_hpu.ops import anchors
import tfrecord_fixtures as fixtures
from efficientdet_hpu.data import record_parser
from efficientdet_hpu.data import tfrecord_format as fmt
from tfrecord_fixtures import ImageSpec

LEVELS = (3, 4, 5)
NUM_ANCHORS = 9  # 3 scales x 3 aspect ratios.
# Level 4 (stride 16) anchor at row 3, column 3, octave 0, ratio 1.0: centre (56, 56),
# size anchor_scale * stride = 64 -> exactly this box.
LEVEL4_ANCHOR_BOX = [24.0, 24.0, 88.0, 88.0]


def tiny_params(batch_size=2, **overrides):
    config = hparams_config.get_efficientdet_config('efficientdet-d0')
    config.override(dict(image_size=128, min_level=3, max_level=5, num_classes=3,
                         max_instances_per_image=8, shuffle_buffer=16))
    config.override(overrides)
    return settings.finalize(config, settings.RunFacts(per_rank_batch=batch_size))


NO_AUGMENTATION = dict(input_rand_hflip=False, jitter_min=1.0, jitter_max=1.0)


def first_batch(reader, params):
    return next(iter(reader(params).as_numpy_iterator()))


def all_source_ids(reader, params):
    return [int(i) for _, labels in reader(params).as_numpy_iterator()
            for i in labels['source_ids']]


def flat_targets(labels, index, name, per_anchor):
    """Concatenates the per-level targets of example `index` in anchor order."""
    return np.concatenate([labels['%s_%d' % (name, level)][index].reshape(-1, *per_anchor)
                           for level in LEVELS])


def decode_codes(codes, anchor_boxes):
    """Faster R-CNN decoding of [ty, tx, th, tw] against [ymin, xmin, ymax, xmax] anchors."""
    anchor_h = anchor_boxes[:, 2] - anchor_boxes[:, 0]
    anchor_w = anchor_boxes[:, 3] - anchor_boxes[:, 1]
    centre_y = anchor_boxes[:, 0] + anchor_h / 2 + codes[:, 0] * anchor_h
    centre_x = anchor_boxes[:, 1] + anchor_w / 2 + codes[:, 1] * anchor_w
    height, width = np.exp(codes[:, 2]) * anchor_h, np.exp(codes[:, 3]) * anchor_w
    return np.stack([centre_y - height / 2, centre_x - width / 2,
                     centre_y + height / 2, centre_x + width / 2], axis=1)


@pytest.fixture(scope='module')
def random_records(tmp_path_factory):
    """5 images of 96x160 with 1-4 boxes each, in 2 files."""
    specs = fixtures.random_specs(5, height=96, width=160, max_boxes=4, seed=3)
    return fixtures.write_shards(tmp_path_factory.mktemp('random'), specs, num_files=2)


@pytest.mark.parametrize('is_training', [True, False])
def test_shapes_and_dtypes_per_level(random_records, is_training):
    params = tiny_params(batch_size=2, image_size='128x64')  # width 128, height 64.
    reader = dataloader.InputReader(random_records, is_training=is_training)
    batches = list(reader(params).take(3).as_numpy_iterator())
    for images, labels in batches:
        batch = len(images)
        assert images.shape[1:] == (64, 128, 3) and images.dtype == np.float32
        for level in LEVELS:
            shape = (batch, 64 // 2 ** level, 128 // 2 ** level)
            assert labels['cls_targets_%d' % level].shape == shape + (NUM_ANCHORS,)
            assert labels['cls_targets_%d' % level].dtype == np.int32
            assert labels['box_targets_%d' % level].shape == shape + (NUM_ANCHORS * 4,)
            assert labels['box_targets_%d' % level].dtype == np.float32
        expected = {'num_positives': ((batch,), np.float32), 'source_ids': ((batch,), np.int64),
                    'image_scales': ((batch,), np.float32), 'image_sizes': ((batch, 2), np.int32),
                    'groundtruth_data': ((batch, 8, 7), np.float32)}
        for key, (shape, dtype) in expected.items():
            assert (labels[key].shape, labels[key].dtype) == (shape, dtype), key
        assert set(labels) == set(expected) | {'%s_targets_%d' % (kind, level)
                                               for kind in ('cls', 'box') for level in LEVELS}
        np.testing.assert_array_equal(labels['image_sizes'], [[96, 160]] * batch)
    # Training drops the last partial batch (and repeats); eval keeps it: 5 = 2 + 2 + 1.
    assert [len(images) for images, _ in batches] == ([2, 2, 2] if is_training else [2, 2, 1])


@pytest.mark.parametrize('is_training', [True, False])
def test_no_pipeline_is_autotuned(random_records, is_training):
    """TensorFlow 2.15 destroys an autotuned iterator once its tuning thread wakes, which at
    times takes that thread's whole period (20 s and more): train_and_eval replaces its
    evaluation iterator at every evaluation and closes the training one at its end."""
    params = tiny_params(batch_size=2, image_size='128x64')
    dataset = dataloader.InputReader(random_records, is_training=is_training)(params)
    assert dataset.options().autotune.enabled is False


@pytest.mark.parametrize('is_training', [True, False])
def test_box_equal_to_an_anchor_makes_it_positive_with_zero_code(tmp_path, is_training):
    spec = ImageSpec(1, 128, 128, boxes=[LEVEL4_ANCHOR_BOX], labels=[3])
    pattern = fixtures.write_shards(tmp_path, [spec])
    reader = dataloader.InputReader(pattern, is_training=is_training)
    _, labels = first_batch(reader, tiny_params(batch_size=1, **NO_AUGMENTATION))
    anchor_boxes = anchors.generate_anchor_boxes(128, 128, 3, 5, 3, [1.0, 2.0, 0.5], 4.0)
    start = 16 * 16 * NUM_ANCHORS  # After level 3's 16x16 locations.
    level4 = anchor_boxes[start:start + 8 * 8 * NUM_ANCHORS].reshape(8, 8, NUM_ANCHORS, 4)
    np.testing.assert_array_equal(level4[3, 3, 0], LEVEL4_ANCHOR_BOX)  # The premise.
    assert labels['cls_targets_4'][0, 3, 3, 0] == 2  # label 3 -> class index 2.
    np.testing.assert_allclose(labels['box_targets_4'][0, 3, 3, 0:4], 0.0, atol=1e-6)
    assert labels['num_positives'][0] >= 1
    np.testing.assert_allclose(labels['groundtruth_data'][0, 0],
                               LEVEL4_ANCHOR_BOX + [0, 64 * 64, 3], rtol=1e-6)
    np.testing.assert_array_equal(labels['groundtruth_data'][0, 1:], -1.0)
    assert labels['image_scales'][0] == 1.0


def test_flip_mirrors_image_and_boxes():
    pixels = fixtures.render_pixels(ImageSpec(1, 64, 80, boxes=[[8, 4, 40, 30]], labels=[1]))
    boxes = tf.constant([[8 / 64, 4 / 80, 40 / 64, 30 / 80]], tf.float32)
    flip_draw = tf.constant([0.0, 0.5, 0.0, 0.0])  # < 0.5 flips; no jitter below.
    image, flipped, window = dataloader.training_window(
        tf.constant(pixels), boxes, flip_draw, (64, 80), hflip=True, jitter_min=1.0,
        jitter_max=1.0)
    np.testing.assert_array_equal(image.numpy(), pixels[:, ::-1])
    np.testing.assert_allclose(flipped.numpy(), [[8 / 64, 50 / 80, 40 / 64, 76 / 80]], rtol=1e-6)
    assert window.scale.numpy() == 1.0
    for size in (window.crop_size, window.resized_size):
        np.testing.assert_array_equal(size.numpy(), [64, 80])
    network_boxes, visible = dataloader.boxes_to_network_pixels(flipped, [64, 80], window)
    np.testing.assert_allclose(network_boxes.numpy(), [[8, 50, 40, 76]], rtol=1e-6)
    assert visible.numpy().all()
    _, kept = dataloader.training_window(tf.constant(pixels), boxes, tf.constant([0.5, 0.5, 0, 0]),
                                         (64, 80), hflip=True, jitter_min=1.0, jitter_max=1.0)[:2]
    np.testing.assert_array_equal(kept.numpy(), boxes.numpy())


def test_random_flip_in_the_pipeline_mirrors_the_positive_anchors(tmp_path):
    # Centred on a level-4 anchor centre (56, 40) so no IoU ties flip with the image.
    spec = ImageSpec(1, 128, 128, boxes=[[24, 16, 88, 64]], labels=[2])
    pattern = fixtures.write_shards(tmp_path, [spec])
    params = tiny_params(batch_size=8, **dict(NO_AUGMENTATION, input_rand_hflip=True))
    reader = dataloader.InputReader(pattern, is_training=True, deterministic=True, seed=1)
    eval_reader = dataloader.InputReader(pattern, is_training=False)
    _, unflipped = first_batch(eval_reader, tiny_params(batch_size=1))
    seen = collections.Counter()
    for _, labels in reader(params).take(3).as_numpy_iterator():
        for index in range(8):
            for level in LEVELS:
                cls = labels['cls_targets_%d' % level][index]
                reference = unflipped['cls_targets_%d' % level][0]
                if np.array_equal(cls, reference):
                    seen['same_%d' % level] += 1
                else:
                    # Anchor grids are symmetric: mirroring the image mirrors the columns.
                    np.testing.assert_array_equal(cls, reference[:, ::-1])
                    seen['mirrored_%d' % level] += 1
    assert seen['same_4'] > 0 and seen['mirrored_4'] > 0, seen


def test_augmented_boxes_stay_on_their_object(tmp_path):
    """Flip + scale jitter + crop: every positive anchor's box decodes onto the painted box."""
    spec = ImageSpec(4, 96, 128, boxes=[[20, 10, 76, 70]], labels=[1])
    pattern = fixtures.write_shards(tmp_path, [spec])
    params = tiny_params(batch_size=8, jitter_min=0.6, jitter_max=2.0)
    reader = dataloader.InputReader(pattern, is_training=True, deterministic=True, seed=2)
    images, labels = first_batch(reader, params)
    anchor_boxes = anchors.generate_anchor_boxes(128, 128, 3, 5, 3, [1.0, 2.0, 0.5], 4.0)
    colour = (fixtures.PALETTE[0] - np.array(params.config.mean_rgb)) / params.config.stddev_rgb
    checked = 0
    for index in range(8):
        positive = flat_targets(labels, index, 'cls_targets', ()) >= 0
        decoded = decode_codes(flat_targets(labels, index, 'box_targets', (4,))[positive],
                               anchor_boxes[positive])
        for ymin, xmin, ymax, xmax in np.round(decoded).astype(int):
            if ymax - ymin > 8 and xmax - xmin > 8:
                inside = images[index, ymin + 3:ymax - 3, xmin + 3:xmax - 3]
                np.testing.assert_allclose(inside.mean(axis=(0, 1)), colour, atol=0.25)
                checked += 1
    assert checked >= 8


def test_eval_maps_back_to_original_pixels(tmp_path):
    box = [40.0, 60.0, 200.0, 260.0]
    crowd = [150.0, 270.0, 250.0, 320.0]
    spec = ImageSpec(77, 256, 320, boxes=[box, crowd], labels=[1, 2], is_crowd=[0, 1])
    pattern = fixtures.write_shards(tmp_path, [spec])
    reader = dataloader.InputReader(pattern, is_training=False)
    images, labels = first_batch(reader, tiny_params(batch_size=1, crowd_anchors='ignore'))
    # Fit 320x256 into 128x128: scale 0.4 -> 128 wide, round(102.4) = 102 high, rest padded.
    np.testing.assert_allclose(labels['image_scales'], [2.5], rtol=1e-6)
    np.testing.assert_array_equal(labels['image_sizes'], [[256, 320]])
    assert labels['source_ids'][0] == 77
    np.testing.assert_array_equal(images[0, 102:], 0.0)
    assert np.abs(images[0, :102]).sum(axis=-1).min() > 0
    rows = labels['groundtruth_data'][0]
    np.testing.assert_allclose(rows[0], box + [0, 160 * 200, 1], rtol=1e-5)
    np.testing.assert_allclose(rows[1], crowd + [1, 100 * 50, 2], rtol=1e-5)
    np.testing.assert_array_equal(rows[2:], -1.0)
    anchor_boxes = anchors.generate_anchor_boxes(128, 128, 3, 5, 3, [1.0, 2.0, 0.5], 4.0)
    cls = flat_targets(labels, 0, 'cls_targets', ())
    codes = flat_targets(labels, 0, 'box_targets', (4,))
    positive = cls >= 0
    assert positive.any() and (cls[positive] == 0).all()  # The crowd box makes none.
    assert (cls == -2).any()  # ... but anchors on it are ignored.
    decoded = decode_codes(codes[positive], anchor_boxes[positive]) * labels['image_scales'][0]
    # Per-axis rounding of the resized size (102 / 256 vs 0.4) moves pixels by < 1.
    np.testing.assert_allclose(decoded, np.tile(box, (positive.sum(), 1)), atol=1.0)


def test_preprocess_for_eval_matches_the_eval_pipeline(tmp_path):
    spec = ImageSpec(5, 100, 140, boxes=[[10, 10, 50, 60]], labels=[1], image_format='png')
    pattern = fixtures.write_shards(tmp_path, [spec])
    images, labels = first_batch(dataloader.InputReader(pattern, is_training=False),
                                 tiny_params(batch_size=1))
    config = hparams_config.get_efficientdet_config('efficientdet-d0')
    config.override('image_size=128')
    image, scale, size = dataloader.preprocess_for_eval(
        tf.constant(fixtures.render_pixels(spec)), config)
    np.testing.assert_array_equal(image.numpy(), images[0])  # PNG is lossless.
    assert scale.numpy() == pytest.approx(140 / 128, rel=1e-6) == labels['image_scales'][0]
    np.testing.assert_array_equal(size.numpy(), [100, 140])


def test_png_records_decode_exactly(tmp_path):
    spec = ImageSpec(9, 128, 128, boxes=[[0, 0, 64, 64]], labels=[2], image_format='png')
    pattern = fixtures.write_shards(tmp_path, [spec])
    params = tiny_params(batch_size=1)
    images, _ = first_batch(dataloader.InputReader(pattern, is_training=False), params)
    expected = (fixtures.render_pixels(spec) - np.array(params.config.mean_rgb)) / np.array(
        params.config.stddev_rgb)
    np.testing.assert_allclose(images[0], expected, rtol=1e-5, atol=1e-5)


def test_crowd_boxes_are_skipped_ignored_or_positive_in_training(tmp_path):
    spec = ImageSpec(3, 128, 128, boxes=[LEVEL4_ANCHOR_BOX], labels=[1], is_crowd=[1])
    pattern = fixtures.write_shards(tmp_path, [spec])
    reader = dataloader.InputReader(pattern, is_training=True, deterministic=True)
    # Skipped: a negative anchor; ignored: -2; automl's default: an ordinary box (class 0).
    for skip, crowd_anchors, expected_state in ((True, 'positive', -1), (False, 'ignore', -2),
                                                (False, 'positive', 0)):
        params = tiny_params(batch_size=1, skip_crowd_during_training=skip,
                             crowd_anchors=crowd_anchors, **NO_AUGMENTATION)
        _, labels = first_batch(reader, params)
        assert labels['cls_targets_4'][0, 3, 3, 0] == expected_state
        assert (labels['num_positives'][0] > 0) == (expected_state == 0)
        assert labels['groundtruth_data'][0, 0, 4] == 1.0  # Kept for evaluation.


def test_boxes_are_clipped_to_the_last_pixel_as_automl_clips_them():
    window = dataloader.fit_window(128, 128, (128, 128))
    boxes = tf.constant([[0.5, 0.0, 1.0, 1.0], [0.25, 0.25, 0.5, 0.5]])
    clipped, _ = dataloader.boxes_to_network_pixels(boxes, [128, 128], window,
                                                    last_pixel_of=(128, 128))
    np.testing.assert_array_equal(clipped.numpy(), [[64, 0, 127, 127], [32, 32, 64, 64]])
    edge, _ = dataloader.boxes_to_network_pixels(boxes, [128, 128], window)
    np.testing.assert_array_equal(edge.numpy()[0], [64, 0, 128, 128])


def test_jitter_window_crops_before_resizing_and_drops_boxes_that_leave_it():
    # 200x100 (h x w) into 128x128 at multiplier 2: scale 1.28 -> 256x128 scaled; the
    # 128-row window is round(128 / 1.28) = 100 original rows, starting at 0.5 * 100 = 50.
    window = dataloader.fit_window(200, 100, (128, 128), 2.0, [0.5, 0.9])
    assert window.scale.numpy() == pytest.approx(1.28)
    np.testing.assert_array_equal(window.crop_offset.numpy(), [50, 0])
    np.testing.assert_array_equal(window.crop_size.numpy(), [100, 100])
    np.testing.assert_array_equal(window.resized_size.numpy(), [128, 128])
    boxes = tf.constant([[0.0, 0.0, 0.2, 0.5], [0.5, 0.25, 1.0, 0.75]])  # Rows 0-40, 100-200.
    network_boxes, visible = dataloader.boxes_to_network_pixels(boxes, [200, 100], window)
    np.testing.assert_array_equal(visible.numpy(), [False, True])
    np.testing.assert_allclose(network_boxes.numpy()[1], [64, 32, 128, 96], rtol=1e-6)
    pixels = np.arange(200 * 100 * 3, dtype=np.float32).reshape(200, 100, 3) % 251
    image = dataloader.crop_resize_pad(tf.constant(pixels), window, (128, 128), [0.0] * 3,
                                       [1.0] * 3)
    expected = tf.image.resize(pixels[50:150], [128, 128])
    np.testing.assert_array_equal(image.numpy(), expected.numpy())


def _shard_ids(pattern, num_shards, is_training=False, **kwargs):
    parts = []
    for index in range(num_shards):
        reader = dataloader.InputReader(pattern, is_training=is_training, num_shards=num_shards,
                                        shard_index=index, **kwargs)
        if is_training:
            dataset = reader(tiny_params(batch_size=2)).take(6)
            parts.append([int(i) for _, labels in dataset.as_numpy_iterator()
                          for i in labels['source_ids']])
        else:
            parts.append(all_source_ids(reader, tiny_params(batch_size=2)))
    return parts


@pytest.fixture(scope='module', params=[4, 1], ids=['by_file', 'by_record'])
def sharded_records(request, tmp_path_factory):
    """11 small images in 4 files (workers split files) or in 1 (workers split records)."""
    specs = fixtures.random_specs(11, height=64, width=64, max_boxes=2, seed=request.param)
    return fixtures.write_shards(tmp_path_factory.mktemp('shards'), specs,
                                 num_files=request.param)


def test_eval_worker_shards_are_disjoint_and_cover_everything_once(sharded_records):
    first, second = _shard_ids(sharded_records, 2)
    assert sorted(first + second) == sorted(fixtures.read_source_ids(sharded_records))
    assert first and second and not set(first) & set(second)
    context = tf.distribute.InputContext(num_input_pipelines=2, input_pipeline_id=1)
    reader = dataloader.InputReader(sharded_records, is_training=False)
    from_context = [int(i) for _, labels in reader(tiny_params(), context).as_numpy_iterator()
                    for i in labels['source_ids']]
    assert from_context == second


def test_training_worker_shards_are_disjoint(sharded_records):
    first, second = _shard_ids(sharded_records, 2, is_training=True)
    assert len(first) == len(second) == 12  # 6 batches of 2, repeating.
    assert not set(first) & set(second)
    assert set(first) | set(second) <= set(fixtures.read_source_ids(sharded_records))


def test_max_examples_limits_the_whole_dataset_across_workers(tmp_path):
    specs = fixtures.random_specs(9, height=64, width=64, max_boxes=2)
    pattern = fixtures.write_shards(tmp_path, specs, num_files=3)
    parts = _shard_ids(pattern, 2, max_examples=5)
    assert sorted(parts[0] + parts[1]) == sorted(fixtures.read_source_ids(pattern)[:5])


def test_deterministic_mode_repeats_batches(random_records):
    params = tiny_params(batch_size=2)  # Default flip and 0.1..2.0 scale jitter.

    def batches(seed):
        reader = dataloader.InputReader(random_records, is_training=True, deterministic=True,
                                        seed=seed)
        return list(reader(params).take(4).as_numpy_iterator())  # Into the 2nd epoch.
    first, second = batches(5), batches(5)
    for (images_a, labels_a), (images_b, labels_b) in zip(first, second):
        np.testing.assert_array_equal(images_a, images_b)
        for key in labels_a:
            np.testing.assert_array_equal(labels_a[key], labels_b[key], err_msg=key)


def test_fake_data_needs_no_files():
    reader = dataloader.InputReader('/nonexistent/*.tfrecord', is_training=True,
                                    use_fake_data=True)
    params = tiny_params(batch_size=3, image_size='128x64')
    batches = list(reader(params).take(2).as_numpy_iterator())
    for images, labels in batches:
        assert images.shape == (3, 64, 128, 3) and images.dtype == np.float32
        assert labels['cls_targets_3'].shape == (3, 8, 16, NUM_ANCHORS)
        assert labels['box_targets_5'].shape == (3, 2, 4, NUM_ANCHORS * 4)
        assert labels['groundtruth_data'].shape == (3, 8, 7)
        assert (labels['num_positives'] > 0).all()
    np.testing.assert_array_equal(batches[0][0], batches[1][0])


def test_no_matching_files_is_a_clear_error(tmp_path):
    pattern = str(tmp_path / 'missing-*.tfrecord')
    with pytest.raises(ValueError, match='create_coco_tfrecord') as error:
        dataloader.InputReader(pattern, is_training=True)(tiny_params())
    assert pattern in str(error.value)


@pytest.mark.parametrize('drop_key', [fmt.IMAGE_ENCODED, fmt.IMAGE_SOURCE_ID])
def test_record_missing_a_required_key_names_it(tmp_path, drop_key):
    path = fixtures.write_records(str(tmp_path / 'bad.tfrecord'),
                                  [ImageSpec(1, 64, 64, [[0, 0, 32, 32]], [1])], [drop_key])
    reader = dataloader.InputReader(path, is_training=False)
    with pytest.raises(tf.errors.InvalidArgumentError) as error:
        first_batch(reader, tiny_params())
    assert drop_key in error.value.message and path in error.value.message


def test_labels_beyond_num_classes_are_an_error(tmp_path):
    pattern = fixtures.write_shards(tmp_path, [ImageSpec(1, 64, 64, [[0, 0, 32, 32]], [5])])
    with pytest.raises(tf.errors.InvalidArgumentError, match='num_classes=3'):
        first_batch(dataloader.InputReader(pattern, is_training=False), tiny_params())


def test_too_many_boxes_fail_eval_and_truncate_in_training(tmp_path):
    boxes = [[i, i, i + 20, i + 20] for i in range(10)]
    pattern = fixtures.write_shards(tmp_path, [ImageSpec(1, 64, 64, boxes, [1] * 10)])
    with pytest.raises(tf.errors.InvalidArgumentError, match='max_instances_per_image=8'):
        first_batch(dataloader.InputReader(pattern, is_training=False), tiny_params())
    _, labels = first_batch(dataloader.InputReader(pattern, is_training=True),
                            tiny_params(**NO_AUGMENTATION))
    assert (labels['groundtruth_data'][:, :, 6] == 1).all()


def test_converter_side_files_are_not_read_as_records(tmp_path):
    # `train-*` is what users type; it also matches the converter's JSON side files.
    for name in ('train-00000-of-00001.tfrecord', 'train-label_map.json', 'train-summary.json'):
        (tmp_path / name).write_text('x')
    assert dataloader.list_record_files(str(tmp_path / 'train-*')) == [
        str(tmp_path / 'train-00000-of-00001.tfrecord')]


@pytest.mark.parametrize('mode', ['RGBA', 'LA', 'L', 'P', 'RGB'])
def test_decode_image_matches_the_converters_colour_handling(mode):
    # What a served PNG decodes to equals what the converter would have stored for it.
    from PIL import Image  # pylint: disable=import-outside-toplevel
    from efficientdet_hpu.data import image_codec  # pylint: disable=import-outside-toplevel
    rng = np.random.default_rng(3)
    pixels = rng.integers(0, 256, [12, 9, 4], dtype=np.uint8)
    image = Image.fromarray(pixels, 'RGBA').convert(mode)
    buffer = io.BytesIO()
    image.save(buffer, format='PNG')
    decoded = record_parser.decode_image(tf.constant(buffer.getvalue())).numpy()
    buffer.seek(0)
    expected = np.asarray(image_codec.to_rgb(Image.open(buffer)))  # as the converter reads it
    assert decoded.shape == (12, 9, 3) and decoded.dtype == np.uint8
    assert np.abs(decoded.astype(int) - expected).max() <= 1
    if mode == 'RGBA':  # the colours under transparent pixels must not show
        assert np.abs(decoded.astype(int) - pixels[..., :3]).max() > 50


def test_whole_axes_are_truncated_as_automl_does():
    # 640 x 427 (w x h) into 512: scale 0.8, 427 * 0.8 = 341.6 -> 341 rows (automl's
    # int32(size * scale)); rounding would give 342. The width, 640 * 0.8 = 512, fills.
    window = dataloader.fit_window(427, 640, (512, 512))
    np.testing.assert_array_equal(window.resized_size.numpy(), [341, 512])
    np.testing.assert_array_equal(window.crop_size.numpy(), [427, 640])
    # 500 x 300: scale min(512 / 500, 512 / 300) = 1.024 -> 512 x 307 (307.2 truncated).
    window = dataloader.fit_window(500, 300, (512, 512))
    np.testing.assert_array_equal(window.resized_size, [512, 307])
