"""Tests for the data doctor (dataset/doctor*.py) and for aspect ratios beyond automl's three.

Geometry is checked on paper: a box equal to an anchor, a 1:4 box against 1:1 / 2:1 / 1:2
anchors, an image resized by the recipe's rule; then the doctor against the anchor labeler's
own IoU, on hand-made and generated datasets, from TFRecords, as a CLI, and (slow) a tiny
training, evaluation and export with five aspect ratios, one of them an (x, y) pair.
"""
import json
import math
import os

import numpy as np
import pytest
import tensorflow as tf
import yaml

from efficientdet_hpu.config import hparams_config
from efficientdet_hpu.data import anchor_coverage as geometry
from efficientdet_hpu.data import annotated_boxes as doctor_data
from efficientdet_hpu.data import dataloader
from efficientdet_hpu.datatools import doctor
from efficientdet_hpu.datatools import doctor_advice
from efficientdet_hpu.datatools import synthetic_coco
from efficientdet_hpu.ops import anchors
from efficientdet_hpu.engine import coverage_check
from cli_runs import TINY_HPARAMS, assert_one_line_error, run_main, run_python, tiny_flags

# Square 128 px input, no jitter: the eval and training geometry coincide.
EXACT = ('image_size=128,min_level=3,max_level=5,anchor_scale=2.0,jitter_min=1.0,'
         'jitter_max=1.0')
# And one scale: 1:1 anchors of 16, 32 and 64 px at P3, P4 and P5 (centres 8 + 16 i at P4).
ONE_SCALE = EXACT + ',num_scales=1'


def _setup(hparams, model_name='efficientdet-d0'):
    config = hparams_config.get_efficientdet_config(model_name)
    config.override(hparams)
    return geometry.AnchorSetup.from_config(config)


# ----------------------------------------------------------------------------- geometry

def test_a_box_equal_to_an_anchor_has_iou_one():
    # P3 anchors are 8 x 8 (anchor_scale 1, one scale, ratio 1), centred at 4 + 8 i: the one
    # at row 1, column 2 is [8, 16, 16, 24].
    setup = _setup('image_size=64,min_level=3,max_level=4,num_scales=1,aspect_ratios=[1.0],'
                   'anchor_scale=1.0')
    best_iou, level, anchor = geometry.best_anchor_match([[8.0, 16.0, 16.0, 24.0]], setup)
    assert best_iou.tolist() == [1.0] and level.tolist() == [3] and anchor.tolist() == [0]


def test_a_1_to_4_box_against_the_default_ratios_worked_on_paper():
    # P3 base anchor 32 px (anchor_scale 4, one scale), centre (60, 60). The box is 64 wide
    # and 16 high (area 32**2) on that centre. Each ratio r gives an anchor 32*sqrt(r) wide
    # and 32/sqrt(r) high; the intersection is min(widths) * min(heights):
    #   r = 1: 32 * 16 = 512,           IoU = 512 / (2048 - 512)       = 1/3
    #   r = 2: 32*sqrt(2) * 16,         IoU = sqrt(2) / (4 - sqrt(2))  ~ 0.547
    #   r = 1/2: 32/sqrt(2) * 16,       IoU = sqrt(2) / (8 - sqrt(2))  ~ 0.215
    # P4 anchors (64 px base, centres at 8 + 16 i: 56 is the nearest) overlap it less.
    box = [[52.0, 28.0, 68.0, 92.0]]
    base = 'image_size=128,min_level=3,max_level=4,num_scales=1,anchor_scale=4.0,'
    root2 = math.sqrt(2.0)
    for ratio, expected in ((1.0, 1.0 / 3.0), (2.0, root2 / (4 - root2)),
                            (0.5, root2 / (8 - root2))):
        best_iou, level, _ = geometry.best_anchor_match(
            box, _setup(base + 'aspect_ratios=[%s]' % ratio))
        np.testing.assert_allclose(best_iou, [expected], rtol=1e-5)
        assert level.tolist() == [3]
    best_iou, level, anchor = geometry.best_anchor_match(
        box, _setup(base + 'aspect_ratios=[1.0,2.0,0.5]'))
    np.testing.assert_allclose(best_iou, [root2 / (4 - root2)], rtol=1e-5)
    assert anchor.tolist() == [1]  # The 2:1 anchor: reaches 0.5, so the box gets a positive.
    # A 4:1 anchor of the same area is the box itself.
    best_iou, _, _ = geometry.best_anchor_match(box, _setup(base + 'aspect_ratios=[4.0]'))
    np.testing.assert_allclose(best_iou, [1.0], rtol=1e-6)


def test_an_image_resized_by_the_recipe_rule():
    # A 640 x 480 (w x h) image into 128 px: scale min(128/480, 128/640) = 0.2, resized to
    # 96 x 128 (h x w); the COCO box [x 100, y 50, w 200, h 100] lands at [10, 20, 30, 60].
    box_set = doctor_data.BoxSet(
        boxes=np.array([[50.0, 100.0, 150.0, 300.0], [400.0, 0.0, 470.0, 60.0]]),
        class_index=np.array([0, 0]), is_crowd=np.array([False, False]),
        image_index=np.array([0, 0]), image_sizes=np.array([[480, 640]]), class_names=['a'],
        source='hand')
    boxes, visible = geometry.place_boxes(box_set, (128, 128), [1.0, 1.5])
    np.testing.assert_allclose(boxes[0, 0], [10.0, 20.0, 30.0, 60.0], rtol=1e-6)
    # At multiplier 1.5: scale min(192/480, 192/640) = 0.3, the kept window is round(128 /
    # 0.3) = 427 px square, centred: offset floor((480 - 427) / 2) = 26, floor(213 / 2) = 106,
    # resized to round(427 * 0.3) = 128. Network px = (px - offset) * 128 / 427, clipped.
    factor = 128.0 / 427.0
    np.testing.assert_allclose(boxes[1, 0], [24 * factor, 0.0, 124 * factor, 194 * factor],
                               rtol=1e-5)
    # The second box (y 400..470, x 0..60) falls outside that window: training drops it.
    assert visible.tolist() == [[True, True], [True, False]]


def test_fit_windows_is_dataloaders_fit_window():
    sizes = np.array([[480, 640], [333, 200], [1000, 17]])
    offset, crop, resized = geometry.fit_windows(sizes, (128, 96), [0.8, 1.3])
    for row, (height, width) in enumerate(sizes):
        for column, multiplier in enumerate([0.8, 1.3]):
            window = dataloader.fit_window(int(height), int(width), (128, 96), multiplier,
                                           (0.5, 0.5))
            assert offset[row, column].tolist() == window.crop_offset.numpy().tolist()
            assert crop[row, column].tolist() == window.crop_size.numpy().tolist()
            assert resized[row, column].tolist() == window.resized_size.numpy().tolist()


def test_placed_boxes_are_the_input_pipelines_boxes():
    rng = np.random.default_rng(1)
    sizes = np.array([[480, 640], [333, 200]])
    corner = rng.uniform(0, 0.8, size=(6, 2))
    normalized = np.concatenate([corner, corner + rng.uniform(0.01, 0.2, (6, 2))], axis=1)
    image_index = np.array([0, 0, 0, 1, 1, 1])
    box_set = doctor_data.BoxSet(normalized * np.tile(sizes[image_index], 2), np.zeros(6, int),
                                 np.zeros(6, bool), image_index, sizes, ['a'], 'hand')
    multipliers = [0.7, 1.0, 1.6]
    placed, visible = geometry.place_boxes(box_set, (128, 96), multipliers)
    for image, (height, width) in enumerate(sizes):
        rows = image_index == image
        for k, multiplier in enumerate(multipliers):
            window = dataloader.fit_window(int(height), int(width), (128, 96), multiplier,
                                           (0.5, 0.5))
            boxes, kept = dataloader.boxes_to_network_pixels(
                tf.constant(normalized[rows], tf.float32), tf.constant([height, width]), window)
            np.testing.assert_allclose(placed[k, rows], boxes.numpy(), rtol=1e-5, atol=1e-4)
            assert visible[k, rows].tolist() == kept.numpy().tolist()


def test_best_iou_is_the_labelers_best_iou():
    setup = _setup(EXACT + ',aspect_ratios=[1.0,2.0,0.5,[1.5,0.4]]')
    rng = np.random.default_rng(0)
    corner = rng.uniform(-10, 130, size=(300, 2))
    boxes = np.concatenate([corner, corner + np.exp(rng.uniform(0.5, 5.0, (300, 2)))], 1)
    best_iou, _, _ = geometry.best_anchor_match(boxes, setup)
    height, width = setup.output_size
    labeler = anchors.AnchorLabeler(
        anchors.generate_anchor_boxes(height, width, **setup.anchor_settings()),
        anchors.level_shapes(height, width, setup.min_level, setup.max_level),
        setup.anchors_per_location)
    ious = labeler._level_ious(tf.constant(boxes, tf.float32))  # pylint: disable=protected-access
    expected = np.max(np.concatenate([iou.numpy() for iou in ious], axis=1), axis=1)
    np.testing.assert_allclose(best_iou, expected, rtol=1e-5, atol=1e-7)


# ----------------------------------------------------------------------------- aspect ratios

def test_aspect_ratios_accept_more_ratios_and_xy_pairs():
    config = hparams_config.get_efficientdet_config()
    config.override('aspect_ratios=[1.0,2.0,0.5,4.0,[1.4,0.7]]')
    assert config.aspect_ratios == [1.0, 2.0, 0.5, 4.0, [1.4, 0.7]]
    assert hparams_config.anchors_per_location(config) == 15
    assert hparams_config.Config.from_yaml(config.to_yaml()) == config
    config.override('aspect_ratios=1.0*4.0*0.25')  # automl's list syntax.
    assert config.aspect_ratios == [1.0, 4.0, 0.25]
    for bad in ('aspect_ratios=[1.0,0.0]', 'aspect_ratios=[[1.0,2.0,3.0]]',
                'aspect_ratios=[[1.0,-1.0]]'):
        with pytest.raises(hparams_config.ConfigError, match='aspect_ratios entries must be'):
            config.override(bad)


def test_an_xy_pair_scales_width_and_height():
    # (x, y) = (2, 0.5) on an 8 px base: 16 wide, 4 high, the same anchor as ratio 4.
    kwargs = dict(image_height=16, image_width=16, min_level=3, max_level=3, num_scales=1,
                  anchor_scale=1.0)
    pair = anchors.generate_anchor_boxes(aspect_ratios=[(2.0, 0.5)], **kwargs)
    assert pair[0].tolist() == [2.0, -4.0, 6.0, 12.0]
    assert np.array_equal(pair, anchors.generate_anchor_boxes(aspect_ratios=[4.0], **kwargs))
    wide = anchors.generate_anchor_boxes(aspect_ratios=[[1.5, 0.5]], **kwargs)
    assert wide[0].tolist() == [2.0, -2.0, 6.0, 10.0]


# ----------------------------------------------------------------------------- the doctor

def _write_coco(path, images, annotations, categories):
    with open(path, 'w') as handle:
        json.dump({'images': images, 'annotations': annotations, 'categories': categories},
                  handle)
    return str(path)


@pytest.fixture
def square_and_stick(tmp_path):
    """128 px images for ONE_SCALE. Class 'square' (id 5): 32 px boxes equal to P4 anchors.
    Class 'stick' (id 9): 96 x 16 boxes (1:6) centred on a P4 centre. Its best default anchor
    is P4's 2:1 (45.25 x 22.63): IoU 45.25*16 / (1536 + 1024 - 45.25*16) = 0.39; P5's 2:1
    (90.5 x 45.25) gives 1448 / 4184 = 0.35. P4's 3:1 (55.43 x 18.48) covers its height:
    IoU 55.43*16 / (1536 + 1024 - 55.43*16) = 0.53; a 4:1 (64 x 16), 5:1 or 6:1 P4 anchor
    lies inside it: IoU 1024 / 1536 = 2/3."""
    images = [{'id': i, 'file_name': '%d.jpg' % i, 'width': 128, 'height': 128}
              for i in range(1, 5)]
    images.append({'id': 9, 'file_name': 'empty.jpg', 'width': 128, 'height': 128})
    annotations = []
    for image_id in range(1, 5):
        for top in (8, 40, 72):  # Box centres (24, 24), (56, 24), (88, 24): P4 centres.
            annotations.append({'id': len(annotations) + 1, 'image_id': image_id,
                                'category_id': 5, 'bbox': [8, top, 32, 32], 'iscrowd': 0})
        annotations.append({'id': len(annotations) + 1, 'image_id': image_id,
                            'category_id': 9, 'bbox': [8, 48, 96, 16], 'iscrowd': 0})
    annotations.append({'id': 99, 'image_id': 1, 'category_id': 9, 'bbox': [0, 0, 128, 128],
                        'iscrowd': 1})
    return _write_coco(tmp_path / 'instances.json', images, annotations,
                       [{'id': 9, 'name': 'stick'}, {'id': 5, 'name': 'square'}])


def test_doctor_report_names_the_stick_class_and_fixes_it(square_and_stick):
    box_set = doctor.load_boxes(square_and_stick)
    assert box_set.class_names == ['square', 'stick']  # Ascending category id.
    config = hparams_config.get_efficientdet_config()
    config.override(ONE_SCALE)
    report, _, advised = doctor.diagnose(box_set, config, hparams=ONE_SCALE)
    square, stick = report['classes']
    assert (square['boxes'], square['images'], square['crowd']) == (12, 4, 0)
    assert (stick['boxes'], stick['images'], stick['crowd']) == (5, 4, 1)
    assert report['dataset']['negatives'] == 1
    assert square['size_px'] == [32.0, 32.0, 32.0] and square['aspect'] == [1.0, 1.0, 1.0]
    assert square['median_best_iou'] == 1.0 and square['coverage'] == 1.0
    assert square['levels'] == {'P3': 0.0, 'P4': 1.0, 'P5': 0.0}
    assert stick['median_best_iou'] == round(724.0773 / 1835.9227, 4)  # Reported to 1e-4.
    assert stick['coverage'] == 0.0 and report['weak_classes'] == ['stick']
    ratios = report['advice'][0]
    assert ratios['key'] == 'aspect_ratios' and ratios['changed']
    # 3:1 to 6:1 all lift every stick over 0.5; the search prefers the ratio nearest 1.
    assert ratios['after'] == [1.0, 2.0, 0.5, 3.0] and ratios['coverage'] == [1.0, 1.0, 1.0]
    assert [step['changed'] for step in report['advice']] == [True, False, False]
    assert list(advised.aspect_ratios) == [1.0, 2.0, 0.5, 3.0]
    assert 'stick' in doctor.doctor_report.format_text(report)


def test_low_coverage_warnings_name_the_class_and_the_command(square_and_stick):
    config = hparams_config.get_efficientdet_config()
    config.override(ONE_SCALE)
    lines = coverage_check.low_coverage_warnings(config, square_and_stick, hparams='recipe.yaml')
    assert len(lines) == 1
    assert "class 'stick'" in lines[0] and 'only 0%' in lines[0]
    assert ('python -m dataset.doctor --annotations=%s --hparams=recipe.yaml'
            % square_and_stick) in lines[0]
    config.override('aspect_ratios=[1.0,6.0,0.1667]')
    assert coverage_check.low_coverage_warnings(config, square_and_stick) == []


def test_written_recipe_is_a_valid_recipe_with_the_advice(tmp_path):
    recipe = tmp_path / 'recipe.yaml'
    recipe.write_text('mode: train_and_eval\ntrain_batch_size: 8\nimage_size: 128\n'
                      'min_level: 3\nmax_level: 5\n')
    out = doctor.write_recipe(str(tmp_path / 'out.yaml'), '%s,nms_configs.iou_thresh=0.6'
                              % recipe, 'efficientdet-d0', {'aspect_ratios': [1.0, 2.0, 0.5, 4.0]})
    with open(out) as handle:
        content = yaml.safe_load(handle)
    assert content['mode'] == 'train_and_eval' and content['train_batch_size'] == 8
    assert content['aspect_ratios'] == [1.0, 2.0, 0.5, 4.0]
    assert content['nms_configs'] == {'iou_thresh': 0.6}
    config = doctor.recipe_lib.resolve('efficientdet-d0', out)
    assert config.aspect_ratios == [1.0, 2.0, 0.5, 4.0] and config.image_size == 128


def test_override_string_in_automl_syntax():
    assert doctor_advice.override_string({'aspect_ratios': [1.0, 2.0, 0.5, 4.0, 0.25],
                                          'anchor_scale': 2.5}) == (
        'aspect_ratios=1.0*2.0*0.5*4.0*0.25,anchor_scale=2.5')
    text = doctor_advice.override_string({'aspect_ratios': [1.0, [1.4, 0.7]]})
    assert hparams_config.parse_override_string(text) == {'aspect_ratios': [1.0, [1.4, 0.7]]}


def test_generated_elongated_class_is_the_weakest_and_the_advice_lifts_it(tmp_path):
    paths = synthetic_coco.generate(str(tmp_path), num_train=60, num_val=0, seed=4,
                                    elongated=True)
    box_set = doctor.load_boxes(paths['train_annotations'])
    assert box_set.class_names[3] == 'bar'  # Category id 64, between 42 and 90.
    config = doctor.recipe_lib.resolve('efficientdet-d0', 'configs/demo.yaml')
    report, _, _ = doctor.diagnose(box_set, config, advise=('aspect_ratios',))
    rows = {row['name']: row for row in report['classes']}
    bar = rows.pop('bar')
    assert min(row['aspect'][0] for row in rows.values()) > 0.4
    assert bar['aspect'][0] < 0.34 and bar['aspect'][2] > 3.0  # Lying and standing bars.
    assert bar['coverage'] < min(row['coverage'] for row in rows.values()) - 0.05
    assert 'bar' in report['weak_classes'] + report['lagging_classes']
    names = [row['name'] for row in report['classes']]
    after = report['advice'][0]['coverage'][names.index('bar')]
    assert after > bar['coverage'] + 0.1
    added = report['advice'][0]['after'][3:]
    assert any(r > 2.0 for r in added) and any(r < 0.5 for r in added)  # Lying and standing.


def test_records_give_the_same_boxes_as_the_json(tiny_dataset):
    from_json = doctor.load_boxes(tiny_dataset['val_json'])
    from_records = doctor.load_boxes(file_pattern=tiny_dataset['val_pattern'])
    assert from_records.class_names == from_json.class_names

    def rows(box_set):
        sizes = box_set.image_sizes[box_set.image_index]
        table = np.concatenate([sizes, box_set.boxes, box_set.class_index[:, None]], axis=1)
        return table[np.lexsort(table.T[::-1])]
    assert len(from_json.image_sizes) == len(from_records.image_sizes)
    np.testing.assert_allclose(rows(from_records), rows(from_json), atol=1e-3)


@pytest.mark.slow  # dataset.doctor in a process of its own (TensorFlow).
def test_cli_writes_report_plot_and_recipe(square_and_stick, tmp_path):
    out = tmp_path / 'out'
    out.mkdir()
    result = run_python(['-m', 'dataset.doctor', '--annotations=%s' % square_and_stick,
                         '--hparams=%s' % ONE_SCALE, '--report_json=%s' % (out / 'r.json'),
                         '--plot=%s' % (out / 'p.png'), '--write_recipe=%s' % (out / 'a.yaml')],
                        timeout=300)
    assert result.returncode == 0, result.stdout[-3000:]
    assert 'Weak (coverage under 50%): stick 0%' in result.stdout
    report = json.loads((out / 'r.json').read_text())
    assert report['weak_classes'] == ['stick'] and report['advised_overrides']
    assert (out / 'p.png').read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'
    config = doctor.recipe_lib.resolve('efficientdet-d0', str(out / 'a.yaml'))
    assert len(config.aspect_ratios) > 3


@pytest.mark.slow  # dataset.doctor in a process of its own (TensorFlow).
def test_cli_user_errors_are_clear(tmp_path):
    result = run_python(['-m', 'dataset.doctor', '--annotations=%s' % (tmp_path / 'no.json')],
                        timeout=300)
    assert_one_line_error(result, '--annotations=%s does not exist' % (tmp_path / 'no.json'))


# ----------------------------------------------------------------------------- end to end

@pytest.mark.slow
def test_train_eval_and_export_with_five_aspect_ratios_and_a_pair(tiny_dataset, tmp_path):
    model_dir = str(tmp_path / 'run')
    hparams = TINY_HPARAMS + ',aspect_ratios=[1.0,2.0,0.5,4.0,[0.5,2.0]]'
    result = run_main(tiny_flags(tiny_dataset, model_dir, '--mode=train_and_eval',
                                 '--num_epochs=1', hparams=hparams))
    assert result.returncode == 0, result.stdout[-5000:]
    assert 'Average Precision  (AP) @[ IoU=0.50:0.95' in result.stdout
    with open(os.path.join(model_dir, 'config.yaml')) as handle:
        assert yaml.safe_load(handle)['aspect_ratios'] == [1.0, 2.0, 0.5, 4.0, [0.5, 2.0]]
    export_dir = str(tmp_path / 'saved_model')
    result = run_python(['inference.py', 'export', '--model_dir=%s' % model_dir,
                         '--export_dir=%s' % export_dir])
    assert result.returncode == 0, result.stdout[-5000:]
    model = tf.saved_model.load(export_dir)
    outputs = model.signatures['serving_default'](images=tf.zeros([1, 100, 140, 3], tf.uint8))
    assert outputs['detection_boxes'].shape[-1] == 4
    assert int(outputs['num_detections'][0]) <= outputs['detection_boxes'].shape[1]
