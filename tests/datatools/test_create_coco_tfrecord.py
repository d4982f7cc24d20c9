"""Tests for the COCO -> TFRecord converter, the record schema and the label map.

Real files throughout: synthetic JPEGs plus a grayscale JPEG, a CMYK JPEG and an RGBA PNG,
converted to real shards and read back with tf.data.
"""
import glob
import io
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

from efficientdet_hpu.data import image_codec
from efficientdet_hpu.data import label_map as label_map_lib
from efficientdet_hpu.data import tfrecord_format as fmt
from efficientdet_hpu.data.coco_annotations import ConversionError
from efficientdet_hpu.datatools import create_coco_tfrecord
from efficientdet_hpu.datatools import synthetic_coco
from cli_runs import assert_one_line_error, run_process, tmpfs_disk

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SKIPPED_BOXES = {'malformed': 2, 'degenerate': 1, 'outside': 1, 'crowd': 0}


def _save(image_dir, file_name, image, **save_args):
    image.save(os.path.join(image_dir, file_name), **save_args)


def _extra_images(image_dir):
    """Grayscale JPEG, CMYK JPEG and RGBA PNG (left half transparent) with odd ids."""
    gradient = np.tile(np.linspace(0, 255, 90, dtype=np.uint8), (70, 1))
    _save(image_dir, 'gray.jpg', Image.fromarray(gradient, 'L'), format='JPEG', quality=90)
    _save(image_dir, 'cmyk.jpg', Image.new('CMYK', (64, 48), (0, 200, 200, 20)), format='JPEG')
    rgba = np.zeros((50, 80, 4), np.uint8)
    rgba[..., 0], rgba[:, 40:, 3] = 250, 255  # Red; only the right half is opaque.
    _save(image_dir, 'alpha.png', Image.fromarray(rgba, 'RGBA'), format='PNG')
    images = [{'id': 0, 'file_name': 'gray.jpg', 'width': 90, 'height': 70},
              {'id': -5, 'file_name': 'cmyk.jpg', 'width': 64, 'height': 48},
              {'id': 2**40, 'file_name': 'alpha.png', 'width': 80, 'height': 50}]
    boxed = [(0, [10, 10, 30, 20], {}), (-5, [0, 0, 64, 48], {}),
             (2**40, [50, 5, 20, 30], {'iscrowd': 1}),
             (0, [80, 60, 20, 20], {}),  # Clipped to [80, 60, 10, 10].
             (0, [5, 5, 0, 10], {}), (0, [100, 5, 10, 10], {}),  # Degenerate, outside.
             (-5, [1, 2, 3], {}), (-5, None, {})]  # Malformed twice.
    annotations = []
    for image_id, bbox, extra in boxed:
        annotation = {'id': 5000 + len(annotations), 'image_id': image_id, 'category_id': 42,
                      'iscrowd': 0, **extra}
        if bbox is not None:
            annotation['bbox'] = bbox
        annotations.append(annotation)
    return images, annotations


@pytest.fixture(name='dataset')
def _dataset(tmp_path):
    """A mini dataset: 6 synthetic images + 3 odd-format ones; returns (image_dir, json)."""
    paths = synthetic_coco.generate(str(tmp_path / 'synthetic'), num_train=6, num_val=0, seed=2)
    image_dir = paths['train_image_dir']
    with open(paths['train_annotations']) as handle:
        content = json.load(handle)
    images, annotations = _extra_images(image_dir)
    content['images'] += images
    content['annotations'] += annotations
    json_path = str(tmp_path / 'instances.json')
    _write_json(json_path, content)
    return image_dir, json_path


def _write_json(path, content):
    with open(path, 'w') as handle:
        json.dump(content, handle)


def _load_json(path):
    with open(path) as handle:
        return json.load(handle)


def _read_records(prefix):
    """All Examples of `<prefix>-*-of-*.tfrecord` as dicts of numpy values."""
    shard_pattern = f'{prefix}-[0-9][0-9][0-9][0-9][0-9]-of-[0-9][0-9][0-9][0-9][0-9].tfrecord'
    return _read_records_from(*sorted(glob.glob(shard_pattern)))


def _read_records_from(*files):
    """All Examples of the given TFRecord files as dicts of numpy values."""
    features = {key: tf.io.VarLenFeature(tf.float32) for key in (
        fmt.OBJECT_BBOX_YMIN, fmt.OBJECT_BBOX_XMIN, fmt.OBJECT_BBOX_YMAX, fmt.OBJECT_BBOX_XMAX,
        fmt.OBJECT_AREA)}
    features.update({key: tf.io.VarLenFeature(tf.int64)
                     for key in (fmt.OBJECT_CLASS_LABEL, fmt.OBJECT_IS_CROWD)})
    features[fmt.OBJECT_CLASS_TEXT] = tf.io.VarLenFeature(tf.string)
    for key in (fmt.IMAGE_ENCODED, fmt.IMAGE_FORMAT, fmt.IMAGE_SOURCE_ID, fmt.IMAGE_FILENAME):
        features[key] = tf.io.FixedLenFeature([], tf.string)
    for key in (fmt.IMAGE_HEIGHT, fmt.IMAGE_WIDTH):
        features[key] = tf.io.FixedLenFeature([], tf.int64)
    records = []
    for serialized in tf.data.TFRecordDataset(list(files)):
        parsed = tf.io.parse_single_example(serialized, features)
        records.append({key: (tf.sparse.to_dense(value) if isinstance(value, tf.SparseTensor)
                              else value).numpy() for key, value in parsed.items()})
    return records


def _expected_boxes(content, image_id):
    """[ymin, xmin, ymax, xmax] pixels of the annotations the converter must keep, in order."""
    image = next(image for image in content['images'] if image['id'] == image_id)
    boxes, category_ids = [], []
    for annotation in content['annotations']:
        bbox = annotation.get('bbox')
        if annotation['image_id'] != image_id or not bbox or len(bbox) != 4:
            continue
        x, y, width, height = bbox
        box = [max(y, 0), max(x, 0), min(y + height, image['height']),
               min(x + width, image['width'])]
        if width > 0 and height > 0 and box[2] > box[0] and box[3] > box[1]:
            boxes.append(box)
            category_ids.append(annotation['category_id'])
    return np.array(boxes, np.float64).reshape(-1, 4), category_ids


def _output_files(directory):
    return sorted(name for name in os.listdir(directory))


def test_round_trip_keeps_every_image_and_box(dataset, tmp_path):
    image_dir, json_path = dataset
    prefix = str(tmp_path / 'out' / 'train')
    summary = create_coco_tfrecord.convert(image_dir, json_path, prefix, num_shards=3,
                                           num_threads=2, show_progress=False)
    content = _load_json(json_path)
    records = _read_records(prefix)
    label_map = label_map_lib.load_label_map(prefix + '-label_map.json')
    assert label_map.label_to_category_id == {1: 3, 2: 17, 3: 42, 4: 90}
    assert sorted(int(record[fmt.IMAGE_SOURCE_ID]) for record in records) == sorted(
        image['id'] for image in content['images'])
    for record in records:
        image_id = int(record[fmt.IMAGE_SOURCE_ID])
        height, width = record[fmt.IMAGE_HEIGHT], record[fmt.IMAGE_WIDTH]
        assert tf.io.decode_jpeg(record[fmt.IMAGE_ENCODED]).shape == (height, width, 3)
        assert record[fmt.IMAGE_FORMAT] == b'jpeg'
        expected_boxes, expected_ids = _expected_boxes(content, image_id)
        boxes = np.stack([record[fmt.OBJECT_BBOX_YMIN], record[fmt.OBJECT_BBOX_XMIN],
                          record[fmt.OBJECT_BBOX_YMAX], record[fmt.OBJECT_BBOX_XMAX]], axis=-1)
        np.testing.assert_allclose(boxes * [height, width, height, width], expected_boxes,
                                   rtol=1e-5, atol=1e-5)
        assert [label_map.label_to_category_id[label]
                for label in record[fmt.OBJECT_CLASS_LABEL]] == expected_ids
        assert [name.decode() for name in record[fmt.OBJECT_CLASS_TEXT]] == [
            label_map.label_to_name[label] for label in record[fmt.OBJECT_CLASS_LABEL]]
    assert summary['images_written'] == len(content['images'])
    assert summary['skipped_boxes'] == SKIPPED_BOXES
    assert summary['clipped_boxes'] == 1 and summary['crowd_boxes'] == 1
    assert summary['negative_images'] == sum(not record[fmt.OBJECT_CLASS_LABEL].size
                                             for record in records)
    assert _load_json(prefix + '-summary.json')['boxes_written'] == summary['boxes_written']
    assert _output_files(tmp_path / 'out') == [
        'train-00000-of-00003.tfrecord', 'train-00001-of-00003.tfrecord',
        'train-00002-of-00003.tfrecord', 'train-label_map.json', 'train-summary.json']


def test_formats_are_converted_and_baseline_jpegs_kept_verbatim(dataset, tmp_path):
    image_dir, json_path = dataset
    prefix = str(tmp_path / 'out')
    create_coco_tfrecord.convert(image_dir, json_path, prefix, num_shards=1,
                                 show_progress=False)
    by_name = {record[fmt.IMAGE_FILENAME].decode(): record for record in _read_records(prefix)}
    with open(os.path.join(image_dir, '001000.jpg'), 'rb') as handle:
        assert by_name['001000.jpg'][fmt.IMAGE_ENCODED] == handle.read()
    for name in ('gray.jpg', 'cmyk.jpg', 'alpha.png'):
        with Image.open(io.BytesIO(by_name[name][fmt.IMAGE_ENCODED])) as image:
            assert (image.format, image.mode) == ('JPEG', 'RGB'), name
    gray = tf.io.decode_jpeg(by_name['gray.jpg'][fmt.IMAGE_ENCODED]).numpy().astype(int)
    assert np.abs(gray[..., 0] - gray[..., 2]).max() <= 3
    alpha = tf.io.decode_jpeg(by_name['alpha.png'][fmt.IMAGE_ENCODED]).numpy().astype(int)
    assert alpha[25, 10].max() <= 10  # Transparent: composited on black.
    assert alpha[25, 70, 0] >= 235 and alpha[25, 70, 1:].max() <= 15
    assert by_name['alpha.png'][fmt.IMAGE_SOURCE_ID] == str(2**40).encode()
    assert by_name['cmyk.jpg'][fmt.IMAGE_SOURCE_ID] == b'-5'


def test_more_shards_than_images_and_crowd_and_empty_flags(tmp_path):
    paths = synthetic_coco.generate(str(tmp_path / 'synthetic'), num_train=5, num_val=0, seed=1)
    content = _load_json(paths['train_annotations'])
    boxes_per_image = {image['id']: 0 for image in content['images']}
    for annotation in content['annotations']:
        boxes_per_image[annotation['image_id']] += 1
    assert list(boxes_per_image.values()).count(0) == 1  # One negative image.
    # Mark as crowd one box of an image that keeps other boxes, so only the negative is empty.
    crowd = next(a for a in content['annotations'] if boxes_per_image[a['image_id']] > 1)
    crowd['iscrowd'] = 1
    json_path = str(tmp_path / 'crowd.json')
    _write_json(json_path, content)
    prefix = str(tmp_path / 'out' / 'val')
    summary = create_coco_tfrecord.convert(paths['train_image_dir'], json_path, prefix,
                                           num_shards=32, include_crowd=False, skip_empty=True,
                                           show_progress=False)
    assert summary['images_written'] == 4 and summary['skipped_empty_images'] == 1
    shards = sorted(glob.glob(prefix + '-*.tfrecord'))
    assert len(shards) == 4 and shards[0].endswith('-00000-of-00004.tfrecord')
    assert [len(_read_records_from(shard)) for shard in shards] == [1, 1, 1, 1]
    assert summary['skipped_boxes']['crowd'] == 1 and summary['crowd_boxes'] == 0
    assert summary['boxes_written'] == len(content['annotations']) - 1
    assert summary['negative_images'] == 0


def _break(case, image_dir, json_path):
    """Damages the dataset; returns substrings the error message must contain."""
    content = _load_json(json_path)
    if case == 'malformed_json':
        with open(json_path, 'w') as handle:
            handle.write('{"images": [\n  {"id": 1,}\n]}')
        return ['instances.json:2:12: not valid JSON']
    if case == 'missing_key':
        del content['categories']
    elif case == 'unknown_image_id':
        content['annotations'][1]['image_id'] = 424242
    elif case == 'unknown_category_id':
        content['annotations'][1]['category_id'] = 7
    elif case == 'duplicate_image_id':
        content['images'][1]['id'] = content['images'][0]['id']
    elif case == 'missing_file':
        os.remove(os.path.join(image_dir, 'cmyk.jpg'))
        return ['cmyk.jpg', 'instances.json', f'--image_dir={image_dir}']
    elif case == 'truncated_image':
        path = os.path.join(image_dir, '001000.jpg')
        with open(path, 'rb') as handle:
            data = handle.read()
        with open(path, 'wb') as handle:
            handle.write(data[:len(data) // 2])
        return ['001000.jpg', 'truncated']
    elif case == 'size_mismatch':
        content['images'][0]['width'] += 1
        size = f'{content["images"][0]["width"]}x{content["images"][0]["height"]}'
        _write_json(json_path, content)
        return ['001000.jpg', size, 'correct the width and height of the image in']
    elif case == 'exif_rotated':  # Sizes of the upright view, pixels stored unrotated.
        path = os.path.join(image_dir, '001000.jpg')
        with Image.open(path) as image:
            exif = image.getexif()
            exif[0x0112] = 6
            image.save(path, exif=exif)
        first = content['images'][0]
        first['width'], first['height'] = first['height'], first['width']
        _write_json(json_path, content)
        return ['001000.jpg', 'EXIF orientation 6', 'Save the photo upright']
    _write_json(json_path, content)
    return {'missing_key': ['instances.json', 'categories'],
            'unknown_image_id': ['instances.json', 'annotations[1]', 'image_id 424242'],
            'unknown_category_id': ['instances.json', 'annotations[1]', 'category_id 7'],
            'duplicate_image_id': ['instances.json', 'images[1]', 'repeats image id']}[case]


ERROR_CASES = ['malformed_json', 'missing_key', 'unknown_image_id', 'unknown_category_id',
               'duplicate_image_id', 'missing_file', 'truncated_image', 'size_mismatch',
               'exif_rotated']


@pytest.mark.parametrize('case', ERROR_CASES)
def test_bad_input_fails_cleanly_without_leaving_outputs(case, dataset, tmp_path):
    image_dir, json_path = dataset
    expected = _break(case, image_dir, json_path)
    prefix = str(tmp_path / 'out' / 'train')
    with pytest.raises(ConversionError) as raised:
        create_coco_tfrecord.convert(image_dir, json_path, prefix, num_shards=4,
                                     show_progress=False)
    for substring in expected:
        assert substring in str(raised.value), (substring, str(raised.value))
    leftovers = os.listdir(tmp_path / 'out') if os.path.isdir(tmp_path / 'out') else []
    assert leftovers == []


def test_failed_run_leaves_earlier_output_untouched(dataset, tmp_path):
    image_dir, json_path = dataset
    prefix = str(tmp_path / 'out' / 'train')
    create_coco_tfrecord.convert(image_dir, json_path, prefix, num_shards=2,
                                 show_progress=False)
    before = {name: (tmp_path / 'out' / name).read_bytes()
              for name in _output_files(tmp_path / 'out')}
    _break('truncated_image', image_dir, json_path)
    with pytest.raises(ConversionError):
        create_coco_tfrecord.convert(image_dir, json_path, prefix, num_shards=3, num_threads=2,
                                     show_progress=False)
    after = {name: (tmp_path / 'out' / name).read_bytes()
             for name in _output_files(tmp_path / 'out')}
    assert after == before


def test_rerun_with_other_shard_count_replaces_stale_shards(dataset, tmp_path):
    image_dir, json_path = dataset
    prefix = str(tmp_path / 'out' / 'train')
    (tmp_path / 'out').mkdir()
    (tmp_path / 'out' / 'train-extra-00000-of-00001.tfrecord').write_bytes(b'other dataset')
    for num_shards in (4, 2):
        create_coco_tfrecord.convert(image_dir, json_path, prefix, num_shards=num_shards,
                                     show_progress=False)
    assert _output_files(tmp_path / 'out') == [
        'train-00000-of-00002.tfrecord', 'train-00001-of-00002.tfrecord',
        'train-extra-00000-of-00001.tfrecord', 'train-label_map.json', 'train-summary.json']
    assert len(_read_records(prefix)) == len(_load_json(json_path)['images'])


def _run_cli(args, as_script=False):
    entry = ([os.path.join(REPO_ROOT, 'dataset', 'create_coco_tfrecord.py')] if as_script
             else ['-m', 'dataset.create_coco_tfrecord'])
    return run_process([sys.executable, *entry, *args], timeout=120, cwd=REPO_ROOT,
                       stderr=subprocess.PIPE)


def _cli_args(image_dir, json_path, prefix):
    return [f'--image_dir={image_dir}', f'--object_annotations_file={json_path}',
            f'--output_file_prefix={prefix}', '--num_shards=2', '--num_threads=1']


@pytest.mark.slow  # The converter in a process of its own.
@pytest.mark.parametrize('case', ['malformed_json', 'truncated_image'])
def test_cli_reports_user_errors_in_one_line_with_exit_2(case, dataset, tmp_path):
    image_dir, json_path = dataset
    expected = _break(case, image_dir, json_path)
    result = _run_cli(_cli_args(image_dir, json_path, str(tmp_path / 'out' / 'train')))
    assert_one_line_error(result, *expected)
    assert not glob.glob(str(tmp_path / 'out' / '*'))


@pytest.mark.slow  # The converter in a process of its own.
def test_cli_as_script_prints_summary(dataset, tmp_path):
    image_dir, json_path = dataset
    prefix = str(tmp_path / 'out' / 'train')
    result = _run_cli(_cli_args(image_dir, json_path, prefix), as_script=True)
    assert result.returncode == 0, result.stderr
    assert 'images written : 9' in result.stdout
    assert 'malformed 2, degenerate 1, outside 1' in result.stdout
    assert 'triangle' in result.stdout and 'images 9/9' in result.stderr


def test_label_map_path_for_patterns_and_prefixes(tmp_path):
    prefix = str(tmp_path / 'my-train')
    label_map_lib.write_label_map(prefix + '-label_map.json',
                                  [{'id': 1000, 'name': 'b'}, {'id': 0, 'name': 'a'}])
    (tmp_path / 'my-train-00000-of-00002.tfrecord').write_bytes(b'')
    expected = prefix + '-label_map.json'
    for pattern in (prefix, prefix + '-*-of-00002.tfrecord', prefix + '-00000-of-00002.tfrecord',
                    prefix + '-?????-of-?????.tfrecord', prefix + '*', str(tmp_path / '*.tfrecord'),
                    f'{prefix}-*,/elsewhere/x-*'):
        assert label_map_lib.label_map_path_for(pattern) == expected, pattern
    assert label_map_lib.label_map_path_for(str(tmp_path / 'val-*-of-00002.tfrecord')) is None
    label_map = label_map_lib.load_label_map(expected)
    assert label_map.label_to_category_id == {1: 0, 2: 1000}
    assert label_map.category_id_to_label == {0: 1, 1000: 2}
    assert label_map.label_to_name == {1: 'a', 2: 'b'} and label_map.num_classes == 2


@pytest.mark.parametrize('text, message', [
    ('{"num_classes": 2, "classes": [', 'not valid JSON'),
    ('{"num_classes": 2, "classes": [{"label": 1, "category_id": 5, "name": "a"}]}',
     '"num_classes" is 2'),
    ('{"num_classes": 1, "classes": [{"label": 2, "category_id": 5, "name": "a"}]}',
     'labels must be exactly 1..1'),
    ('{"classes": [{"label": 1, "name": "a"}]}', 'integer "category_id"'),
])
def test_malformed_label_map_errors_name_the_file(tmp_path, text, message):
    path = tmp_path / 'bad-label_map.json'
    path.write_text(text)
    with pytest.raises(label_map_lib.LabelMapError) as raised:
        label_map_lib.load_label_map(str(path))
    assert str(path) in str(raised.value) and message in str(raised.value)


def test_build_example_checks_shapes():
    example = fmt.build_example(b'jpeg', 10, 20, 7, 'a.jpg', [], [], [], [], [])
    assert example.features.feature[fmt.OBJECT_BBOX_YMIN].float_list.value == []
    assert example.features.feature[fmt.IMAGE_SOURCE_ID].bytes_list.value == [b'7']
    with pytest.raises(ValueError, match='labels has 2 entries for 1 boxes'):
        fmt.build_example(b'jpeg', 10, 20, 7, 'a.jpg', [[0, 0, 1, 1]], [1, 2], ['a'], [0], [1.0])


def _encode_and_decode(path, width, height):
    jpeg = image_codec.encode_jpeg(str(path), width, height, 'instances.json')
    with Image.open(io.BytesIO(jpeg)) as image:
        assert (image.format, image.mode) == ('JPEG', 'RGB')
        assert not image.info.get('progressive')
        return jpeg, np.asarray(image).astype(int)


def test_sixteen_bit_palette_and_progressive_images_become_baseline_rgb(tmp_path):
    sixteen_bit = np.full((20, 30), 65535, np.uint16)
    sixteen_bit[:, :15] = 128 * 257
    Image.fromarray(sixteen_bit).save(tmp_path / 'deep.png')
    _, pixels = _encode_and_decode(tmp_path / 'deep.png', 30, 20)
    assert abs(pixels[10, 5, 0] - 128) <= 2 and pixels[10, 25].min() >= 250  # Scaled, not clipped.
    palette = Image.new('P', (30, 20), 1)
    palette.putpalette([0, 0, 255] + [0, 255, 0] + [0, 0, 0] * 254)
    palette.paste(0, (0, 0, 15, 20))
    palette.save(tmp_path / 'palette.png', transparency=0)
    _, pixels = _encode_and_decode(tmp_path / 'palette.png', 30, 20)
    assert pixels[10, 3].max() <= 10 and pixels[10, 25, 1] >= 240  # Transparent -> black.
    Image.new('RGB', (30, 20), (200, 30, 30)).save(tmp_path / 'progressive.jpg', format='JPEG',
                                                   progressive=True)
    jpeg, _ = _encode_and_decode(tmp_path / 'progressive.jpg', 30, 20)
    assert jpeg != (tmp_path / 'progressive.jpg').read_bytes()


@pytest.mark.slow  # The converter in a process of its own.
def test_cli_on_a_full_disk_says_so_and_leaves_no_shard(dataset, tmp_path):
    image_dir, json_path = dataset
    with tmpfs_disk(tmp_path / 'disk', '48k') as disk:
        result = _run_cli(_cli_args(image_dir, json_path, str(disk / 'train')))
        leftovers = os.listdir(disk)
    assert_one_line_error(result, '--output_file_prefix', starts_with=(
        'create_coco_tfrecord: error: no space left on the device writing %s' % disk))
    assert leftovers == []  # No shard, finished or not, is left behind.


def test_category_id_layout_is_automls_coco_layout(dataset, tmp_path):
    # label = category id and 90 classes (automl's COCO head); the ids are 3, 17, 42, 90.
    image_dir, json_path = dataset
    prefix = str(tmp_path / 'out' / 'train')
    summary = create_coco_tfrecord.convert(image_dir, json_path, prefix, num_shards=1,
                                           show_progress=False, label_layout='category_id')
    label_map = label_map_lib.load_label_map(prefix + '-label_map.json')
    assert (label_map.layout, label_map.num_classes) == ('category_id', 90)
    assert label_map.label_to_category_id == {3: 3, 17: 17, 42: 42, 90: 90}
    assert label_map.to_json_dict()['layout'] == 'category_id'
    content = _load_json(json_path)
    for record in _read_records(prefix):
        _, expected_ids = _expected_boxes(content, int(record[fmt.IMAGE_SOURCE_ID]))
        assert record[fmt.OBJECT_CLASS_LABEL].tolist() == expected_ids
    assert (summary['label_layout'], summary['num_classes']) == ('category_id', 90)
    assert [row['label'] for row in summary['per_class']] == [3, 17, 42, 90]
    assert '(label = category id, 90 classes)' in create_coco_tfrecord.format_summary(summary, 1)


def test_category_id_layout_refuses_ids_above_90(dataset, tmp_path):
    image_dir, json_path = dataset
    content = _load_json(json_path)
    for annotation in content['annotations']:
        annotation['category_id'] = 1000 if annotation['category_id'] == 90 else (
            annotation['category_id'])
    next(c for c in content['categories'] if c['id'] == 90)['id'] = 1000
    _write_json(json_path, content)
    prefix = str(tmp_path / 'out' / 'train')
    with pytest.raises(ConversionError, match=r'ids \[1000\] are outside it'):
        create_coco_tfrecord.convert(image_dir, json_path, prefix, num_shards=1,
                                     show_progress=False, label_layout='category_id')
    assert not os.path.exists(tmp_path / 'out' / 'train-label_map.json')


@pytest.mark.parametrize('text, message', [
    ('{"num_classes": 90, "layout": "category_id", "classes": '
     '[{"label": 2, "category_id": 5, "name": "a"}]}', 'every label is its category id'),
    ('{"num_classes": 4, "layout": "category_id", "classes": '
     '[{"label": 5, "category_id": 5, "name": "a"}]}', 'below its largest label 5'),
    ('{"num_classes": 1, "layout": "by_name", "classes": '
     '[{"label": 1, "category_id": 5, "name": "a"}]}', '"layout" is \'by_name\''),
])
def test_malformed_category_id_label_maps(tmp_path, text, message):
    path = tmp_path / 'bad-label_map.json'
    path.write_text(text)
    with pytest.raises(label_map_lib.LabelMapError, match=message):
        label_map_lib.load_label_map(str(path))
