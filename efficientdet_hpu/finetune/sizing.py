"""Whether to tile, and the input size of whole photos: as small as the photos' boxes allow, as
large as the photos and the model's own size, and within those the largest that the budget
trains for enough passes; where that trade cannot be settled by rule (a smaller size buys
passes, a larger one detail), two sizes to try (finetune/search.py). Pure: numbers in, numbers
and reasons out.
"""
import math

from efficientdet_hpu.finetune import stats as stats_lib

SMALL_AT_INPUT = 16.0  # px: under it a box is below Lite0's smallest anchor (24 px) by far.
LARGE_PHOTO = 2.0  # Photos at least this many times the input side are worth tiling.

SIZE_LADDER = (128, 192, 256, 320, 384, 448, 512, 640, 768, 896, 1024, 1280, 1536)
# px: the 10th percentile of the boxes (sqrt(w h)) at the input stays at least one cell of the
# finest feature level (stride 8). configs/demo.yaml trains its shapes at 128 px, where 1 box in
# 10 is about 8 px, to AP50 0.57-0.64; the data doctor, run at the chosen size, advises a
# larger one where its anchors then miss too many boxes.
MIN_BOX_AT_INPUT = 8.0
ENOUGH_PASSES = 50  # Fewer than these in the budget: a smaller input is worth its detail.
# And at least these steps: the detection heads start random and need updates however few the
# photos (configs/demo.yaml: 1,600 steps; make trees: 1,350; 50 photos trained 306 steps of Lite0
# at 256 px learned nothing, docs/finetune.md).
ENOUGH_STEPS = 1000


def ladder_at_least(side) -> int:
    """The smallest ladder size >= side (the largest when none is)."""
    return next((size for size in SIZE_LADDER if size >= side), SIZE_LADDER[-1])


def bounds(photos, native) -> tuple:
    """(floor, top, why): top the model's own size or the photos' (median long side, rounded
    up to the ladder), whichever is smaller; floor the smallest ladder size at which the 10th
    percentile of the boxes is MIN_BOX_AT_INPUT px, at most top."""
    photo_side = stats_lib.median([photo.long_side for photo in photos], native)
    top = min(native, ladder_at_least(photo_side))
    relative = stats_lib.percentile([side / photo.long_side for photo in photos
                                     for side in stats_lib.box_sides((photo,))], 10)
    needed = MIN_BOX_AT_INPUT / relative if relative else float(top)
    floor = min(top, ladder_at_least(needed))
    return floor, top, (
        'the photos are %d px (median long side), so at most %d px; 1 box in 10 is under '
        '%.1f%% of its photo\'s side, %.0f px once fitted to %d px (at least %.0f px '
        'wanted)' % (photo_side, top, 100 * relative, relative * floor, floor,
                     MIN_BOX_AT_INPUT))


def choose(floor, top, trained_at) -> tuple:
    """(size, the next larger size worth trying or 0, why): the largest ladder size in
    [floor, top] whose budgeted training (trained_at(size): (passes, steps), None without a
    budget) reaches ENOUGH_PASSES and ENOUGH_STEPS; else floor, the most of both; without a
    budget top."""
    sizes = [size for size in SIZE_LADDER if floor <= size <= top] or [top]
    if trained_at(top) is None:
        return top, 0, 'no budget: the largest the photos and the model hold'
    trained = {size: trained_at(size) for size in sizes}
    enough = [size for size in sizes
              if trained[size][0] >= ENOUGH_PASSES and trained[size][1] >= ENOUGH_STEPS]
    size = max(enough) if enough else sizes[0]
    larger = [s for s in sizes if s > size]
    listed = ', '.join('%d px %.0f' % (s, trained[s][0]) for s in sizes)
    short = [s for s in sizes if trained[s][1] < ENOUGH_STEPS]
    steps = ('; steps: %s' % ', '.join('%d px %d' % (s, trained[s][1]) for s in sizes)
             if short else '')
    if enough:
        why = 'the largest that the budget trains for %d passes or more%s (passes: %s%s)' % (
            ENOUGH_PASSES, ' and %d steps' % ENOUGH_STEPS if short else '', listed, steps)
    else:
        why = ('no size gets %d passes%s in the budget (passes: %s%s): the smallest the boxes '
               'allow buys the most' % (ENOUGH_PASSES, ' and %d steps' % ENOUGH_STEPS
                                        if short else '', listed, steps))
    return size, (larger[0] if larger else 0), why


def _round_up(value, multiple):
    return int(math.ceil(value / float(multiple)) * multiple)


def choose_tiling(data, image_size) -> tuple:
    """(tile size, overlap, why); (0, 0, why) for whole photos."""
    at_input = stats_lib.median(stats_lib.sides_at_input(data.train, image_size))
    photo_side = stats_lib.median(stats_lib.photo_sides_by_box(data.train))
    native = stats_lib.median(stats_lib.box_sides(data.train))
    if at_input >= SMALL_AT_INPUT or photo_side < LARGE_PHOTO * image_size:
        return 0, 0, ('whole photos: the median box is %.0f px once its photo is fitted to %d '
                      'px%s' % (at_input, image_size, '' if at_input < SMALL_AT_INPUT else
                                ' (at least %.0f px)' % SMALL_AT_INPUT)) + (
            '' if photo_side >= LARGE_PHOTO * image_size or at_input >= SMALL_AT_INPUT else
            ' but the photos (%d px, median by box) are under %.0fx the input'
            % (photo_side, LARGE_PHOTO))
    long_side = stats_lib.percentile(stats_lib.box_long_sides(data.train), 90)
    overlap = min(image_size // 2, max(image_size // 5, _round_up(long_side, 16)))
    return image_size, overlap, (
        'tiles of %d px, overlap %d: the median box is %.1f px once its photo (%d px, median '
        'by box) is fitted to %d px, under %.0f px, and %.0f px in a tile; the overlap holds '
        '9 boxes in 10 (%.0f px long) whole in some tile' % (
            image_size, overlap, at_input, photo_side, image_size, SMALL_AT_INPUT, native,
            long_side))


def asked_tiling(data, native, side) -> tuple:
    """(tile size, overlap, why) at a size --hparams asks for: whole photos where the plan's own
    rules keep them (it decides tiling at the model's own size, `native`, then goes down to the
    floor of `bounds`), so a size the plan could have chosen trains as the plan would; below
    the floor, or where the model's own size tiles, choose_tiling at the asked size."""
    floor = bounds(data.train, native)[0]
    if side < floor or choose_tiling(data, native)[0]:
        return choose_tiling(data, side)
    at_input = stats_lib.median(stats_lib.sides_at_input(data.train, side))
    return 0, 0, ('whole photos: at %d px 1 box in 10 is still at least %.0f px (the floor %d '
                  'px) and the model\'s own %d px keeps whole photos; the median box is %.0f px'
                  % (side, MIN_BOX_AT_INPUT, floor, native, at_input))
