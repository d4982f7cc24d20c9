"""finetune/sizing.py through plan.make_plan: the plan of each kind of set chooses as the rules
say, on finetune_cases.TABLE's round costs, every number worked out by hand."""
import dataclasses

import pytest

from efficientdet_hpu.finetune import model_choice
from efficientdet_hpu.finetune import plan as plan_lib
from efficientdet_hpu.finetune import sizing
from finetune_cases import (FEW_PHOTOS, LITE0_PTH, MANY_CLASSES, ORTHO, ROOMY, SEARCH_TABLE,
                            SMALL_PHOTOS, TABLE, photos)


def test_the_bounds_follow_the_photos_and_their_small_boxes():
    # 340 px photos: at most ladder(340) = 384, but Lite0's own 320 is smaller. 1 box in 10 is
    # the 20 px one: 20 / 340 = 5.9% of its photo; 8 px of it need 8 / 0.0588 = 136 px: 192.
    floor, top, why = sizing.bounds(SMALL_PHOTOS.train, 320)
    assert (floor, top) == (192, 320)
    assert '5.9% of its photo' in why and '11 px once fitted to 192 px' in why
    # 256 px photos: at most 256; the 64 px box is 25%: 32 px wanted, 128 px.
    assert sizing.bounds(MANY_CLASSES.train, 320)[:2] == (128, 256)


def test_small_photos_train_small_and_search_the_next_size():
    """The issue's 600 photos of 340 px in 20 min (from random weights: see the next test for
    the ImageNet backbone).

    Besides training: data 2 x 5 + 720 / 20 + 20 = 66 s, start-up 30. At 192 px (24
    images/s): whole photos + export 2 x 20 + 3 x 120 / 72 + 70 = 115 s, evaluations 2 + 120 /
    72 = 3.67 s each: 1200 - 211 - 36.67 = 952.33 s train 2857 steps, 38 passes; at 256 px
    (15) 1761 steps, 23 passes, at 320 (10) 15: none gets 50, so the smallest, 192 px. The rule
    cannot weigh 192's passes against 256's detail: a search. Trying 256 costs its start-up 30
    s, its first interval (1761 steps -> 176) 176 x 8 / 15 = 93.87 s, an evaluation 2 + 120 /
    45 = 4.67 s and the winner's restart 30 s: 158.53 s, under a quarter of 192's 952.33 s of
    training. Less the search, 793.8 s train 2381 steps at 192 px: 10 evaluations of 238, 2380
    steps."""
    request = plan_lib.Request(max_minutes=20)
    plan = plan_lib.make_plan(SMALL_PHOTOS, ROOMY, request, table=TABLE)
    assert (plan.image_size, plan.tile_size, plan.candidates) == (192, 0, ('192px', '256px'))
    assert (plan.steps, plan.eval_interval) == (2380, 238)
    assert dict(plan.seconds)['search'] == pytest.approx(158.533, abs=0.01)
    reasons = dict(plan.reasons)
    assert 'passes: 192 px 38, 256 px 23, 320 px 15' in reasons['image size']
    assert '192 px against 256 px' in reasons['search']
    assert 'the budget holds 32 passes of the 100 wanted' in reasons['steps']
    assert plan.total_seconds <= 20 * 60
    # The other candidate fits the same budget less the same search: at 256 px 1200 - 66 - 30
    # - 158.53 - (2 x 20 + 3 x 120 / 45 + 70) - 10 x 4.67 = 780.8 s, 1464 steps, 1460 in 10
    # of 146.
    other = plan_lib.candidate_plan(plan, SMALL_PHOTOS, ROOMY, request, '256px', table=TABLE)
    assert (other.image_size, other.steps, other.eval_interval) == (256, 1460, 146)
    assert other.candidates == ()


def test_many_whole_photos_from_imagenet_weights_try_random_weights_first():
    """The same photos from the ImageNet backbone: 600 whole photos, at least
    RANDOM_START_MIN_PHOTOS, so random weights are tried beside it at the smaller size, 192.
    That trial costs 30 + (2857 // 10 = 285) x 8 / 24 + 3.67 = 128.67 s; with 256's 128.53
    and the restart, 287.2 s, over a quarter of the 952.33 s of training: 256 is given up
    first, and the random start alone costs 158.67 s. Less it, 793.67 s train 2381 steps, 2380
    as above. The random start trains D0 (model_choice.RANDOM_START_MODEL), at Lite0's 24
    images/s in SEARCH_TABLE."""
    request = plan_lib.Request(weights=LITE0_PTH, max_minutes=20)
    plan = plan_lib.make_plan(SMALL_PHOTOS, ROOMY, request, table=SEARCH_TABLE)
    assert (plan.image_size, plan.candidates, plan.steps) == (
        192, ('192px', '192px-random'), 2380)
    assert dict(plan.seconds)['search'] == pytest.approx(30 + 95 + 2 + 120 / 72 + 30)
    search = dict(plan.reasons)['search']
    assert search.startswith('192px from the ImageNet backbone against 192px-random from '
                             'random weights')
    assert search.endswith('256px not tried: with it the search would cost 4.8 min, over 25% '
                           'of the training')
    # The random start is the plan from random weights at 192 px: the same steps, the
    # from-scratch rate and warm-up (a quarter), no freeze, no --backbone_ckpt, and
    # configs/demo.yaml's network with Lite0's anchor_scale (the doctor advised none), on the
    # demo's levels 3-5: the boxes, 20-60 px in photos of 340 px, are at most 34 px at 192 px
    # (sqrt(w h)), and level 5's largest anchor at 3.0, 3 x 32 x 2^(2/3) = 152 px, overlaps a
    # box by IoU 0.5 up to 215 px.
    other = plan_lib.candidate_plan(plan, SMALL_PHOTOS, ROOMY, request, '192px-random',
                                    table=SEARCH_TABLE)
    assert (other.image_size, other.steps, other.warmup_steps, other.freeze_steps) == (
        192, 2380, 595, 0)
    assert other.weights == plan_lib.Weights() and other.model_name == 'efficientdet-d0'
    assert dict(other.model_keys) == dict(
        fpn_num_filters=48, fpn_cell_repeats=2, box_class_repeats=2, min_level=3, max_level=5,
        anchor_scale=3.0)
    assert "; levels 3-5, configs/demo.yaml's: 99 boxes in 100 are at most 34 px at the " \
        "input (sqrt(w h)), which level 5's anchors reach" in dict(other.reasons)['model']
    # Boxes beyond level 5's reach keep D0's levels 3-7: at 2.0 it reaches 143.7 px.
    wide = plan_lib.Request(weights=plan_lib.Weights(), max_minutes=20)
    for sides, levels in (([100.0] * 99 + [150.0], True), ([100.0] * 98 + [150.0] * 2, False)):
        network = model_choice.random_start_network(wide, 'efficientdet-lite0',
                                                    (('anchor_scale', 1.5),), sides)[1][0]
        assert ('max_level' in dict(network)) == levels
    # One octave (--hparams num_scales=1): level 5's largest anchor at 2.0 is 64 px, reaching
    # 90.5 px, so boxes of 80 px keep levels 3-5 and boxes of 100 px D0's 3-7.
    one = plan_lib.Request(weights=plan_lib.Weights(), hparams=(('num_scales', 1),))
    for side, levels in ((80.0, True), (100.0, False)):
        network = model_choice.random_start_network(one, 'efficientdet-lite0',
                                                    (('anchor_scale', 1.5),), [side] * 100)[1][0]
        assert ('max_level' in dict(network)) == levels
    assert dict(other.reasons)['model'].startswith(
        "efficientdet-d0 with configs/demo.yaml's narrower BiFPN and heads (fpn_num_filters=48")
    assert dict(other.reasons)['model'].endswith(
        "anchor_scale 3.0, efficientdet-lite0's, whose anchors the data doctor checked")
    assert dict(other.schedule_keys)['learning_rate'] == 1.28
    assert dict(other.reasons)['weights'].startswith(
        "random initialisation: the search's other start beside /")
    # Its steps come from D0's rate in the table (Lite0's 24 images/s would not).
    d0_rate = TABLE.images_per_second('efficientdet-d0', 192, 2)[0]
    assert plan_lib.candidate_plan(plan, SMALL_PHOTOS, ROOMY, request, '192px-random',
                                   table=TABLE).images_per_second == pytest.approx(d0_rate)
    assert d0_rate < 10
    # The doctor's anchor_scale, or the user's --hparams, stay; so does a network key asked.
    asked = plan_lib.Request(weights=LITE0_PTH, max_minutes=20,
                             hparams=(('fpn_num_filters', 64),))
    advised = plan_lib.candidate_plan(plan, SMALL_PHOTOS, ROOMY, asked, '192px-random',
                                      (('anchor_scale', 2.0),), 0.5, SEARCH_TABLE)
    assert 'fpn_num_filters' not in dict(advised.model_keys)
    assert 'anchor_scale' not in dict(advised.model_keys)
    assert dict(advised.anchors)['anchor_scale'] == 2.0
    # A doctor's scale under configs/demo.yaml's 2.0 is raised to it for random weights (the
    # ImageNet start keeps the doctor's), and the anchors line says so; the user's stays.
    small = (('anchor_scale', 1.5), ('aspect_ratios', ((1.0, 1.0), (1.4, 0.7))))
    raised = plan_lib.candidate_plan(plan, SMALL_PHOTOS, ROOMY, request, '192px-random', small,
                                     0.5, SEARCH_TABLE)
    assert dict(raised.model_keys)['anchor_scale'] == 2.0
    assert dict(raised.anchors) == {'aspect_ratios': ((1.0, 1.0), (1.4, 0.7))}
    assert dict(raised.reasons)['anchors'].endswith(
        "anchor_scale 2.0, configs/demo.yaml's, in place of the data doctor's 1.5: from random "
        "weights a smaller scale reached more boxes and trained worse (docs/finetune.md)")
    kept = plan_lib.candidate_plan(plan, SMALL_PHOTOS, ROOMY, request, '256px', small, 0.5,
                                   SEARCH_TABLE)
    assert dict(kept.anchors)['anchor_scale'] == 1.5
    users = plan_lib.candidate_plan(plan, SMALL_PHOTOS, ROOMY, plan_lib.Request(
        weights=LITE0_PTH, max_minutes=20, hparams=(('anchor_scale', 1.25),)), '192px-random',
        small, 0.5, SEARCH_TABLE)
    assert 'anchor_scale' not in dict(users.model_keys)
    # Fewer photos, or a fixed --steps: no random start.
    assert plan_lib.make_plan(FEW_PHOTOS, ROOMY, request, table=TABLE).candidates == ()
    assert plan_lib.make_plan(SMALL_PHOTOS, ROOMY, plan_lib.Request(
        weights=LITE0_PTH, max_minutes=20, steps=900), table=TABLE).candidates == ()


def test_few_photos_keep_the_full_size_and_widen_the_jitter():
    """40 photos of 640 px, boxes a third to half of them, 30 min: at 320 px the fixed stages
    take 2 x 5 + 50 / 20 + 20 + 30 + 2 x 20 + 3 x 10 / 30 + 70 = 173.5 s and 10 evaluations 2
    + 10 / 30 = 2.33 s each: 1800 - 173.5 - 23.33 = 1603.17 s fill 2003 steps, 401 passes (in
    10 evaluations of 200: 2000, 400 passes). Every size gets 50 passes, so the largest (320,
    the model's own; the 640 px photos allow more), no search; 40 photos seen 100 times or
    more widen the jitter."""
    plan = plan_lib.make_plan(FEW_PHOTOS, ROOMY,
                              plan_lib.Request(weights=LITE0_PTH, max_minutes=30), table=TABLE)
    assert (plan.image_size, plan.steps, plan.eval_interval, plan.candidates) == (
        320, 2000, 200, ())
    keys = dict(plan.schedule_keys)
    assert (keys['jitter_min'], keys['jitter_max']) == (0.7, 1.3)
    assert '40 photos seen about 400 times' in dict(plan.reasons)['augmentation']


def test_few_photos_in_a_short_budget_train_small_for_enough_steps():
    """The same 40 photos in 6 min: data 2 x 5 + 50 / 20 + 20 = 32.5 s and start-up 30 at
    every size. At 256 px (15 images/s) whole photos + export 2 x 20 + 3 x 10 / 45 + 70 =
    110.67 s, evaluations 2.22 s: 360 - 173.17 = 186.83 s, 350 steps, then with 7 evaluations
    (15.56 s) 321 steps, with 6 (13.33 s) 325, 65 passes; at 192 px 497 steps, 99 passes; at
    128 px (40 images/s) 832 steps, 166 passes; at 320 px 221, 44. Three sizes get 50 passes
    but none 1000 steps, too few for the random heads: the smallest the boxes allow (a 160 px
    box is 25% of its photo: 32 px at 128). Trying 192 costs 30 + (497 // 9 = 55) x 8 / 24 +
    2.14 + 30 = 80.5 s, over 25% of 832 x 8 / 40 = 166.4 s: no search. 10 evaluations of 83:
    830 steps."""
    plan = plan_lib.make_plan(FEW_PHOTOS, ROOMY,
                              plan_lib.Request(weights=LITE0_PTH, max_minutes=6), table=TABLE)
    assert (plan.image_size, plan.steps, plan.eval_interval, plan.candidates) == (
        128, 830, 83, ())
    reasons = dict(plan.reasons)
    assert ('no size gets 50 passes and 1000 steps in the budget (passes: 128 px 166, 192 px '
            '99, 256 px 65, 320 px 44; steps: 128 px 832, 192 px 497, 256 px 325, 320 px 221)'
            in reasons['image size'])
    assert reasons['search'].startswith('none: trying 192px beside 128px would cost 1.3 min')


def test_enough_passes_and_steps_pick_the_largest_size_that_has_both():
    trained = {128: (400, 2500), 192: (120, 1200), 256: (60, 700), 320: (30, 400)}
    size, other, why = sizing.choose(128, 320, trained.get)
    assert (size, other) == (192, 256)
    assert why.startswith('the largest that the budget trains for 50 passes or more and 1000 '
                          'steps (passes: 128 px 400, 192 px 120, 256 px 60, 320 px 30; steps: ')


def test_many_classes_and_photos_in_a_short_budget_train_small_without_a_search():
    """2000 photos of 256 px, 20 classes, random weights, 10 min: data 2 x 5 + 2200 / 20 + 20
    = 140 s. At 128 px (40 images/s) whole photos + export 2 x 20 + 3 x 200 / 120 + 70 = 115
    s, evaluations 2 + 200 / 120 = 3.67 s: 600 - 285 - 36.67 = 278.33 s, 1391 steps, 6
    passes; no size gets 50: 128 px. Trying 192 (791 steps there) would cost 30 + 79 x 8 / 24
    + 4.78 + 30 = 91.1 s, over a quarter of 278.2: no search. From random weights: the demo's
    rate."""
    plan = plan_lib.make_plan(MANY_CLASSES, ROOMY, plan_lib.Request(max_minutes=10),
                              table=TABLE)
    assert (plan.image_size, plan.steps, plan.eval_interval, plan.candidates) == (
        128, 1390, 139, ())
    assert 'none: trying 192px beside 128px would cost 1.5 min' in dict(plan.reasons)['search']
    assert dict(plan.schedule_keys)['learning_rate'] == 1.28
    assert plan.warmup_steps == 347  # A quarter of 1390, at most 1390 // 4.


def test_big_photos_with_small_objects_are_tiled_at_the_models_size():
    # ORTHO: 40 px crowns on a 2400 px photo, 5.3 px at 320: tiles of 320, whatever the budget.
    plan = plan_lib.make_plan(ORTHO, ROOMY, plan_lib.Request(weights=LITE0_PTH, max_minutes=20),
                              table=TABLE)
    assert (plan.image_size, plan.tile_size, plan.candidates) == (320, 320, ())
    assert dict(plan.reasons)['image size'] == "320 px: efficientdet-lite0's own, tiles of it"


def test_without_a_budget_the_largest_size_and_no_search():
    plan = plan_lib.make_plan(SMALL_PHOTOS, ROOMY, plan_lib.Request(weights=LITE0_PTH),
                              table=TABLE)
    assert (plan.image_size, plan.candidates) == (320, ())
    assert plan.steps == 7500  # 100 passes of 600 photos.


def test_the_doctors_larger_size_is_the_plans_and_the_rules_is_tried_beside_it():
    """The doctor, run at the rule's 192 px, found the anchors miss boxes there and advised
    256: the plan trains 256 and tries 192 beside it (the doctor's coverage against the rule's
    passes). At 256 px 1761 steps fit (above); trying 192 costs 30 + (2857 // 10 = 285) x 8 /
    24 + 3.67 + 30 = 158.67 s, under a quarter of 256's 939.2 s of training; less it, 939.33 -
    158.67 = 780.67 s train 1463 steps at 256: 10 evaluations of 146."""
    plan = plan_lib.make_plan(SMALL_PHOTOS, ROOMY, plan_lib.Request(max_minutes=20),
                              (('image_size', 256),), table=TABLE)
    assert (plan.image_size, plan.candidates, plan.steps) == (256, ('256px', '192px'), 1460)
    assert dict(plan.seconds)['search'] == pytest.approx(30 + 95 + 2 + 120 / 72 + 30)
    assert "the data doctor's advice (more of the boxes reach an anchor) over the 192 px" in \
        dict(plan.reasons)['image size']
    # Without a budget the doctor's size alone.
    alone = plan_lib.make_plan(SMALL_PHOTOS, ROOMY, plan_lib.Request(), (('image_size', 384),),
                               table=TABLE)
    assert (alone.image_size, alone.candidates) == (384, ())


def test_an_asked_size_the_plan_could_choose_trains_whole_photos():
    """--hparams=image_size=128 on 600 photos of 340 x 300 px with boxes of 24, 36 and 48 px: at
    Lite0's own 320 px the median box is 36 x 320 / 340 = 34 px, whole photos; 1 box in 10 is
    24 px, 7.1% of its photo, so 8 px need 113 px: the floor is 128. Whole photos at 128 px,
    as the plan would train them, though the median box there is 36 x 128 / 340 = 13.6 px
    (under sizing.SMALL_AT_INPUT, which alone would cut 20 times as many tiles). SMALL_PHOTOS'
    floor is 192 (above): 128 px is below it, and tiles (so many that converting and evaluating
    them would take the 15 minutes: that plan is made without a budget)."""
    shapes = dataclasses.replace(SMALL_PHOTOS, train=photos(600, 340, 300, (24, 36, 48)))
    asked = plan_lib.Request(max_minutes=15, hparams=(('image_size', 128),))
    plan = plan_lib.make_plan(shapes, ROOMY, asked, table=TABLE)
    assert (plan.image_size, plan.tile_size) == (128, 0)
    assert dict(plan.reasons)['tiling'] == (
        "whole photos: at 128 px 1 box in 10 is still at least 8 px (the floor 128 px) and the "
        "model's own 320 px keeps whole photos; the median box is 14 px")
    tiled = plan_lib.make_plan(SMALL_PHOTOS, ROOMY, plan_lib.Request(
        hparams=(('image_size', 128),)), table=TABLE)
    assert (tiled.image_size, tiled.tile_size) == (128, 128)
    assert dict(tiled.reasons)['tiling'].startswith('tiles of 128 px')
