"""The error analysis around evaluation: the confusion matrix on a hand-made case, the report
files, and end to end on the tiny run: `--mode=eval` on a finished training evaluates its last
checkpoint and exits, writes the analysis and the detections, the offline command rereads them,
and records checked against another split's JSON stop before scoring."""
import glob
import json
import os
import shutil

import numpy as np
import pytest
from PIL import Image

from cli_runs import assert_one_line_error, run_main, run_python, tiny_flags
from coco_cases import tide_image as _image, write_photo_of_trees
from efficientdet_hpu.analysis import confusion
from efficientdet_hpu.analysis import report
from efficientdet_hpu.data import record_index

CAT, DOG, BIRD = 1, 2, 3


def test_confusion_matrix_on_a_hand_made_case():
    """Image 1: cat A [0,0,10,10], dog B [20,0,10,10], crowd cat [50,50,40,40].
      cat .9 on A -> (cat, cat); dog .8 on A (IoU 1, A taken: best untaken is B with IoU 0)
      -> (background, dog); cat .7 on B -> (dog, cat); bird .6 inside the crowd -> left out;
      cat .1 far away -> below the 0.3 score threshold, left out.
    Image 2: bird C [0,0,10,10] and nothing detected -> (bird, missed); bird .5 at [30,30,
      10,10] -> (background, bird)."""
    images = [_image([([0, 0, 10, 10], CAT, 0), ([20, 0, 10, 10], DOG, 0),
                      ([50, 50, 40, 40], CAT, 1)],
                     [([0, 0, 10, 10], CAT, .9), ([0, 0, 10, 10], DOG, .8),
                      ([20, 0, 10, 10], CAT, .7), ([60, 60, 5, 5], BIRD, .6),
                      ([200, 200, 10, 10], CAT, .1)]),
              _image([([0, 0, 10, 10], BIRD, 0)], [([30, 30, 10, 10], BIRD, .5)])]
    truths, detections = zip(*images)
    matrix = confusion.confusion_matrix(truths, detections, [CAT, DOG, BIRD])
    #                     cat dog bird missed
    expected = np.array([[1, 0, 0, 0],      # cat
                         [1, 0, 0, 0],      # dog
                         [0, 0, 0, 1],      # bird
                         [0, 1, 1, 0]])     # background
    np.testing.assert_array_equal(matrix, expected)
    table = confusion.format_table(matrix, ['cat', 'dog', 'bird'])
    assert table.splitlines()[0].split()[-4:] == ['cat', 'dog', 'bird', 'missed']
    assert table.splitlines()[-1].split() == ['background', '0', '1', '1', '0']
    assert confusion.plot_png(matrix, ['cat', 'dog', 'bird'], 't')[:4] == b'\x89PNG'


def _coco_case():
    """Two 100x80 images; image 1 has a cat found and a dog detected as cat, image 2 a dog
    missed and a background detection."""
    dataset = {'images': [{'id': 1, 'file_name': 'a.jpg', 'width': 100, 'height': 80},
                          {'id': 2, 'file_name': 'b.jpg', 'width': 100, 'height': 80}],
               'categories': [{'id': CAT, 'name': 'cat'}, {'id': DOG, 'name': 'dog'}],
               'annotations': [
                   {'id': 1, 'image_id': 1, 'category_id': CAT, 'bbox': [0, 0, 20, 20],
                    'iscrowd': 0, 'area': 400},
                   {'id': 2, 'image_id': 1, 'category_id': DOG, 'bbox': [50, 20, 30, 30],
                    'iscrowd': 0, 'area': 900},
                   {'id': 3, 'image_id': 2, 'category_id': DOG, 'bbox': [10, 10, 40, 40],
                    'iscrowd': 0, 'area': 1600}]}
    results = [{'image_id': 1, 'category_id': CAT, 'bbox': [0, 0, 20, 20], 'score': .9},
               {'image_id': 1, 'category_id': CAT, 'bbox': [50, 20, 30, 30], 'score': .8},
               {'image_id': 2, 'category_id': CAT, 'bbox': [70, 60, 10, 10], 'score': .7}]
    return dataset, results


def test_report_names_the_dominant_errors_and_writes_its_files(tmp_path):
    dataset, results = _coco_case()
    names = {CAT: 'cat', DOG: 'dog'}
    # Best F1 at IoU 0.5 (3 truths; by score TP, FP, FP): 2/4 after the first, 2/5, 2/6.
    assert report.analyse(dataset, results, [1, 2], names)[0]['score_threshold'] == 0.9
    built, truths, detections, result = report.analyse(dataset, results, [1, 2], names,
                                                       score_threshold=0.3)
    assert built['errors']['classification']['count'] == 1
    assert built['errors']['background']['count'] == 1
    assert built['errors']['missed']['count'] == 1
    # Dog: no detection of its own -> AP50 0, the weakest class; its truths: one reachable by
    # fixing the class, one missed.
    assert built['weakest_class']['class'] == 'dog' and built['weakest_class']['ap50'] == 0.0
    assert built['weakest_class']['dominant_error'] in ('classification', 'missed')
    assert built['confusion']['matrix'] == [[1, 0, 0], [1, 0, 1], [1, 0, 0]]
    assert any(line.startswith('classification') for line in built['advice'])
    pictures = report.worst_pictures(built, dataset, [1, 2], truths, detections, result,
                                      lambda image_id: Image.new('RGB', (100, 80)), names)
    assert [row['image_id'] for row in built['worst_images']] == [1, 2]  # 1 missed + 1 FP each
    directory = report.write(str(tmp_path / 'analysis'), built, pictures)
    assert sorted(os.listdir(directory)) == ['analysis.json', 'analysis.txt', 'confusion.png',
                                             'worst-01-1.png', 'worst-02-2.png']
    drawn = np.asarray(Image.open(os.path.join(directory, 'worst-01-1.png')))
    assert (drawn == report.worst_images.TRUTH_COLOUR).all(axis=-1).any()
    assert (drawn == report.worst_images.DETECTION_COLOUR).all(axis=-1).any()
    text = open(os.path.join(directory, 'analysis.txt')).read()
    assert "weakest class 'dog'" in text and 'Confusion matrix' in text
    assert json.load(open(os.path.join(directory, 'analysis.json')))['images'] == 2


def test_a_class_without_validation_boxes_is_named_and_left_out(tmp_path):
    """The validation images hold cats only; the model also predicts a dog and a bird is in
    the label map: neither has an AP (COCO's -1), so the AP50 is the cat's 1.0, the weakest
    class is the cat, the advice follows the cat's errors, and one line names the two."""
    dataset, _ = _coco_case()
    dataset = dict(dataset, annotations=dataset['annotations'][:1],
                   categories=dataset['categories'] + [{'id': BIRD, 'name': 'bird'}])
    results = [{'image_id': 1, 'category_id': CAT, 'bbox': [0, 0, 20, 20], 'score': .9},
               {'image_id': 2, 'category_id': DOG, 'bbox': [10, 10, 40, 40], 'score': .8}]
    names = {CAT: 'cat', DOG: 'dog', BIRD: 'bird'}
    built = report.analyse(dataset, results, [1, 2], names, score_threshold=0.3)[0]
    assert built['ap50'] == 1.0 and [row['class'] for row in built['per_class']] == ['cat']
    assert built['unscored_classes'] == ['dog', 'bird']
    assert built['weakest_class']['class'] == 'cat' and built['advice'] == []
    assert built['errors']['background']['count'] == 1  # The dog detection is still an error.
    lines = report.short_lines(built)
    assert lines[1] == ("not scored: 'dog', 'bird', no boxes in the 2 validation images (COCO "
                        "gives such a class AP -1 and leaves it out), so not in the AP50, the "
                        "weakest class or the advice")
    report.write(str(tmp_path / 'analysis'), built, [])
    assert lines[1] in (tmp_path / 'analysis' / 'analysis.txt').read_text()
    empty = report.analyse(dict(dataset, annotations=[]), results, [1, 2], names)[0]
    assert empty['ap50'] is None and report.short_lines(empty) == [
        'error analysis (TIDE): nothing to score, no class has boxes in the 2 validation images']


@pytest.mark.slow
def test_eval_of_a_finished_training_scores_its_last_checkpoint_analyses_and_exits(
        tiny_trained_run, tiny_dataset, tmp_path):
    model_dir = str(tmp_path / 'run')
    shutil.copytree(tiny_trained_run, model_dir)
    # --num_epochs=50 and a long timeout: before, eval waited for step 100 that never came.
    result = run_main(tiny_flags(tiny_dataset, model_dir, '--mode=eval', '--num_epochs=50',
                                 '--eval_timeout=3000'), timeout=600)
    assert result.returncode == 0, result.stdout[-5000:]
    assert 'evaluated the final step 2; stopping' in result.stdout
    assert 'error analysis (TIDE, AP50' in result.stdout
    eval_dir = os.path.join(model_dir, 'eval')
    files = os.listdir(os.path.join(eval_dir, 'analysis'))
    assert {'analysis.json', 'analysis.txt', 'confusion.png'} <= set(files)
    assert any(name.startswith('worst-01-') for name in files), files  # Drawn from the records.
    import tensorflow as tf  # pylint: disable=import-outside-toplevel  (slow tests only)
    tags = {value.tag for path in glob.glob(os.path.join(eval_dir, 'events.out.*'))
            for event in tf.compat.v1.train.summary_iterator(path)
            for value in event.summary.value}
    assert any(tag.startswith('eval_worst/worst-01-') for tag in tags), tags
    analysis = json.load(open(os.path.join(eval_dir, 'analysis', 'analysis.json')))
    assert analysis['step'] == 2 and analysis['images'] == 8
    assert [row['bin'] for row in analysis['sizes']][0] == '0-16 px'
    detections = json.load(open(os.path.join(eval_dir, 'detections.json')))
    assert detections and set(detections[0]) == {'image_id', 'category_id', 'bbox', 'score'}
    offline = run_python(['-m', 'efficientdet_hpu.cli.analyze', '--model_dir=%s' % model_dir,
                          '--output_dir=%s' % (tmp_path / 'offline')], timeout=300)
    assert offline.returncode == 0, offline.stdout[-3000:]
    again = json.load(open(tmp_path / 'offline' / 'analysis.json'))
    assert again['errors'] == analysis['errors'] and again['sizes'] == analysis['sizes']


@pytest.mark.slow
def test_records_against_another_splits_json_stop_before_scoring(tiny_trained_run,
                                                                 tiny_dataset, tmp_path):
    """The training split's JSON renumbered to the validation ids: the ids overlap, the
    images (file names) do not, as in the issue's report."""
    model_dir = str(tmp_path / 'run')
    shutil.copytree(tiny_trained_run, model_dir)
    train = json.load(open(tiny_dataset['val_json'].replace('instances_val', 'instances_train')))
    val_ids = [image['id'] for image in json.load(open(tiny_dataset['val_json']))['images']]
    renumber = {image['id']: val_id for image, val_id in zip(train['images'], val_ids)}
    train['images'] = [dict(image, id=renumber[image['id']]) for image in train['images']
                       if image['id'] in renumber]
    train['annotations'] = [dict(a, image_id=renumber[a['image_id']])
                            for a in train['annotations'] if a['image_id'] in renumber]
    other_split = str(tmp_path / 'overlapping_ids.json')
    json.dump(train, open(other_split, 'w'))
    flags = [f for f in tiny_flags(tiny_dataset, model_dir, '--mode=eval')
             if not f.startswith('--val_json_file')] + ['--val_json_file=%s' % other_split]
    result = run_main(flags, timeout=600)
    assert_one_line_error(result, 'different splits', other_split, 'record 0 of',
                          "'%s'" % train['images'][0]['file_name'])
    assert 'Average Precision' not in result.stdout


def test_split_check_names_the_first_record_and_both_files():
    records = [record_index.Identity(7, 'val/7.jpg', 240, 320),
               record_index.Identity(8, 'val/8.jpg', 240, 320)]
    same = [{'id': 7, 'file_name': '7.jpg', 'height': 240, 'width': 320},
            {'id': 8, 'file_name': '8.jpg', 'height': 240, 'width': 320}]
    record_index.check_against_json(records, same, 'val-*', 'val.json')  # Basenames agree.
    resized = [same[0], dict(same[1], height=256)]
    with pytest.raises(record_index.SplitMismatchError,
                       match=r"image id 8 is 'val/8.jpg' 320x240 in record 1 of val-\* but "
                             r"'8.jpg' 320x256 in --val_json_file=val.json"):
        record_index.check_against_json(records, resized, 'val-*', 'val.json')
    with pytest.raises(record_index.SplitMismatchError,
                       match=r"image id 8 \('val/8.jpg', record 1 of val-\*\) is not in"):
        record_index.check_against_json(records, same[:1], 'val-*', 'val.json')


def test_analyze_counts_every_detection_of_a_tiled_whole_photo(tmp_path):
    # inference.py predict --tile_size on one orthophoto: 150 trees, all found, in rows that
    # carry the photo's file_name and its position (7) as image_id, not the JSON's id (3).
    # COCO's 100 detections per image would leave 50 trees missed; --max_dets=0 counts all,
    # and the rows are matched to the JSON's photo by file name.
    truth = tmp_path / 'photo.json'
    trees = write_photo_of_trees(truth, 3, 'ortho.png')
    detections = tmp_path / 'detections.json'
    detections.write_text(json.dumps([
        {'image_id': 7, 'file_name': 'ortho.png', 'category_id': 1, 'bbox': box,
         'score': round(1 - i / 1000, 3)} for i, box in enumerate(trees)]))

    def analyze(*extra):
        result = run_python(['-m', 'efficientdet_hpu.cli.analyze',
                             '--detections_json=%s' % detections, '--val_json_file=%s' % truth,
                             '--output_dir=%s' % (tmp_path / 'out')] + list(extra))
        assert result.returncode == 0, result.stdout[-3000:]
        return json.loads((tmp_path / 'out' / 'analysis.json').read_text())
    every = analyze('--max_dets=0')
    assert every['ap50'] == pytest.approx(1.0)
    assert every['errors']['missed']['count'] == 0
    capped = analyze()
    assert capped['errors']['missed']['count'] == 50
    # Rows of other photos (another split's predictions): one line, not AP 0 and every
    # detection dropped.
    detections.write_text(json.dumps([{'image_id': 7, 'file_name': 'other.png',
                                       'category_id': 1, 'bbox': trees[0], 'score': 0.9}]))
    result = run_python(['-m', 'efficientdet_hpu.cli.analyze', '--detections_json=%s'
                         % detections, '--val_json_file=%s' % truth,
                         '--output_dir=%s' % (tmp_path / 'other')])
    assert_one_line_error(result, 'no detection of %s is of a photo of %s' % (detections, truth))


def test_dense_photos_are_drawn_without_tags():
    # Hundreds of trees on one photo: tags would cover it. Up to MAX_TAGGED boxes carry a
    # tag (white text on the box colour), beyond that only the two colours of the boxes.
    from efficientdet_hpu.analysis import tide, worst_images

    def drawn(count):
        boxes = np.array([[12 * (i % 20), 12 * (i // 20), 8, 8] for i in range(count)], float)
        truth = tide.ImageTruth(boxes, np.ones(count, np.int64), np.zeros(count, bool))
        dets = tide.ImageDetections(boxes + 1, np.ones(count, np.int64), np.full(count, 0.9))
        picture = worst_images.draw(Image.new('RGB', (240, 240)), truth, dets, {1: 'tree'}, 0.5)
        pixels = np.asarray(picture)
        text = bool((pixels > 200).all(axis=-1).any())  # White letters (anti-aliased).
        return [text] + [bool((pixels == colour).all(axis=-1).any()) for colour in (
            worst_images.TRUTH_COLOUR, worst_images.DETECTION_COLOUR)]
    assert drawn(worst_images.MAX_TAGGED // 2) == [True, True, True]
    assert drawn(worst_images.MAX_TAGGED // 2 + 1) == [False, True, True]
