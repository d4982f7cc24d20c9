"""review/folds.py: fold 0 is the fine-tune's validation, the training photos are cut in the
fine-tune's SHA-1 order into runs of equal size, no photo is in two folds, and the folds do not
depend on the order of the files."""
import hashlib

import pytest

from efficientdet_hpu.core.errors import UserError
from efficientdet_hpu.review import folds as folds_lib


def coco(names, first_id=1):
    return {'images': [{'id': first_id + i, 'file_name': name, 'width': 10, 'height': 10}
                       for i, name in enumerate(names)],
            'annotations': [], 'categories': [{'id': 1, 'name': 'a'}]}


def sha1(name):
    return hashlib.sha1(name.encode('utf-8')).hexdigest()


def test_fold_zero_is_the_validation_and_the_rest_runs_of_the_sha1_order():
    names = ['p%d.jpg' % i for i in range(7)]
    train, val = coco(names), coco(['v0.jpg', 'v1.jpg'], first_id=1)  # Ids clash: sources differ.
    folds = folds_lib.assign(train, val, 4)
    assert folds[0] == folds_lib.Fold(0, 'val', (1, 2))
    ordered = sorted(range(7), key=lambda i: sha1(names[i]))  # By hand: 7 photos in 3 runs.
    ids = [i + 1 for i in ordered]
    assert [fold.image_ids for fold in folds[1:]] == [tuple(ids[:3]), tuple(ids[3:5]),
                                                      tuple(ids[5:])]
    assert all(fold.source == 'train' for fold in folds[1:])
    folds_lib.check_disjoint(folds)


def test_the_order_of_the_files_does_not_change_the_folds():
    names = ['a%d.png' % i for i in range(9)]
    shuffled = coco(list(reversed(names)))
    by_name = lambda folds, data: [sorted(next(image['file_name'] for image in data['images']
                                               if image['id'] == i) for i in fold.image_ids)
                                   for fold in folds[1:]]
    forward, backward = coco(names), shuffled
    assert by_name(folds_lib.assign(forward, coco(['v.png']), 3), forward) == by_name(
        folds_lib.assign(backward, coco(['v.png']), 3), backward)


def test_a_photo_in_two_folds_is_caught():
    folds = (folds_lib.Fold(0, 'val', (1,)), folds_lib.Fold(1, 'train', (1, 2)),
             folds_lib.Fold(2, 'train', (2,)))
    with pytest.raises(AssertionError, match=r"photo \('train', 2\) in folds 1 and 2"):
        folds_lib.check_disjoint(folds)


def test_too_few_photos_or_folds_are_one_line():
    with pytest.raises(UserError, match='at least 2 folds'):
        folds_lib.assign(coco(['a.jpg']), coco(['b.jpg']), 1)
    with pytest.raises(UserError, match='2 training photos cannot make 3 more folds; give '
                                        '--folds=3 or fewer'):
        folds_lib.assign(coco(['a.jpg', 'c.jpg']), coco(['b.jpg']), 4)


def test_folds_survive_their_json_record():
    folds = folds_lib.assign(coco(['x%d' % i for i in range(5)]), coco(['v']), 3)
    assert folds_lib.from_record(folds_lib.to_record(folds)) == folds
