"""The review's plan: how many folds, how many steps each fold's model trains, and what the
review adds to the time. Pure (no TensorFlow, no files), like finetune/plan.py, whose plan
each fold's model follows (model, image size, tiles, batch, schedule, anchors).

Folds: DEFAULT_FOLDS, so that fold 0 is the fine-tune's 20% validation and every fold's
model trains on about as many photos as the fine-tune's own (review/folds.py: where that
would leave a fold over 1.25/K of the photos, the K folds cut them all). Steps: the fine-tune's.
A budget (--max_minutes) that cannot hold them scales every fold's steps down by one factor;
below half of them, fewer folds are tried (fewer models, so each gets more steps), down to 2;
a budget that cannot hold MIN_STEPS a fold is an error saying how long the review needs. Once a
fold has trained, its measured rate re-estimates the rest and refits the later folds (refit).
"""
import dataclasses
import math
from typing import Tuple

from efficientdet_hpu.core.errors import UserError
from efficientdet_hpu.finetune import costs
from efficientdet_hpu.finetune import plan as finetune_plan
from efficientdet_hpu.finetune import plan_file
from efficientdet_hpu.finetune import schedule
from efficientdet_hpu.finetune import stats
from efficientdet_hpu.review import folds as folds_lib

DEFAULT_FOLDS = 5  # 1 / 0.2: fold 0 is the fine-tune's validation share (VAL_FRACTION).
MIN_FOLDS = 2
MIN_STEPS = schedule.MIN_BUDGET_STEPS
KEEP_SHARE = 0.5  # Under this share of the fine-tune's steps, fewer folds are tried first.
# cleanlab's scores (pure Python IoU loops, rank.py) and the page's crops: measured on the
# synthetic set (docs/review.md), rounded up.
SCORE_SECONDS = 20.0
SCORE_SECONDS_PER_LABEL = 0.02
MIN_MAX_DETECTIONS = 100  # inference.py's own cap; more when photos hold more boxes.


@dataclasses.dataclass(frozen=True)
class Request:
    """--folds (0: planned), --steps per fold (0: the fine-tune's), --max_minutes of the
    review (0: none), whether fold 0 is predicted by a fine-tune's trained model, and the
    cost table the times come from (finetune/costs.py; None: costs.load())."""
    folds: int = 0
    steps: int = 0
    max_minutes: float = 0.0
    reuse_first: bool = False
    table: object = None

    def costs(self) -> costs.Table:
        return self.table or costs.load()


@dataclasses.dataclass(frozen=True)
class ReviewPlan:
    """folds: the Folds; steps: each fold's training steps (0: the fine-tune's model, not
    trained again); train_images: the images (tiles when tiled) each fold's model trains on;
    max_detections: the prediction cap per image (per tile when tiled)."""
    folds: Tuple[folds_lib.Fold, ...]
    steps: Tuple[int, ...]
    train_images: Tuple[int, ...]
    max_detections: int
    max_instances: int
    seconds: Tuple[Tuple[str, float], ...]
    reasons: Tuple[Tuple[str, str], ...]

    @property
    def total_seconds(self) -> float:
        return sum(seconds for _, seconds in self.seconds)


def _images(coco, ids, plan):
    """Photos of `ids`, or their tiles when the plan tiles."""
    keep = set(ids)
    photos = [photo for image, photo in zip(coco['images'], stats.photos_of(coco))
              if image['id'] in keep]
    return (stats.tile_count(photos, plan.tile_size, plan.tile_overlap) if plan.tile_size
            else len(photos))


def _fold_images(folds, train, val, plan):
    """(images each fold predicts, images each fold's model trains on)."""
    own = [_images(train, fold.ids('train'), plan) + _images(val, fold.ids('val'), plan)
           for fold in folds]
    return own, [sum(own) - count for count in own]


def training_seconds(plan, steps, table) -> float:
    """A fold model's start-up and steps (0 steps: not trained, no time)."""
    if not steps:
        return 0.0
    return (table.startup_seconds(plan.model_name, plan.image_size)
            + steps * plan.global_batch / plan.images_per_second)


def _prediction_seconds(plan, own, table) -> float:
    """The prediction runs of folds predicting `own` images each, at the plan's rate."""
    return (len(own) * table.predict_seconds
            + sum(own) / (plan.images_per_second * table.inference_speedup))


def _fitting_steps(plan, spare, trained) -> int:
    """The steps each of `trained` fold models gets in `spare` seconds at the plan's rate."""
    return int(spare * plan.images_per_second / plan.global_batch / max(1, trained))


def _seconds(plan, folds, steps, own, request, labels):
    table = request.costs()
    converted = sum(count for fold, count in zip(folds, own)
                    if not (fold.index == 0 and request.reuse_first))
    trained = [count for count in steps if count]
    return (('records', converted / table.convert_images_per_second),
            ('training', sum(training_seconds(plan, count, table) for count in trained)),
            ('predictions', _prediction_seconds(plan, own, table)),
            ('scores and page', SCORE_SECONDS + SCORE_SECONDS_PER_LABEL * labels))


def refit(review, plan, index, rate, seconds_left, table, reached=None):
    """The review once fold `index` trained at `rate` images/s, measured (the plan's rate came
    from the cost table): where `seconds_left` (the budget's; None: no budget) cannot hold the
    later folds at that rate, their steps cut by one factor, never under MIN_STEPS and never
    above the plan's. `reached` maps a later fold's index to the step a stopped run's
    checkpoint of it reached (its steps once trained): only the steps left are timed. Returns
    (the review with those steps, the plan at `rate`, the seconds the rest of the review
    takes: the later folds' training, the predictions from fold `index`'s on, the scores and
    the page)."""
    plan = dataclasses.replace(plan, images_per_second=rate)
    steps = list(review.steps)
    done = [min((reached or {}).get(fold.index, 0), count)
            for fold, count in zip(review.folds, steps)]
    every = sum(review.train_images) // max(1, len(review.folds) - 1)  # Each photo once.
    own = [every - count for count, fold in zip(review.train_images, review.folds)
           if fold.index >= index]
    rest = _prediction_seconds(plan, own, table) + dict(review.seconds)['scores and page']
    later = [i for i, fold in enumerate(review.folds)
             if fold.index > index and steps[i] > done[i]]
    if seconds_left is not None and later:
        spare = (seconds_left - rest
                 - len(later) * table.startup_seconds(plan.model_name, plan.image_size))
        fitting = max(MIN_STEPS, _fitting_steps(plan, spare, len(later)))
        steps = [min(count, done[i] + fitting) if i in later else count
                 for i, count in enumerate(steps)]
    rest += sum(training_seconds(plan, steps[i] - done[i], table) for i in later)
    return dataclasses.replace(review, steps=tuple(steps)), plan, rest


def _steps_within(plan, folds, own, request, labels, wanted):
    """(steps of each fold, the factor of `wanted` they are) under the budget."""
    fold_steps = [0 if fold.index == 0 and request.reuse_first else wanted for fold in folds]
    if not request.max_minutes:
        return fold_steps, 1.0
    budget = request.max_minutes * 60.0
    fixed = sum(s for part, s in _seconds(plan, folds, [0] * len(folds), own, request, labels))
    trained = sum(1 for count in fold_steps if count)
    spare = budget - fixed - trained * request.costs().startup_seconds(plan.model_name,
                                                                       plan.image_size)
    fitting = _fitting_steps(plan, spare, trained)
    factor = min(1.0, fitting / float(wanted))
    return [min(count, fitting) for count in fold_steps], factor


def _minimum_minutes(plan, folds, own, request, labels):
    fixed = sum(s for _, s in _seconds(plan, folds, [MIN_STEPS] * len(folds), own, request,
                                       labels))
    return int(math.ceil(fixed / 60.0))


def _choose(plan, train, val, request, labels, wanted):
    """(folds, steps per fold, images each fold's model trains on, images each fold
    predicts, why, whether the fine-tune's model predicts fold 0)."""
    if request.folds:
        candidates = [request.folds]
    else:
        top = min(DEFAULT_FOLDS, len(train['images']) + 1)
        candidates = list(range(top, MIN_FOLDS - 1, -1)) or [MIN_FOLDS]
    last = None
    for count in candidates:
        # The fine-tune's model predicts fold 0 only where its validation makes a fold.
        reuse = request.reuse_first and folds_lib.keeps_validation(
            len(train['images']), len(val['images']), count)
        asked = dataclasses.replace(request, reuse_first=reuse)
        folds = folds_lib.assign(train, val, count, keep_validation=reuse)
        own, trains = _fold_images(folds, train, val, plan)
        steps, factor = _steps_within(plan, folds, own, asked, labels, wanted)
        trained = [s for fold, s in zip(folds, steps) if not (fold.index == 0 and reuse)]
        if all(s >= min(MIN_STEPS, wanted) for s in trained) and (
                factor >= KEEP_SHARE or count == candidates[-1]):
            why = ('asked with --folds' if request.folds else
                   'each model trains on 4/5 of the photos' if count == DEFAULT_FOLDS else
                   'fewer than %d: %s' % (DEFAULT_FOLDS, 'one a training photo' if count ==
                                          len(train['images']) + 1 else 'the budget'))
            return folds, steps, trains, own, why, reuse
        last = (folds, own, asked)
    raise finetune_plan.PlanError(
        '--max_minutes=%g is too short for the review: %d folds of %d steps take about %d '
        'min here; give at least that, or --folds=2' % (
            request.max_minutes, len(last[0]), MIN_STEPS,
            _minimum_minutes(plan, last[0], last[1], last[2], labels)))


def make(plan, train, val, request) -> ReviewPlan:
    """The review's plan for a fine-tune `plan` (finetune.plan.Plan) over its train and val
    COCO dicts; raises PlanError (a budget too short) or UserError (too few photos)."""
    if len(train['images']) + len(val['images']) < MIN_FOLDS:
        raise UserError('the review needs at least %d labelled photos' % MIN_FOLDS)
    labels = len(train['annotations']) + len(val['annotations'])
    wanted = request.steps or plan.steps
    folds, steps, trains, own, folds_why, reuse = _choose(plan, train, val, request, labels,
                                                          wanted)
    request = dataclasses.replace(request, reuse_first=reuse)
    every = stats.photos_of(train) + stats.photos_of(val)
    most = stats.most_boxes_per_image(every, plan.tile_size, plan.tile_overlap)
    per_image = max(len(photo.boxes) for photo in every) if not plan.tile_size else most
    seconds = _seconds(plan, folds, steps, own, request, labels)
    review = ReviewPlan(folds, tuple(steps), tuple(trains),
                        max(MIN_MAX_DETECTIONS, 3 * per_image), max(100, most), seconds, ())
    return dataclasses.replace(review, reasons=_reasons(review, plan, request, folds_why,
                                                        wanted))


def _fold_words(folds, request) -> str:
    """What each fold holds, in words."""
    sizes = lambda chosen: ' + '.join(str(len(fold.photos)) for fold in chosen)
    if not folds[0].is_validation:
        held = sum(len(fold.ids('val')) for fold in folds)
        photos = sum(len(fold.photos) for fold in folds)
        return ('the training and validation photos together, %s (fold 0 the validation\'s %s '
                'would leave a model %d of the %d to train on)' % (
                    sizes(folds), stats.count(held, 'photo'), folds_lib.smallest_training(
                        photos - held, held, len(folds)), photos))
    return 'fold 0 the %s of the validation%s; %s the training photos, %s' % (
        stats.count(len(folds[0].photos), 'photo'),
        ', predicted by the fine-tune\'s own model' if request.reuse_first else '',
        'fold 1' if len(folds) == 2 else 'folds 1-%d' % (len(folds) - 1), sizes(folds[1:]))


def _reasons(review, plan, request, folds_why, wanted):
    unit = 'tiles' if plan.tile_size else 'images'
    trained = [s for s in review.steps if s]
    reasons = [('folds', '%d by photo (%s): %s' % (len(review.folds), folds_why,
                                                   _fold_words(review.folds, request)))]
    reasons += [
        ('fold models', '%s, each the fine-tune\'s plan (%s, batch %d) for %s%s on the other '
                        'folds\' %s %s' % (
                            stats.count(len(trained), 'model'), plan.model_name,
                            plan.global_batch, stats.count(max(trained or [0]), 'step'),
                            '' if max(trained or [0]) >= wanted else
                            ' (of the fine-tune\'s %d: the budget)' % wanted,
                            '-'.join(str(n) for n in sorted({min(review.train_images),
                                                             max(review.train_images)})),
                            unit)),
        ('predictions', 'each fold\'s photos whole%s by the model that never saw them, every '
                        'detection down to score 0.001 (cleanlab scores the full '
                        'distribution), up to %d per %s' % (
                            ', in tiles of %d px' % plan.tile_size if plan.tile_size else '',
                            review.max_detections, 'tile' if plan.tile_size else 'photo')),
    ]
    parts = ', '.join('%s %.1f' % (part, seconds / 60.0) for part, seconds in review.seconds)
    reasons.append(('review time', 'the review adds about %s (%s min)%s' % (
        plan_file.minutes(review.total_seconds), parts,
        '; within --max_minutes=%g' % request.max_minutes if request.max_minutes else '')))
    return tuple(reasons)


def to_record(review) -> dict:
    record = dataclasses.asdict(review)
    record['folds'] = folds_lib.to_record(review.folds)
    return record


def from_record(record) -> ReviewPlan:
    values = dict(record, folds=folds_lib.from_record(record['folds']))
    for key in ('steps', 'train_images'):
        values[key] = tuple(values[key])
    for key in ('seconds', 'reasons'):
        values[key] = tuple(tuple(item) for item in values[key])
    return ReviewPlan(**values)
