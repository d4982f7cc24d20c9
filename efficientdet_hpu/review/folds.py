"""The labelled photos in K folds, whole photos, each fold held out by the model that predicts
it and seen by every other fold's model.

Fold 0 is the fine-tune's validation (its --val_photos, --val_data, a data.yaml's val: or its
split by file name), and folds 1..K-1 cut the training photos, where then no fold holds more
than MOST_SHARE / K of the photos, or where the fine-tune's own model predicts fold 0.
Otherwise (2 folds of a 20% validation: a model would train on a fifth of the photos) the K
folds cut the training and validation photos together. The cuts are contiguous runs of
equal size in the fine-tune's order, the SHA-1 of each file name (finetune/inputs.py): the same
photos make the same folds whatever the order of the files. Tiles never cross folds: a photo's
tiles go where it goes.

A photo is (source, COCO image id), source 'train' or 'val' (data/train.json, data/val.json
of the fine-tune's layout: the two may number their images alike). Plain Python over COCO
dicts.
"""
import dataclasses
from typing import List, Sequence, Tuple

from efficientdet_hpu.core.errors import UserError
from efficientdet_hpu.finetune import inputs

MOST_SHARE = 1.25  # Of 1/K: no fold with fold 0 the validation may hold more.


@dataclasses.dataclass(frozen=True)
class Fold:
    """One fold: its index and its photos, (source, image id) pairs."""
    index: int
    photos: Tuple[Tuple[str, int], ...]

    @property
    def is_validation(self) -> bool:
        """Whether the fold is the fine-tune's validation photos (all of them: fold 0)."""
        return self.index == 0 and all(source == 'val' for source, _ in self.photos)

    def ids(self, source) -> Tuple[int, ...]:
        """The image ids of the fold's photos from `source`."""
        return tuple(image_id for kind, image_id in self.photos if kind == source)


def _chunks(items: Sequence, count: int) -> List[list]:
    """`items` in `count` contiguous runs whose sizes differ by at most one."""
    size, extra = divmod(len(items), count)
    runs, start = [], 0
    for index in range(count):
        end = start + size + (1 if index < extra else 0)
        runs.append(list(items[start:end]))
        start = end
    return runs


def smallest_training(train_photos, val_photos, folds) -> int:
    """The photos the smallest training set holds with fold 0 the validation and folds
    1..folds-1 the training photos: all but the biggest fold."""
    biggest = max(val_photos, -(-train_photos // max(1, folds - 1)))
    return train_photos + val_photos - biggest


def keeps_validation(train_photos, val_photos, folds) -> bool:
    """Whether fold 0 can be the validation: then no fold holds more than MOST_SHARE / folds
    of the photos (every model trains on nearly as many as with `folds` equal folds)."""
    photos = train_photos + val_photos
    return photos - smallest_training(train_photos, val_photos, folds) <= (
        MOST_SHARE * photos / float(folds))


def _ordered(*sources):
    """(source, image id) of every photo of the (source, COCO dict) pairs, in SHA-1 order of
    the file names (the fine-tune's), a name in both sources train's first."""
    photos = [(inputs.hash_key(image), source, image['id']) for source, coco in sources
              for image in coco['images']]
    return [(source, image_id) for _, source, image_id in sorted(photos)]


def assign(train, val, folds, keep_validation=False) -> Tuple[Fold, ...]:
    """The folds of a fine-tune's train and val COCO dicts: fold 0 the val photos where
    keeps_validation (or `keep_validation`: the fine-tune's model predicts them), folds
    1..folds-1 the training photos; otherwise every photo cut into `folds` runs."""
    if folds < 2:
        raise UserError('--folds=%d: the review needs at least 2 folds (each photo is '
                        'predicted by a model trained on the others)' % folds)
    if not val['images']:
        raise UserError('the review needs validation photos for its first fold; the data '
                        'stage held out none')
    photos = len(train['images']) + len(val['images'])
    if not (keep_validation or keeps_validation(len(train['images']), len(val['images']),
                                                folds)):
        if photos < folds:
            raise UserError('%d photos cannot make %d folds; give --folds=%d or fewer'
                            % (photos, folds, photos))
        return tuple(Fold(index, tuple(run)) for index, run in enumerate(
            _chunks(_ordered(('train', train), ('val', val)), folds)))
    if len(train['images']) < folds - 1:
        raise UserError('%d training photos cannot make %d more folds; give --folds=%d or '
                        'fewer' % (len(train['images']), folds - 1, len(train['images']) + 1))
    runs = _chunks(_ordered(('train', train)), folds - 1)
    return (Fold(0, tuple(_ordered(('val', val)))),) + tuple(
        Fold(index + 1, tuple(run)) for index, run in enumerate(runs))


def training_folds(folds, held_out) -> Tuple[Fold, ...]:
    """The folds a fold's model trains on: all but `held_out`."""
    return tuple(fold for fold in folds if fold.index != held_out.index)


def to_record(folds) -> list:
    return [{'index': fold.index, 'photos': [list(photo) for photo in fold.photos]}
            for fold in folds]


def from_record(record) -> Tuple[Fold, ...]:
    """The folds of to_record's list (or of a review written before folds could mix sources:
    {'index', 'source', 'image_ids'})."""
    return tuple(Fold(entry['index'], tuple(
        (source, image_id) for source, image_id in entry['photos']) if 'photos' in entry
        else tuple((entry['source'], image_id) for image_id in entry['image_ids']))
        for entry in record)


def check_disjoint(folds) -> None:
    """Raises AssertionError when a photo (source, id) is in two folds: the review's premise."""
    seen = {}
    for fold in folds:
        for photo in fold.photos:
            assert photo not in seen, 'photo %s in folds %d and %d' % (photo, seen[photo],
                                                                        fold.index)
            seen[photo] = fold.index
