"""`python finetune.py` as a user runs it: a small COCO, Pascal VOC and YOLO set of real photos
(PIL, a few boxes each), the tiny model (cli_runs.TINY_HPARAMS) for 2 steps, end to end: the
plan, plan.yaml, main.py's training, the whole-photo evaluation with the error analysis and the
picture, the SavedModel (and TFLite), summary.json. One run per format, shared by its
assertions; bad input: one line, exit 2, nothing written; a rerun resumes (here: is done). The
time budget's stop of training: test_finetune_budget.py."""
import json
import os

import pytest
from PIL import Image, ImageDraw

from cli_runs import assert_one_line_error, run_python, TINY_HPARAMS

STEPS = 2
SUMMARY_KEYS = ('AP', 'AP50', 'recall_iou40', 'minutes', 'export')
COLOURS = ((200, 40, 40), (40, 40, 200))


def _photo(path, index, size=(160, 120), side=31):
    """A photo with 3 squares of `side` px, two colours; returns their [x, y, w, h, class]."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    image = Image.new('RGB', size, (90, 120, 60))
    draw = ImageDraw.Draw(image)
    boxes = []
    for j in range(3):
        x, y = 10 + (side + 14) * j, 15 + (7 * index) % 60
        draw.rectangle([x, y, x + side - 1, y + side - 1], fill=COLOURS[j % 2])
        boxes.append((x, y, side, side, j % 2))
    image.save(path)
    return boxes


def make_coco(folder, count=5):
    images, annotations = [], []
    for i in range(count):
        name = 'photo%d.jpg' % i
        for x, y, w, h, label in _photo(os.path.join(folder, name), i):
            annotations.append({'id': len(annotations) + 1, 'image_id': 100 + i,
                                'category_id': 3 + label, 'bbox': [x, y, w, h],
                                'area': w * h, 'iscrowd': 0})
        images.append({'id': 100 + i, 'file_name': name, 'width': 160, 'height': 120})
    with open(os.path.join(folder, 'instances.json'), 'w') as stream:
        json.dump({'images': images, 'annotations': annotations,
                   'categories': [{'id': 3, 'name': 'red'}, {'id': 4, 'name': 'blue'}]}, stream)
    return folder


def make_voc(folder, count=5, size=(160, 120), side=31):
    for i in range(count):
        boxes = _photo(os.path.join(folder, 'v%d.png' % i), i, size, side)
        objects = ''.join(
            '<object><name>%s</name><bndbox><xmin>%d</xmin><ymin>%d</ymin><xmax>%d</xmax>'
            '<ymax>%d</ymax></bndbox></object>' % (('red', 'blue')[label], x + 1, y + 1, x + w,
                                                   y + h) for x, y, w, h, label in boxes)
        with open(os.path.join(folder, 'v%d.xml' % i), 'w') as stream:
            stream.write('<annotation><filename>v%d.png</filename><size><width>%d</width>'
                         '<height>%d</height></size>%s</annotation>' % (i, size[0], size[1],
                                                                        objects))
    return folder


def make_yolo(folder, count=5):
    for i in range(count):
        boxes = _photo(os.path.join(folder, 'images', 'y%d.jpg' % i), i)
        os.makedirs(os.path.join(folder, 'labels'), exist_ok=True)
        with open(os.path.join(folder, 'labels', 'y%d.txt' % i), 'w') as stream:
            for x, y, w, h, label in boxes:
                stream.write('%d %.5f %.5f %.5f %.5f\n' % (
                    label, (x + w / 2) / 160, (y + h / 2) / 120, w / 160, h / 120))
    with open(os.path.join(folder, 'classes.txt'), 'w') as stream:
        stream.write('red\nblue\n')
    return folder


def finetune(data, output_dir, *extra, timeout=1100):
    return run_python(['finetune.py', '--data=%s' % data, '--output_dir=%s' % output_dir,
                       '--steps=%d' % STEPS, '--hparams=%s' % TINY_HPARAMS] + list(extra),
                      timeout=timeout)


def _run(tmp_path_factory, make):
    root = tmp_path_factory.mktemp(make.__name__)
    data = make(str(root / 'data'))
    result = finetune(data, str(root / 'out'))
    return result, str(root / 'out'), data


@pytest.fixture(scope='module')
def coco_run(tmp_path_factory):
    return _run(tmp_path_factory, make_coco)


def make_large_voc(folder):
    """deepforest's case in small: 16 px objects on 480 x 360 photos, 4.3 px once a photo is
    fitted to the tiny model's 128 px: the plan tiles them (128 px tiles, overlap 128 // 5 =
    25; x starts 0, 103, 206, 309 and 352, y 0, 103, 206 and 232: 20 tiles a photo)."""
    return make_voc(folder, size=(480, 360), side=16)


@pytest.fixture(scope='module')
def voc_run(tmp_path_factory):
    return _run(tmp_path_factory, make_large_voc)


@pytest.fixture(scope='module')
def yolo_run(tmp_path_factory):
    return _run(tmp_path_factory, make_yolo)


def _check_run(run, format_line):
    result, out, _ = run
    assert result.returncode == 0, result.stdout[-5000:]
    for stage in range(1, 7):
        assert '[%d/6]' % stage in result.stdout
    assert format_line in result.stdout
    with open(os.path.join(out, 'summary.json')) as stream:
        summary = json.load(stream)
    assert all(summary[key] is not None for key in SUMMARY_KEYS), summary
    assert 0 <= summary['AP'] <= 1 and 0 <= summary['recall_iou40'] <= 1
    assert os.path.isfile(os.path.join(summary['export'], 'saved_model.pb'))
    assert summary['tflite'] or summary['tflite_error']
    # main.py resolved plan.yaml to the planned steps and trained them.
    assert summary['steps_trained'] == summary['steps_planned'] == STEPS
    with open(os.path.join(out, 'model', 'train_log.jsonl')) as stream:
        totals = {json.loads(line).get('total_steps') for line in stream} - {None}
    assert totals == {STEPS}
    for path in ('plan.yaml', 'detections.png', 'evaluation/metrics.json',
                 'evaluation/flipped/metrics.json', 'evaluation/analysis/analysis.json'):
        assert os.path.isfile(os.path.join(out, path)), path
    # Both views scored, the higher AP kept and said with both scores.
    views = summary['views']
    assert summary['tta'] == (views['flips fused']['AP'] > views['as they are']['AP'])
    assert summary['AP'] == views['flips fused' if summary['tta'] else 'as they are']['AP']
    assert ('  with left-right flips fused (test-time augmentation): AP %.3f / AP50 %.3f, as '
            'they are %.3f / %.3f: ' % (views['flips fused']['AP'], views['flips fused']['AP50'],
                                        views['as they are']['AP'], views['as they are']['AP50'])
            in run[0].stdout)
    return summary


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_a_coco_folder_end_to_end(coco_run):
    summary = _check_run(coco_run, 'COCO: instances.json, 5 photos, 2 classes, 15 boxes')
    assert summary['photos'] == 1 and summary['annotations'] == 3  # 20% of 5, held out whole.
    assert 'split by photo: 4 photos, 12 boxes to train; 1 photo, 3 boxes to validate' in \
        coco_run[0].stdout


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_a_voc_folder_of_large_photos_end_to_end_in_tiles(voc_run):
    summary = _check_run(voc_run, 'Pascal VOC: 5 XML files, 5 photos, 2 classes, 15 boxes')
    assert summary['tile_size'] == 128
    assert 'train: 80 tiles' in voc_run[0].stdout and 'val: 20 tiles' in voc_run[0].stdout
    # The whole validation photo is scored, not its tiles.
    assert (summary['photos'], summary['annotations']) == (1, 3)


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_the_output_folder_is_a_detector_that_tiles_as_the_plan(voc_run):
    """Detector(output_dir) from Python: the checkpoint the fine-tune evaluated, its tiles and
    class names, with the flips where it kept them, give the rows of its own evaluation
    (evaluation/detections.json, or evaluation/flipped/ with the flips)."""
    import efficientdet_hpu  # pylint: disable=import-outside-toplevel
    result, out, _ = voc_run
    assert "from Python                Detector(%r).predict(photos)" % out in result.stdout
    with open(os.path.join(out, 'summary.json')) as stream:
        summary = json.load(stream)
    checkpoint = summary['checkpoint']
    kept = os.path.join(out, 'evaluation', 'flipped' if summary['tta'] else '')
    with open(os.path.join(kept, 'detections.json')) as stream:
        expected = [dict(row, image_id=None) for row in json.load(stream)]
    with efficientdet_hpu.Detector(out) as detector:
        assert detector.format == 'finetune' and detector.tiles == (128, 25)
        assert detector.checkpoint.startswith(checkpoint)  # model/best, as evaluated.
        assert set(detector.names.values()) == {'red', 'blue'}  # make_voc's classes.
        assert 'tiles of 128 px' in repr(detector) and detector.tta == summary['tta']
        found = detector.predict(os.path.join(out, 'data', 'val_photos'), score_threshold=0)
        whole = detector.predict(os.path.join(out, 'data', 'val_photos'), score_threshold=0,
                                 tile_size=0)
    rows = [dict(row, image_id=None) for one in found for row in one.to_coco()]
    assert len(rows) > 10 and rows == expected
    assert [dict(row, image_id=None) for one in whole for row in one.to_coco()] != expected


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_a_yolo_folder_end_to_end(yolo_run):
    _check_run(yolo_run, 'YOLO: classes.txt, 5 photos, 2 classes, 15 boxes')


@pytest.mark.slow
def test_a_rerun_resumes_and_other_flags_are_refused(coco_run):
    _, out, data = coco_run
    again = finetune(data, out, timeout=120)
    assert again.returncode == 0 and 'done earlier' in again.stdout, again.stdout[-3000:]
    other = finetune(data, out, '--val_photos=photo1', timeout=120)
    assert_one_line_error(other, "the data changed since %s/model was trained on it (val_photos: "
                          "was [], now ['photo1']" % out, '--output_dir=%s-2' % out,
                          starts_with='finetune: error:')
    other = finetune(data, out, '--model_name=efficientdet-d0', timeout=120)
    assert_one_line_error(other, '--output_dir=%s holds a fine-tune trained to step 2 with other '
                          'flags (model_name' % out, 'resume it with its own: python finetune.py',
                          starts_with='finetune: error:')


def test_bad_input_is_one_line_and_writes_nothing(tmp_path):
    photos = tmp_path / 'photos'
    _photo(str(photos / 'a.jpg'), 0)
    result = finetune(str(photos), str(tmp_path / 'out1'), timeout=120)
    assert_one_line_error(result, 'holds 1 image, no annotations: expected a COCO JSON',
                          starts_with='finetune: error: --data=')
    voc = make_voc(str(tmp_path / 'voc'), count=2)
    os.remove(os.path.join(voc, 'v1.png'))
    result = finetune(voc, str(tmp_path / 'out2'), timeout=120)
    assert_one_line_error(result, "v1.xml: image 'v1.png' is not in --image_dir")
    both = make_voc(make_coco(str(tmp_path / 'both'), count=2), count=2)
    result = finetune(both, str(tmp_path / 'out3'), timeout=120)
    assert_one_line_error(result, 'is ambiguous')
    result = finetune(make_coco(str(tmp_path / 'coco'), count=2), str(tmp_path / 'out4'),
                      '--val_photos=nothing', timeout=120)
    assert_one_line_error(result, '--val_photos names nothing, not a photo of --data')
    assert not any(os.path.exists(tmp_path / name) for name in ('out1', 'out2', 'out3', 'out4'))


@pytest.mark.slow  # The data doctor's process imports TensorFlow.
def test_a_dry_run_prints_the_plan_and_writes_nothing(tmp_path):
    data = make_coco(str(tmp_path / 'data'))
    result = finetune(data, str(tmp_path / 'out'), '--dry_run', '--max_minutes=60', timeout=300)
    assert result.returncode == 0, result.stdout[-3000:]
    for topic in ('model', 'tiling', 'batch', 'steps', 'schedule', 'time'):
        assert '  %s ' % topic in result.stdout
    assert 'dry run: nothing written' in result.stdout
    assert not os.path.exists(tmp_path / 'out')
