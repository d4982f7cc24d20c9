"""The labelled photos in K folds, whole photos, each fold held out by the model that predicts
it and seen by every other fold's model.

Fold 0 is the fine-tune's validation (its --val_photos, --val_data, a data.yaml's val: or its
split by file name), so a fine-tune's own model predicts it; folds 1..K-1 cut the training
photos into contiguous runs of equal size in the fine-tune's order, the SHA-1 of each file name
(finetune/inputs.py): the same photos make the same folds whatever the order of the files.
Tiles never cross folds: a photo's tiles go where it goes.

Plain Python over COCO dicts; the file names and ids come from data/train.json and
data/val.json of the fine-tune's layout.
"""
import dataclasses
from typing import List, Sequence, Tuple

from efficientdet_hpu.core.errors import UserError
from efficientdet_hpu.finetune import inputs


@dataclasses.dataclass(frozen=True)
class Fold:
    """One fold: its photos (COCO image ids of `source`, 'val' or 'train') and its index."""
    index: int
    source: str
    image_ids: Tuple[int, ...]


def _chunks(items: Sequence, count: int) -> List[list]:
    """`items` in `count` contiguous runs whose sizes differ by at most one."""
    size, extra = divmod(len(items), count)
    runs, start = [], 0
    for index in range(count):
        end = start + size + (1 if index < extra else 0)
        runs.append(list(items[start:end]))
        start = end
    return runs


def assign(train, val, folds) -> Tuple[Fold, ...]:
    """The folds of a fine-tune's train and val COCO dicts: fold 0 the val photos, folds 1..
    folds-1 the training photos in SHA-1 order of their file names."""
    if folds < 2:
        raise UserError('--folds=%d: the review needs at least 2 folds (each photo is '
                        'predicted by a model trained on the others)' % folds)
    if not val['images']:
        raise UserError('the review needs validation photos for its first fold; the data '
                        'stage held out none')
    if len(train['images']) < folds - 1:
        raise UserError('%d training photos cannot make %d more folds; give --folds=%d or '
                        'fewer' % (len(train['images']), folds - 1, len(train['images']) + 1))
    ordered = inputs._hash_order(train['images'])  # pylint: disable=protected-access
    runs = _chunks([image['id'] for image in ordered], folds - 1)
    return (Fold(0, 'val', tuple(image['id'] for image in val['images'])),) + tuple(
        Fold(index + 1, 'train', tuple(run)) for index, run in enumerate(runs))


def training_folds(folds, held_out) -> Tuple[Fold, ...]:
    """The folds a fold's model trains on: all but `held_out`."""
    return tuple(fold for fold in folds if fold.index != held_out.index)


def to_record(folds) -> list:
    return [dataclasses.asdict(fold) for fold in folds]


def from_record(record) -> Tuple[Fold, ...]:
    return tuple(Fold(entry['index'], entry['source'], tuple(entry['image_ids']))
                 for entry in record)


def check_disjoint(folds) -> None:
    """Raises AssertionError when a photo (source, id) is in two folds: the review's premise."""
    seen = {}
    for fold in folds:
        for image_id in fold.image_ids:
            key = (fold.source, image_id)
            assert key not in seen, 'photo %s in folds %d and %d' % (key, seen[key], fold.index)
            seen[key] = fold.index
