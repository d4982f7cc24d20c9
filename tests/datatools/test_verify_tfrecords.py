"""dataset/verify_tfrecords.py and data/data_errors.py on real shards with real faults.

The converter's shards of the session's tiny dataset (conftest.tiny_dataset) are copied and
broken the way disks and copies break them: cut mid-record, one byte flipped. A shard written
with tfrecord_fixtures carries the content faults: an image that does not decode, a box
outside [0, 1], a label outside the label map. Expected record offsets are worked out from
TF's own reader (16 framing bytes + the record), not from the code under test.
"""
import io
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

import tfrecord_fixtures as fixtures
from efficientdet_hpu.data import data_errors
from efficientdet_hpu.data import record_check
from efficientdet_hpu.data import record_parser
from efficientdet_hpu.data import shard_check
from efficientdet_hpu.data import tfrecord_format as fmt
from efficientdet_hpu.data import tfrecord_framing as framing
from efficientdet_hpu.datatools import verify_tfrecords
from cli_runs import assert_one_line_error, run_process

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LABELS_1_TO_3 = record_check.LabelSpace(3, 'test')


def run_cli(*args):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL='2')
    return run_process([sys.executable, '-m', 'dataset.verify_tfrecords', *args], timeout=300,
                       cwd=REPO, env=env, stderr=subprocess.PIPE)


def tf_record_offsets(path):
    """[(start offset, record bytes)] as TF's reader sees the file."""
    offsets, position = [], 0
    for record in tf.data.TFRecordDataset(path).as_numpy_iterator():
        offsets.append((position, record))
        position += framing.HEADER_BYTES + len(record) + framing.FOOTER_BYTES
    return offsets


def content_fault_examples():
    """Five records: 0, 1 good; 2 a cut JPEG; 3 a box with ymax 1.7; 4 label 7."""
    specs = fixtures.random_specs(5, height=64, width=96, num_classes=3, seed=3, first_id=500)
    examples = [fixtures.make_example(spec) for spec in specs]
    feature = [example.features.feature for example in examples]
    jpeg = feature[2][fmt.IMAGE_ENCODED].bytes_list.value[0]
    feature[2][fmt.IMAGE_ENCODED].bytes_list.value[:] = [jpeg[:len(jpeg) // 2]]
    feature[3][fmt.OBJECT_BBOX_YMAX].float_list.value[0] = 1.7
    feature[4][fmt.OBJECT_CLASS_LABEL].int64_list.value[0] = 7
    return examples


@pytest.fixture(scope='module')
def faulty_set(tiny_dataset, tmp_path_factory):
    """faulty-0000{0..3}-of-00004.tfrecord: 0 a clean copy, 1 cut mid-record, 2 a flipped
    byte, 3 content faults; with the converter's label map (4 classes). Returns expectations."""
    directory = tmp_path_factory.mktemp('faulty')
    train = sorted(tf.io.gfile.glob(tiny_dataset['train_pattern']))
    names = [str(directory / ('faulty-%05d-of-00004.tfrecord' % index)) for index in range(4)]
    shutil.copy(tiny_dataset['train_label_map'], directory / 'faulty-label_map.json')
    shutil.copy(train[0], names[0])
    records = tf_record_offsets(train[1])
    cut_start, cut_record = records[3]
    with open(train[1], 'rb') as source, open(names[1], 'wb') as target:
        target.write(source.read()[:cut_start + framing.HEADER_BYTES + len(cut_record) // 2])
    flip_start, flip_record = records[5]
    data = bytearray(open(train[1], 'rb').read())
    data[flip_start + framing.HEADER_BYTES + len(flip_record) // 3] ^= 0x40
    with open(names[2], 'wb') as target:
        target.write(bytes(data))
    with tf.io.TFRecordWriter(names[3]) as writer:
        for example in content_fault_examples():
            writer.write(example.SerializeToString())
    content = tf_record_offsets(names[3])
    return {'pattern': str(directory / 'faulty-*.tfrecord'), 'names': names,
            'num_records': [len(tf_record_offsets(train[0])), len(records)],
            'cut': (3, cut_start), 'cut_length': len(cut_record), 'flip': (5, flip_start),
            'content_offsets': [offset for offset, _ in content]}


@pytest.fixture(scope='module')
def faulty_run(faulty_set):
    """One CLI run over the faulty set (24 records: checked in the CLI's own process)."""
    return run_cli(faulty_set['pattern'], '--num_workers=2')


def line_of(output, *parts):
    lines = [line for line in output.splitlines() if all(part in line for part in parts)]
    assert lines, 'no line with %s in:\n%s' % (parts, output)
    return lines[0]


# ----------------------------------------------------------------------------- framing

def test_crc32c_check_value():
    assert framing.crc32c(b'') == 0
    assert framing.crc32c(b'123456789') == 0xe3069283  # The CRC-32C catalogue's check value.


def test_framing_scan_agrees_with_tf_reader(tiny_dataset):
    path = sorted(tf.io.gfile.glob(tiny_dataset['train_pattern']))[0]
    expected = tf_record_offsets(path)
    layout = framing.scan_framing(path)
    assert layout.fault is None
    assert layout.offsets == [offset for offset, _ in expected]
    assert layout.lengths == [len(record) for _, record in expected]
    assert layout.size == os.path.getsize(path)


def test_chunks_cover_every_record_once_in_order():
    layouts = [framing.ShardLayout('a', 0, list(range(0, 100, 10)), [1] * 10),
               framing.ShardLayout('b', 0, [0, 7, 9], [1] * 3)]
    chunks = shard_check.make_chunks(layouts, LABELS_1_TO_3, 0.01, num_workers=2)
    assert len(chunks) > 2  # Shards are split: both workers get a share of a big shard.
    for layout in layouts:
        own = [chunk for chunk in chunks if chunk.path == layout.path]
        assert [offset for chunk in own for offset in chunk.offsets] == layout.offsets
        assert [chunk.first_index for chunk in own] == [
            layout.offsets.index(chunk.offsets[0]) for chunk in own]


def test_two_workers_find_what_one_finds(faulty_set):
    """Shards split into chunks over a pool of spawned workers, results merged."""
    def verify(num_workers):
        return shard_check.verify_shards(
            framing.list_shards(faulty_set['pattern']), record_check.LabelSpace(4, 'test'),
            0.01, num_workers, on_start=lambda layouts, workers: used.append(workers),
            min_records_per_worker=1)
    used = []
    alone, pooled = verify(1), verify(2)
    assert used == [1, 2]
    assert pooled == alone
    assert [len(report.bad) for report in alone] == [0, 1, 1, 3]


# ----------------------------------------------------------------------------- CLI

@pytest.mark.slow  # dataset.verify_tfrecords in a process of its own (TensorFlow).
def test_clean_set_passes(tiny_dataset):
    result = run_cli(tiny_dataset['train_pattern'], '--num_workers=1')
    assert result.returncode == 0, result.stdout + result.stderr
    shards = sorted(tf.io.gfile.glob(tiny_dataset['train_pattern']))
    for path in shards:
        count = len(tf_record_offsets(path))
        row = line_of(result.stdout, os.path.basename(path)).split()
        assert row[1:5] == [str(count), str(count), '0', '-']
    verdict = result.stdout.strip().splitlines()[-1]
    assert verdict.startswith('OK: 2 shards, 16 records')
    assert 'labels within 1..4 (label map %s)' % tiny_dataset['train_label_map'] in verdict


def test_faulty_set_exits_1_with_a_verdict(faulty_run):
    assert faulty_run.returncode == 1, faulty_run.stdout + faulty_run.stderr
    assert 'Traceback' not in faulty_run.stderr
    verdict = faulty_run.stdout.strip().splitlines()[-1]
    assert verdict.startswith('FAILED: 5 bad records in 3 of 4 shards.')
    assert 're-copy faulty-00001-of-00004.tfrecord, faulty-00002-of-00004.tfrecord' in verdict
    assert 're-convert faulty-00003-of-00004.tfrecord' in verdict
    clean = line_of(faulty_run.stdout, 'faulty-00000').split()
    assert clean[1:5] == ['8', '8', '0', '-']


def test_truncated_shard_names_record_and_offset(faulty_set, faulty_run):
    index, offset = faulty_set['cut']
    row = line_of(faulty_run.stdout, 'faulty-00001-of-00004.tfrecord ').split()
    assert row[1:4] == [str(index), str(index), '1']  # The records before the cut are good.
    line = line_of(faulty_run.stdout, 'faulty-00001', 'record %d  byte %d:' % (index, offset))
    assert 'truncated: the record declares %d data bytes' % faulty_set['cut_length'] in line
    line_of(faulty_run.stdout, 'faulty-00001', 'cannot be read', 'from byte %d' % offset)


def test_flipped_byte_fails_the_data_crc(faulty_set, faulty_run):
    index, offset = faulty_set['flip']
    total = faulty_set['num_records'][1]
    row = line_of(faulty_run.stdout, 'faulty-00002-of-00004.tfrecord ').split()
    assert row[1:4] == [str(total), str(total - 1), '1']  # Reading went on after it.
    line = line_of(faulty_run.stdout, 'faulty-00002', 'record %d  byte %d:' % (index, offset))
    assert 'data CRC mismatch' in line


def test_content_faults_name_record_source_id_and_problem(faulty_set, faulty_run):
    offsets = faulty_set['content_offsets']
    row = line_of(faulty_run.stdout, 'faulty-00003-of-00004.tfrecord ').split()
    assert row[1:4] == ['5', '4', '3']
    image = line_of(faulty_run.stdout, 'record 2  byte %d  source_id 502, 000000000502.jpg: '
                    'image does not decode' % offsets[2])
    assert image.split()[0] == 'faulty-00003-of-00004.tfrecord'
    box = line_of(faulty_run.stdout, 'record 3  byte %d  source_id 503' % offsets[3])
    assert 'box 0 [ymin, xmin, ymax, xmax] = [' in box and ', 1.7, ' in box
    assert 'is outside [0, 1]' in box
    label = line_of(faulty_run.stdout, 'record 4  byte %d  source_id 504' % offsets[4])
    assert 'label 7 outside 1..4' in label


@pytest.mark.slow  # dataset.verify_tfrecords in a process of its own (TensorFlow).
def test_pattern_matching_nothing_exits_2_in_one_line(tmp_path):
    pattern = str(tmp_path / 'nothing-*.tfrecord')
    result = run_cli(pattern)
    assert result.stdout == ''
    assert_one_line_error(result, pattern, 'quote the pattern')


def test_two_class_sources_are_a_usage_error(faulty_set):
    with pytest.raises(verify_tfrecords.UsageError, match=r'got --label_map, --num_classes'):
        verify_tfrecords.resolve_labels(faulty_set['pattern'], label_map_path='x.json',
                                        num_classes=3)
    labels = verify_tfrecords.resolve_labels(faulty_set['pattern'], num_classes=3)
    assert labels.num_classes == 3


# ----------------------------------------------------------------------------- data_errors

def first_reader_error(path, graph_mode):
    """The DataLossError of reading `path` with tf.data, eagerly or in a graph session as the
    Estimator runs it (a multi-line message with the node and where it was defined)."""
    with pytest.raises(tf.errors.DataLossError) as caught:
        if graph_mode:
            with tf.Graph().as_default():
                dataset = tf.data.TFRecordDataset(path).map(tf.strings.length)
                next_element = tf.compat.v1.data.make_one_shot_iterator(dataset).get_next()
                with tf.compat.v1.Session() as session:
                    while True:
                        session.run(next_element)
        else:
            for _ in tf.data.TFRecordDataset(path):
                pass
    return caught.value


@pytest.mark.parametrize('graph_mode', [False, True])
@pytest.mark.parametrize('shard, fault, words', [(1, 'cut', 'truncated'),
                                                 (2, 'flip', 'data CRC mismatch')])
def test_describe_data_error_names_the_shard(faulty_set, shard, fault, words, graph_mode):
    error = first_reader_error(faulty_set['names'][shard], graph_mode)
    message = data_errors.describe_data_error(error, faulty_set['pattern'])
    index, offset = faulty_set[fault]
    assert '\n' not in message
    assert '%s: record %d at byte %d: %s' % (faulty_set['names'][shard], index, offset,
                                             words) in message
    assert 'Re-copy or re-convert %s;' % faulty_set['names'][shard] in message
    assert "python -m dataset.verify_tfrecords '%s'" % faulty_set['pattern'] in message
    for other in (0, 3, 3 - shard):  # Only the broken shard is named.
        assert faulty_set['names'][other] + ':' not in message


def test_describe_data_error_without_an_offset_points_to_the_checker(faulty_set):
    with pytest.raises(tf.errors.InvalidArgumentError) as caught:
        record_parser.decode_image(tf.constant(b'not an image'))
    message = data_errors.describe_data_error(caught.value, faulty_set['pattern'])
    assert '\n' not in message and 'Unknown image file format' in message
    assert "python -m dataset.verify_tfrecords '%s'" % faulty_set['pattern'] in message


# ----------------------------------------------------------------------------- parity

def pipeline_rejects(serialized, num_classes=3):
    try:
        record = record_parser.parse_record(tf.constant(serialized), 'test', num_classes)
        record_parser.decode_image(record['encoded'])
    except tf.errors.InvalidArgumentError:
        return True
    return False


def malformed_records():
    """{name: serialized Example}: a good one and ways the input pipeline's parse fails."""
    def variant(edit):
        example = fixtures.make_example(fixtures.ImageSpec(9, 32, 48, [[4, 4, 20, 30]], [2]))
        edit(example.features.feature)
        return example.SerializeToString()

    def set_bytes(key, values):
        return lambda feature: feature[key].bytes_list.value.__setitem__(slice(None), values)

    def drop(key):
        return lambda feature: feature.__delitem__(key)
    return {
        'good': variant(lambda feature: None),
        'no image': variant(drop(fmt.IMAGE_ENCODED)),
        'empty image': variant(set_bytes(fmt.IMAGE_ENCODED, [b''])),
        'two images': variant(set_bytes(fmt.IMAGE_ENCODED, [b'a', b'b'])),
        'text source id': variant(set_bytes(fmt.IMAGE_SOURCE_ID, [b'abc'])),
        'label 0': variant(lambda feature: feature[fmt.OBJECT_CLASS_LABEL].int64_list.value
                           .__setitem__(0, 0)),
        'label 4 of 3': variant(lambda feature: feature[fmt.OBJECT_CLASS_LABEL].int64_list
                                .value.__setitem__(0, 4)),
        'short box list': variant(lambda feature: feature[fmt.OBJECT_BBOX_XMAX].float_list
                                  .value.pop()),
        'int boxes': variant(lambda feature: feature[fmt.OBJECT_BBOX_YMIN].CopyFrom(
            tf.train.Feature(int64_list=tf.train.Int64List(value=[1])))),
        'png': variant(set_bytes(fmt.IMAGE_ENCODED, [fixtures.encode_pixels(
            np.zeros((32, 48, 3), np.uint8), 'png')])),
        'garbage image': variant(set_bytes(fmt.IMAGE_ENCODED, [b'\x00' * 64])),
    }


@pytest.mark.parametrize('name', sorted(malformed_records()))
def test_record_check_rejects_what_the_pipeline_rejects(name):
    serialized = malformed_records()[name]
    verdict = record_check.check_record(serialized, LABELS_1_TO_3, box_tolerance=0.01)
    assert bool(verdict.errors) == pipeline_rejects(serialized), verdict.errors
    assert (name in ('good', 'png')) == (not verdict.errors)


def image_variants():
    pixels = fixtures.render_pixels(fixtures.ImageSpec(1, 40, 56, [[5, 5, 30, 40]], [1]))
    jpeg = fixtures.encode_pixels(pixels, 'jpeg')
    png = fixtures.encode_pixels(pixels, 'png')
    gif, bmp = io.BytesIO(), io.BytesIO()
    Image.fromarray(pixels).save(gif, format='GIF')
    Image.fromarray(pixels).save(bmp, format='BMP')
    return {'jpeg': jpeg, 'png': png, 'gif': gif.getvalue(), 'bmp': bmp.getvalue(),
            'cut jpeg': jpeg[:len(jpeg) // 2], 'cut png': png[:len(png) // 2],
            'jpeg header only': jpeg[:20], 'text': b'hello'}


@pytest.mark.parametrize('name', sorted(image_variants()))
def test_image_decode_agrees_with_the_pipeline(name):
    encoded = image_variants()[name]
    try:
        expected = tuple(record_parser.decode_image(tf.constant(encoded)).shape[:2])
    except tf.errors.InvalidArgumentError:
        expected = None
    try:
        size = record_check.decoded_size(encoded)
    except tf.errors.InvalidArgumentError:
        size = None
    assert size == expected
    assert (size is not None) == (name in ('jpeg', 'png', 'gif', 'bmp'))
