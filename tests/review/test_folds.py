"""review/folds.py: fold 0 is the fine-tune's validation where no fold then holds more than
1.25/K of the photos, the training photos are cut in the fine-tune's SHA-1 order into runs of
equal size; otherwise all the photos are; no photo is in two folds, and the folds do not
depend on the order of the files."""
import hashlib
import json

import pytest

from efficientdet_hpu.core.errors import UserError
from efficientdet_hpu.review import folds as folds_lib
from efficientdet_hpu.review import layout as layout_lib
from efficientdet_hpu.review import predictions


def coco(names, first_id=1):
    return {'images': [{'id': first_id + i, 'file_name': name, 'width': 10, 'height': 10}
                       for i, name in enumerate(names)],
            'annotations': [], 'categories': [{'id': 1, 'name': 'a'}]}


def sha1(name):
    return hashlib.sha1(name.encode('utf-8')).hexdigest()


def test_fold_zero_is_the_validation_and_the_rest_runs_of_the_sha1_order():
    names = ['p%d.jpg' % i for i in range(8)]
    train, val = coco(names), coco(['v0.jpg', 'v1.jpg'], first_id=1)  # Ids clash: sources differ.
    folds = folds_lib.assign(train, val, 4)  # The biggest fold 3 of 10: under 1.25 / 4.
    assert folds[0] == folds_lib.Fold(0, (('val', 1), ('val', 2))) and folds[0].is_validation
    ordered = sorted(range(8), key=lambda i: sha1(names[i]))  # By hand: 8 photos in 3 runs.
    ids = [i + 1 for i in ordered]
    assert [fold.ids('train') for fold in folds[1:]] == [tuple(ids[:3]), tuple(ids[3:6]),
                                                         tuple(ids[6:])]
    assert not any(fold.ids('val') for fold in folds[1:])
    folds_lib.check_disjoint(folds)


def test_a_validation_far_from_one_kth_is_cut_with_the_training_photos():
    # 2 folds of 8 + 2 photos: fold 0 the validation would leave fold 1's model 2 photos.
    names = ['p%d.jpg' % i for i in range(8)]
    train, val = coco(names), coco(['v0.jpg', 'v1.jpg'], first_id=1)  # Ids clash.
    folds = folds_lib.assign(train, val, 2)
    every = sorted([(sha1(name), 'train', i + 1) for i, name in enumerate(names)]
                   + [(sha1('v%d.jpg' % i), 'val', i + 1) for i in range(2)])
    photos = [(source, image_id) for _, source, image_id in every]
    assert folds == (folds_lib.Fold(0, tuple(photos[:5])), folds_lib.Fold(1, tuple(photos[5:])))
    assert not folds[0].is_validation
    folds_lib.check_disjoint(folds)
    # The fine-tune's model predicts its validation: fold 0 stays the validation.
    assert folds_lib.assign(train, val, 2, keep_validation=True)[0].is_validation
    # No fold over 1.25/K keeps it: 3 folds of 2 + 4 + 4 photos (4 is 1.2 thirds of 10).
    assert folds_lib.assign(train, val, 3)[0].is_validation
    # 1 + 4 + 4 of 9: 4 is 1.33 thirds.
    assert not folds_lib.assign(train, coco(['v0.jpg']), 3)[0].is_validation
    # 2 folds of 2 + 6 (a quarter of the photos as fold 0): the other model would train on 2.
    assert not folds_lib.assign(coco(names[:6]), val, 2)[0].is_validation
    assert folds_lib.smallest_training(6, 2, 2) == 2


def test_the_order_of_the_files_does_not_change_the_folds():
    names = ['a%d.png' % i for i in range(9)]
    shuffled = coco(list(reversed(names)))
    by_name = lambda folds, data: [sorted(next(image['file_name'] for image in data['images']
                                               if image['id'] == i) for i in fold.ids('train'))
                                   for fold in folds]
    forward, backward = coco(names), shuffled
    assert by_name(folds_lib.assign(forward, coco(['v.png']), 3), forward) == by_name(
        folds_lib.assign(backward, coco(['v.png']), 3), backward)


def test_a_photo_in_two_folds_is_caught():
    folds = (folds_lib.Fold(0, (('val', 1),)), folds_lib.Fold(1, (('train', 1), ('train', 2))),
             folds_lib.Fold(2, (('train', 2),)))
    with pytest.raises(AssertionError, match=r"photo \('train', 2\) in folds 1 and 2"):
        folds_lib.check_disjoint(folds)


def test_too_few_photos_or_folds_are_one_line():
    with pytest.raises(UserError, match='at least 2 folds'):
        folds_lib.assign(coco(['a.jpg']), coco(['b.jpg']), 1)
    with pytest.raises(UserError, match='2 training photos cannot make 3 more folds; give '
                                        '--folds=3 or fewer'):  # The validation's own fold.
        folds_lib.assign(coco(['a.jpg', 'c.jpg']), coco(['b.jpg']), 4, keep_validation=True)
    with pytest.raises(UserError, match='3 photos cannot make 5 folds; give --folds=3 or '
                                        'fewer'):
        folds_lib.assign(coco(['a.jpg', 'c.jpg']), coco(['b.jpg']), 5)


def test_folds_survive_their_json_record_and_an_earlier_review_s_is_read():
    folds = folds_lib.assign(coco(['x%d' % i for i in range(5)]), coco(['v']), 3)
    assert folds_lib.from_record(folds_lib.to_record(folds)) == folds
    mixed = folds_lib.assign(coco(['x%d' % i for i in range(5)]), coco(['v']), 2)
    assert folds_lib.from_record(json.loads(json.dumps(folds_lib.to_record(mixed)))) == mixed
    # A plan.json written when each fold held one source.
    assert folds_lib.from_record([{'index': 0, 'source': 'val', 'image_ids': [4]},
                                  {'index': 1, 'source': 'train', 'image_ids': [1, 2]}]) == (
        folds_lib.Fold(0, (('val', 4),)), folds_lib.Fold(1, (('train', 1), ('train', 2))))


def test_a_fold_of_both_sources_is_one_coco_whose_photos_map_back(tmp_path):
    # A --val_data folder numbers its photos and labels as the training folder does.
    dirs = {'train': tmp_path / 'train', 'val': tmp_path / 'val'}
    for source, directory in dirs.items():
        directory.mkdir()
        for name in ('same.jpg', '%s.jpg' % source):
            (directory / name).write_bytes(source.encode())
    labelled = lambda names: dict(coco(names), annotations=[
        {'id': 1, 'image_id': 1, 'category_id': 1, 'bbox': [1, 1, 2, 2]},
        {'id': 2, 'image_id': 2, 'category_id': 1, 'bbox': [3, 3, 2, 2]}])
    train, val = labelled(['same.jpg', 'train.jpg']), labelled(['same.jpg', 'val.jpg'])
    fold = folds_lib.Fold(0, (('train', 1), ('val', 1), ('val', 2)))
    layout = layout_lib.Layout(str(tmp_path / 'out'))
    predictions.write_inputs(layout, fold, predictions.fold_coco(fold, train, val),
                             {source: str(directory) for source, directory in dirs.items()})
    with open(layout.fold(0, 'photos.json')) as stream:
        photos = json.load(stream)
    with open(layout.fold(0, 'records.json')) as stream:
        records = json.load(stream)
    assert [image['id'] for image in photos['images']] == [1, 2, 3]  # Renumbered: ids clash.
    keys = {image['id']: predictions.photo_key(fold, image) for image in photos['images']}
    assert sorted(keys.values()) == sorted(fold.photos)
    # Each label stays with its photo, its own id kept (the issues name it).
    assert sorted((keys[a['image_id']], a['id']) for a in photos['annotations']) == [
        (('train', 1), 1), (('val', 1), 1), (('val', 2), 2)]
    # The converter reads the links: one name each, to the photo of its source.
    names = [image['file_name'] for image in records['images']]
    assert len(set(names)) == 3 and [image['file_name'] for image in photos['images']] == [
        'same.jpg', 'same.jpg', 'val.jpg']
    for image, name in zip(photos['images'], names):
        source = keys[image['id']][0]
        assert (tmp_path / 'out' / 'review' / 'folds' / 'fold-0' / 'photos' / name
                ).read_bytes() == source.encode()
