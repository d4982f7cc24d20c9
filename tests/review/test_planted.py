"""review/planted.py: what is planted (how many, which boxes, the shifted boxes' IoU), how an
issues.csv is scored against it (worked out by hand), the easy set, and `bench.py
review_planted --quick` run as a user runs it (slow: two reviews of two folds each)."""
import json
import os

import pytest
from pycocotools.coco import COCO

from cli_runs import run_python
from efficientdet_hpu.review import planted
from efficientdet_hpu.review import scores as scores_lib


def _coco(photos=20, per_photo=5):
    images = [{'id': i + 1, 'file_name': 'p%d.jpg' % i, 'width': 400, 'height': 300}
              for i in range(photos)]
    annotations = [{'id': 100 + len(images) * k + i, 'image_id': i + 1,
                    'category_id': (k % 3) + 1, 'bbox': [10 + 70 * k, 20, 50, 40],
                    'area': 2000, 'iscrowd': 0} for i in range(photos) for k in range(per_photo)]
    return {'images': images, 'annotations': annotations,
            'categories': [{'id': c, 'name': 'c%d' % c} for c in (1, 2, 3)]}


def test_five_percent_of_each_kind_on_distinct_boxes():
    coco = _coco()  # 100 boxes: 5 of each kind.
    noisy, record = planted.plant(coco, seed=3)
    assert [len(record[kind]) for kind in ('dropped', 'swapped', 'shifted')] == [5, 5, 5]
    ids = ([a['id'] for a in record['dropped']] + [e['id'] for e in record['swapped']]
           + [e['id'] for e in record['shifted']])
    assert len(set(ids)) == 15
    assert len(noisy['annotations']) == 95
    by_id = {a['id']: a for a in noisy['annotations']}
    original = {a['id']: a for a in coco['annotations']}
    for entry in record['swapped']:
        assert by_id[entry['id']]['category_id'] == entry['now'] != entry['was'] == \
            original[entry['id']]['category_id']
    for entry in record['shifted']:
        assert by_id[entry['id']]['bbox'] == entry['now']
        iou = scores_lib.iou_matrix([scores_lib.xyxy(entry['was'])],
                                    [scores_lib.xyxy(entry['now'])])[0, 0]
        assert 0.4 <= iou <= 0.6 and iou == pytest.approx(entry['iou'])
        x, y, w, h = entry['now']
        assert x >= 0 and y >= 0 and x + w <= 400 and y + h <= 300
    assert planted.plant(coco, seed=3) == (noisy, record)  # The seed decides.
    assert coco == _coco()  # The clean set is left as it was.


def _row(kind, image='p0.jpg', label_id='', box=(0, 0, 1, 1)):
    return dict(kind=kind, image=image, label_id=label_id,
                **{key: str(v) for key, v in zip(('x1', 'y1', 'x2', 'y2'), box)})


def test_an_issues_table_scored_against_what_was_planted():
    record = {'dropped': [{'id': 1, 'image_id': 1, 'bbox': [10, 10, 40, 40]},
                          {'id': 2, 'image_id': 2, 'bbox': [100, 100, 20, 20]}],
              'swapped': [{'id': 7}], 'shifted': [{'id': 8}, {'id': 9}]}
    names = {1: 'p0.jpg', 2: 'p1.jpg'}
    rows = [_row('overlooked', 'p0.jpg', box=(12, 10, 52, 50)),  # IoU 38 x 40 / 1680: found.
            _row('overlooked', 'p0.jpg', box=(200, 200, 220, 220)),  # Nothing planted there.
            _row('swap', label_id='5'), _row('swap', label_id='7'),  # 7 second of 2N = 2.
            _row('badloc', label_id='9'), _row('badloc', label_id='3'),
            _row('badloc', label_id='4'), _row('badloc', label_id='8'),  # 8 is 4th: in 2N.
            _row('overlooked', 'p1.jpg', box=(100, 100, 120, 120))]  # The second dropped box.
    table = planted.measure(rows, record, names, clean_rows=[_row('swap'), _row('swap')])
    # dropped: 2 planted, the 3 overlooked rows are all in the first 2N = 4: both found; the
    # first N = 2 rows: one planted.
    assert table['dropped'] == {'planted': 2, 'listed': 3, 'recall_2n': 1.0,
                                'precision_n': 0.5, 'clean': 0}
    assert table['swapped'] == {'planted': 1, 'listed': 2, 'recall_2n': 1.0,
                                'precision_n': 0.0, 'clean': 2}
    assert table['shifted'] == {'planted': 2, 'listed': 4, 'recall_2n': 1.0,
                                'precision_n': 0.5, 'clean': 0}
    rows[7] = _row('badloc', label_id='1')  # 8 no longer listed.
    assert planted.measure(rows, record, names)['shifted']['recall_2n'] == 0.5


def test_the_easy_set_is_valid_coco_with_boxes_inside_the_photos(tmp_path):
    coco = COCO(planted.make_easy(str(tmp_path / 'easy'), 6, seed=1))
    assert len(coco.getImgIds()) == 6 and len(coco.getAnnIds()) >= 6
    for annotation in coco.dataset['annotations']:
        x, y, w, h = annotation['bbox']
        assert x >= 0 and y >= 0 and x + w <= 192 and y + h <= 144 and 20 <= w <= 56


@pytest.mark.slow
@pytest.mark.timeout(2400)
def test_the_quick_benchmark_prints_its_table(tmp_path):
    result = run_python(['bench.py', 'review_planted', '--quick',
                         '--output_dir=%s' % (tmp_path / 'bench')], timeout=2300)
    assert result.returncode == 0, result.stdout[-5000:]
    for kind in ('dropped', 'swapped', 'shifted'):
        assert any(line.split()[:1] == [kind] for line in result.stdout.splitlines()), kind
    with open(tmp_path / 'bench' / 'planted.json') as stream:
        record = json.load(stream)
    table = record['table']
    # 12 easy photos hold about 30 boxes: round(5%) of them of each kind.
    with open(tmp_path / 'bench' / 'planted-set' / 'planted.json') as stream:
        planted_record = json.load(stream)
    for kind in ('dropped', 'swapped', 'shifted'):
        assert table[kind]['planted'] == len(planted_record[kind]) >= 1
        for key in ('recall_2n', 'precision_n'):
            assert 0.0 <= table[kind][key] <= 1.0
        assert table[kind]['clean'] is not None
    for run in ('planted', 'clean'):
        assert os.path.isfile(tmp_path / 'bench' / run / 'review' / 'summary.json')
    assert 'BENCHMARK {' in result.stdout


def test_without_the_clean_set_one_review_runs_and_its_column_stays_empty(tmp_path, monkeypatch):
    reviewed = []

    def review(settings, data, output_dir, stream):
        reviewed.append(os.path.basename(output_dir))
        return [], 2.0
    monkeypatch.setattr(planted, '_review', review)
    record = planted.benchmark(planted.settings(str(tmp_path / 'bench'), photos=12, clean=False))
    assert reviewed == ['planted']
    assert record['minutes'] == {'planted': 2.0, 'clean': None}
    for kind in ('dropped', 'swapped', 'shifted'):
        assert record['table'][kind]['clean'] is None
        assert record['table'][kind]['planted'] >= 1 and record['table'][kind]['listed'] == 0
    reviewed.clear()
    planted.benchmark(planted.settings(str(tmp_path / 'both'), photos=12))
    assert reviewed == ['planted', 'clean']


@pytest.mark.parametrize('data', ['easy', 'synthetic'])
def test_a_rerun_leaves_the_sets_files_as_they_were(tmp_path, data):
    """The review's rerun check reads the input's file times (finetune/rerun.py): a rerun of the
    benchmark that wrote its sets again would be refused over the folds it trained. Other
    settings make the set again."""
    def times(folder):
        return {os.path.join(top, name): os.stat(os.path.join(top, name)).st_mtime_ns
                for top, _, names in os.walk(folder) for name in names}
    root = tmp_path / 'bench'
    made = planted.clean_set(data, str(root / 'data'), 6, 1)
    planted.write_planted_set(*made, str(root / 'planted-set'), 1, 0.2)
    before = times(root)
    assert len(before) > 6
    assert planted.clean_set(data, str(root / 'data'), 6, 1) == tuple(made)
    planted.write_planted_set(*made, str(root / 'planted-set'), 1, 0.2)
    assert times(root) == before
    planted.clean_set(data, str(root / 'data'), 6, 2)  # Another seed: made again.
    assert times(root / 'data') != {path: time for path, time in before.items()
                                    if path.startswith(str(root / 'data'))}
