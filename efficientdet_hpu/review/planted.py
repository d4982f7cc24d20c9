"""Errors planted in a labelled set known to be clean, and how many of them the review finds
(`python bench.py review_planted`, docs/review.md).

Planted, each in SHARE of the boxes, no box twice: dropped (the label removed: an overlooked
object), swapped (another class, at random), shifted (moved along x or y until its IoU with the
true box falls in SHIFT_IOU). The review then runs twice, on the planted set and on the clean
one, and for each kind, with N the number planted:
  recall     the share of the planted errors among the first 2N rows of that kind
  precision  the share of the first N rows of that kind that are planted errors
  clean      the rows of that kind the review lists on the clean set (all false alarms)
A dropped box is found by an overlooked row of its photo whose box overlaps it by IoU >=
FOUND_IOU; a swapped or shifted one by the swap or badloc row of its label id.

The sets: 'synthetic' (the embedded set, datatools/synthetic_coco.py: four shapes told apart
by outline on textured backgrounds) or 'easy' (made here: three classes of flat shapes told
apart by colour on a plain noisy background, which a small model learns in minutes), or a
COCO folder of your own that you know to be clean.
"""
import csv
import dataclasses
import json
import os
import time

import numpy as np
from PIL import Image, ImageDraw

from efficientdet_hpu.core import atomic_file
from efficientdet_hpu.datatools import synthetic_coco
from efficientdet_hpu.finetune import inputs
from efficientdet_hpu.review import issues as issues_lib
from efficientdet_hpu.review import run
from efficientdet_hpu.review import scores as scores_lib

SHARE = 0.05
SHIFT_IOU = (0.4, 0.6)
FOUND_IOU = 0.5
KINDS = (('dropped', 'overlooked'), ('swapped', 'swap'), ('shifted', 'badloc'))
EASY_CLASSES = ({'id': 1, 'name': 'red square'}, {'id': 2, 'name': 'blue disc'},
                {'id': 3, 'name': 'yellow triangle'})
EASY_COLOURS = ((210, 40, 40), (40, 70, 220), (230, 200, 30))


def _shape(draw, index, box):
    x0, y0, x1, y1 = box
    colour = EASY_COLOURS[index]
    if index == 0:
        draw.rectangle(box, fill=colour)
    elif index == 1:
        draw.ellipse(box, fill=colour)
    else:
        draw.polygon([(x0, y1), ((x0 + x1) / 2.0, y0), (x1, y1)], fill=colour)


def make_easy(folder, photos, seed=0, size=(192, 144)) -> str:
    """folder/instances.json and its photos: 1-4 shapes of 20-56 px, not overlapping."""
    rng = np.random.default_rng(seed)
    os.makedirs(folder, exist_ok=True)
    images, annotations = [], []
    for number in range(photos):
        noise = rng.integers(90, 140, (size[1] // 8, size[0] // 8, 3), dtype=np.uint8)
        image = Image.fromarray(noise).resize(size, Image.BILINEAR)
        draw, placed = ImageDraw.Draw(image), []
        for _ in range(int(rng.integers(1, 5))):
            side = int(rng.integers(20, 57))
            x, y = int(rng.integers(0, size[0] - side)), int(rng.integers(0, size[1] - side))
            box = (x, y, x + side - 1, y + side - 1)
            if any(scores_lib.iou_matrix([box], [other])[0, 0] > 0 for other in placed):
                continue
            placed.append(box)
            label = int(rng.integers(0, len(EASY_CLASSES)))
            _shape(draw, label, box)
            annotations.append({'id': len(annotations) + 1, 'image_id': number + 1,
                                'category_id': EASY_CLASSES[label]['id'],
                                'bbox': [x, y, side, side], 'area': side * side, 'iscrowd': 0})
        name = 'easy%04d.png' % number
        image.save(os.path.join(folder, name))
        images.append({'id': number + 1, 'file_name': name, 'width': size[0],
                       'height': size[1]})
    path = os.path.join(folder, 'instances.json')
    atomic_file.write_json_atomically(path, {
        'images': images, 'annotations': annotations, 'categories': list(EASY_CLASSES)})
    return path


def _shift(bbox, width, height, rng):
    """bbox [x, y, w, h] moved along one axis so its IoU with itself falls in SHIFT_IOU and
    it stays in the photo; None when no direction fits."""
    target = rng.uniform(*SHIFT_IOU)
    for axis, sign in rng.permutation([(0, 1), (0, -1), (1, 1), (1, -1)]).tolist():
        side = bbox[2 + axis]
        offset = sign * side * (1 - target) / (1 + target)
        moved = list(bbox)
        moved[axis] = round(bbox[axis] + offset, 2)
        if moved[0] >= 0 and moved[1] >= 0 and moved[0] + moved[2] <= width and \
                moved[1] + moved[3] <= height:
            iou = scores_lib.iou_matrix([scores_lib.xyxy(bbox)], [scores_lib.xyxy(moved)])[0, 0]
            if SHIFT_IOU[0] <= iou <= SHIFT_IOU[1]:
                return moved, float(iou)
    return None


def plant(coco, seed=0, share=SHARE) -> tuple:
    """(the COCO dict with errors planted, {'dropped': [annotation], 'swapped': [{'id',
    'was', 'now'}], 'shifted': [{'id', 'was', 'now', 'iou'}]})."""
    rng = np.random.default_rng(seed)
    annotations = [dict(a) for a in coco['annotations'] if not a.get('iscrowd')]
    count = int(round(share * len(annotations)))
    order = rng.permutation(len(annotations)).tolist()
    sizes = {image['id']: (image['width'], image['height']) for image in coco['images']}
    category_ids = [c['id'] for c in coco['categories']]
    planted = {'dropped': [], 'swapped': [], 'shifted': []}
    dropped = set(order[:count])
    planted['dropped'] = [annotations[i] for i in sorted(dropped)]
    if len(category_ids) > 1:
        for index in order[count:2 * count]:
            annotation = annotations[index]
            now = int(rng.choice([c for c in category_ids if c != annotation['category_id']]))
            planted['swapped'].append({'id': annotation['id'],
                                       'was': annotation['category_id'], 'now': now})
            annotation['category_id'] = now
    for index in order[2 * count:]:
        if len(planted['shifted']) == count:
            break
        annotation = annotations[index]
        moved = _shift(annotation['bbox'], *sizes[annotation['image_id']], rng)
        if moved:
            planted['shifted'].append({'id': annotation['id'], 'was': annotation['bbox'],
                                       'now': moved[0], 'iou': moved[1]})
            annotation['bbox'] = moved[0]
    kept = [a for i, a in enumerate(annotations) if i not in dropped]
    return dict(coco, annotations=kept), planted


def read_issues(path) -> list:
    with open(path, newline='', encoding='utf-8') as stream:
        return list(csv.DictReader(stream))


def _is_planted(row, planted, names):
    """Whether an issues.csv row is one of the planted errors of its kind."""
    if row['kind'] == 'swap':
        return row['label_id'] in {str(entry['id']) for entry in planted['swapped']}
    if row['kind'] == 'badloc':
        return row['label_id'] in {str(entry['id']) for entry in planted['shifted']}
    box = [float(row[key]) for key in ('x1', 'y1', 'x2', 'y2')]
    return any(names[entry['image_id']] == row['image'] and scores_lib.iou_matrix(
        [box], [scores_lib.xyxy(entry['bbox'])])[0, 0] >= FOUND_IOU
        for entry in planted['dropped'])


def _found(rows, entry, kind, names):
    if kind == 'overlooked':
        return any(row['image'] == names[entry['image_id']] and scores_lib.iou_matrix(
            [[float(row[key]) for key in ('x1', 'y1', 'x2', 'y2')]],
            [scores_lib.xyxy(entry['bbox'])])[0, 0] >= FOUND_IOU for row in rows)
    return str(entry['id']) in {row['label_id'] for row in rows}


def measure(rows, planted, names, clean_rows=None) -> dict:
    """{planted kind: {'planted', 'recall_2n', 'precision_n', 'listed', 'clean'}} of one
    review's issues.csv rows; names: {image id: file name}."""
    table = {}
    for planted_kind, kind in KINDS:
        entries = planted[planted_kind]
        count = len(entries)
        ranked = [row for row in rows if row['kind'] == kind]
        top = ranked[:2 * count]
        table[planted_kind] = {
            'planted': count, 'listed': len(ranked),
            'recall_2n': (sum(_found(top, entry, kind, names) for entry in entries) / count
                          if count else None),
            'precision_n': (sum(_is_planted(row, planted, names) for row in ranked[:count])
                            / count if count else None),
            'clean': None if clean_rows is None else sum(
                1 for row in clean_rows if row['kind'] == kind)}
    return table


COLUMNS = (('kind', 'kind', '%s'), ('planted', 'planted', '%d'),
           ('recall top 2N %', 'recall_2n', '%.0f'), ('precision top N %', 'precision_n', '%.0f'),
           ('rows listed', 'listed', '%d'), ('clean set: rows listed', 'clean', '%d'))


def table_rows(table) -> list:
    """The table's rows for benchmarks/report.py (percentages)."""
    rows = []
    for planted_kind, _ in KINDS:
        row = dict(table[planted_kind], kind=planted_kind)
        for key in ('recall_2n', 'precision_n'):
            row[key] = None if row[key] is None else 100.0 * row[key]
        rows.append(row)
    return rows


def write_planted_set(clean_json, image_dir, folder, seed, share) -> dict:
    """folder/instances.json (errors planted) with links to the photos; returns the record
    of what was planted (also folder/planted.json)."""
    with open(clean_json) as stream:
        coco = json.load(stream)
    noisy, planted = plant(coco, seed, share)
    os.makedirs(folder, exist_ok=True)
    for image in coco['images']:
        link = os.path.join(folder, image['file_name'])
        if not os.path.lexists(link):
            os.makedirs(os.path.dirname(link), exist_ok=True)
            os.symlink(os.path.abspath(os.path.join(image_dir, image['file_name'])), link)
    _write_if_changed(os.path.join(folder, 'planted.json'), planted)
    _write_if_changed(os.path.join(folder, 'instances.json'), noisy)
    return planted


def _write_if_changed(path, value):
    """A rerun leaves an equal file as it is: the review's rerun check reads the input's file
    times, and a rewritten set would be a changed input (finetune/rerun.py)."""
    try:
        with open(path) as stream:
            if json.load(stream) == json.loads(json.dumps(value)):
                return
    except (OSError, ValueError):
        pass
    atomic_file.write_json_atomically(path, value)


def clean_set(data, folder, photos, seed) -> tuple:
    """(clean COCO JSON, its image dir) of --data: 'easy', 'synthetic' or a COCO folder/file
    of your own (its JSON and images as the fine-tune finds them)."""
    if data == 'easy':
        made = synthetic_coco.generated_once(folder, [data, photos, seed], lambda: {
            'annotations': make_easy(folder, photos, seed), 'image_dir': folder})
        return made['annotations'], made['image_dir']
    if data == 'synthetic':
        paths = synthetic_coco.generated_once(
            folder, [data, photos, seed],
            lambda: synthetic_coco.generate(folder, num_train=photos, num_val=0, seed=seed))
        return paths['train_annotations'], paths['train_image_dir']
    kind, paths = inputs.detect('data', data)
    if kind != 'COCO':
        raise inputs.InputError('--data=%s holds %s; the planted benchmark reads a COCO set '
                                '(convert it with dataset.voc_to_coco or yolo_to_coco)'
                                % (data, kind))
    return paths[0], inputs.read_coco(paths[0]).image_dir


def image_names(json_path) -> dict:
    with open(json_path) as stream:
        return {image['id']: image['file_name'] for image in json.load(stream)['images']}


QUICK_HPARAMS = ('image_size=128,min_level=3,max_level=5,fpn_num_filters=16,fpn_cell_repeats=1,'
                 'box_class_repeats=1')


def settings(output_dir, quick=False, **values) -> 'Settings':
    """The benchmark's Settings; quick: a dozen easy photos, a small network, 2 folds of 2
    steps (that it runs, not numbers)."""
    if quick:
        values.update(data='easy', photos=12, folds=2, steps=2, hparams=','.join(
            part for part in (QUICK_HPARAMS, values.get('hparams')) if part))
    return Settings(output_dir, **values)


@dataclasses.dataclass(frozen=True)
class Settings:
    """`bench.py review_planted`: the clean set (data, photos, seed), what is planted (share)
    and how the review runs (its flags: folds, steps, model_name, weights, hparams,
    max_minutes, threshold); clean: also review the clean set."""
    output_dir: str
    data: str = 'easy'
    photos: int = 200
    seed: int = 0
    share: float = SHARE
    folds: int = 0
    steps: int = 0
    model_name: str = ''
    weights: str = ''
    hparams: str = ''
    max_minutes: float = 0.0
    threshold: float = issues_lib.DEFAULT_THRESHOLD
    clean: bool = True
    verbose: bool = False


def _review(settings, data, output_dir, stream):
    start = time.monotonic()
    run.review(run.Options(
        data=data, output_dir=output_dir, weights=settings.weights,
        model_name=settings.model_name, hparams=settings.hparams, folds=settings.folds,
        steps=settings.steps, max_minutes=settings.max_minutes, threshold=settings.threshold,
        verbose=settings.verbose), stream)
    rows = read_issues(os.path.join(output_dir, 'review', 'issues.csv'))
    return rows, (time.monotonic() - start) / 60.0


def benchmark(settings, stream=None) -> dict:
    """Plants, reviews the planted set (and the clean one), measures; returns the record
    (also output_dir/planted.json) with the table's rows."""
    root = os.path.abspath(settings.output_dir)
    clean_json, image_dir = clean_set(settings.data, os.path.join(root, 'data'),
                                      settings.photos, settings.seed)
    clean_folder = os.path.join(root, 'clean-set')
    write_planted_set(clean_json, image_dir, clean_folder, settings.seed, 0.0)
    planted = write_planted_set(clean_json, image_dir, os.path.join(root, 'planted-set'),
                                settings.seed, settings.share)
    rows, minutes = _review(settings, os.path.join(root, 'planted-set'),
                            os.path.join(root, 'planted'), stream)
    clean_rows, clean_minutes = (_review(settings, clean_folder, os.path.join(root, 'clean'),
                                         stream) if settings.clean else (None, None))
    table = measure(rows, planted, image_names(clean_json), clean_rows)
    record = {'settings': dataclasses.asdict(settings), 'table': table,
              'minutes': {'planted': round(minutes, 1),
                          'clean': None if clean_minutes is None else round(clean_minutes, 1)},
              'rows': table_rows(table)}
    atomic_file.write_json_atomically(os.path.join(root, 'planted.json'), record)
    return record
