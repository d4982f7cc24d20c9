"""finetune/plan.py, plan_file.py, costs.py, stats.py and hardware.py: the plan's rules on data
whose numbers are worked out by hand, and the written plan.yaml resolved by main.py's own
config code to the same steps."""
import math

import pytest

from efficientdet_hpu.config import recipe as recipe_lib
from efficientdet_hpu.config import settings as settings_lib
from efficientdet_hpu.engine import loops
from efficientdet_hpu.finetune import budget
from efficientdet_hpu.finetune import costs
from efficientdet_hpu.finetune import hardware
from efficientdet_hpu.finetune import model_choice
from efficientdet_hpu.finetune import plan as plan_lib
from efficientdet_hpu.finetune import plan_file
from efficientdet_hpu.finetune import schedule
from efficientdet_hpu.finetune import sizing
from efficientdet_hpu.finetune import stats
from efficientdet_hpu.finetune.stats import Photo
from finetune_cases import grid as _grid, ORTHO, ROOMY, TABLE

def test_small_objects_on_large_photos_are_tiled_at_the_input_size():
    # A 40 px box on a 2400 px photo fitted to 320 px: 40 * 320 / 2400 = 5.3 px < 16, and the
    # photo is >= 2 x 320: tiles of 320. Overlap: 90% of the boxes are 40 px long, rounded up
    # to 48, less than 320 // 5 = 64: 64.
    tile, overlap, why = sizing.choose_tiling(ORTHO, 320)
    assert (tile, overlap) == (320, 64)
    assert '5.3 px' in why and '2400 px' in why
    # Tiles every 256 px: 0, 256, ..., 2048 (9), then one flush with the edge at 2080: 10 x 10.
    # Val: x 0, 256, 512, 768 and 880 (5); y 0, 256, 512 and 680 (4).
    assert stats.tile_count(ORTHO.train, 320, 64) == 100
    assert stats.tile_count(ORTHO.val, 320, 64) == 20


def test_large_objects_or_small_photos_stay_whole():
    # 100 px boxes on 640 px photos: 100 * 320 / 640 = 50 px at the input.
    big = stats.DataStats((Photo(640, 480, _grid(480, 100, 3)),), (Photo(640, 480),), 1)
    assert sizing.choose_tiling(big, 320)[:2] == (0, 0)
    # 20 px boxes on 500 px photos: 12.8 px at the input, but 500 < 2 x 320: no tiling (the
    # doctor may advise a larger image size instead).
    small = stats.DataStats((Photo(500, 500, _grid(500, 20, 3)),), (Photo(500, 500),), 1)
    tile, _, why = sizing.choose_tiling(small, 320)
    assert tile == 0 and '12.8' not in why and 'under 2x' in why


def test_long_boxes_widen_the_overlap_up_to_half_a_tile():
    # 90th percentile of the box long sides: 100 px -> 112 (multiple of 16) > 64.
    data = stats.DataStats((Photo(3000, 3000, tuple((i * 200, 0, 100, 30) for i in range(10))),),
                           (), 1)
    assert sizing.choose_tiling(data, 320)[:2] == (320, 112)


def test_the_batch_fits_the_memory_found():
    # Lite0 at 320: 1.0 GB + 0.2 GB an image (costs.LITE0). 20 GB: 70% is 14 GB, batch 8 (2.6).
    assert plan_lib.choose_batch('efficientdet-lite0', 320, 100, ROOMY)[:2] == (8, 1)
    # 2.2 GB available: 1.54 usable; 8 -> 2.6, 4 -> 1.8 do not fit, 2 -> 1.4 does: 2 x 4.
    tight = plan_lib.Hardware(cores=2, memory_gb=2.2)
    per_rank, accumulation, why = plan_lib.choose_batch('efficientdet-lite0', 320, 100, tight)
    assert (per_rank, accumulation) == (2, 4)
    assert 'as 4 x 2 accumulated' in why
    # 1.2 GB: 0.84 usable, one image needs 1.2: an error naming both.
    with pytest.raises(plan_lib.PlanError, match='1.2 GB of memory available'):
        plan_lib.choose_batch('efficientdet-lite0', 320, 100, plan_lib.Hardware(2, 1.2))
    # Fewer training images than the batch: the batch is the images (3), as 3 x 1.
    assert plan_lib.choose_batch('efficientdet-lite0', 320, 3, ROOMY)[:2] == (3, 1)


def test_memory_estimate_scales_with_compute_and_pixels():
    assert costs.training_memory_gb('efficientdet-lite0', 320, 8) == pytest.approx(2.6)
    # D0 at 512 (measured): 1.3 + 0.85 x 8 = 8.1 GB, the figure of docs/training.md.
    assert costs.training_memory_gb('efficientdet-d0', 512, 8) == pytest.approx(8.1)
    # D0 at 256: a quarter of the pixels.
    assert costs.training_memory_gb('efficientdet-d0', 256, 4) == pytest.approx(1.3 + 0.85)


def test_steps_from_the_data_without_a_budget():
    # 100 tiles, batch 8: 100 passes are ceil(100 x 100 / 8) = 1250 steps; 10 evaluations
    # every 125 steps; from random weights the warm-up is a quarter: max(one pass = 13,
    # round(0.25 x 1250 = 312.5) = 312), at most 1250 // 4 = 312; automl's EMA decay;
    # patience 10 // 2 = 5; the demo's rate for random weights.
    plan = plan_lib.make_plan(ORTHO, ROOMY, plan_lib.Request(), table=TABLE)
    assert (plan.tile_size, plan.train_images, plan.val_images) == (320, 100, 20)
    assert (plan.steps, plan.eval_interval, plan.evaluations) == (1250, 125, 10)
    assert (plan.warmup_steps, plan.ema_decay, plan.early_stop_patience) == (312, 0.9998, 5)
    assert plan.freeze_steps == 0  # Random weights: nothing to protect.
    assert dict(plan.schedule_keys)['learning_rate'] == 1.28
    # automl's moving average counts its updates: at step 1250 its decay is 1251 / 1260, so it
    # spans 1260 / 9 = 140 steps; the 0.9998 only rules past step 9 / 0.0002 - 10 = 44,990.
    assert dict(plan.reasons)['EMA'].endswith('at step 1250 it spans about the last 140 steps')
    assert (schedule.ema_span(44000), schedule.ema_span(60000)) == (4890, 5000)


def test_the_ema_line_names_a_decay_set_by_hparams():
    # --hparams=moving_average_decay=0.9 is what main.py averages with: 1 / (1 - 0.9) = 10
    # steps from step 80 on, where 0.9 falls below the count (1 + n) / (10 + n).
    request = plan_lib.Request(hparams=(('moving_average_decay', 0.9),))
    plan = plan_lib.make_plan(ORTHO, ROOMY, request, table=TABLE)
    assert plan.ema_decay == 0.9
    assert dict(plan.reasons)['EMA'].startswith(
        'automl\'s moving average of the weights (what evaluation and export use): decay '
        'min(0.9 (--hparams\'), (1 + n) / (10 + n))')
    assert dict(plan.reasons)['EMA'].endswith('at step 1250 it spans about the last 10 steps')
    assert '(0.9998 (automl\'s)' in dict(plan_lib.make_plan(
        ORTHO, ROOMY, plan_lib.Request(), table=TABLE).reasons)['EMA']


def test_the_budget_caps_the_steps():
    # TABLE: Lite0 at 320 trains 10 images/s. Besides training: the data (2 x 5 + (100 + 20) /
    # 20 + 20 = 36 s), the start-up 30, the whole photos and export (2 x 20 + 3 x 20 / 30 + 10
    # + 60 = 112): 178 s; 10 evaluations of 2 + 20 / 30 = 2.67 s. 15 min leave 900 - 178 -
    # 26.67 = 695.33 s: 869 steps of 8. 10 evaluations every 86: 860 steps; warm-up
    # max(one pass = 13, round(5% of 860 = 43) = 43) = 43; automl's EMA decay 0.9998.
    weights = plan_lib.Weights('backbone', '/w/efficientnet-lite0.pth', 'efficientdet-lite0')
    plan = plan_lib.make_plan(ORTHO, ROOMY, plan_lib.Request(weights=weights, max_minutes=15),
                              table=TABLE)
    assert (plan.steps, plan.eval_interval, plan.warmup_steps) == (860, 86, 43)
    assert plan.ema_decay == 0.9998
    assert plan.freeze_steps == 43  # ImageNet backbone: frozen during the warm-up.
    assert dict(plan.schedule_keys)['learning_rate'] == 0.08
    assert plan.total_seconds <= 15 * 60
    steps_line = dict(plan.reasons)['steps']
    assert '869 fit --max_minutes=15; the budget holds 70 passes of the 100 wanted' in steps_line
    # 21 min hold more than the 100 passes (1250 steps): 1260 - 178 - 26.67 = 1055.33 s spare,
    # 1319 steps fill it (10 evaluations of 131: 1310), 105.5 passes; early stopping ends it
    # sooner on a plateau.
    roomy = plan_lib.make_plan(ORTHO, ROOMY, plan_lib.Request(weights=weights, max_minutes=21),
                               table=TABLE)
    assert (roomy.steps, roomy.eval_interval) == (1310, 131)
    assert dict(roomy.reasons)['steps'].startswith(
        '1310 steps of 8 images: 1319 fill --max_minutes=21: 106 passes')


def test_steps_asked_past_the_budget_say_where_its_stop_comes():
    # As above: 869 steps fit 15 minutes. The training floor (3 min) with the stages before and
    # after it (36 + 112 s) takes 328 s: over a 4-minute budget, 5.5 min.
    weights = plan_lib.Weights('backbone', '/w/efficientnet-lite0.pth', 'efficientdet-lite0')

    def steps_line(steps, minutes):
        plan = plan_lib.make_plan(ORTHO, ROOMY, plan_lib.Request(
            weights=weights, max_minutes=minutes, steps=steps), table=TABLE)
        assert plan.steps == steps and budget.steps_asked(plan)
        return dict(plan.reasons)['steps']
    assert steps_line(500, 15) == '500 steps of 8 images: asked with --steps'
    assert steps_line(5000, 15) == (
        '5000 steps of 8 images: about 869 fit --max_minutes=15: its time-budget stop ends '
        'training there, and the run goes on with the best checkpoint; asked with --steps')
    assert steps_line(5000, 4) == (
        '5000 steps of 8 images: --max_minutes=4 stops training after its floor of 3 min, so '
        'the run takes about 5 min; asked with --steps')


def test_a_budget_too_short_for_the_fixed_stages_is_one_line():
    # The fixed stages take 178 s (above, 2.97 min); 20 steps of 8 at 10 images/s 16 s and
    # an evaluation 2.67 s more: 196.67 s, 3.28 min, so at least 4.
    with pytest.raises(plan_lib.PlanError,
                       match=r'--max_minutes=2 is too short.*about 3 min here; give at least 4$'):
        plan_lib.make_plan(ORTHO, ROOMY, plan_lib.Request(max_minutes=2), table=TABLE)


def test_the_model_follows_the_request_the_weights_then_the_hardware():
    assert model_choice.choose_model(plan_lib.Request(), ORTHO, ROOMY)[0] == 'efficientdet-lite0'
    many = stats.DataStats(tuple(Photo(640, 480) for _ in range(1000)), (), 1)
    gpu = plan_lib.Hardware(8, 60.0, 'GPU')
    assert model_choice.choose_model(plan_lib.Request(), many, gpu)[0] == 'efficientdet-lite2'
    assert model_choice.choose_model(plan_lib.Request(), ORTHO, gpu)[0] == 'efficientdet-lite0'
    detector = plan_lib.Weights('detector', '/ckpt/efficientdet-d0', 'efficientdet-d0')
    assert model_choice.choose_model(plan_lib.Request(weights=detector), many,
                                 gpu)[0] == 'efficientdet-d0'
    asked = plan_lib.Request(model_name='efficientdet-lite1', weights=detector)
    assert model_choice.choose_model(asked, many, gpu)[0] == 'efficientdet-lite1'


def test_the_doctor_advice_sets_anchors_and_an_untiled_image_size():
    whole = stats.DataStats((Photo(640, 480, _grid(480, 100, 3)),), (Photo(640, 480),), 1)
    plan = plan_lib.make_plan(whole, ROOMY, plan_lib.Request(),
                              (('anchor_scale', 2.0), ('image_size', 384)))
    assert (plan.image_size, plan.anchors, plan.tile_size) == (384, (('anchor_scale', 2.0),), 0)
    # --hparams image_size wins over the advice.
    asked = plan_lib.Request(hparams=(('image_size', 256),))
    assert plan_lib.make_plan(whole, ROOMY, asked, (('image_size', 384),)).image_size == 256


def test_the_models_anchor_scale_stays_while_its_anchors_reach_most_boxes():
    """deepforest: the doctor's 1.875 (coverage 92% -> 97%) cost AP50 0.439 -> 0.367."""
    advice = (('aspect_ratios', [1.0, 2.0, 0.5, 4.0]), ('anchor_scale', 1.875))
    kept = plan_lib.make_plan(ORTHO, ROOMY, plan_lib.Request(), advice, coverage=0.9245)
    assert kept.anchors == (('aspect_ratios', [1.0, 2.0, 0.5, 4.0]),)
    assert ("the doctor's anchor_scale 1.875 not taken: the model's own anchors already reach "
            "92% of the boxes (>= 90%)") in dict(kept.reasons)['anchors']
    # Where the model's anchors miss many boxes, the doctor's scale is taken.
    taken = plan_lib.make_plan(ORTHO, ROOMY, plan_lib.Request(), advice, coverage=0.6)
    assert taken.anchors == advice
    assert 'not taken' not in dict(taken.reasons)['anchors']
    # Only the scale: with no scale advised, nothing is dropped and the reason says so.
    only_ratios = plan_lib.make_plan(ORTHO, ROOMY, plan_lib.Request(), advice[:1], coverage=0.95)
    assert only_ratios.anchors == advice[:1]
    assert dict(plan_lib.make_plan(ORTHO, ROOMY, plan_lib.Request(), (), coverage=0.95)
                .reasons)['anchors'] == "the model's own (the data doctor advised no change)"


@pytest.mark.parametrize('warmup,interval', [(56, 111), (62, 125), (1, 4), (13, 7), (99, 100),
                                             (1, 3), (7, 49)])
def test_warmup_epochs_give_main_py_the_warmup_steps(warmup, interval):
    assert int(plan_file.warmup_epochs(warmup, interval) * interval) == warmup


@pytest.mark.parametrize('request_,moved', [
    (plan_lib.Request(max_minutes=30), None),
    (plan_lib.Request(max_minutes=30), 0.63),
    (plan_lib.Request(weights=plan_lib.Weights('backbone', '/w.pth', 'efficientdet-lite0')),
     None),
    (plan_lib.Request(weights=plan_lib.Weights('backbone', '/w.pth', 'efficientdet-lite0')),
     1.37),
    (plan_lib.Request(steps=4, hparams=(('image_size', 128), ('nms_configs.iou_thresh', 0.6))),
     None)])
def test_plan_yaml_resolves_in_main_py_to_the_planned_steps(tmp_path, request_, moved):
    """The recipe read back as main.py reads it (config/recipe.py), finalised by
    config/settings.py: the steps, the evaluation epochs, the batch and the warm-up; `moved`:
    the plan's end moved in place (finetune/correction.py) to that share of its steps, inside
    an interval."""
    plan = plan_lib.make_plan(ORTHO, plan_lib.Hardware(2, 2.2), request_, table=TABLE)
    if moved:
        steps = int(plan.steps * moved)
        steps += 0 if steps % plan.eval_interval else 1
        plan = budget.with_steps(plan, steps, 'moved')
        assert plan.steps % plan.eval_interval
    path = tmp_path / 'plan.yaml'
    content = plan_file.recipe(plan, '/r/train-*', '/r/val-*', '/r/val.json', request_.hparams)
    path.write_text(plan_file.yaml_text(content, 'python main.py ...'))
    recipe = recipe_lib.read_recipe(str(path))
    run = recipe.run_options
    config = recipe_lib.build_config(run['model_name'], recipe)
    final = settings_lib.finalize(config, settings_lib.RunFacts(
        per_rank_batch=run['train_batch_size'], eval_per_rank_batch=run['eval_batch_size'],
        examples_per_epoch=run['num_examples_per_epoch'], num_epochs=run['num_epochs']))
    assert final.schedule.total_steps == plan.steps
    assert final.schedule.steps_per_epoch == plan.eval_interval
    # The steps engine/loops.train_and_eval evaluates at: each interval's end, then the end.
    assert loops.evaluation_steps(final.schedule) == [
        k * plan.eval_interval for k in range(1, plan.evaluations)] + [plan.steps]
    assert final.schedule.warmup_steps == plan.warmup_steps
    assert final.batch.global_size == plan.global_batch == 8
    assert (final.batch.per_rank, final.batch.accumulation_steps) == (
        plan.per_rank_batch, plan.accumulation)
    # 2.2 GB: at 320 px 2 images a micro-batch (see above); at 128 px 1.0 + 0.2 x 0.16 x 8 =
    # 1.26 GB, the whole batch fits.
    assert plan.accumulation == (1 if request_.hparams else 4)
    # The rate per 64 images scaled to the batch: a fine-tune's 0.08 from the ImageNet
    # backbone, the demo's 1.28 from random weights.
    assert final.schedule.learning_rate == pytest.approx(
        (0.08 if request_.weights.kind else 1.28) * 8 / 64)
    assert final.config.var_freeze_steps == plan.freeze_steps
    assert run['early_stop_patience'] == plan.early_stop_patience
    if request_.hparams:
        assert final.config.nms_configs['iou_thresh'] == 0.6 and final.config.image_size == 128


@pytest.mark.parametrize('request_,act_type', [
    (plan_lib.Request(), 'swish'),
    (plan_lib.Request(weights=plan_lib.Weights('backbone', '/w.pth', 'efficientdet-lite0')),
     'relu6'),
    (plan_lib.Request(hparams=(('act_type', 'relu6'),)), 'relu6'),
    (plan_lib.Request(model_name='efficientdet-d0'), 'swish')])
def test_a_lite_model_from_random_weights_trains_with_swish(tmp_path, request_, act_type):
    """ReLU6 stays where it has a reason: Lite's ImageNet weights, or asked with --hparams;
    D0 has swish of its own. The activation read back as main.py reads plan.yaml."""
    plan = plan_lib.make_plan(ORTHO, ROOMY, request_, table=TABLE)
    path = tmp_path / 'plan.yaml'
    path.write_text(plan_file.yaml_text(plan_file.recipe(
        plan, '/r/train-*', '/r/val-*', '/r/val.json', request_.hparams), 'python main.py'))
    recipe = recipe_lib.read_recipe(str(path))
    assert recipe_lib.build_config(recipe.run_options['model_name'], recipe).act_type == act_type
    line = dict(plan.reasons).get('activation', '')
    planned = not request_.weights.kind and not request_.hparams and not request_.model_name
    assert line.startswith('swish in place of efficientdet-lite0\'s ReLU6') == planned
    assert dict(plan.model_keys) == ({'act_type': 'swish'} if planned else {})


def test_rates_come_from_the_table_interpolated_and_scaled():
    assert TABLE.images_per_second('efficientdet-lite0', 320, 2)[0] == pytest.approx(10.0)
    # Between 256 (15) and 320 (10) in log-log: 15 x (288^2 / 256^2)^(log(10/15) / log(320^2 /
    # 256^2)) = 15 x (288 / 256)^(log(10/15) / log(320 / 256)).
    slope = math.log(10.0 / 15.0) / math.log(320.0 / 256.0)
    rate, how = TABLE.images_per_second('efficientdet-lite0', 288, 2)
    assert rate == pytest.approx(15.0 * (288.0 / 256.0) ** slope)
    assert 'interpolated' in how
    rate, how = TABLE.images_per_second('efficientdet-lite0', 384, 2)
    assert rate == pytest.approx(10.0 * (384.0 / 320.0) ** slope)
    assert 'extrapolated from the measured sizes 128-320 px' in how
    # Lite1, not measured: Lite0's rate at the same pixels over the ratio of multiply-adds per
    # pixel, (2.01 / 384^2) / (0.99 / 320^2); at 384 px Lite0's is extrapolated from 256-320.
    lite0_384 = 10.0 * (384.0 / 320.0) ** (2 * slope / 2)
    rate, how = TABLE.images_per_second('efficientdet-lite1', 384, 2)
    assert rate == pytest.approx(lite0_384 / ((2.01 / 384 ** 2) / (0.99 / 320 ** 2)))
    assert 'scaled from efficientdet-lite0' in how
    # Other core counts: linear, said.
    rate, how = TABLE.images_per_second('efficientdet-d0', 512, 4)
    assert rate == pytest.approx(1.13 * 2) and 'assumed linear' in how


def test_a_model_measured_at_one_size_follows_the_size_curve_of_the_model_measured_at_most():
    # D0 is measured at 512 px only. At 256 px: Lite0's rate changes from 256 to 512 px (512
    # extrapolated from the 256-320 slope) by the same factor, not by the pixels' 4.
    slope = math.log(10.0 / 15.0) / math.log(320.0 ** 2 / 256.0 ** 2)
    lite0_512 = 15.0 * (512.0 ** 2 / 256.0 ** 2) ** slope
    rate, how = TABLE.images_per_second('efficientdet-d0', 256, 2)
    assert rate == pytest.approx(1.13 * 15.0 / lite0_512)
    assert rate < 1.13 * 4  # Where pixels alone would put it.
    assert "scaled from 512 px as efficientdet-lite0's measured rates change" in how
    # A table of one size per model has no curve: pixels, said.
    single = costs.Table('test CPU', 2, 'today', (costs.Rate('efficientdet-d0', 512, 1.13, 30.0),),
                         2.0, 3.0, 5.0, 20.0, 20.0, 20.0, 10.0, 60.0, 'tests')
    rate, how = single.images_per_second('efficientdet-d0', 256, 2)
    assert rate == pytest.approx(1.13 * 4) and 'scaled by pixels from 512 px' in how


def test_a_table_of_another_machine_is_said():
    assert costs.for_machine(TABLE, 'test CPU') == ''
    assert 'the cost table is for test CPU, not this Other CPU' in costs.for_machine(
        TABLE, 'Other CPU')
    plan = plan_lib.make_plan(ORTHO, plan_lib.Hardware(2, 20.0, '', 'Other CPU'),
                              plan_lib.Request(), table=TABLE)
    assert 'not this Other CPU' in dict(plan.reasons)['time']


def test_the_shipped_table_reads(tmp_path, monkeypatch):
    monkeypatch.setenv('HOME', str(tmp_path))  # No table of the user's.
    monkeypatch.delenv(costs.ENVIRONMENT, raising=False)
    table = costs.load('any CPU')
    assert table.images_per_second('efficientdet-lite0', 320, table.cores)[0] > 0
    monkeypatch.setenv(costs.ENVIRONMENT, str(tmp_path / 'absent.json'))
    with pytest.raises(OSError):
        costs.load()


def test_most_boxes_per_image_counts_a_tile_by_the_sliver_rule():
    # Boxes at x = 0, 100, ..., 900 (40 px) on a 1000 x 100 photo; 320 px tiles every 256:
    # starts 0, 256, 512 and 680. Tile 0..320 holds x = 0, 100, 200 (300..340 has 20 of its
    # 40 px inside: half, kept): 4.
    photo = Photo(1000, 100, tuple((x, 10, 40, 40) for x in range(0, 1000, 100)))
    assert stats.most_boxes_per_image((photo,), 320, 64) == 4
    assert stats.most_boxes_per_image((photo,)) == 10


def test_memory_available_reads_meminfo(tmp_path):
    meminfo = tmp_path / 'meminfo'
    meminfo.write_text('MemTotal:       24000000 kB\nMemAvailable:   20971520 kB\n')
    assert hardware.memory_available_gb(str(meminfo)) == pytest.approx(20.0)
    assert hardware.memory_available_gb(str(tmp_path / 'absent')) > 0  # os.sysconf's figure.


def test_run_option_overrides_reach_plan_yaml_and_the_printed_plan():
    request = plan_lib.Request(steps=400, hparams=(('num_examples_per_epoch', 16),
                                                   ('early_stop_patience', 0)))
    plan = plan_lib.make_plan(ORTHO, plan_lib.Hardware(2, 2.2), request, table=TABLE)
    content = plan_file.recipe(plan, '/r/train-*', '/r/val-*', '/r/val.json', request.hparams)
    assert content['num_examples_per_epoch'] == 16 and content['early_stop_patience'] == 0
    assert plan.early_stop_patience != 0  # The plan's own, which the override replaced.
    overrides = dict(plan.reasons)['overrides']
    assert overrides.startswith('num_examples_per_epoch=16, early_stop_patience=0 from --hparams')
