"""TFLite export, prediction and benchmark on a tiny trained model: the fp32 network gives the
SavedModel graph's outputs, fp16 nearly so, int8 runs; the post-processing file equals
modeling/postprocess.py (the default per-class soft-NMS); predict --tflite writes detections.json; bench --formats prints a line per format;
bad inputs are one line and exit 2."""
import json
import os

import numpy as np
import pytest

from efficientdet_hpu.benchmarks import report
from efficientdet_hpu.config import hparams_config
from efficientdet_hpu.ops import anchors
from efficientdet_hpu.ops import postprocess
from efficientdet_hpu.serving import detector
from efficientdet_hpu.serving import model_spec
from efficientdet_hpu.serving import tflite_runner
import tfrecord_fixtures as fixtures
from cli_runs import REPO, TINY_HPARAMS, assert_one_line_error, run_python

CATEGORY_IDS = {3, 17, 42, 90}  # The synthetic data's label map.


@pytest.fixture(scope='module')
def exported(tiny_trained_run, tiny_export):
    """Two training steps of the tiny model, exported in every TFLite format (int8
    calibrated on the training TFRecords flags.json names: the default) beside the
    SavedModel and the ONNX file."""
    assert 'calibrating int8 on 4 images' in tiny_export['output']  # conftest.py: shared.
    return {'model_dir': tiny_trained_run, 'export_dir': tiny_export['export_dir']}


def _raw_outputs(predictor, image):
    """The TFLite network's (class_logits, box_codes) on one uint8 image."""
    network_image = predictor._preprocess(image)[0]  # pylint: disable=protected-access
    interpreter = predictor._interpreter  # pylint: disable=protected-access
    interpreter.set_tensor(interpreter.get_input_details()[0]['index'], network_image)
    interpreter.invoke()
    outputs = {d['name']: interpreter.get_tensor(d['index'])
               for d in interpreter.get_output_details()}
    return outputs[tflite_runner.LOGITS], outputs[tflite_runner.CODES]


def test_tflite_network_matches_the_frozen_graph(exported, tiny_dataset):
    """Raw outputs on real images: fp32 equal to the SavedModel's graph within float
    round-off, fp16 close; int8 runs end to end. (Detections of a two-step model are near
    ties, so the post-processing is compared on separated scores below.)"""
    spec = model_spec.load_model_spec(exported['model_dir'])
    graph = detector.GraphPredictor(spec, batch_size=1)
    export_dir = exported['export_dir']
    predictors = {fmt: tflite_runner.TFLitePredictor(os.path.join(export_dir, name))
                  for fmt, name in (('fp32', 'model_fp32.tflite'), ('fp16', 'model_fp16.tflite'),
                                    ('int8', 'model_int8.tflite'))}
    for image in fixtures.decoded_images(tiny_dataset['val_pattern']):
        expected = graph.predict(image[None], ('class_logits', 'box_codes'))
        logits, codes = _raw_outputs(predictors['fp32'], image)
        np.testing.assert_allclose(logits, expected['class_logits'], atol=1e-4, rtol=1e-4)
        np.testing.assert_allclose(codes, expected['box_codes'], atol=1e-4, rtol=1e-4)
        logits, codes = _raw_outputs(predictors['fp16'], image)
        np.testing.assert_allclose(logits, expected['class_logits'], atol=0.05)
        np.testing.assert_allclose(codes, expected['box_codes'], atol=0.05)
        int8 = predictors['int8'].predict(image[None])
        assert [int8[key].shape for key in tflite_runner.OUTPUT_KEYS] == [
            (1, 100, 4), (1, 100), (1, 100), (1,)]
        count = int(int8['num_detections'][0])
        assert 0 < count <= 100 and set(int8['detection_classes'][0][:count]) <= CATEGORY_IDS
        assert ((int8['detection_scores'] >= 0) & (int8['detection_scores'] <= 1)).all()
    graph.close()
    metadata = json.load(open(os.path.join(export_dir, tflite_runner.METADATA_FILE)))
    assert metadata['files']['model_int8.tflite']['calibration']['images'] == 4
    assert metadata['nms']['method'] == 'gaussian' and metadata['nms']['max_nms_inputs'] == 0


def test_tflite_postprocess_equals_the_graph_postprocess(exported):
    """The post-processing file (the default per-class soft-NMS over each anchor's best
    class) against modeling/postprocess.py on separated random scores, then finished on the
    host as detector.py does in-graph."""
    config = model_spec.load_model_spec(exported['model_dir']).config
    anchor_boxes = anchors.generate_anchor_boxes(128, 128,
                                                 **hparams_config.anchor_settings(config))
    rng = np.random.default_rng(0)
    logits = rng.normal(-3.0, 2.0, [1, len(anchor_boxes), 4]).astype(np.float32)
    codes = rng.normal(0.0, 0.3, [1, len(anchor_boxes), 4]).astype(np.float32)
    scale, size = np.float32(1.5), np.array([150, 192])
    rows, counts = postprocess.generate_detections(
        {3: logits}, {3: codes}, anchor_boxes, np.zeros([1]), [scale], size[None],
        num_classes=4, network_size=(128, 128), **hparams_config.nms_settings(config))
    predictor = tflite_runner.TFLitePredictor(
        os.path.join(exported['export_dir'], 'model_fp32.tflite'))
    post = predictor._postprocess  # pylint: disable=protected-access
    for detail in post.get_input_details():
        post.set_tensor(detail['index'], {tflite_runner.LOGITS: logits,
                                          tflite_runner.CODES: codes}[detail['name']])
    post.invoke()
    outputs = {d['name']: post.get_tensor(d['index']) for d in post.get_output_details()}
    boxes, scores, classes, count = tflite_runner.finish_detections(
        outputs[tflite_runner.DETECTIONS_OUTPUT][0],
        outputs[tflite_runner.NUM_DETECTIONS_OUTPUT][0], scale, size,
        predictor.metadata['category_ids'])
    expected = rows.numpy()[0]
    # Of the 100 kept, those the clip to the 150 px height leaves without area are dropped.
    assert 50 < count == int(counts[0]) <= 100
    np.testing.assert_allclose(scores, expected[:, 5], rtol=1e-5)
    np.testing.assert_allclose(boxes, expected[:, 1:5], atol=1e-3)
    table = np.asarray(predictor.metadata['category_ids'])
    assert classes.tolist() == table[expected[:, 6].astype(int)].tolist()


def test_finish_detections_scales_clips_and_maps_categories():
    detections = np.array([[10, 20, 30, 40, 0.9, 2], [-5, 50, 60, 130, 0.5, 1],
                           [0, 0, 0, 0, 0, 0]], np.float32)
    boxes, scores, classes, count = tflite_runner.finish_detections(
        detections, 2, 2.0, (100, 200), [0, 7, 9])
    # Row 2: (-10, 100, 120, 260) clipped to the 100 x 200 image.
    assert boxes.tolist() == [[20, 40, 60, 80], [0, 100, 100, 200], [0, 0, 0, 0]]
    assert scores.tolist() == pytest.approx([0.9, 0.5, 0.0])
    assert classes.tolist() == [9, 7, 0] and count == 2


def test_finish_detections_drops_a_box_wholly_outside_the_photo():
    # Row 0 lies past the 200 px width (the network input's padding): clipped it keeps no
    # area; the rows after it move up and the count falls, as in the graph's postprocess.
    detections = np.array([[10, 110, 30, 130, 0.95, 1], [10, 20, 30, 40, 0.9, 2],
                           [5, 90, 20, 120, 0.6, 1], [0, 0, 0, 0, 0, 0]], np.float32)
    boxes, scores, classes, count = tflite_runner.finish_detections(
        detections, 3, 2.0, (100, 200), [0, 7, 9])
    assert count == 2
    assert boxes.tolist() == [[20, 40, 60, 80], [10, 180, 40, 200], [0] * 4, [0] * 4]
    assert scores.tolist() == pytest.approx([0.9, 0.6, 0, 0])
    assert classes.tolist() == [9, 7, 0, 0]


def test_predict_tflite_writes_detections_json(exported, tiny_dataset, tmp_path):
    images = fixtures.write_jpegs(fixtures.decoded_images(tiny_dataset['val_pattern'], 2),
                                  tmp_path / 'images')
    output_dir = tmp_path / 'out'
    result = run_python(['inference.py', 'predict', '--tflite=%s'
                         % os.path.join(exported['export_dir'], 'model_int8.tflite'),
                         '--input=%s' % images,
                         '--output_dir=%s' % output_dir, '--min_score=0'])
    assert result.returncode == 0, result.stdout[-5000:]
    assert sorted(os.listdir(output_dir)) == ['000001.jpg', '000002.jpg', 'detections.json']
    rows = json.load(open(output_dir / 'detections.json'))
    assert rows and {row['image_id'] for row in rows} == {1, 2}
    assert {row['category_id'] for row in rows} <= CATEGORY_IDS
    assert {row['category_name'] for row in rows} <= {'ellipse', 'rectangle', 'triangle',
                                                     'cross'}


# Photos on any machine (docs/'s PNGs): predict refuses an --input without one before
# the model loads, so the model's error is only seen with real photos.
PHOTOS = '--input=' + os.path.join(REPO, 'docs')


@pytest.mark.slow
def test_bench_prints_one_line_per_format():
    formats = ['saved_model', 'tflite_fp32', 'tflite_fp16', 'tflite_int8']
    result = run_python(['bench.py', 'infer', '--random_weights', '--source=random',
                         '--batch_sizes=1', '--steps=2', '--warmup=1', '--hparams=%s'
                         % TINY_HPARAMS, '--formats=%s' % ','.join(formats)], timeout=900)
    assert result.returncode == 0, result.stdout[-5000:]
    lines = report.parse_result_lines(result.stdout)
    assert [line['format'] for line in lines] == formats
    for line in lines:
        assert line['images_per_sec'] > 0 and line['batch_size'] == 1
        assert line['rows'][0]['latency_p99_ms'] > 0


@pytest.mark.slow  # inference.py/bench.py up to its user error: TensorFlow's start-up.
@pytest.mark.parametrize('args, needle', [
    (['bench.py', 'infer', '--random_weights', '--formats=saved_model,onnx'],
     'bench.py: error: --formats=saved_model,onnx: unknown format onnx; choose from'),
    (['inference.py', 'export', '--model_dir=/nonexistent', '--export_dir=/tmp/x',
      '--formats=tflite'], 'inference.py: error: --formats=tflite: unknown format tflite'),
    (['inference.py', 'predict', '--tflite=/nonexistent/model.tflite', PHOTOS,
      '--output_dir=/tmp/x'], 'inference.py: error: --tflite=/nonexistent/model.tflite '
     'does not exist'),
])
def test_bad_tflite_inputs_are_one_line_and_exit_2(args, needle):
    assert_one_line_error(run_python(args), starts_with=needle)
