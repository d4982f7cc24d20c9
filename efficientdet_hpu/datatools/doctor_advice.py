"""Anchor advice: the aspect ratios, anchor_scale and image_size that raise coverage most.

Coverage of a class = the share of its (non-crowd) boxes, at the recipe's training scales,
whose best anchor IoU reaches match_threshold: only those boxes get a positive anchor besides
the one forced match. The search scores candidates by the mean of the per-class coverages
(every class counts the same, however rare), on a sample of at most SEARCH_BOXES_PER_CLASS
boxes per class, in three greedy steps, each on top of the previous one:

  1. aspect_ratios: keep the recipe's and add, one at a time, the RATIO_CANDIDATES ratio that
     raises the score most, while a ratio adds at least MIN_GAIN (at most MAX_ADDED_RATIOS).
     Adding never lowers any box's best IoU, so no class gets worse. A set with one more
     ratio has the union of the anchors of the two, so a box's best IoU under it is the max
     of its best IoUs under each: every candidate is matched once.
  2. anchor_scale: the recipe's times ANCHOR_SCALE_FACTORS, if one adds at least MIN_GAIN.
  3. image_size: the recipe's times IMAGE_SIZE_FACTORS (rounded to multiples of
     2**max_level), from the cheapest up; a larger one is taken only if it adds at least
     IMAGE_SIZE_GAIN_PER_PIXELS times the fraction of pixels it adds (4 points of coverage
     for twice the pixels): compute grows with the pixels.
`advise(..., keys=...)` searches only some of the three (the others keep the recipe's value).
"""
import dataclasses
from typing import List

import numpy as np

from efficientdet_hpu.data import anchor_coverage as geometry

RATIO_CANDIDATES = (1 / 6, 1 / 5, 1 / 4, 1 / 3, 1 / 2, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0)
MAX_ADDED_RATIOS = 4
ANCHOR_SCALE_FACTORS = (0.5, 0.625, 0.75, 0.875, 1.0, 1.25, 1.5, 2.0)
IMAGE_SIZE_FACTORS = (1.25, 1.5, 2.0)
MIN_GAIN = 0.005
IMAGE_SIZE_GAIN_PER_PIXELS = 0.04
ADVISED_KEYS = ('aspect_ratios', 'anchor_scale', 'image_size')
SEARCH_BOXES_PER_CLASS = geometry.SEARCH_BOXES_PER_CLASS
class_coverage = geometry.class_coverage
search_sample = geometry.search_sample


@dataclasses.dataclass
class Step:
    """One piece of advice: `key` goes from `before` to `after` (equal when the search kept
    the recipe's value); setup is the recipe with this and the earlier steps applied; score
    the mean class coverage on the search sample; cost_note says what the change costs."""
    key: str
    before: object
    after: object
    setup: geometry.AnchorSetup
    score: float
    cost_note: str = ''

    @property
    def changed(self) -> bool:
        return self.before != self.after


def ratio_value(ratio) -> float:
    """width / height of an aspect ratio entry (a float, or an (x, y) pair)."""
    return float(ratio[0]) / float(ratio[1]) if isinstance(ratio, (list, tuple)) else float(ratio)


def rounded_ratio(ratio: float) -> float:
    """A ratio as automl writes them: 4.0, 0.25, 0.3333."""
    return round(float(ratio), 4)


def mean_coverage(coverage) -> float:
    """Mean over the classes that have boxes (0 when none has)."""
    present = coverage[~np.isnan(coverage)]
    return float(present.mean()) if len(present) else 0.0


class _Scorer:
    """Mean class coverage of a setup on fixed placed boxes."""

    def __init__(self, placed, num_classes, threshold):
        self.placed, self.num_classes, self.threshold = placed, num_classes, threshold

    def best_iou(self, setup):
        return geometry.best_anchor_match(self.placed.boxes, setup)[0]

    def score(self, best_iou) -> float:
        return mean_coverage(class_coverage(best_iou, self.placed.class_index,
                                            self.num_classes, self.threshold))


def grow_aspect_ratios(scorer, setup) -> Step:
    """Step 1: the recipe's aspect ratios plus the greedy best additions."""
    current = scorer.best_iou(setup)
    score = scorer.score(current)
    have = [ratio_value(r) for r in setup.aspect_ratios]
    candidates = {rounded_ratio(r): scorer.best_iou(setup.replace(
        aspect_ratios=(rounded_ratio(r),))) for r in RATIO_CANDIDATES
        if not np.any(np.isclose(have, r, rtol=1e-3))}
    added = []
    while candidates and len(added) < MAX_ADDED_RATIOS:
        scores = {r: scorer.score(np.maximum(current, iou)) for r, iou in candidates.items()}
        best = max(scores, key=lambda r: (scores[r], -abs(np.log(r))))
        if scores[best] - score < MIN_GAIN:
            break
        current, score = np.maximum(current, candidates.pop(best)), scores[best]
        added.append(best)
    after = setup.replace(aspect_ratios=setup.aspect_ratios + tuple(added))
    note = ('%d -> %d anchors per location: the heads\' prediction layers change shape, so a '
            '--ckpt trained with other anchors no longer fits them (--backbone_ckpt does)'
            % (setup.anchors_per_location, after.anchors_per_location) if added else '')
    return Step('aspect_ratios', setup.overrides()['aspect_ratios'],
                after.overrides()['aspect_ratios'], after, score, note)


def pick_anchor_scale(scorer, setup) -> Step:
    """Step 2: the best anchor_scale among the recipe's times ANCHOR_SCALE_FACTORS."""
    base = scorer.score(scorer.best_iou(setup))
    best_setup, best_score = setup, base
    for factor in ANCHOR_SCALE_FACTORS:
        candidate = setup.replace(anchor_scale=round(setup.anchor_scale * factor, 3))
        score = scorer.score(scorer.best_iou(candidate))
        if score > best_score:
            best_setup, best_score = candidate, score
    if best_score - base < MIN_GAIN:
        best_setup, best_score = setup, base
    return Step('anchor_scale', setup.anchor_scale, best_setup.anchor_scale, best_setup,
                best_score)


def _image_size_candidates(setup):
    height, width = setup.output_size
    stride = 2 ** setup.max_level
    for factor in IMAGE_SIZE_FACTORS:
        new_h, new_w = (max(stride, int(round(side * factor / stride)) * stride)
                        for side in (height, width))
        yield new_h * new_w / (height * width), (
            new_h if new_h == new_w and isinstance(setup.image_size, int)
            else '%dx%d' % (new_w, new_h))


def pick_image_size(sample, setup, base_score, num_classes) -> Step:
    """Step 3: a larger image_size, only where the coverage it adds pays for its pixels."""
    best_setup, best_score, best_cost = setup, base_score, 1.0
    for cost, image_size in sorted(_image_size_candidates(setup)):
        candidate = setup.replace(image_size=image_size)
        scorer = _Scorer(geometry.place_for_training(sample, candidate), num_classes,
                         setup.match_threshold)
        score = scorer.score(scorer.best_iou(candidate))
        if score - best_score >= IMAGE_SIZE_GAIN_PER_PIXELS * (cost / best_cost - 1.0):
            best_setup, best_score, best_cost = candidate, score, cost
    note = '%.2fx the pixels per image' % best_cost if best_setup is not setup else ''
    return Step('image_size', setup.image_size, best_setup.image_size, best_setup, best_score,
                note)


def _kept(key, setup, score):
    value = setup.overrides()[key]
    return Step(key, value, value, setup, score)


def advise(box_set, setup, keys=ADVISED_KEYS) -> List[Step]:
    """The three steps of the module docstring, each on top of the previous; a step whose key
    is not in `keys` keeps the recipe's value."""
    unknown = set(keys) - set(ADVISED_KEYS)
    if unknown:
        raise ValueError('cannot advise on %s; choose among %s' % (
            ', '.join(sorted(unknown)), ', '.join(ADVISED_KEYS)))
    sample = search_sample(box_set)
    scorer = _Scorer(geometry.place_for_training(sample, setup), box_set.num_classes,
                     setup.match_threshold)
    score = scorer.score(scorer.best_iou(setup))
    ratios = (grow_aspect_ratios(scorer, setup) if 'aspect_ratios' in keys
              else _kept('aspect_ratios', setup, score))
    scale = (pick_anchor_scale(scorer, ratios.setup) if 'anchor_scale' in keys
             else _kept('anchor_scale', ratios.setup, ratios.score))
    size = (pick_image_size(sample, scale.setup, scale.score, box_set.num_classes)
            if 'image_size' in keys else _kept('image_size', scale.setup, scale.score))
    return [ratios, scale, size]


def advised_overrides(steps) -> dict:
    """{hparams key: value} of the steps that change something."""
    return {step.key: step.after for step in steps if step.changed}


def override_string(overrides) -> str:
    """'aspect_ratios=1.0*2.0*0.5*4.0,anchor_scale=2.5' (automl's list syntax), or with
    [x, y] pairs the bracket form, which hparams_config also reads."""
    parts = []
    for key, value in overrides.items():
        if isinstance(value, list):
            if any(isinstance(v, list) for v in value):
                text = '[%s]' % ','.join(('[%g,%g]' % tuple(v)) if isinstance(v, list)
                                         else repr(float(v)) for v in value)
            else:
                text = '*'.join(repr(float(v)) for v in value)
        else:
            text = str(value)
        parts.append('%s=%s' % (key, text))
    return ','.join(parts)
