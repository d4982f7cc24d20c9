"""ONNX export, prediction and benchmark on the tiny trained model: the ONNX network gives the
frozen TF graph's outputs, the predictor (network in onnxruntime, the export's TFLite
post-processing) the SavedModel's detections, in the library and through predict --onnx;
bench --formats=onnx_fp32 prints its line; bad inputs are one line and exit 2."""
import json
import os

import numpy as np
import pytest

from efficientdet_hpu.benchmarks import report
from efficientdet_hpu.serving import detector
from efficientdet_hpu.serving import model_spec
from efficientdet_hpu.serving import onnx_runner
from efficientdet_hpu.serving import tflite_export
from efficientdet_hpu.serving import tflite_runner
import tfrecord_fixtures as fixtures
from cli_runs import REPO, TINY_HPARAMS, assert_one_line_error, run_python

ONNX_FILE = 'model_fp32.onnx'


@pytest.fixture(scope='module')
def exported(tiny_trained_run, tiny_export):
    """The tiny model exported as SavedModel and ONNX into one directory (with the TFLite
    files), and the ONNX predictor of it (shared: building a session and the preprocessing
    takes seconds)."""
    export_dir = tiny_export['export_dir']  # conftest.py: every format, shared.
    onnx_path = os.path.join(export_dir, ONNX_FILE)
    assert 'exported %s' % onnx_path in tiny_export['output']
    predictor = onnx_runner.ONNXPredictor(onnx_path)
    yield {'model_dir': tiny_trained_run, 'export_dir': export_dir, 'onnx': onnx_path,
           'predictor': predictor}
    predictor.close()


def test_export_writes_the_network_file_and_its_metadata(exported):
    names = sorted(os.listdir(exported['export_dir']))
    for name in (ONNX_FILE, tflite_export.POSTPROCESS_FILE, tflite_runner.METADATA_FILE,
                 'saved_model.pb'):
        assert name in names
    assert not [name for name in names if '.tmp-' in name]  # Written atomically.
    with open(os.path.join(exported['export_dir'], tflite_runner.METADATA_FILE)) as f:
        entry = json.load(f)['files'][ONNX_FILE]
    assert entry['format'] == 'onnx_fp32' and entry['converter'] == 'tf2onnx, opset 17'
    assert entry['postprocess'] == tflite_export.POSTPROCESS_FILE
    assert entry['bytes'] == os.path.getsize(exported['onnx'])
    session = onnx_runner.make_session(exported['onnx'])
    assert [(item.name, item.shape) for item in session.get_inputs()] == [
        ('images', [1, 128, 128, 3])]
    assert sorted(item.name for item in session.get_outputs()) == [
        tflite_runner.CODES, tflite_runner.LOGITS]


def test_onnx_network_equals_the_frozen_graph(exported, tiny_dataset):
    """Raw outputs on real images, against the SavedModel's frozen graph in a session."""
    graph = detector.GraphPredictor(model_spec.load_model_spec(exported['model_dir']),
                                    batch_size=1)
    predictor = exported['predictor']
    for image in fixtures.decoded_images(tiny_dataset['val_pattern']):
        expected = graph.predict(image[None], ('class_logits', 'box_codes'))
        network_image = predictor._preprocess(image)[0]  # pylint: disable=protected-access
        outputs = predictor.network_outputs(network_image)
        for name in (tflite_runner.LOGITS, tflite_runner.CODES):
            np.testing.assert_allclose(outputs[name], expected[name], rtol=1e-5, atol=1e-5)
    graph.close()


def _identical_rows(boxes, scores, classes, expected, box_atol=1e-3):
    """How many leading rows of one image's detections equal `expected` (the same three
    arrays of the SavedModel): boxes within box_atol, scores rtol 1e-5, same classes. Where
    they first differ the two rows must score the same: two anchors tied in score, the
    network's round-off picked the other one, and the soft-NMS goes on from a different box.
    (Scores of the two-step model are all near the 0.01 prior: such ties happen.)"""
    want_boxes, want_scores, want_classes = (np.asarray(values) for values in expected)
    assert len(boxes) == len(want_boxes) > 0
    same = ((np.abs(np.asarray(boxes) - want_boxes).max(axis=1) <= box_atol)
            & np.isclose(scores, want_scores, rtol=1e-5, atol=2e-6)
            & (np.asarray(classes) == want_classes))
    identical = len(same) if same.all() else int(np.argmin(same))
    if identical < len(same):
        assert scores[identical] == pytest.approx(want_scores[identical], rel=1e-5, abs=2e-6)
    return identical


def _rows_of(outputs):
    count = int(outputs['num_detections'][0])
    return [outputs[key][0][:count] for key in ('detection_boxes', 'detection_scores',
                                                'detection_classes')]


def _square(images):
    """The photos cut to squares, which fill the square network input: the anchors of a
    padded input's flat padding score alike, and the boxes of such ties lie wholly outside
    the photo, where the clip drops them (postprocess): the tie would be unseen, and the rows
    after it differ in score."""
    return [image[:min(image.shape[:2]), :min(image.shape[:2])] for image in images]


def test_onnx_detections_equal_the_saved_model(exported, tiny_dataset):
    """Same count on every image; rows equal until the first tie. (How many rows precede a
    tie depends on the two-step model's near-prior scores, not on the export: a CI run saw
    [15, 56, 100, 22] of 100. The network itself is compared exactly above.)"""
    saved_model = detector.SavedModelPredictor(exported['export_dir'])
    images = _square(fixtures.decoded_images(tiny_dataset['val_pattern']))
    for image in images:
        expected = saved_model.predict(image[None])
        outputs = exported['predictor'].predict(image[None])
        assert outputs['num_detections'].tolist() == expected['num_detections'].tolist()
        _identical_rows(*_rows_of(outputs), _rows_of(expected))


def _predict_rows(model_flag, images, output_dir):
    result = run_python(['inference.py', 'predict', model_flag, '--input=%s' % images,
                         '--output_dir=%s' % output_dir, '--min_score=0'])
    assert result.returncode == 0, result.stdout[-5000:]
    with open(output_dir / 'detections.json') as f:
        return json.load(f)


def _json_rows_of(rows, image_id):
    """detections.json rows of one image as boxes [n, 4] (x, y, w, h), scores, classes."""
    rows = [row for row in rows if row['image_id'] == image_id]
    return ([row['bbox'] for row in rows], np.array([row['score'] for row in rows]),
            [row['category_id'] for row in rows])


def test_predict_onnx_writes_what_the_saved_model_writes(exported, tiny_dataset, tmp_path):
    images = fixtures.write_jpegs(_square(fixtures.decoded_images(tiny_dataset['val_pattern'],
                                                                  2)), tmp_path / 'images')
    onnx_rows = _predict_rows('--onnx=%s' % exported['onnx'], images, tmp_path / 'onnx')
    expected = _predict_rows('--saved_model=%s' % exported['export_dir'], images,
                             tmp_path / 'saved_model')
    assert sorted(os.listdir(tmp_path / 'onnx')) == ['000001.jpg', '000002.jpg',
                                                    'detections.json']
    assert len(onnx_rows) == len(expected) > 0
    assert {row['category_name'] for row in onnx_rows} == {
        row['category_name'] for row in expected}
    for image_id in (1, 2):  # bbox is rounded to 0.01 px.
        _identical_rows(*_json_rows_of(onnx_rows, image_id), _json_rows_of(expected, image_id),
                        box_atol=0.011)


# Photos on any machine (docs/'s PNGs): predict refuses an --input without one before
# the model loads, so the model's error is only seen with real photos.
PHOTOS = '--input=' + os.path.join(REPO, 'docs')


@pytest.mark.slow
def test_bench_prints_an_onnx_line():
    result = run_python(['bench.py', 'infer', '--random_weights', '--source=random',
                         '--batch_sizes=1', '--steps=2', '--warmup=1', '--hparams=%s'
                         % TINY_HPARAMS, '--formats=onnx_fp32'], timeout=900)
    assert result.returncode == 0, result.stdout[-5000:]
    (line,) = report.parse_result_lines(result.stdout)
    assert line['format'] == 'onnx_fp32' and line['batch_size'] == 1
    assert line['images_per_sec'] > 0


@pytest.mark.slow  # inference.py/bench.py up to its user error: TensorFlow's start-up.
@pytest.mark.parametrize('args, needle', [
    (['inference.py', 'predict', '--onnx=/nonexistent/model_fp32.onnx', PHOTOS,
      '--output_dir=/tmp/x'], 'inference.py: error: --onnx=/nonexistent/model_fp32.onnx '
     'does not exist; create it with `python inference.py export --formats=onnx_fp32`'),
    (['inference.py', 'export', '--model_dir=/nonexistent', '--export_dir=/tmp/x',
      '--formats=saved_model,onnx_fp16'],
     'inference.py: error: --formats=saved_model,onnx_fp16: unknown format onnx_fp16'),
    (['bench.py', 'infer', '--random_weights', '--formats=onnx'],
     'bench.py: error: --formats=onnx: unknown format onnx; choose from'),
])
def test_bad_onnx_inputs_are_one_line_and_exit_2(args, needle):
    assert_one_line_error(run_python(args), starts_with=needle)


@pytest.mark.slow  # inference.py up to its user error: TensorFlow's start-up.
def test_onnx_file_without_metadata_is_one_line(tmp_path):
    (tmp_path / ONNX_FILE).write_bytes(b'')
    result = run_python(['inference.py', 'predict', '--onnx=%s' % (tmp_path / ONNX_FILE),
                         PHOTOS, '--output_dir=%s' % (tmp_path / 'out')])
    assert_one_line_error(result, starts_with='inference.py: error: %s does not exist: %s of '
                          '`python inference.py export --formats=onnx_fp32` needs the tflite.json'
                          % (tmp_path / tflite_runner.METADATA_FILE, ONNX_FILE))


def test_missing_onnxruntime_names_the_pip_command(exported, tmp_path):
    """An onnxruntime that fails to import (shadowed by a package raising ImportError)."""
    shadow = tmp_path / 'shadow' / 'onnxruntime'
    shadow.mkdir(parents=True)
    (shadow / '__init__.py').write_text("raise ImportError('no onnxruntime here')\n")
    result = run_python(['inference.py', 'predict', '--onnx=%s' % exported['onnx'],
                         PHOTOS, '--output_dir=%s' % (tmp_path / 'out')],
                        env={'PYTHONPATH': str(tmp_path / 'shadow')})
    assert_one_line_error(result, 'pip install onnxruntime==1.20.1', starts_with=(
        'inference.py: error: running an ONNX export needs the onnxruntime package'))
