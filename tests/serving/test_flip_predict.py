"""serving/flip_predict.py: the two views' fusion worked out by hand, the mirror's pixel
convention against a detector whose answer is known, and the real tiny model through
FlipPredictor (flip-equivariant) and `inference.py predict --tta` in tiles."""
import io
import json
import os

import numpy as np
import pytest
from PIL import Image

from efficientdet_hpu.serving import detector
from efficientdet_hpu.serving import flip_predict
from cli_runs import run_python


def test_two_views_that_agree_fuse_to_their_weighted_box_and_mean_score():
    plain = (np.array([[10., 10., 50., 50.]]), np.array([0.8]), np.array([1]))
    flipped = (np.array([[12., 14., 52., 54.]]), np.array([0.4]), np.array([1]))
    boxes, scores, classes = flip_predict.fuse([plain, flipped])
    # IoU 0.68 > 0.55: one box, (0.8 b1 + 0.4 b2) / 1.2, score (0.8 + 0.4) / 2.
    np.testing.assert_allclose(boxes, [[32 / 3., 34 / 3., 152 / 3., 154 / 3.]], rtol=1e-6)
    np.testing.assert_allclose(scores, [0.6], rtol=1e-6)
    assert classes.tolist() == [1]


def test_a_box_one_view_finds_keeps_half_its_score_and_ranks_after_agreement():
    plain = (np.array([[0., 0., 10., 10.], [100., 100., 120., 120.], [0., 0., 10., 10.]]),
             np.array([0.9, 0.5, 0.7]), np.array([1, 1, 2]))
    flipped = (np.array([[100., 100., 120., 120.]]), np.array([0.5]), np.array([1]))
    boxes, scores, classes = flip_predict.fuse([plain, flipped])
    # The class-1 pair agrees (0.5); the lone class-1 box halves to 0.45; class 2's box is
    # not fused with class 1's though it is the same box: 0.35.
    np.testing.assert_allclose(scores, [0.5, 0.45, 0.35], rtol=1e-6)
    assert classes.tolist() == [1, 1, 2]
    np.testing.assert_allclose(boxes, [[100, 100, 120, 120], [0, 0, 10, 10], [0, 0, 10, 10]])
    # Under the IoU threshold: two boxes, each half its score; a cap keeps the best.
    apart = flip_predict.fuse([(np.array([[0., 0., 10., 10.]]), np.array([0.6]), [3]),
                               (np.array([[0., 5., 10., 15.]]), np.array([0.4]), [3])])
    np.testing.assert_allclose(apart[1], [0.3, 0.2], rtol=1e-6)
    assert len(flip_predict.fuse([plain, flipped], max_detections=2)[1]) == 2
    empty = flip_predict.fuse([(np.zeros((0, 4)), np.zeros(0), np.zeros(0))] * 2)
    assert [part.shape for part in empty] == [(0, 4), (0,), (0,)]


def test_each_view_votes_once_so_soft_nms_neighbours_stay_apart():
    """The model's soft-NMS keeps overlapping lower-scored boxes of one object: one view alone
    comes back unchanged, and with two views the other view's box joins the best of them."""
    plain = (np.array([[10., 10., 50., 50.], [12., 10., 52., 50.]]), np.array([0.8, 0.3]),
             np.array([1, 1]))
    alone = flip_predict.fuse([plain])
    np.testing.assert_array_equal(alone[0], plain[0])  # Exactly: a cluster of one is its box.
    np.testing.assert_allclose(alone[1], plain[1], rtol=1e-6)
    flipped = (np.array([[10., 12., 50., 52.]]), np.array([0.6]), np.array([1]))
    boxes, scores, _ = flip_predict.fuse([plain, flipped])
    # (0.8 + 0.6) / 2 with the box (0.8 b1 + 0.6 b3) / 1.4; the neighbour 0.3 / 2 alone.
    np.testing.assert_allclose(scores, [0.7, 0.15], rtol=1e-6)
    np.testing.assert_allclose(boxes, [[10, 10 + 1.2 / 1.4, 50, 50 + 1.2 / 1.4],
                                       [12, 10, 52, 50]], rtol=1e-6)


class _BrightBox:
    """A detector that knows the answer: the box around the pixels brighter than 128, as the
    predictors give boxes (input pixels, edges: a pixel column x spans x to x + 1)."""

    def predict(self, images):
        out = {'detection_boxes': np.zeros((len(images), 3, 4), np.float32),
               'detection_scores': np.zeros((len(images), 3), np.float32),
               'detection_classes': np.zeros((len(images), 3), np.int64),
               'num_detections': np.ones(len(images), np.int32)}
        for index, image in enumerate(images):
            rows, cols = np.nonzero(image[..., 0] > 128)
            out['detection_boxes'][index, 0] = [rows.min(), cols.min(), rows.max() + 1,
                                                cols.max() + 1]
            out['detection_scores'][index, 0] = 0.9
            out['detection_classes'][index, 0] = 4
        return out

    def close(self):
        pass


def test_the_mirrored_view_lands_on_the_same_pixels():
    images = np.zeros((2, 40, 64, 3), np.uint8)
    images[0, 5:15, 3:20] = 255  # Off centre: a mirror off by a pixel would move it.
    images[1, 20:30, 50:64] = 255  # Against the right edge.
    out = flip_predict.FlipPredictor(_BrightBox()).predict(images)
    assert out['num_detections'].tolist() == [1, 1]
    np.testing.assert_allclose(out['detection_boxes'][:, 0], [[5, 3, 15, 20], [20, 50, 30, 64]],
                               atol=1e-4)  # The weighted mean's rounding, not a pixel.
    np.testing.assert_allclose(out['detection_scores'][:, 0], [0.9, 0.9], rtol=1e-6)
    assert out['detection_classes'][:, 0].tolist() == [4, 4]


def _val_image(tiny_dataset):
    with open(tiny_dataset['val_json']) as stream:
        photo = json.load(stream)['images'][0]
    path = os.path.join(tiny_dataset['root'], 'val', photo['file_name'])
    return path, np.asarray(Image.open(path).convert('RGB'))


def test_the_tiny_model_with_flips_is_flip_equivariant(tiny_export, tiny_dataset):
    """The fused views of a mirrored photo are the fused views of the photo, mirrored: the
    views swap, and the fusion treats them alike. Compared on the 20 best detections, each
    found among the other's: the barely trained model gives many equal low scores, whose
    order (and which of them the cap keeps) float rounding decides."""
    predictor = flip_predict.FlipPredictor(
        detector.SavedModelPredictor(tiny_export['export_dir']))
    _, image = _val_image(tiny_dataset)
    direct = predictor.predict(image[None])
    mirrored = predictor.predict(np.ascontiguousarray(image[None, :, ::-1]))
    count = int(direct['num_detections'][0])
    assert count == int(mirrored['num_detections'][0]) > 20
    back = flip_predict.mirror(mirrored['detection_boxes'][0, :count], image.shape[1])
    for index in range(20):  # Best first.
        box, score = direct['detection_boxes'][0, index], direct['detection_scores'][0, index]
        same = ((np.abs(back - box).max(axis=1) < 1e-3)
                & (np.abs(mirrored['detection_scores'][0, :count] - score) < 1e-5)
                & (mirrored['detection_classes'][0, :count]
                   == direct['detection_classes'][0, index]))
        assert same.any(), (index, box, score)
    plain = detector.SavedModelPredictor(tiny_export['export_dir']).predict(image[None])
    assert not np.allclose(np.sort(plain['detection_scores'][0])[-count:],
                           np.sort(direct['detection_scores'][0, :count]))


def test_predict_with_tta_in_tiles_scores_the_photo(tiny_trained_run, tiny_dataset, tmp_path):
    path, _ = _val_image(tiny_dataset)
    metrics = {}
    for name, extra in (('plain', []), ('tta', ['--tta'])):
        result = run_python(['inference.py', 'predict', '--model_dir=%s' % tiny_trained_run,
                             '--input=%s' % path, '--output_dir=%s' % (tmp_path / name),
                             '--tile_size=64', '--tile_overlap=8',
                             '--annotations_file=%s' % tiny_dataset['val_json']] + extra)
        assert result.returncode == 0, result.stdout[-5000:]
        metrics[name] = json.loads((tmp_path / name / 'metrics.json').read_text())
    assert metrics['tta']['photos'] == 1 and metrics['tta']['detections'] > 0
    assert 0 <= metrics['tta']['AP'] <= 1
    assert metrics['tta'] != metrics['plain']  # The views were fused, not one passed on.
