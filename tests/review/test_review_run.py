"""`python review.py` end to end as a user runs it, on a Pascal VOC folder of large photos with
small objects (the plan tiles them: 128 px tiles for the tiny network), 2 folds of 2 steps:
the records each fold's model trained on never hold a photo that model predicted (read back
from the TFRecords themselves), the photos were predicted whole in tiles, the outputs are
there and readable, and a rerun is done at once."""
import json
import os
import re

import pytest
import tensorflow as tf
import yaml
from pycocotools.coco import COCO

from cli_runs import assert_one_line_error, run_python, TINY_HPARAMS
from efficientdet_hpu.data import tfrecord_format
from efficientdet_hpu.data.dataloader import list_record_files
from efficientdet_hpu.review import issues
from efficientdet_hpu.review import planted
from efficientdet_hpu.review import scores as scores_lib

SIZE, SIDE, PHOTOS = (480, 360), 16, 5
NAMES = ('red', 'blue')
STATED_RATE = 5000.0


def make_large_voc(folder):
    """5 photos, 3 squares of 16 px each: 4.3 px once fitted to 128 px, so the plan tiles."""
    from PIL import Image, ImageDraw  # pylint: disable=import-outside-toplevel
    os.makedirs(folder, exist_ok=True)
    for i in range(PHOTOS):
        image = Image.new('RGB', SIZE, (90, 120, 60))
        draw, objects = ImageDraw.Draw(image), ''
        for j in range(3):
            x, y = 40 + 150 * j, 60 + 40 * i
            draw.rectangle([x, y, x + SIDE - 1, y + SIDE - 1],
                           fill=((200, 40, 40), (40, 40, 200))[j % 2])
            objects += ('<object><name>%s</name><bndbox><xmin>%d</xmin><ymin>%d</ymin><xmax>%d'
                        '</xmax><ymax>%d</ymax></bndbox></object>' % (
                            NAMES[j % 2], x + 1, y + 1, x + SIDE, y + SIDE))
        image.save(os.path.join(folder, 'v%d.png' % i))
        with open(os.path.join(folder, 'v%d.xml' % i), 'w') as stream:
            stream.write('<annotation><filename>v%d.png</filename><size><width>%d</width>'
                         '<height>%d</height></size>%s</annotation>' % (i, SIZE[0], SIZE[1],
                                                                        objects))
    return folder


def _review(data, out, *flags, hparams=TINY_HPARAMS, timeout=300):
    """`python review.py` on the module's folder: two folds of 2 steps, and `flags`."""
    return run_python(['review.py', '--data=%s' % data, '--output_dir=%s' % out, '--folds=2',
                       '--steps=2', '--hparams=%s' % hparams] + list(flags), timeout=timeout)


@pytest.fixture(scope='module')
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp('review_run')
    data = make_large_voc(str(root / 'data'))
    out = str(root / 'out')
    # A rate far above this machine's: the first fold's measured one must take its place.
    result = _review(data, out, '--images_per_second=%g' % STATED_RATE, timeout=1700)
    return result, out, data


def _json(path):
    with open(path) as stream:
        return json.load(stream)


def photos_in_records(pattern):
    """The photo file names of every record of `pattern` (a tile's name is its photo's and
    '#tile-...')."""
    names = set()
    for path in list_record_files(pattern):
        for raw in tf.data.TFRecordDataset(path).as_numpy_iterator():
            feature = tf.train.Example.FromString(raw).features.feature
            name = feature[tfrecord_format.IMAGE_FILENAME].bytes_list.value[0].decode()
            names.add(name.split('#tile')[0])
    return names


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_no_fold_predicts_a_photo_its_model_trained_on(run):
    result, out, _ = run
    assert result.returncode == 0, result.stdout[-5000:]
    plan = _json(os.path.join(out, 'review', 'plan.json'))
    assert len(plan['folds']) == 2
    every = set()
    for fold in plan['folds']:
        directory = os.path.join(out, 'review', 'folds', 'fold-%d' % fold['index'])
        with open(os.path.join(directory, 'train.yaml')) as stream:
            recipe = yaml.safe_load(stream)
        assert recipe['mode'] == 'train' and 'validation_file_pattern' not in recipe
        trained_on = photos_in_records(recipe['training_file_pattern'])
        predicted = {row['file_name'] for row in _json(os.path.join(
            directory, 'predictions', 'detections.json'))}
        own = {image['file_name'] for image in _json(os.path.join(directory,
                                                                  'photos.json'))['images']}
        assert predicted and predicted <= own
        assert not trained_on & own, (fold['index'], trained_on & own)
        assert len(trained_on | own) == PHOTOS  # Every other photo was trained on.
        every |= own
    assert len(every) == PHOTOS


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_the_photos_are_predicted_whole_in_tiles_and_the_outputs_are_readable(run):
    result, out, _ = run
    assert result.returncode == 0, result.stdout[-5000:]
    for stage in range(1, 6):
        assert '[%d/5]' % stage in result.stdout
    assert 'tiles of 128 px' in result.stdout
    for fold in range(2):  # Each fold's training says what it does and where its output goes.
        log = os.path.join(out, 'logs', 'train-fold-%d.log' % fold)
        assert re.search(r"fold %d: training 2 steps on \d+ images, about \d+ min \(until "
                         r"\d\d:\d\d\); main.py's output in %s" % (fold, re.escape(log)),
                         result.stdout), result.stdout[-3000:]
    measured = re.findall(r"fold (\d) trained at ([\d.]+) images/s, the plan's ([\d.]+): the rest "
                          r'of the review takes about \d+ min at that rate \(until \d\d:\d\d\)$',
                          result.stdout, re.M)
    assert measured and measured[0][0] == '0', result.stdout[-3000:]
    assert float(measured[0][2]) == STATED_RATE and float(measured[0][1]) < STATED_RATE / 2
    with open(os.path.join(out, 'logs', 'predict-fold-1.log')) as stream:
        command = stream.readline()
    assert '--tile_size=128' in command and 'nms_configs.max_output_size=' in command
    assert 'nms_configs.class_agnostic=true' in command
    summary = _json(os.path.join(out, 'review', 'summary.json'))
    assert (summary['photos'], summary['labels'], summary['folds']) == (PHOTOS, 15, 2)
    scored = _json(os.path.join(out, 'review', 'scores.json'))
    assert scored['overlooked_cover_iou'] == scores_lib.COVER_IOU
    assert len(scored['photos']) == PHOTOS
    with open(summary['issues_csv']) as stream:
        assert stream.readline().strip() == ','.join(issues.COLUMNS)
    coco = COCO(summary['coco_json'])
    assert len(coco.getImgIds()) == PHOTOS
    assert all('review' in a for a in coco.dataset['annotations'])
    assert os.path.isfile(summary['page'])
    assert 'fiftyone' in summary['fiftyone_line']


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_a_rerun_is_done_at_once(run):
    _, out, data = run
    again = _review(data, out, timeout=120)
    assert again.returncode == 0 and 'review done earlier' in again.stdout, again.stdout[-3000:]


def _listed(path):
    """issues.csv's rows as (image, kind, label_id, box) -> score."""
    return {(row['image'], row['kind'], row['label_id'], row['x1'], row['y1'], row['x2'],
             row['y2']): float(row['score']) for row in planted.read_issues(path)}


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_another_threshold_lists_anew_from_the_same_folds(run):
    """--threshold only cuts the list: a finished review asked again with another is listed
    anew from the folds' predictions, no fold trained again. At 1 every label is listed as a
    swap (and so none as a bad location: a label is listed once) and every photo; at a
    threshold halfway between two of those scores, exactly the overlooked, swap and image rows
    scoring under it (a badloc row may come in where its label's swap row went out). What the
    first list held depends on the 2-step models' scores: all under the default or none."""
    _, out, data = run
    listed = os.path.join(out, 'review', 'issues.csv')
    before = _listed(listed)

    def again(threshold, was):
        result = _review(data, out, '--threshold=%r' % threshold)
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
        assert '(the review listed at %g): listed anew' % was in result.stdout, result.stdout
        assert 'training 2 steps' not in result.stdout and 'review done in' in result.stdout
        assert _json(os.path.join(out, 'review', 'summary.json'))['threshold'] == threshold
        return _listed(listed)

    every = again(1.0, 0.6)
    kinds = [key[1] for key in every]
    assert (kinds.count('swap'), kinds.count('image'), kinds.count('badloc')) == (
        3 * PHOTOS, PHOTOS, 0)
    assert {key for key in before if key[1] != 'badloc'} <= set(every)
    # Halfway between two printed scores, no row sits on it; below the only one, none is kept.
    scores, middle = sorted(set(every.values())), len(set(every.values())) // 2
    threshold = (scores[middle - 1] + scores[middle]) / 2 if middle else scores[0] / 2
    after = again(threshold, 1)
    assert len(after) < len(every) and all(score < threshold for score in after.values())
    kept = {key for key, score in every.items() if score < threshold and key[1] != 'badloc'}
    assert kept == {key for key in after if key[1] != 'badloc'}


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_other_flags_over_trained_folds_are_refused_in_one_line(run):
    """A rerun whose fine-tune flags differ (the plan every fold trains with) would mix two
    plans in one review: one line saying how to resume it or where to start afresh."""
    _, out, data = run
    again = _review(data, out, hparams='%s,jitter_min=0.8' % TINY_HPARAMS)
    assert_one_line_error(again, 'holds a review whose fold-0 model trained on the last run\'s '
                          'input and flags', "now '%s,jitter_min=0.8'" % TINY_HPARAMS,
                          'in another --output_dir', starts_with='review: error: ')


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_input_files_only_touched_leave_the_trained_folds_to_go_on(run):
    """The same photos and boxes with new file times (a copy without -p, a git checkout) are
    the input the folds trained on: the rerun goes on (here: the review is done) and says why;
    it was refused, naming as its fix the very rerun it refused."""
    _, out, data = run
    later = os.stat(data).st_mtime + 60
    for name in os.listdir(data):
        os.utime(os.path.join(data, name), (later, later))
    again = _review(data, out)
    assert again.returncode == 0, again.stdout[-3000:]
    assert re.search(r"the input's files changed since the last run \(\d+ files changed \(.*\)"
                     r"\), its photos and boxes did not: the review's trained folds \(fold-0, "
                     r"fold-1\) go on", again.stdout), again.stdout[-3000:]
    assert 'review done' in again.stdout, again.stdout[-3000:]
