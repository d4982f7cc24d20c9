"""Equivalence with google/automl, shown on automl's own D0 checkpoint and outputs.

../shared/automl_ckpt (beside the repository) holds a checkpoint written by automl's Estimator
code (EMA kept), automl's config.yaml and, in expected.npz / expected.json, automl's outputs
for the images beside it: resized size, class logits and box codes at 500 fixed anchors per
level, and the detections of its serving path (class-agnostic soft-NMS) and of its per-class
COCO-eval paths (every anchor's best class; the 5000 best pairs). The checkpoint is loaded
here the four ways a user brings it: as a model_dir with automl's config.yaml (predict
--model_dir), through --mode=eval's prediction, through --ckpt, and through export.

Tolerances: logits and box codes within 5e-4 (two fp32 CPU implementations of one network);
scores within 1e-4; boxes within 0.05 px, plus 2e-5 of the box's size for the untrained
network's degenerate boxes (tens of thousands of pixels: a code differing by 1e-5 moves
their edges by more than 0.05 px).
"""
import hashlib
import json
import os
import shutil

import numpy as np
import pytest
import tensorflow as tf

from efficientdet_hpu.config import hparams_config
from efficientdet_hpu.config import settings
from efficientdet_hpu.config import recipe
from efficientdet_hpu.config.options import RunOptions
from efficientdet_hpu.data import dataloader
from efficientdet_hpu.data import record_parser
from efficientdet_hpu.data import tfrecord_format
from efficientdet_hpu.network import efficientdet_arch
from efficientdet_hpu.ops import anchors
from efficientdet_hpu.ops import host_postprocess
from efficientdet_hpu.ops import postprocess
from efficientdet_hpu.serving import detector
from efficientdet_hpu.serving import export
from efficientdet_hpu.serving import model_spec
from efficientdet_hpu.checkpoints import checkpoints
from efficientdet_hpu.engine import checkpoint_eval
from efficientdet_hpu.engine import setup
from efficientdet_hpu.checkpoints import warm_start

tf1 = tf.compat.v1

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SHARED = os.path.join(REPO, '..', 'shared', 'automl_ckpt')
LEVELS = range(3, 8)
CODE_TOLERANCE = 5e-4
SCORE_TOLERANCE = 1e-4
BOX_TOLERANCE_PX = 0.05
BOX_TOLERANCE_OF_SIZE = 2e-5

pytestmark = [pytest.mark.skipif(not os.path.isdir(SHARED),
                                 reason='automl reference checkpoint not at %s' % SHARED),
              pytest.mark.slow]  # The full-size D0 network, evaluated, warm-started, exported.


def _load_reference():
    with open(os.path.join(SHARED, 'expected.json')) as f:
        meta = json.load(f)
    return meta, np.load(os.path.join(SHARED, 'expected.npz'))


META, EXPECTED = _load_reference() if os.path.isdir(SHARED) else ({'images': []}, {})
FILES = [os.path.join(SHARED, image['file']) for image in META['images']]


def _encoded(path):
    with open(path, 'rb') as f:
        return f.read()


def _flat_anchor_index(level):
    """Our flat anchor index (level, y, x, anchor) of automl's stored anchors of `level`."""
    return (EXPECTED['anchor_indices_l%d' % level]
            + META['anchor_layout']['global_index_offset'][str(level)])


def assert_codes_match(class_logits, box_codes, image):
    """class_logits [N, 90], box_codes [N, 4] of one image against automl's at its anchors."""
    for level in LEVELS:
        index = _flat_anchor_index(level)
        np.testing.assert_allclose(class_logits[index], EXPECTED['cls_logits_l%d' % level][image],
                                   rtol=0, atol=CODE_TOLERANCE, err_msg='level %d' % level)
        np.testing.assert_allclose(box_codes[index], EXPECTED['box_codes_l%d' % level][image],
                                   rtol=0, atol=CODE_TOLERANCE, err_msg='level %d' % level)


def assert_detections_match(boxes, scores, classes, path, image):
    """One image's detections (rows beyond its count ignored) against automl's `path`."""
    count = int(EXPECTED['%s_num_valid' % path][image])
    want_boxes = EXPECTED['%s_boxes' % path][image][:count]
    size = np.maximum(want_boxes[:, 2] - want_boxes[:, 0], want_boxes[:, 3] - want_boxes[:, 1])
    assert len(scores) >= count
    np.testing.assert_array_equal(np.asarray(classes)[:count],
                                  EXPECTED['%s_classes' % path][image][:count])
    np.testing.assert_allclose(scores[:count], EXPECTED['%s_scores' % path][image][:count],
                               rtol=0, atol=SCORE_TOLERANCE)
    error = np.abs(np.asarray(boxes)[:count] - want_boxes).max(axis=1)
    allowed = BOX_TOLERANCE_PX + BOX_TOLERANCE_OF_SIZE * np.abs(size)
    assert (error <= allowed).all(), (path, image, error.max(), np.argmax(error - allowed))


@pytest.fixture(scope='module')
def automl_model_dir(tmp_path_factory):
    """A copy of the reference as automl leaves a model_dir: its config.yaml, checkpoint."""
    model_dir = str(tmp_path_factory.mktemp('automl_model_dir'))
    for name in os.listdir(SHARED):
        if name.startswith(('model.ckpt', 'checkpoint')):
            shutil.copy(os.path.join(SHARED, name), model_dir)
    shutil.copy(os.path.join(SHARED, 'automl_config.yaml'), os.path.join(model_dir, 'config.yaml'))
    return model_dir


@pytest.fixture(scope='module')
def model_dir_outputs(automl_model_dir):
    """`predict --model_dir` on automl's model_dir: the frozen graph of serving/detector.py,
    fed the image files' bytes; raw outputs and (per-class path) detections per image."""
    spec = model_spec.load_model_spec(automl_model_dir)
    predictor = detector.GraphPredictor(spec, batch_size=1, encoded=True)
    try:
        return spec, [predictor.predict(np.array([_encoded(path)], dtype=object),
                                        detector.OUTPUT_KEYS + detector.RAW_KEYS)
                      for path in FILES]
    finally:
        predictor.close()


def test_automl_config_yaml_is_understood(automl_model_dir, model_dir_outputs):
    spec, _ = model_dir_outputs
    config = spec.config
    assert (config.name, config.num_classes, config.image_size, config.backbone_name) == (
        'efficientdet-d0', 90, 512, 'efficientnet-b0')
    assert config.survival_prob is None and config.fpn_weight_method == 'fastattn'
    # automl's nms_configs with the fallbacks its nms() applies (expected.json nms_effective).
    effective = META['nms_effective']
    assert config.nms_configs.as_dict() == dict(
        method=effective['method'], iou_thresh=effective['iou_thresh'],
        score_thresh=effective['score_thresh'], sigma=effective['sigma'],
        max_nms_inputs=effective['max_nms_inputs'],
        max_output_size=effective['max_output_size'], class_agnostic=False,
        clip_to_image=False)
    assert spec.checkpoint == os.path.join(automl_model_dir, 'model.ckpt')
    assert checkpoints.checkpoint_step(spec.checkpoint) == 40  # Its global_step: no -STEP.


def test_decoded_pixels_and_resized_size_are_automls():
    for index, path in enumerate(FILES):
        pixels = record_parser.decode_image(_encoded(path)).numpy()
        assert hashlib.sha256(pixels.tobytes()).hexdigest() == (
            META['images'][index]['decoded_rgb_sha256'])
        height, width = pixels.shape[:2]
        window = dataloader.fit_window(height, width, (512, 512))
        assert window.resized_size.numpy().tolist() == EXPECTED['scaled_hw'][index].tolist()
        assert np.float32(1.0 / window.scale.numpy()) == EXPECTED['image_scale_to_original'][index]
    assert EXPECTED['scaled_hw'][1].tolist() == [341, 512]  # Truncated (rounding: 342).


def test_anchor_boxes_are_automls():
    boxes = anchors.generate_anchor_boxes(512, 512, 3, 7, 3, [1.0, 2.0, 0.5], 4.0)
    assert len(boxes) == META['anchor_layout']['num_anchors_total']
    for level in LEVELS:
        np.testing.assert_array_equal(boxes[_flat_anchor_index(level)],
                                      EXPECTED['anchor_boxes_l%d' % level])


def test_model_dir_outputs_match_automl_at_every_level(model_dir_outputs):
    _, outputs = model_dir_outputs
    for image, output in enumerate(outputs):
        assert output['image_sizes'][0].tolist() == EXPECTED['image_hw'][image].tolist()
        assert output['image_scales'][0] == EXPECTED['image_scale_to_original'][image]
        assert_codes_match(output['class_logits'][0], output['box_codes'][0], image)


def test_model_dir_detections_are_automls_per_class_eval(model_dir_outputs):
    _, outputs = model_dir_outputs
    for image, output in enumerate(outputs):
        assert_detections_match(output['detection_boxes'][0], output['detection_scores'][0],
                                output['detection_classes'][0], 'perclass', image)


@pytest.mark.parametrize('path, settings', [
    ('serving', dict(max_nms_inputs=0, class_agnostic=True)),
    ('perclass', dict(max_nms_inputs=0, class_agnostic=False)),
    ('perclass5k', dict(max_nms_inputs=5000, class_agnostic=False))])
def test_both_postprocessing_paths_in_graph_and_on_host(model_dir_outputs, path, settings):
    spec, outputs = model_dir_outputs
    nms = dict(hparams_config.nms_settings(spec.config), **settings)
    anchor_boxes = anchors.generate_anchor_boxes(
        512, 512, **hparams_config.anchor_settings(spec.config))
    for image, output in enumerate(outputs):
        raw = [output[key] for key in detector.RAW_KEYS]
        rows, _ = postprocess.generate_detections(
            {3: raw[0][:, None]}, {3: raw[1][:, None]}, anchor_boxes, tf.zeros([1]),
            raw[2], raw[3], num_classes=90, network_size=(512, 512), **nms)
        rows = rows.numpy()[0]
        assert_detections_match(rows[:, 1:5], rows[:, 5], rows[:, 6].astype(int), path, image)
        boxes, scores, labels = host_postprocess.generate_detections(
            raw[0], raw[1], anchor_boxes, raw[2], raw[3], network_size=(512, 512), **nms)[0]
        assert_detections_match(boxes, scores, labels, path, image)


def _eval_options(model_dir, pattern):
    values = dict.fromkeys(RunOptions.names())
    values.update(mode='eval', model_name='efficientdet-d0', model_dir=model_dir, hparams='',
                  backbone_ckpt='', ckpt='', train_batch_size=1, eval_batch_size=1,
                  eval_samples=0, validation_file_pattern=pattern, num_examples_per_epoch=1,
                  iterations_per_loop=100, log_every_n_steps=100, cp_every_n_steps=1000,
                  keep_checkpoint_max=5, min_eval_interval=1, eval_timeout=0,
                  eval_after_training=False, use_fake_data=False, use_amp=False, use_xla=False,
                  deterministic=False, no_hpu=True, benchmark=False, benchmark_steps=1,
                  benchmark_warmup_steps=0, skip_bad_records=False, verbose=False)
    return RunOptions.from_values(values)


def test_eval_mode_on_automl_model_dir_gives_automls_detections(automl_model_dir, tmp_path):
    """--mode=eval's set-up (automl's config.yaml adopted) and prediction (det_model_fn in
    an Estimator over validation TFRecords holding the files' bytes as they are)."""
    pattern = str(tmp_path / 'val-00000-of-00001.tfrecord')
    with tf.io.TFRecordWriter(pattern) as writer:
        for index, path in enumerate(FILES):
            height, width = EXPECTED['image_hw'][index]
            writer.write(tfrecord_format.build_example(
                _encoded(path), height, width, index + 1, os.path.basename(path), [], [], [],
                [], []).SerializeToString())
    run = setup.prepare(_eval_options(automl_model_dir, pattern),
                            hparams_config.get_efficientdet_config('efficientdet-d0'), set())
    assert run.config.num_classes == 90 and run.config.nms_configs.method == 'gaussian'
    with open(os.path.join(automl_model_dir, 'config.yaml')) as f:
        assert '!!python/tuple' in f.read()  # automl's own file is left as it was.
    image_ids, rows, _ = checkpoint_eval.predict_shard(
        run, checkpoints.latest_checkpoint(automl_model_dir))
    assert image_ids.tolist() == [1, 2, 3]
    for image in range(3):
        mine = rows[rows[:, 0] == image + 1]
        assert_detections_match(mine[:, 1:5], mine[:, 5], mine[:, 6].astype(int), 'perclass',
                                image)


def test_ckpt_warm_start_loads_automls_weights_class_head_included():
    """--ckpt=<automl model_dir>: warm_start.apply sets every variable, the 90-way class head
    included, to automl's EMA value; the network then computes automl's outputs."""
    config = recipe.read_saved_config(os.path.join(SHARED, 'automl_config.yaml'))
    with tf.Graph().as_default():
        pixels = tf1.placeholder(tf.uint8, [None, None, 3])
        image, _, _ = dataloader.preprocess_for_eval(pixels, config)
        class_outputs, box_outputs = efficientdet_arch.build_model(image[None], config, False)
        variables = [v for v in tf1.global_variables() if v.op.name != 'global_step']
        _, skipped, problems = warm_start.plan_restore(
            tf.train.latest_checkpoint(SHARED), variables, allow_class_head_skip=True)
        assert skipped == [] and problems == []
        warm_start.apply(settings.finalize(config, settings.RunFacts(ckpt=SHARED)).runtime)
        logits = postprocess.flatten_levels(class_outputs, 90)[0]
        codes = postprocess.flatten_levels(box_outputs, 4)[0]
        with tf1.Session() as session:
            session.run(tf1.global_variables_initializer())
            for image, path in enumerate(FILES):
                decoded = record_parser.decode_image(_encoded(path))
                values = session.run((logits, codes), {pixels: session.run(decoded)})
                assert_codes_match(*values, image)


def test_a_re_initialised_automl_head_points_to_the_category_id_layout():
    hint = warm_start._layout_hint(os.path.join(SHARED, 'model.ckpt'))  # pylint: disable=W0212
    assert "automl's 90-way COCO head" in hint and '--label_layout=category_id' in hint


def test_export_gives_automls_serving_detections(automl_model_dir, tmp_path):
    """automl's export default, its serving path: one class-agnostic soft-NMS."""
    spec = model_spec.load_model_spec(automl_model_dir, hparams='nms_configs.class_agnostic=true')
    export_dir = export.export_saved_model(spec, str(tmp_path / 'saved_model'))
    serve = tf.saved_model.load(export_dir).signatures['serving_encoded']
    outputs = serve(encoded_images=tf.constant([_encoded(path) for path in FILES]))
    for image in range(len(FILES)):
        assert_detections_match(outputs['detection_boxes'][image].numpy(),
                                outputs['detection_scores'][image].numpy(),
                                outputs['detection_classes'][image].numpy(), 'serving', image)
