"""Export and prediction end to end on a tiny trained model: the SavedModel, loaded with plain
tf.saved_model.load in a fresh process, gives eval mode's detections (both signatures); the
predict CLI annotates a directory of odd images and skips a corrupt one."""
import io
import json
import os
import pickle
import re
import shutil
import textwrap

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

from efficientdet_hpu.config import hparams_config
from efficientdet_hpu.config import settings
from efficientdet_hpu.core import progress
from efficientdet_hpu.data import dataloader
from efficientdet_hpu.data import tiling
from efficientdet_hpu.ops import host_postprocess
from efficientdet_hpu.serving import detector
from efficientdet_hpu.serving import predict
from efficientdet_hpu.serving import tiled_predict
from efficientdet_hpu.serving import visualize
from efficientdet_hpu.training import det_model_fn
from cli_runs import assert_one_line_error, run_python, tmpfs_disk
from efficientdet_hpu.data import label_map as label_map_lib

tf1 = tf.compat.v1


@pytest.fixture(name='exported')
def exported_fixture(tiny_export):
    """The shared tiny run exported as a SavedModel (with the other formats beside it:
    conftest.py's tiny_export)."""
    return tiny_export['export_dir']


def _val_records(pattern):
    """{source_id: encoded JPEG bytes} of the validation TFRecords."""
    records = {}
    for path in sorted(tf.io.gfile.glob(pattern)):
        for raw in tf.data.TFRecordDataset(path).as_numpy_iterator():
            example = tf.train.Example.FromString(raw)
            feature = example.features.feature
            source_id = int(feature['image/source_id'].bytes_list.value[0])
            records[source_id] = feature['image/encoded'].bytes_list.value[0]
    return records


def _eval_mode_detections(model_dir, val_pattern):
    """{source_id: rows [n, 7]} from Estimator.predict through det_model_fn (EMA weights)."""
    with open(os.path.join(model_dir, 'config.yaml')) as f:
        config = hparams_config.Config.from_yaml(f.read())
    params = settings.finalize(config, settings.RunFacts(per_rank_batch=2))
    reader = dataloader.InputReader(val_pattern, is_training=False)

    def input_fn(params):
        def as_features(images, labels):
            features = {key: labels[key] for key in det_model_fn.PREDICT_PASSTHROUGH}
            features['images'] = images
            return features
        return reader(params).map(as_features)
    estimator = tf1.estimator.Estimator(det_model_fn.model_fn, model_dir=model_dir,
                                        params=params)
    detections = {}
    for batch in estimator.predict(input_fn, yield_single_examples=False):
        for source_id, rows, count in zip(batch['source_ids'], batch['detections'],
                                          batch['num_detections']):
            detections[int(source_id)] = rows[:count]
    return detections


FRESH_PROCESS_SCRIPT = textwrap.dedent('''
    import pickle, sys
    import tensorflow as tf
    export_dir, inputs_path, outputs_path = sys.argv[1:]
    with open(inputs_path, 'rb') as f:
        encoded = pickle.load(f)
    model = tf.saved_model.load(export_dir)
    by_pixels = {}
    for source_id, data in encoded.items():
        pixels = tf.io.decode_jpeg(data, channels=3)[None]
        out = model.signatures['serving_default'](images=pixels)
        by_pixels[source_id] = {k: v.numpy()[0] for k, v in out.items()}
    ids = sorted(encoded)
    out = model.signatures['serving_encoded'](encoded_images=tf.constant([encoded[i] for i in ids]))
    by_encoded = {i: {k: v.numpy()[n] for k, v in out.items()} for n, i in enumerate(ids)}
    with open(outputs_path, 'wb') as f:
        pickle.dump({'pixels': by_pixels, 'encoded': by_encoded}, f)
''')


def _matched_rows(expected_rows, outputs, category_ids, source_id):
    """How many of eval mode's rows the served ones hold (boxes within 1e-3 px, scores within
    float32 round-off, same category id), each served row matched once; the counts must be
    equal."""
    count = int(outputs['num_detections'])
    assert count == len(expected_rows), source_id
    served = np.concatenate([outputs['detection_boxes'][:count],
                             outputs['detection_scores'][:count, None],
                             outputs['detection_classes'][:count, None]], axis=1)
    expected = np.concatenate([expected_rows[:, 1:6], [[category_ids[int(label)]]
                                                       for label in expected_rows[:, 6]]], 1)
    unmatched, matched = list(range(count)), []
    for row in expected:
        matches = [j for j in unmatched if served[j, 5] == row[5]
                   and abs(served[j, 4] - row[4]) <= 1e-5 * row[4]
                   and np.abs(served[j, :4] - row[:4]).max() <= 1e-3]
        matched.append(bool(matches))
        if matches:
            unmatched.remove(matches[0])
    return sum(matched)


def test_saved_model_in_a_fresh_process_equals_eval_mode(tiny_trained_run, exported,
                                                         tiny_dataset, tmp_path):
    encoded = _val_records(tiny_dataset['val_pattern'])
    inputs_path, outputs_path = str(tmp_path / 'inputs.pkl'), str(tmp_path / 'outputs.pkl')
    with open(inputs_path, 'wb') as f:
        pickle.dump(encoded, f)
    result = run_python(['-c', FRESH_PROCESS_SCRIPT, exported, inputs_path, outputs_path])
    assert result.returncode == 0, result.stdout[-5000:]
    with open(outputs_path, 'rb') as f:
        served = pickle.load(f)

    expected = _eval_mode_detections(tiny_trained_run, tiny_dataset['val_pattern'])
    category_ids = label_map_lib.load_label_map(
        tiny_dataset['train_label_map']).label_to_category_id
    assert sorted(expected) == sorted(encoded) and len(expected) == 8
    assert sum(len(rows) for rows in expected.values()) > 0
    # Two steps from random weights: every score is within 15% of the prior's 0.01 and every
    # box near its anchor, so which of two near-tied candidates (or of two boxes overlapping at
    # NMS's threshold) is kept turns on the last bits, where two graphs' kernels may differ on
    # another CPU: bitwise equal on an AMD EPYC (AVX-512), a few rows of an image apart on
    # another VM. A wrong export (preprocessing, scale, weights, class ids) moves nearly every
    # row (eval mode on the checkpoint of step 0 matches none of the 800 rows of step 2's
    # export): 90% of the rows must match.
    total = sum(len(rows) for rows in expected.values())
    for signature in ('pixels', 'encoded'):
        matched = sum(_matched_rows(rows, served[signature][source_id], category_ids, source_id)
                      for source_id, rows in expected.items())
        assert matched >= 0.9 * total, (signature, matched, total)


def test_export_is_complete_and_replaces_atomically(tiny_trained_run, exported):
    assert tf.saved_model.contains_saved_model(exported)
    extra = os.path.join(exported, 'assets.extra')
    assert json.load(open(os.path.join(extra, 'label_map.json')))['num_classes'] == 4
    assert json.load(open(os.path.join(extra, 'export.json')))['checkpoint'].endswith('-2')
    parent = os.path.dirname(exported)
    assert [n for n in os.listdir(parent) if n.startswith('.')] == []


def _frozen_constants(export_dir):
    """{node name: value} of the Const nodes of the exported graph."""
    from tensorflow.core.protobuf import saved_model_pb2  # pylint: disable=import-outside-toplevel
    saved_model = saved_model_pb2.SavedModel()
    with open(os.path.join(export_dir, 'saved_model.pb'), 'rb') as f:
        saved_model.ParseFromString(f.read())
    (meta_graph,) = saved_model.meta_graphs
    return {node.name: tf.make_ndarray(node.attr['value'].tensor)
            for node in meta_graph.graph_def.node if node.op == 'Const'}


def test_exported_weights_are_the_ema_weights(tiny_trained_run, exported):
    constants = _frozen_constants(exported)
    checkpoint = tf.train.load_checkpoint(tf.train.latest_checkpoint(tiny_trained_run))
    names = [name for name in checkpoint.get_variable_to_shape_map()
             if name.endswith(('kernel', 'bias', 'gamma', 'beta', 'moving_mean',
                               'moving_variance', 'depthwise_kernel'))
             and 'ExponentialMovingAverage' not in name and 'Momentum' not in name]
    assert len(names) > 100 and set(names) <= set(constants)
    moved = 0
    for name in names:
        np.testing.assert_array_equal(
            constants[name], checkpoint.get_tensor(name + '/ExponentialMovingAverage'), name)
        moved += not np.array_equal(constants[name], checkpoint.get_tensor(name))
    assert moved > 0  # After two steps the averages differ from the raw weights.


def _odd_images(directory, encoded_jpegs):
    """Writes images of several modes and one corrupt file; returns the good names."""
    os.makedirs(directory)
    names = []
    for index, data in enumerate(encoded_jpegs[:2]):
        names.append('%06d.jpg' % (index + 1))
        with open(os.path.join(directory, names[-1]), 'wb') as f:
            f.write(data)
    rng = np.random.default_rng(0)
    Image.fromarray(rng.integers(0, 255, [90, 200], dtype=np.uint8), 'L').save(
        os.path.join(directory, 'gray.png'))
    Image.fromarray(rng.integers(0, 255, [300, 140, 4], dtype=np.uint8), 'RGBA').save(
        os.path.join(directory, 'alpha.png'))
    Image.fromarray(rng.integers(0, 255, [64, 64, 4], dtype=np.uint8), 'CMYK').save(
        os.path.join(directory, 'cmyk.jpg'))
    Image.fromarray(rng.integers(0, 255, [40, 700, 3], dtype=np.uint8), 'RGB').save(
        os.path.join(directory, 'wide.bmp'))
    names += ['alpha.png', 'cmyk.jpg', 'gray.png', 'wide.bmp']
    with open(os.path.join(directory, 'broken.jpg'), 'wb') as f:
        f.write(encoded_jpegs[0][:200])  # A truncated JPEG.
    return sorted(names)


def test_predict_directory_with_a_corrupt_file(exported, tiny_dataset, tmp_path):
    images = str(tmp_path / 'images')
    good = _odd_images(images, list(_val_records(tiny_dataset['val_pattern']).values()))
    output_dir = str(tmp_path / 'predictions')
    result = run_python(['inference.py', 'predict', '--saved_model=%s' % exported,
                         '--input=%s' % images, '--output_dir=%s' % output_dir,
                         '--min_score=0'])
    assert result.returncode == 0, result.stdout[-5000:]
    assert 'skipped %s' % os.path.join(images, 'broken.jpg') in result.stdout
    assert 'processed %d image(s), skipped 1' % len(good) in result.stdout
    # The folder's progress (a pipe: plain lines), skipped files counted as done.
    shown = [line for line in result.stdout.splitlines() if line.startswith('predicting: ')]
    for line in shown[:-1]:  # Lines at tenths after 5 s, if predicting took that long.
        assert re.fullmatch(r'predicting: \d/%d images \(\d+%%\)(, [\d.]+ images/s, ETA '
                            r'0:\d\d:\d\d)?' % (len(good) + 1), line), line
    assert re.fullmatch(r'predicting: %d/%d images \(100%%\) in 0:\d\d:\d\d'
                        r'( \(start-up 0:\d\d:\d\d\))?, [\d.]+ images/s'
                        % ((len(good) + 1,) * 2), shown[-1]), shown
    written = sorted(os.listdir(output_dir))
    assert written == sorted(['detections.json', 'wide.bmp.png'] +
                             [n for n in good if n != 'wide.bmp'])
    for name in written:
        if name != 'detections.json':
            with Image.open(os.path.join(output_dir, name)) as image:
                source = [n for n in good if name.startswith(n)][0]
                with Image.open(os.path.join(images, source)) as original:
                    assert image.size == original.size and image.mode == 'RGB'
    rows = json.load(open(os.path.join(output_dir, 'detections.json')))
    assert {r['file_name'] for r in rows} <= set(good) and rows
    categories = {3, 17, 42, 90}
    for row in rows:
        assert row['category_id'] in categories and len(row['bbox']) == 4
        assert 0 <= row['score'] <= 1 and row['bbox'][2] >= 0 and row['bbox'][3] >= 0
    assert {r['image_id'] for r in rows if r['file_name'] == '000001.jpg'} == {1}


def _detections(outputs, index=0, shift_x=0.0):
    """[(score, class, box in float32 after the shift)] of one image."""
    count = int(outputs['num_detections'][index])
    boxes = (outputs['detection_boxes'][index][:count].astype(np.float64)
             + [0, shift_x, 0, shift_x]).astype(np.float32)
    return list(zip(outputs['detection_scores'][index][:count].tolist(),
                    outputs['detection_classes'][index][:count].tolist(),
                    map(tuple, boxes.tolist())))


def test_tiled_prediction_on_the_tiny_model(exported, tiny_dataset):
    predictor = detector.SavedModelPredictor(exported)
    left, right = [np.asarray(Image.open(io.BytesIO(jpeg)).convert('RGB')) for jpeg in
                   list(_val_records(tiny_dataset['val_pattern']).values())[:2]]
    side = min(left.shape[:2] + right.shape[:2])  # Square crops: one tile each.
    left, right = left[:side, :side], right[:side, :side]
    untiled = predictor.predict(left[None])
    # A photo that fits one tile: exactly the untiled outputs.
    one_tile = tiled_predict.predict_tiled(predictor, left, tile_size=side, overlap=0)
    count = int(untiled['num_detections'][0])
    assert int(one_tile['num_detections'][0]) == count > 0
    for key in ('detection_boxes', 'detection_scores', 'detection_classes'):
        np.testing.assert_array_equal(one_tile[key][0], untiled[key][0][:count])
    # Two images side by side, one tile each: each image's own detections, the right one's
    # moved by the left one's width (boxes are clipped to their tile: none overlap the seam).
    both = tiled_predict.predict_tiled(predictor, np.concatenate([left, right], axis=1),
                                       tile_size=side, overlap=0, batch_size=2)
    expected = _detections(untiled) + _detections(predictor.predict(right[None]), shift_x=side)
    # Merged best first; equal scores keep the left tile's before the right tile's.
    assert _detections(both) == sorted(expected, key=lambda row: -row[0])


def test_tiled_predict_cli_from_model_dir_scores_the_whole_photo(tiny_trained_run, tiny_dataset,
                                                                 tmp_path):
    # One val photo in tiles of 64 px (several batches of 3, the last one smaller), through
    # the checkpoint graph, scored against the val JSON (only this photo: matched by name).
    with open(tiny_dataset['val_json']) as f:
        photo = json.load(f)['images'][0]
    path = os.path.join(tiny_dataset['root'], 'val', photo['file_name'])
    output_dir = tmp_path / 'out'
    result = run_python(['inference.py', 'predict', '--model_dir=%s' % tiny_trained_run,
                         '--input=%s' % path, '--output_dir=%s' % output_dir,
                         '--tile_size=64', '--tile_overlap=8', '--tile_batch_size=3',
                         '--annotations_file=%s' % tiny_dataset['val_json']])
    assert result.returncode == 0, result.stdout[-5000:]
    metrics = json.loads((output_dir / 'metrics.json').read_text())
    assert metrics['photos'] == 1 and metrics['detections'] > 100  # Several tiles' worth.
    assert 0 <= metrics['AP'] <= 1 and 0 <= metrics['recall_iou0.4'] <= 1
    rows = json.loads((output_dir / 'detections.json').read_text())
    assert max(r['bbox'][0] + r['bbox'][2] for r in rows) > 64  # Boxes beyond the first tile.
    # Said before the scoring (the tiles' progress shows for a photo of 5 s or more: below).
    assert 'scoring %d detections of 1 photo(s) against %s' % (
        metrics['detections'], tiny_dataset['val_json']) in result.stdout


def test_predict_shows_the_tiles_of_a_photo_that_takes_a_while(exported, tiny_dataset,
                                                             tmp_path, monkeypatch, capsys):
    """A photo of several tile batches that takes 5 s or more (here: any, by the threshold
    set to 0) shows its tiles' progress, ended by a line with the time and the rate; quicker
    photos stay silent (tests/core/test_progress.py)."""
    monkeypatch.setattr(progress, 'MIN_LINE_SECONDS', 0.0)
    with open(tiny_dataset['val_json']) as f:
        photo = json.load(f)['images'][0]
    path = os.path.join(tiny_dataset['root'], 'val', photo['file_name'])
    predictor = tiled_predict.TiledPredictor(detector.SavedModelPredictor(exported),
                                             tile_size=64, overlap=8, batch_size=3)
    try:
        assert predict.predict_files(predictor, {}, path, str(tmp_path / 'out')) == 0
    finally:
        predictor.close()
    tiles = len(tiling.tile_windows(photo['height'], photo['width'], 64, 8))
    assert tiles > 3  # Several batches.
    lines = capsys.readouterr().out.splitlines()
    shown = [line for line in lines if line.startswith('predicting %s: ' % photo['file_name'])]
    name = re.escape(photo['file_name'])
    for line in shown[:-1]:  # At each tenth (no wait between lines here).
        assert re.fullmatch(r'predicting %s: \d+/%d tiles \(\d+%%\)(, [\d.]+ tiles/s, ETA '
                            r'0:00:\d\d)?' % (name, tiles), line), line
    assert re.fullmatch(r'predicting %s: %d/%d tiles \(100%%\) in 0:00:\d\d'
                        r'( \(start-up 0:00:\d\d\))?, [\d.]+ tiles/s'
                        % (name, tiles, tiles), shown[-1]), lines
    assert lines[len(shown)].startswith('%s: %dx%d, ' % (photo['file_name'], photo['width'],
                                                         photo['height']))


def test_predict_from_model_dir_and_nothing_readable(tiny_trained_run, tmp_path):
    broken = tmp_path / 'broken'
    broken.mkdir()
    (broken / 'a.jpg').write_bytes(b'not an image')
    result = run_python(['inference.py', 'predict', '--model_dir=%s' % tiny_trained_run,
                         '--input=%s' % broken, '--output_dir=%s' % (tmp_path / 'out')])
    assert_one_line_error(result, 'no photo of --input=%s could be read (1 skipped' % broken)
    assert 'skipped' in result.stdout and not os.path.exists(tmp_path / 'out' / 'detections.json')
    picture = tmp_path / 'one.png'
    Image.fromarray(np.full([100, 150, 3], 200, np.uint8)).save(picture)
    # Drawn copies over the photos themselves, and a missing annotations file: refused before
    # the model loads.
    result = run_python(['inference.py', 'predict', '--model_dir=%s' % tiny_trained_run,
                         '--input=%s' % picture, '--output_dir=%s' % tmp_path])
    assert_one_line_error(result, '--output_dir=%s holds the photos of --input' % tmp_path)
    result = run_python(['inference.py', 'predict', '--model_dir=%s' % tiny_trained_run,
                         '--input=%s' % picture, '--output_dir=%s' % (tmp_path / 'out'),
                         '--annotations_file=%s' % (tmp_path / 'nope.json')])
    assert_one_line_error(result, '--annotations_file=%s does not exist' % (tmp_path / 'nope.json'))
    result = run_python(['inference.py', 'predict', '--model_dir=%s' % tiny_trained_run,
                         '--input=%s' % (tmp_path / '*.png'),
                         '--output_dir=%s' % (tmp_path / 'out'), '--repeat=3'])
    assert result.returncode == 0, result.stdout[-5000:]
    assert 'latency per image' in result.stdout
    assert os.path.getsize(tmp_path / 'out' / 'one.png') > 0


def test_model_dir_keeps_the_label_map_for_class_names(tiny_trained_run, tiny_dataset, tmp_path):
    """main.py copies the data's label map into model_dir, so predict names classes even
    when the TFRecords it trained on are gone."""
    copied = os.path.join(tiny_trained_run, 'label_map.json')
    assert label_map_lib.load_label_map(copied).label_to_name == label_map_lib.load_label_map(
        tiny_dataset['train_label_map']).label_to_name
    moved = tmp_path / 'run'
    shutil.copytree(tiny_trained_run, moved)
    with open(moved / 'flags.json') as f:
        run_flags = json.load(f)
    run_flags.update(training_file_pattern=str(tmp_path / 'gone-*'),
                     validation_file_pattern=str(tmp_path / 'gone-*'))
    with open(moved / 'flags.json', 'w') as f:
        json.dump(run_flags, f)
    images = tmp_path / 'images'
    images.mkdir()
    for index, encoded in enumerate(list(_val_records(tiny_dataset['val_pattern']).values())[:2]):
        (images / ('%d.jpg' % index)).write_bytes(encoded)
    result = run_python(['inference.py', 'predict', '--model_dir=%s' % moved,
                         '--input=%s' % images, '--output_dir=%s' % (tmp_path / 'out'),
                         '--min_score=0'])
    assert result.returncode == 0, result.stdout[-5000:]
    rows = json.load(open(tmp_path / 'out' / 'detections.json'))
    assert rows and {r['category_name'] for r in rows} <= {
        'ellipse', 'rectangle', 'triangle', 'cross'}


@pytest.mark.slow  # inference.py up to its user error: TensorFlow's start-up.
def test_export_without_checkpoint_is_a_clear_error(tmp_path):
    result = run_python(['inference.py', 'export', '--model_dir=%s' % tmp_path,
                         '--export_dir=%s' % (tmp_path / 'x')])
    assert_one_line_error(result, 'config.yaml')


@pytest.mark.slow  # inference.py up to its user error: TensorFlow's start-up.
def test_an_export_replaces_only_an_earlier_export(tiny_trained_run, tmp_path):
    """An export replaces its directory: the model_dir itself, a folder of photos or a file
    is refused before anything is built, and left as it was."""
    photos = tmp_path / 'photos'
    photos.mkdir()
    (photos / 'a.jpg').write_bytes(b'jpeg')
    for target, said in ((tiny_trained_run, 'holds checkpoint, config.yaml, '),
                         (str(photos), 'holds a.jpg, not an earlier export'),
                         (str(photos / 'a.jpg'), 'is a file')):
        before = sorted(os.listdir(target)) if os.path.isdir(target) else None
        result = run_python(['inference.py', 'export', '--model_dir=%s' % tiny_trained_run,
                             '--export_dir=%s' % target])
        assert_one_line_error(result, 'export directory %s %s' % (target, said))
        assert before is None or sorted(os.listdir(target)) == before
    assert (photos / 'a.jpg').read_bytes() == b'jpeg'


def test_label_text_contrasts_with_its_fill():
    assert visualize.text_colour_for((0, 0, 128)) == visualize.WHITE
    assert visualize.text_colour_for((255, 215, 0)) == visualize.BLACK
    for colour in visualize.PALETTE:
        assert visualize.contrast_ratio(colour, visualize.text_colour_for(colour)) >= 4.5


def test_draw_detections_fills_a_tag_in_the_class_colour():
    image = Image.new('L', (120, 80), 0)
    drawn = visualize.draw_detections(image, [[30, 20, 70, 100]], [0.9], [3],
                                      {3: 'circle'})
    pixels = np.asarray(drawn)
    assert drawn.mode == 'RGB' and drawn.size == (120, 80)
    colour = visualize.class_colour(3)
    assert (pixels == colour).all(axis=-1).sum() > 100  # Outline and filled tag.
    assert (pixels[:30] == colour).all(axis=-1).any()  # Tag above the box.


def test_host_nms_on_hand_placed_boxes():
    boxes = np.array([[0, 0, 10, 10], [0, 1, 10, 11], [20, 20, 30, 30], [0, 0, 10, 10.5],
                      [50, 50, 60, 60]], np.float64)
    scores = np.array([0.9, 0.8, 0.7, 0.95, 0.1])
    # Box 3 (best) suppresses 0 (IoU 100/105) and 1 (IoU 95/110); 2 and 4 stand alone.
    assert host_postprocess.nms(boxes, scores, 0.5, 10).tolist() == [3, 2, 4]
    assert host_postprocess.nms(boxes, scores, 0.5, 2).tolist() == [3, 2]


def test_host_nms_per_class():
    boxes = np.array([[0, 0, 10, 10], [0, 0, 10, 10], [0, 0, 10, 10]], np.float64)
    scores = np.array([0.9, 0.8, 0.7])
    # Identical boxes: only another class survives the best one.
    assert host_postprocess.nms(boxes, scores, 0.5, 10, classes=np.array([0, 0, 1])).tolist() \
        == [0, 2]


def test_export_to_a_full_disk_is_one_line_and_leaves_nothing(tiny_trained_run, tmp_path):
    with tmpfs_disk(tmp_path / 'disk', '4m') as disk:
        result = run_python(['inference.py', 'export', '--model_dir=%s' % tiny_trained_run,
                             '--export_dir=%s' % (disk / 'saved_model')])
        leftovers = os.listdir(disk)
    assert_one_line_error(
        result, starts_with='inference.py: error: no space left on the device writing %s' % disk)
    assert leftovers == []  # Neither the export nor its staging directory is left behind.
