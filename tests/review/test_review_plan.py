"""review/plan.py: the folds, the steps and the time, worked out by hand on a fine-tune plan of
ten 100 px photos (eight to train, two held out): Lite0 at 128 px (the photos' size), batch 8,
300 steps, under a cost table of round figures given here (TABLE: 10 images/s at 128 px, 45 s
to start, predicting 3 times as fast as training, the converter 4 images/s, 60 s a
prediction run), so the arithmetic below does not move when the shipped table is measured
again."""
import dataclasses
import json
import os
import time
import types

import pytest

from efficientdet_hpu.finetune import costs
from efficientdet_hpu.finetune import plan as finetune_plan
from efficientdet_hpu.finetune import plan_file
from efficientdet_hpu.finetune import stats
from efficientdet_hpu.review import layout as layout_lib
from efficientdet_hpu.review import plan as plan_lib
from efficientdet_hpu.review import run
from finetune_cases import ROOMY


def _coco(count, first):
    images = [{'id': first + i, 'file_name': 'p%d.jpg' % (first + i), 'width': 100,
               'height': 100} for i in range(count)]
    annotations = [{'id': 2 * image['id'] + k, 'image_id': image['id'], 'category_id': 1,
                    'bbox': [10 + 40 * k, 10, 30, 30], 'area': 900, 'iscrowd': 0}
                   for image in images for k in range(2)]
    return {'images': images, 'annotations': annotations, 'categories': [{'id': 1, 'name': 'a'}]}


TRAIN, VAL = _coco(8, 1), _coco(2, 100)
TABLE = costs.Table(
    machine=ROOMY.cpu, cores=ROOMY.cores, date='2026-11-27',
    rates=(costs.Rate('efficientdet-lite0', 128, 10.0, 45.0),),
    evaluation_fixed_seconds=5.0, inference_speedup=3.0, convert_seconds=0.0,
    convert_images_per_second=4.0, doctor_seconds=40.0, predict_seconds=60.0,
    analysis_seconds=10.0, export_seconds=150.0, source='test_review_plan.py')
PLAN = finetune_plan.make_plan(stats.from_coco(TRAIN, VAL), ROOMY, finetune_plan.Request(),
                               table=TABLE)


def Request(**values):  # pylint: disable=invalid-name
    return plan_lib.Request(table=TABLE, **values)


def test_the_fine_tune_plan_this_file_assumes():
    assert (PLAN.model_name, PLAN.image_size, PLAN.tile_size) == ('efficientdet-lite0', 128, 0)
    assert (PLAN.global_batch, PLAN.steps, PLAN.images_per_second) == (8, 300, 10.0)


def test_five_folds_of_the_fine_tune_steps_and_their_time():
    review = plan_lib.make(PLAN, TRAIN, VAL, Request())
    assert [len(fold.photos) for fold in review.folds] == [2, 2, 2, 2, 2]
    assert review.steps == (300,) * 5 and review.train_images == (8,) * 5
    # Records: 10 photos at 4/s. Training: 5 x (45 s start-up + 300 x 8 / 10). Predictions: 5 x
    # 60 s + 10 photos at 3 x 10/s. Scores: 20 s + 0.02 s x 20 labels.
    assert dict(review.seconds) == pytest.approx({
        'records': 2.5, 'training': 1425.0, 'predictions': 300.0 + 10 / 30.0,
        'scores and page': 20.4})
    # 2 boxes a photo at most: 100 detections (inference.py's own cap) each.
    assert review.max_detections == 100 and review.max_instances == 100
    lines = '\n'.join(plan_file.lines(review))
    assert 'fold 0 the 2 photos of the validation; folds 1-4 the training photos, 2 + 2 + 2 + 2' \
        in lines
    assert 'the review adds about 30 min' in lines


def test_a_trained_fine_tune_predicts_fold_zero_itself():
    review = plan_lib.make(PLAN, TRAIN, VAL, Request(reuse_first=True))
    assert review.steps == (0, 300, 300, 300, 300)
    # Fold 0's photos are the fine-tune's own val records: 8 photos to convert.
    assert dict(review.seconds)['records'] == 2.0
    assert dict(review.seconds)['training'] == 4 * 285.0
    assert 'predicted by the fine-tune\'s own model' in '\n'.join(plan_file.lines(review))


def test_a_budget_scales_the_steps_then_takes_fewer_folds():
    # 15 min = 900 s. 5 folds: 900 - 2.5 - 300.33 - 20.4 - 5 x 45 leaves 351.77 s, 87 steps a
    # fold: under half of 300. 4 folds (2, then 3 + 3 + 2): 142 steps, still under. 3 folds:
    # 900 - 2.5 - 180.33 - 20.4 - 135 = 561.77 s, int(561.77 x 10 / 8 / 3) = 234 steps.
    review = plan_lib.make(PLAN, TRAIN, VAL, Request(max_minutes=15))
    assert len(review.folds) == 3 and review.steps == (234, 234, 234)
    assert '3 by photo (fewer than 5: the budget)' in dict(review.reasons)['folds']
    assert '234 steps (of the fine-tune\'s 300: the budget)' in dict(review.reasons)['fold models']


def test_a_budget_too_short_names_the_minutes_the_review_needs():
    # 3 min: even 2 folds leave no steps. 2 folds of 20 steps: 2.5 + 2 x (45 + 16) + 120.33 +
    # 20.4 = 265.2 s: 5 min.
    with pytest.raises(finetune_plan.PlanError, match='--max_minutes=3 is too short for the '
                                                      'review: 2 folds of 20 steps take about '
                                                      '5 min'):
        plan_lib.make(PLAN, TRAIN, VAL, Request(max_minutes=3))


def test_asked_folds_and_steps_win_and_the_plan_survives_its_record():
    review = plan_lib.make(PLAN, TRAIN, VAL, Request(folds=2, steps=7))
    assert len(review.folds) == 2 and review.steps == (7, 7)
    # The 2 validation photos are not about half of the 10: the 2 folds cut all 10.
    assert [len(fold.photos) for fold in review.folds] == [5, 5]
    assert review.train_images == (5, 5)
    assert ('the training and validation photos together, 5 + 5 (fold 0 the validation\'s 2 '
            'photos would leave a model 2 of the 10 to train on)') in dict(review.reasons)['folds']
    assert plan_lib.from_record(plan_lib.to_record(review)) == review


def test_the_fine_tune_s_model_predicts_fold_zero_only_where_it_is_a_fold():
    # 2 folds: fold 0 the validation would leave the other model 2 photos; both train on 5.
    review = plan_lib.make(PLAN, TRAIN, VAL, Request(folds=2, steps=7, reuse_first=True))
    assert review.steps == (7, 7) and review.train_images == (5, 5)
    assert 'fine-tune\'s own model' not in dict(review.reasons)['folds']
    # 4 folds: 2 + 3 + 3 + 2 photos, none over 1.25 quarters of 10.
    review = plan_lib.make(PLAN, TRAIN, VAL, Request(folds=4, steps=7, reuse_first=True))
    assert review.steps == (0, 7, 7, 7) and review.folds[0].is_validation


def test_a_fold_slower_than_the_table_refits_the_later_folds_to_the_budget():
    review = plan_lib.make(PLAN, TRAIN, VAL, Request())
    # Fold 1 trained at 5 images/s, half the table's. The rest: predictions of folds 1-4 (4 x
    # 60 s + 8 photos at 3 x 5/s) + scores (20.4 s) = 260.93 s, then folds 2-4.
    kept, at_rate, rest = plan_lib.refit(review, PLAN, 1, 5.0, None, TABLE)
    assert kept.steps == review.steps and at_rate.images_per_second == 5.0
    assert rest == pytest.approx(4 * 60 + 8 / 15.0 + 20.4 + 3 * (45 + 300 * 8 / 5.0))
    # 1,200 s left: 1200 - 260.93 - 3 x 45 = 804.07 s for 3 folds, int(804.07 x 5 / 8 / 3) = 167.
    cut, _, rest = plan_lib.refit(review, PLAN, 1, 5.0, 1200.0, TABLE)
    assert cut.steps == (300, 300, 167, 167, 167) and rest <= 1200.0
    assert cut.folds == review.folds and cut.train_images == review.train_images
    # Never under MIN_STEPS, never above the plan's steps on a faster machine.
    assert plan_lib.refit(review, PLAN, 1, 5.0, 100.0, TABLE)[0].steps[2:] == (
        plan_lib.MIN_STEPS,) * 3
    assert plan_lib.refit(review, PLAN, 3, 20.0, 1e6, TABLE)[0].steps == review.steps


def test_a_refit_on_a_resumed_review_times_only_the_steps_left():
    """A rerun of a stopped review: fold 2 trained before, fold 3 stopped at step 200. The rest
    is fold 3's 100 steps left and fold 4's 300, not three whole folds; under a budget, fold 3
    keeps its 200 steps done and both get the same steps more."""
    review = plan_lib.make(PLAN, TRAIN, VAL, Request())
    reached = {2: 300, 3: 200}
    _, _, rest = plan_lib.refit(review, PLAN, 1, 5.0, None, TABLE, reached)
    assert rest == pytest.approx(4 * 60 + 8 / 15.0 + 20.4 + (45 + 100 * 8 / 5.0)
                                 + (45 + 300 * 8 / 5.0))
    # 600 s left: 600 - 260.93 - 2 x 45 = 249.07 s for 2 folds, int(249.07 x 5 / 8 / 2) = 77.
    cut, _, rest = plan_lib.refit(review, PLAN, 1, 5.0, 600.0, TABLE, reached)
    assert cut.steps == (300, 300, 300, 277, 77) and rest <= 600.0


def test_a_resumed_review_refits_for_the_folds_left(tmp_path, monkeypatch):
    """run._steps_reached reads what a stopped run left: fold 2's training.json (trained), fold
    3's checkpoint at step 200; the budget's guard on fold 1 keeps time for the steps left."""
    monkeypatch.setattr(run, '_cost_table', lambda: TABLE)
    said = []
    runner = types.SimpleNamespace(say=said.append)
    layout = layout_lib.Layout(str(tmp_path))
    os.makedirs(layout.fold(3, 'model'))
    os.makedirs(layout.fold(2))
    with open(layout.fold(2, 'training.json'), 'w') as stream:
        json.dump({'step': 300}, stream)
    with open(os.path.join(layout.fold(3, 'model'), 'checkpoint'), 'w') as stream:
        stream.write('model_checkpoint_path: "model.ckpt-200"\n')
    review = plan_lib.make(PLAN, TRAIN, VAL, Request())
    assert run._steps_reached(layout, review, 1) == {2: 300, 3: 200, 4: 0}
    assert run._steps_reached(layout, review, 3) == {4: 0}
    # Fold 3: 45 s + 100 x 8 / 10; fold 4: 45 s + 300 x 8 / 10; then predictions and scores.
    after = dict(review.seconds)['predictions'] + dict(review.seconds)['scores and page']
    assert run._fold_stop(10000.0, layout, review, PLAN, 1) == pytest.approx(
        10000.0 - 125.0 - 285.0 - after)


def test_a_checkpoint_past_a_cut_folds_steps_counts_as_that_fold_done(tmp_path, monkeypatch):
    """A budget's refit cut fold 3 to 150 steps after a stopped run had taken it to step 200:
    fold 3 counts as reached at its 150 and costs nothing, where 150 - 200 steps used to take
    40 s off its start-up and keep 5 s for it."""
    monkeypatch.setattr(run, '_cost_table', lambda: TABLE)
    layout = layout_lib.Layout(str(tmp_path))
    os.makedirs(layout.fold(3, 'model'))
    with open(os.path.join(layout.fold(3, 'model'), 'checkpoint'), 'w') as stream:
        stream.write('model_checkpoint_path: "model.ckpt-200"\n')
    review = plan_lib.make(PLAN, TRAIN, VAL, Request())
    cut = dataclasses.replace(review, steps=review.steps[:3] + (150,) + review.steps[4:])
    assert run._steps_reached(layout, cut, 1) == {2: 0, 3: 150, 4: 0}
    after = dict(review.seconds)['predictions'] + dict(review.seconds)['scores and page']
    # Folds 2 and 4: 45 + 300 x 0.8 = 285 s each; fold 3: nothing left.
    assert run._fold_stop(10000.0, layout, cut, PLAN, 1) == pytest.approx(
        10000.0 - 285.0 - 285.0 - after)


def test_the_refit_is_said_in_one_line_and_kept_in_the_plan_file(tmp_path):
    said = []
    runner = types.SimpleNamespace(say=said.append)
    layout = layout_lib.Layout(str(tmp_path))
    os.makedirs(layout.directory)
    review = plan_lib.make(PLAN, TRAIN, VAL, Request())
    # Within 10% of the plan's rate: nothing changes, nothing is said.
    assert run._refitted(runner, layout, review, PLAN, 1, {'images_per_second': 9.5},
                         time.time() + 1200) == (review, PLAN)
    assert not said and not os.path.exists(layout.plan_json)
    cut, at_rate = run._refitted(runner, layout, review, PLAN, 1, {'images_per_second': 5.0},
                                 time.time() + 1200)
    assert at_rate.images_per_second == 5.0 and cut.steps[:2] == (300, 300)
    (line,) = said
    assert line.startswith('  fold 1 trained at 5.0 images/s, the plan\'s 10.0: the rest of '
                           'the review takes about ')
    for index in (2, 3, 4):  # This machine's cost table, so the count is read, not worked out.
        assert 'fold %d %d steps instead of 300' % (index, cut.steps[index]) in line
        assert cut.steps[index] < 300
    with open(layout.plan_json) as stream:
        assert plan_lib.from_record(json.load(stream)).steps == cut.steps
    # A later fold off the rate fold 1 measured: the line names whose rate that was.
    run._refitted(runner, layout, cut, at_rate, 2, {'images_per_second': 2.5}, None, "fold 1's")
    assert said[-1].startswith("  fold 2 trained at 2.5 images/s, fold 1's 5.0: the rest of")


def test_a_fold_resumed_from_its_checkpoint_is_timed_for_the_steps_left(monkeypatch):
    """A stopped review's rerun resumes a fold from its checkpoint: its line says the step and
    times the steps left, not the whole fold again (start-up 45 s + steps x 8 / 10 images/s)."""
    monkeypatch.setattr(run, '_cost_table', lambda: TABLE)
    runner = types.SimpleNamespace(layout=types.SimpleNamespace(logs='/out/logs'))
    fresh = run._training_line(runner, 1, 300, 80, PLAN)
    assert fresh.startswith('  fold 1: training 300 steps on 80 images, about 5 min (until ')
    assert fresh.endswith("main.py's output in /out/logs/train-fold-1.log")
    resumed = run._training_line(runner, 1, 300, 80, PLAN, 200)  # 45 + 100 x 0.8 = 125 s.
    assert resumed.startswith('  fold 1: resuming at step 200 of 300 on 80 images, 100 steps '
                              'left, about 2 min (until ')
    assert ', 0 steps left, about 0 min (until ' in run._training_line(runner, 1, 300, 80, PLAN,
                                                                     320)
