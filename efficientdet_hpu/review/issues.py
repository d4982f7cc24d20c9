"""The issues table: cleanlab's scores (review/scores.py) turned into rows a person acts on,
ranked most likely wrong first, and written as issues.csv.

One row per suspected issue: a label (swap, badloc), a prediction no label covers
(overlooked) or a photo (image) whose cleanlab score is at most the threshold (cleanlab's
`issues_from_scores` picks and orders them within a kind); the kinds are then merged by score.
A label listed as a swap is not listed as badloc too.
Columns:

  rank             1 = most likely wrong
  image            the photo's path from the training photos' folder: its file name as its
                   annotations name it; a --val_data photo's from there ('../val/a.jpg')
  kind             overlooked | swap | badloc | image
  label_id         the input's own id of the label: the COCO annotation id, `file.txt:line`
                   (YOLO), `file.xml:object-index` (Pascal VOC); empty for overlooked and image
  class            the label's class (overlooked: the model's class; image: empty)
  suggested_class  swap: the class the model sees there
  x1,y1,x2,y2      pixels of the original photo: the label's box (swap, badloc), the model's
                   (overlooked), the whole photo (image)
  score            cleanlab's score, 0 (surely wrong) to 1
  suggested_box    badloc and swap: the model's box there, 'x1 y1 x2 y2'
"""
import csv
import dataclasses
from typing import List, Optional

import numpy as np

from efficientdet_hpu.core import atomic_file
from efficientdet_hpu.review import scores as scores_lib

COLUMNS = ('rank', 'image', 'kind', 'label_id', 'class', 'suggested_class', 'x1', 'y1', 'x2',
           'y2', 'score', 'suggested_box')
KINDS = scores_lib.KINDS + ('image',)
# cleanlab's tutorial cuts its photo scores at 0.5; a badloc score is about the IoU of the label
# with the model's box, and boxes planted at IoU 0.4-0.6 score up to 0.6: listed at 0.6.
DEFAULT_THRESHOLD = 0.6


@dataclasses.dataclass(frozen=True)
class Issue:
    """One row; `photo` the index of its photo in the review's photo list, `label` the index
    of the label in that photo's labels (None for overlooked and image)."""
    photo: int
    kind: str
    score: float
    box: tuple
    label: Optional[int] = None
    label_id: str = ''
    class_name: str = ''
    suggested_class: str = ''
    suggested_box: Optional[tuple] = None


def label_id(annotation) -> str:
    """The input's own id: the converters' `source` (YOLO, VOC), else the COCO id."""
    return str(annotation.get('source') or annotation['id'])


def candidates(photos, results, names) -> dict:
    """{kind: [Issue]} of every scored box and photo. photos: [{'name', 'width',
    'height', 'annotations' (cleanlab's labels, in order)}]; results: scores.score's;
    names: class index -> name."""
    found = {kind: [] for kind in KINDS}
    for index, (photo, result) in enumerate(zip(photos, results)):
        for label, (annotation, row) in enumerate(zip(photo['annotations'], result['labels'])):
            common = dict(photo=index, label=label, label_id=label_id(annotation),
                          box=tuple(scores_lib.xyxy(annotation['bbox'])),
                          class_name=names[photo['classes'][label]])
            found['swap'].append(Issue(
                kind='swap', score=row['swap'], suggested_box=_box(row['swap_box']),
                suggested_class='' if row['suggested_class'] is None
                else names[row['suggested_class']], **common))
            found['badloc'].append(Issue(kind='badloc', score=row['badloc'],
                                         suggested_box=_box(row['badloc_box']), **common))
        for row in result['overlooked']:
            found['overlooked'].append(Issue(index, 'overlooked', row['score'],
                                             tuple(row['box']), class_name=names[row['class']]))
        found['image'].append(Issue(index, 'image', result['image'],
                                    (0.0, 0.0, float(photo['width']), float(photo['height']))))
    return found


def _box(values):
    return None if values is None else tuple(float(v) for v in values)


def ranked(found, threshold, rank_module) -> List[Issue]:
    """The issues at or under `threshold`, worst first: each kind's by cleanlab's
    issues_from_scores, then merged by score (ties: overlooked, swap, badloc, image). A label
    listed as a swap is not listed as a bad location too: cleanlab compares a label's box with
    the predictions of the label's class only, so a label the model sees as another class
    scores low there for the same reason (docs/review.md)."""
    chosen, swapped = [], set()
    for order, kind in enumerate(KINDS):
        rows = found[kind]
        values = np.array([row.score for row in rows], np.float64)
        for index in rank_module.issues_from_scores(values, threshold=threshold):
            row = rows[index]
            if kind == 'badloc' and (row.photo, row.label) in swapped:
                continue
            if kind == 'swap':
                swapped.add((row.photo, row.label))
            chosen.append((row.score, order, len(chosen), row))
    return [row for *_, row in sorted(chosen, key=lambda item: item[:3])]


def _number(value):
    return '%.1f' % value


def csv_rows(issues, photos) -> list:
    rows = []
    for rank, issue in enumerate(issues, start=1):
        rows.append([rank, photos[issue.photo]['name'], issue.kind, issue.label_id,
                     issue.class_name, issue.suggested_class]
                    + [_number(v) for v in issue.box] + ['%.4g' % issue.score,
                    ' '.join(_number(v) for v in issue.suggested_box)
                    if issue.suggested_box else ''])
    return rows


def write_csv(path, issues, photos):
    with atomic_file.replacing(path, suffix='.csv') as temporary:
        with open(temporary, 'w', newline='', encoding='utf-8') as stream:
            writer = csv.writer(stream)
            writer.writerow(COLUMNS)
            writer.writerows(csv_rows(issues, photos))


def counts(issues) -> dict:
    """{kind: issues of that kind}."""
    return {kind: sum(1 for issue in issues if issue.kind == kind) for kind in KINDS}
