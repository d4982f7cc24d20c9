"""review/exports.py on the in-process review of review_cases: review_coco.json is COCO that
pycocotools reads, every label carries its review (and CVAT's attributes), the suspected
overlooked object is an annotation of its own; without FiftyOne, the files its COCO importer
reads are there and consistent, and the line that opens the App names them. (FiftyOne itself,
which needs a MongoDB this machine cannot fetch, was tried by hand: docs/review.md.)"""
import json
import os

import pytest
from pycocotools.coco import COCO

import review_cases


@pytest.fixture(scope='module')
def reviewed(tmp_path_factory):
    root = tmp_path_factory.mktemp('exports')
    folder = review_cases.make_coco(str(root / 'data'))
    summary, layout, _, _ = review_cases.fake_review(folder, str(root / 'out'))
    return summary, layout


def test_every_label_carries_its_review_and_overlooked_objects_are_added(reviewed):
    summary, layout = reviewed
    coco = COCO(layout.coco_json)
    annotations = coco.dataset['annotations']
    assert len(annotations) == review_cases.PHOTOS * 3 + 1
    ids = [a['id'] for a in annotations]
    assert len(set(ids)) == len(ids)
    labels = [a for a in annotations if a['review'].get('kind') != 'overlooked']
    for annotation in labels:
        review = annotation['review']
        assert 0 <= review['swap'] <= 1 and 0 <= review['badloc'] <= 1
        assert review['label_id'] == str(annotation['id'])  # COCO input: its own ids.
        assert annotation['attributes']['review_suspected'] == bool(review['suspected'])
    (swapped,) = [a for a in labels if 'swap' in a['review']['suspected']]
    assert swapped['review']['suggested_class'] == 'blue'
    assert swapped['attributes']['review'].startswith('swap 0.')
    (added,) = [a for a in annotations if a['review'].get('kind') == 'overlooked']
    image = coco.imgs[added['image_id']]
    assert image['file_name'] == 'photo3.jpg' and image['review']['suspected']
    x1, y1, x2, y2 = review_cases.OVERLOOKED_BOX
    assert added['bbox'] == [x1, y1, x2 - x1, y2 - y1]
    assert coco.cats[added['category_id']]['name'] == 'blue'


def test_without_fiftyone_its_files_and_the_line_that_opens_the_app(reviewed):
    summary, layout = reviewed
    assert summary['fiftyone'] == 'files'
    directory = layout.fiftyone
    with open(os.path.join(directory, 'labels.json')) as stream:
        labels = json.load(stream)
    for image in labels['images']:
        assert os.path.isfile(os.path.join(directory, 'data', image['file_name']))
    with open(os.path.join(directory, 'predictions.json')) as stream:
        predictions = json.load(stream)['annotations']
    assert {row['image_id'] for row in predictions} <= {image['id'] for image in labels['images']}
    assert all('score' in row and len(row['bbox']) == 4 for row in predictions)
    line = summary['fiftyone_line']
    assert line.startswith('python -c "import json, fiftyone as fo') and line.endswith('"')
    assert "dataset_dir='%s'" % os.path.abspath(directory) in line
    assert 'fo.launch_app(d).wait()' in line
