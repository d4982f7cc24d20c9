"""Tile geometry and the sliver rule, worked by hand (data/tiling.py), and the converter's
--tile_size on a photo with those boxes."""
import json
import sys

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

from cli_runs import run_process
from coco_cases import write_photo_of_trees
from efficientdet_hpu.data import tfrecord_format as fmt
from efficientdet_hpu.data import image_codec
from efficientdet_hpu.data import tiling
from efficientdet_hpu.datatools import create_coco_tfrecord
from efficientdet_hpu.evaluation import photo_eval
from efficientdet_hpu.serving import tiled_predict
from efficientdet_hpu.data.tiling import Window


def test_axis_starts_by_hand():
    # 400 px tiles, 100 px overlap: a stride of 300.
    assert tiling.axis_starts(1000, 400, 100) == [0, 300, 600]       # 600 + 400 = 1000 exactly
    assert tiling.axis_starts(1100, 400, 100) == [0, 300, 600, 700]  # one more, flush right
    assert tiling.axis_starts(300, 400, 100) == [0]                  # shorter than a tile
    assert tiling.axis_starts(400, 400, 0) == [0]
    assert tiling.axis_starts(801, 400, 0) == [0, 400, 401]
    with pytest.raises(ValueError, match='overlap < tile'):
        tiling.axis_starts(1000, 400, 400)


def test_windows_cover_the_photo_row_by_row():
    windows = tiling.tile_windows(300, 1100, 400, 100)
    assert windows == [Window(0, 0, 300, 400), Window(0, 300, 300, 700),
                       Window(0, 600, 300, 1000), Window(0, 700, 300, 1100)]


# The 300 x 1100 photo above; boxes [ymin, xmin, ymax, xmax] in photo pixels.
ON_SEAM = [100, 350, 140, 390]        # inside the 300..400 overlap of tiles 0 and 1
ACROSS_SEAM = [10, 380, 50, 440]      # 60 wide: 20 px (1/3) in tile 0, whole in tile 1
MOSTLY_IN = [200, 370, 220, 410]      # 40 wide: 30 px (3/4) in tile 0, whole in tile 1
ON_EDGE = [280, 1050, 300, 1100]      # touches the photo's right and bottom edges
THIN = [250, 100, 251.5, 180]         # 1.5 px tall: a sliver wherever it is
BOXES = np.array([ON_SEAM, ACROSS_SEAM, MOSTLY_IN, ON_EDGE, THIN], np.float64)


def test_sliver_rule_on_a_seam_an_edge_and_a_thin_box():
    windows = tiling.tile_windows(300, 1100, 400, 100)
    kept = [tiling.boxes_in_tile(BOXES, window) for window in windows]
    # Tile 0 (x 0..400): the seam box whole, MOSTLY_IN clipped at x = 400, ACROSS_SEAM (1/3
    # visible) and THIN (1.5 px) left out.
    np.testing.assert_array_equal(kept[0][1], [0, 2])
    np.testing.assert_array_equal(kept[0][0], [[100, 350, 140, 390], [200, 370, 220, 400]])
    # Tile 1 (x 300..700): the first three whole, shifted by its origin x0 = 300.
    np.testing.assert_array_equal(kept[1][1], [0, 1, 2])
    np.testing.assert_array_equal(kept[1][0], [[100, 50, 140, 90], [10, 80, 50, 140],
                                               [200, 70, 220, 110]])
    # Tile 2 (x 600..1000) holds nothing; tile 3 (x 700..1100) the edge box, at x 350..400.
    assert kept[2][1].size == 0 and kept[2][0].shape == (0, 4)
    np.testing.assert_array_equal(kept[3][1], [3])
    np.testing.assert_array_equal(kept[3][0], [[280, 350, 300, 400]])


def test_min_visible_is_inclusive_and_settable():
    window = Window(0, 0, 300, 400)
    half = np.array([[0, 380, 10, 420]], np.float64)  # exactly half inside
    assert tiling.boxes_in_tile(half, window)[1].tolist() == [0]
    assert tiling.boxes_in_tile(half, window, min_visible=0.51)[1].tolist() == []
    assert tiling.boxes_in_tile(BOXES, window, min_visible=0.3)[1].tolist() == [0, 1, 2]


def test_tile_boxes_map_back_to_the_photo():
    window = Window(0, 300, 300, 700)
    boxes, indices = tiling.boxes_in_tile(BOXES, window)
    np.testing.assert_array_equal(tiling.to_photo(boxes, window), BOXES[indices])


def test_converter_writes_tiles_with_their_origin_and_a_tiles_json(tmp_path, monkeypatch):
    # The 300 x 1100 photo above as a PNG whose pixel values encode x (so a tile's content
    # shows where it was cut), the five boxes in a COCO JSON, converted with 400 px tiles.
    pixels = np.zeros((300, 1100, 3), np.uint8)
    pixels[..., 0] = (np.arange(1100) // 5)[None, :]
    Image.fromarray(pixels).save(tmp_path / 'photo.png')
    annotations = [{'id': i + 1, 'image_id': 7, 'category_id': 3, 'iscrowd': 0,
                    'bbox': [b[1], b[0], b[3] - b[1], b[2] - b[0]]} for i, b in enumerate(BOXES)]
    (tmp_path / 'train.json').write_text(json.dumps({
        'images': [{'id': 7, 'file_name': 'photo.png', 'width': 1100, 'height': 300}],
        'annotations': annotations, 'categories': [{'id': 3, 'name': 'tree'}]}))
    decodes = []
    real_decode = image_codec._decode
    monkeypatch.setattr(image_codec, '_decode',
                        lambda *args: decodes.append(args[0]) or real_decode(*args))
    summary = create_coco_tfrecord.convert(
        str(tmp_path), str(tmp_path / 'train.json'), str(tmp_path / 'out' / 'train'),
        num_shards=1, show_progress=False, tile_size=400, tile_overlap=100)
    # The photo is decoded once for its four tiles (a 10k x 10k orthophoto: 1,600 tiles, 38 s
    # instead of about two hours of decoding it again per tile).
    assert decodes == [str(tmp_path / 'photo.png')]
    assert summary['tiles'] == {'tile_size': 400, 'overlap': 100, 'min_visible': 0.5,
                                'photos': 1, 'tiles': 4, 'boxes_in_no_tile': 1,  # THIN
                                'coco_json': str(tmp_path / 'out' / 'train-tiles.json')}
    examples = [tf.train.Example.FromString(r.numpy())
                for r in tf.data.TFRecordDataset(summary['shards'])]
    feature = [e.features.feature for e in examples]
    assert [(f[fmt.TILE_ORIGIN_Y].int64_list.value[0], f[fmt.TILE_ORIGIN_X].int64_list.value[0],
             f[fmt.TILE_SOURCE_ID].bytes_list.value[0]) for f in feature] == [
        (0, 0, b'7'), (0, 300, b'7'), (0, 600, b'7'), (0, 700, b'7')]
    assert [(f[fmt.IMAGE_WIDTH].int64_list.value[0], f[fmt.IMAGE_HEIGHT].int64_list.value[0])
            for f in feature] == [(400, 300)] * 4
    tile3 = tf.io.decode_jpeg(feature[3][fmt.IMAGE_ENCODED].bytes_list.value[0]).numpy()
    assert abs(int(tile3[150, 0, 0]) - 700 // 5) <= 2  # JPEG: within 2 levels of x = 700
    xmin = [list(f[fmt.OBJECT_BBOX_XMIN].float_list.value) for f in feature]
    np.testing.assert_allclose(xmin[1], [50 / 400, 80 / 400, 70 / 400], rtol=1e-6)
    tiles_json = json.loads((tmp_path / 'out' / 'train-tiles.json').read_text())
    assert [image['tile'] for image in tiles_json['images']][3] == {
        'source_id': 7, 'origin_y': 0, 'origin_x': 700}
    edge = [a for a in tiles_json['annotations'] if a['image_id'] == 4]
    np.testing.assert_allclose(edge[0]['bbox'], [350, 280, 50, 20], atol=1e-4)
    assert edge[0]['category_id'] == 3 and edge[0]['area'] == pytest.approx(1000)


class BrightBoxPredictor:
    """A stand-in network for the tiling glue: per tile, one detection, the bounding box of
    its bright pixels (class 1), scored 0.9 minus the tile's call order / 100; and a second,
    overlapping detection of the same class when `twins` (the model's own output, which the
    merge must leave alone)."""

    def __init__(self, twins=False):
        self.calls, self.twins = [], twins

    def predict(self, images):
        self.calls.append(images.shape)
        batch = len(images)
        boxes = np.zeros((batch, 2, 4), np.float32)
        scores = np.zeros((batch, 2), np.float32)
        counts = np.zeros(batch, np.int32)
        for index, image in enumerate(images):
            ys, xs = np.nonzero(image[..., 0] > 128)
            if ys.size:
                boxes[index, 0] = [ys.min(), xs.min(), ys.max() + 1, xs.max() + 1]
                scores[index, 0] = 0.9 - (len(self.calls) * 10 + index) / 100
                counts[index] = 1
                if self.twins:
                    boxes[index, 1] = boxes[index, 0] + [0, 1, 0, 1]
                    scores[index, 1], counts[index] = 0.1, 2
        return {'detection_boxes': boxes, 'detection_scores': scores,
                'detection_classes': np.ones((batch, 2), np.int64), 'num_detections': counts}

    def close(self):
        pass


def test_tiled_prediction_maps_back_and_merges_across_seams():
    # Square A (x 350..390) lies in the overlap of tiles 0 and 1, square B (x 900..950) in
    # that of tiles 2 and 3: each is seen whole by two tiles and kept once, by the first
    # tile's (higher) score; in photo pixels.
    photo = np.zeros((300, 1100, 3), np.uint8)
    photo[100:140, 350:390] = 255
    photo[20:60, 900:950] = 255
    stub = BrightBoxPredictor()
    outputs = tiled_predict.predict_tiled(stub, photo, tile_size=400, overlap=100,
                                          batch_size=3)
    assert stub.calls == [(3, 300, 400, 3), (1, 300, 400, 3)]
    assert outputs['num_detections'].tolist() == [2]
    np.testing.assert_array_equal(outputs['detection_boxes'][0],
                                  [[100, 350, 140, 390], [20, 900, 60, 950]])
    np.testing.assert_allclose(outputs['detection_scores'][0], [0.8, 0.78])
    # Two overlapping detections of one tile (the model's own output) both stay.
    twins = tiled_predict.predict_tiled(BrightBoxPredictor(twins=True), photo[:, :400], 400, 100)
    assert twins['num_detections'].tolist() == [2]
    # max_detections caps the merged list, best first.
    capped = tiled_predict.predict_tiled(BrightBoxPredictor(), photo, 400, 100,
                                         max_detections=1)
    np.testing.assert_array_equal(capped['detection_boxes'][0], [[100, 350, 140, 390]])


def test_photo_metrics_worked_by_hand(tmp_path):
    # Ground truth A [0, 0, 10, 10] and B [20, 20, 10, 10] (x, y, w, h) on photo.jpg; found:
    # A exactly (0.9), B shifted 4 px right (0.8): overlap 6 x 10 = 60, union 140, IoU 0.43.
    # At IoU >= 0.5 only A matches: precision 1 up to recall 0.5, so 51 of COCO's 101 recall
    # points: AP = AP50 = 51 / 101. At IoU 0.4 both match: recall 1.
    gt = tmp_path / 'photo.json'
    gt.write_text(json.dumps({
        'images': [{'id': 5, 'file_name': 'dir/photo.jpg', 'width': 100, 'height': 100}],
        'annotations': [{'id': 1, 'image_id': 5, 'category_id': 1, 'bbox': [0, 0, 10, 10],
                         'area': 100, 'iscrowd': 0},
                        {'id': 2, 'image_id': 5, 'category_id': 1, 'bbox': [20, 20, 10, 10],
                         'area': 100, 'iscrowd': 0}],
        'categories': [{'id': 1, 'name': 'tree'}]}))
    rows = [{'image_id': 1, 'file_name': 'photo.jpg', 'category_id': 1,
             'bbox': [0, 0, 10, 10], 'score': 0.9},
            {'image_id': 1, 'file_name': 'photo.jpg', 'category_id': 1,
             'bbox': [24, 20, 10, 10], 'score': 0.8}]
    metrics = photo_eval.evaluate(rows, str(gt))
    assert metrics['photos'] == 1 and metrics['annotations'] == 2 and metrics['detections'] == 2
    assert metrics['AP'] == pytest.approx(51 / 101) and metrics['AP50'] == pytest.approx(51 / 101)
    assert metrics['recall_iou0.4'] == pytest.approx(1.0)
    with pytest.raises(photo_eval.PhotoEvalError, match='none of the predicted photos'):
        photo_eval.evaluate([dict(rows[0], file_name='other.jpg')], str(gt))


def test_overlapping_pairs_by_hand():
    # One row of four 400 px tiles (x 0, 300, 600, 700): neighbours share 100 px and the
    # flush tile 3 (700..1100) also shares 300 px with tile 2, none with tile 1 (ends at 700).
    assert tiling.overlapping_pairs(300, 1100, 400, 100).tolist() == [[0, 1], [1, 2], [2, 3]]
    # A 2 x 2 grid: all four share the centre, diagonals included.
    assert tiling.overlapping_pairs(700, 700, 400, 100).tolist() == [
        [0, 1], [0, 2], [0, 3], [1, 2], [1, 3], [2, 3]]
    # No overlap: tiles that only touch share no pixel.
    assert tiling.overlapping_pairs(400, 800, 400, 0).tolist() == []
    assert tiling.overlapping_pairs(100, 100, 400, 100).shape == (0, 2)


def _greedy_over_all_pairs(boxes, scores, classes, tiles, iou_thresh):
    """The merge's definition, quadratic: every box against every later box."""
    from efficientdet_hpu.ops import host_postprocess
    order, kept = np.argsort(-scores, kind='stable'), []
    while order.size:
        best, rest = order[0], order[1:]
        kept.append(best)
        order = rest[~((host_postprocess.iou_one_to_many(boxes[best], boxes[rest]) > iou_thresh)
                       & (classes[rest] == classes[best]) & (tiles[rest] != tiles[best]))]
    return kept


def test_cross_tile_merge_equals_the_quadratic_definition_and_keeps_thousands():
    # 3,000 random boxes of two classes on a 1200 x 1500 photo, each inside the tile that
    # produced it: comparing only tiles that share pixels changes nothing, and nothing is
    # capped (the former cap of 1,000 silently cut a whole orthophoto's trees).
    rng = np.random.default_rng(0)
    height, width, tile, overlap = 1200, 1500, 320, 64
    windows = tiling.tile_windows(height, width, tile, overlap)
    tiles = rng.integers(0, len(windows), 3000)
    size = rng.uniform(8, 60, (3000, 2))
    low = np.array([[windows[t].y0, windows[t].x0] for t in tiles], np.float64)
    high = np.array([[windows[t].y1, windows[t].x1] for t in tiles], np.float64) - size
    corner = low + rng.uniform(0, 1, (3000, 2)) * (high - low)
    boxes = np.concatenate([corner, corner + size], axis=1)
    scores = rng.uniform(0, 1, 3000)
    classes = rng.integers(1, 3, 3000)
    pairs = tiling.overlapping_pairs(height, width, tile, overlap)
    kept = tiled_predict.cross_tile_nms(boxes, scores, classes, tiles, pairs, 0.3)
    expected = _greedy_over_all_pairs(boxes, scores, classes, tiles, 0.3)
    assert 1000 < len(expected) < 3000  # Some merged, more than the old cap kept.
    assert kept.tolist() == [int(i) for i in expected]
    assert tiled_predict.cross_tile_nms(boxes, scores, classes, tiles, pairs, 0.3,
                                        max_detections=5).tolist() == kept[:5].tolist()


def test_photo_metrics_count_every_detection_of_a_photo(tmp_path):
    # 150 annotated trees on one photo, found exactly: with COCO's cap of 100 detections per
    # image the recall would stop at 100/150; the photo evaluation counts all 150.
    gt = tmp_path / 'photo.json'
    trees = write_photo_of_trees(gt, 1, 'photo.png')
    rows = [{'file_name': 'photo.png', 'category_id': 1, 'bbox': box, 'score': 1 - i / 1000}
            for i, box in enumerate(trees)]
    metrics = photo_eval.evaluate(rows, str(gt))
    assert metrics['recall_iou0.4'] == pytest.approx(1.0)
    assert metrics['AP'] == pytest.approx(1.0)
    capped = photo_eval.evaluate(rows, str(gt), max_detections=100)
    assert capped['recall_iou0.4'] == pytest.approx(100 / 150)


def test_tiled_prediction_reads_photos_past_the_pixel_limit(tmp_path, monkeypatch):
    # PIL refuses photos over twice Image.MAX_IMAGE_PIXELS (a decompression-bomb guard): with
    # the limit lowered to 100 pixels, a 40 x 30 photo stands in for a 20k x 20k orthophoto.
    from efficientdet_hpu.serving import predict
    path = tmp_path / 'ortho.png'
    Image.fromarray(np.full((30, 40, 3), 7, np.uint8)).save(path)
    monkeypatch.setattr(Image, 'MAX_IMAGE_PIXELS', 100)
    with pytest.raises(Image.DecompressionBombError):
        predict.read_rgb(str(path))
    assert predict.read_rgb(str(path), any_size=True).shape == (30, 40, 3)
    assert Image.MAX_IMAGE_PIXELS == 100  # Restored for every other reader.


def test_orthophoto_mosaic_moves_every_box_with_its_copy(tmp_path):
    # tools/orthophoto_mosaic.py (the whole-orthophoto measurement of docs/trees.md): a 30 x 40
    # photo with one tree at (5, 6) repeated 3 x 2 gives 6 trees, one per copy, and pixels
    # that repeat with the photo's period.
    photo = np.random.default_rng(0).integers(0, 255, (30, 40, 3), np.uint8)
    Image.fromarray(photo).save(tmp_path / 'p.png')
    (tmp_path / 'p.json').write_text(json.dumps({
        'images': [{'id': 9, 'file_name': 'p.png', 'width': 40, 'height': 30}],
        'annotations': [{'id': 1, 'image_id': 9, 'category_id': 1, 'bbox': [6, 5, 4, 3],
                         'area': 12, 'iscrowd': 0}],
        'categories': [{'id': 1, 'name': 'tree'}]}))
    result = run_process([sys.executable, 'tools/orthophoto_mosaic.py', '--annotations_file',
                          str(tmp_path / 'p.json'), '--image_dir', str(tmp_path), '--columns=3',
                          '--rows=2', '--output_dir', str(tmp_path / 'out')], timeout=120)
    assert result.returncode == 0, result.stdout[-3000:]
    coco = json.loads((tmp_path / 'out' / 'mosaic.json').read_text())
    assert coco['images'][0]['width'] == 120 and coco['images'][0]['height'] == 60
    assert sorted(a['bbox'][:2] for a in coco['annotations']) == [
        [6, 5], [6, 35], [46, 5], [46, 35], [86, 5], [86, 35]]
    big = np.asarray(Image.open(tmp_path / 'out' / coco['images'][0]['file_name']))
    np.testing.assert_array_equal(big[30:60, 80:120], photo)


def _random_photos(tmp_path, seed, photos=3, truths=120, dets=700):
    """A COCO file of `photos` photos with two classes and results with score ties, boxes near
    the truths (some matches at every threshold) and anywhere."""
    rng = np.random.default_rng(seed)
    images, annotations, rows = [], [], []
    for photo in range(1, photos + 1):
        images.append({'id': photo * 10, 'file_name': 'p%d.png' % photo, 'width': 900,
                       'height': 700})
        boxes = np.column_stack([rng.uniform(0, 850, truths), rng.uniform(0, 650, truths),
                                 rng.uniform(6, 60, truths), rng.uniform(6, 60, truths)])
        classes = rng.integers(1, 3, truths)
        for box, cls in zip(boxes, classes):
            annotations.append({'id': len(annotations) + 1, 'image_id': photo * 10,
                                'category_id': int(cls), 'bbox': box.round(1).tolist(),
                                'area': float(box[2] * box[3]), 'iscrowd': 0})
        near = boxes[rng.integers(0, truths, dets)] + rng.normal(0, 4, (dets, 4))
        near[dets // 2:, :2] = rng.uniform(0, 850, (dets - dets // 2, 2))  # Anywhere.
        near[:, 2:] = np.abs(near[:, 2:]) + 1
        for box in near:
            rows.append({'file_name': 'p%d.png' % photo, 'category_id': int(rng.integers(1, 3)),
                         'bbox': box.round(1).tolist(),
                         'score': float(rng.integers(1, 40)) / 40})  # Many ties.
    path = tmp_path / ('photos-%d.json' % seed)
    path.write_text(json.dumps({'images': images, 'annotations': annotations,
                                'categories': [{'id': 1, 'name': 'a'}, {'id': 2, 'name': 'b'}]}))
    return rows, str(path)


@pytest.mark.parametrize('seed', [0, 1])
def test_sparse_photo_scores_equal_pycocotools(tmp_path, seed):
    # A whole orthophoto's dense IoU matrices do not fit in memory (22,320 trees x 128,907
    # detections: 23 GB, killed): past DENSE_LIMIT pairs the scores come from sparse_coco,
    # which must give pycocotools' numbers exactly: same matching, ties, accumulation.
    rows, path = _random_photos(tmp_path, seed)
    dense = photo_eval.evaluate(rows, path)
    sparse = photo_eval.evaluate(rows, path, dense_limit=0)
    assert 0.05 < dense['AP50'] < 0.95 and 0.05 < dense['recall_iou0.4'] < 1
    for key in ('AP', 'AP50', 'recall_iou0.4'):
        assert sparse[key] == pytest.approx(dense[key], abs=1e-12), key
    capped = photo_eval.evaluate(rows, path, max_detections=150)
    assert photo_eval.evaluate(rows, path, max_detections=150, dense_limit=0)['AP'] == (
        pytest.approx(capped['AP'], abs=1e-12))
