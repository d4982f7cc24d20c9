"""finetune/budget.py: the evaluations that fit the time left, worked out by hand on the plan of
ORTHO in 15 min (finetune_cases.TABLE: 860 steps in 10 evaluations of 86, an evaluation 2.67 s,
the whole photos and export 112 s), and the probe reading main.py's first logged rate."""
import dataclasses
import json
import time

import pytest
import yaml

from efficientdet_hpu.finetune import budget
from efficientdet_hpu.finetune import probe as probe_lib
from efficientdet_hpu.finetune import plan as plan_lib
from finetune_cases import LITE0_PTH, ORTHO, ROOMY, TABLE


@pytest.fixture(scope='module')
def plan():
    made = plan_lib.make_plan(ORTHO, ROOMY, plan_lib.Request(weights=LITE0_PTH, max_minutes=15),
                              table=TABLE)
    assert (made.steps, made.eval_interval, made.evaluations) == (860, 86, 10)
    return made


def test_a_faster_machine_gets_more_evaluations(plan):
    # 600 s left at step 100, 20 images/s, a restart of 30 s: 600 - 112 - 30 = 458 s.
    # The interval in progress (72 steps to 172) and its evaluation: 72 x 8 / 20 + 2.67 =
    # 31.47 s; each further interval 86 x 8 / 20 + 2.67 = 37.07 s: 426.53 / 37.07 = 11.51, 12
    # more (an interval at least half of which fits counts: the time-budget stop ends it).
    # 1 done + 1 + 12 = 14 evaluations, 1204 steps.
    assert budget.corrected_evaluations(plan, 600, 100, 20.0, 30) == 14
    assert budget.worth_changing(plan, 14)
    assert budget.corrected_evaluations(plan, 600 - 0.2 * 37.07, 100, 20.0, 30) == 13  # 11.31.


def test_a_slower_machine_gets_fewer(plan):
    # 700 s left at step 20, 5 images/s: 700 - 112 - 30 = 558; the first interval's 66 steps
    # and evaluation 66 x 8 / 5 + 2.67 = 108.27 s; then 86 x 8 / 5 + 2.67 = 140.27 s each:
    # 449.73 / 140.27 = 3.2, 3 more: 4 evaluations.
    assert budget.corrected_evaluations(plan, 700, 20, 5.0, 30) == 4


def test_a_busy_machine_scales_the_other_stages(plan):
    # Load 2: the final stages 224 s and each evaluation 5.33: 600 - 224 - 30 = 346; the
    # interval in progress 28.8 + 5.33 = 34.13; each further 34.4 + 5.33 = 39.73: 311.87 /
    # 39.73 = 7.85, 8 more: 1 + 1 + 8 = 10 (14 at load 1, above).
    assert budget.corrected_evaluations(plan, 600, 100, 20.0, 30, load=2.0) == 10
    assert not budget.worth_changing(plan, 10)
    assert budget.load_factor(60, 30) == 2.0 and budget.load_factor(300, 30) == 3.0
    assert budget.load_factor(None, 30) == 1.0


def test_no_time_left_still_finishes_the_interval_in_progress(plan):
    assert budget.corrected_evaluations(plan, 10, 100, 20.0, 30) == 2


def test_an_end_at_any_step_by_hand(plan):
    # 600 s left at step 100, 20 images/s, no restart: (600 - 112 - 4) x 0.97 = 469.48 s (the
    # whole photos with the export, main.py's exit, the margin). To the interval's end at 172
    # (72 x 0.4 + 2.67 = 31.47 s), then 37.07 s an interval: 11 more end at 1118 after 439.2
    # s; an end past it costs its steps and an evaluation more: (469.48 - 439.2 - 2.67) / 0.4
    # = 69 steps, before the next interval's end at 1204: so 1187.
    assert budget.fitted_end(plan, 600, 100, 20.0) == 1187
    # 70 s less: 401.58 s; 10 more intervals would end at 1032 after 402.13 s, 9 end at 946
    # after 365.07 s; (401.58 - 365.07 - 2.67) / 0.4 = 84.6: 1030.
    assert budget.fitted_end(plan, 530, 100, 20.0) == 1030
    # Nothing fits: one step on, which the probe does not move to.
    assert budget.fitted_end(plan, 60, 100, 20.0) == 101


@pytest.mark.parametrize('seconds_left,step,rate,per_evaluation,load', [
    (600, 100, 20.0, None, 1.0), (437.5, 0, 7.3, 11.0, 1.4), (900, 343, 41.0, 0.0, 0.8),
    (250, 171, 12.0, 30.0, 1.0), (1200, 172, 33.3, 4.2, 1.2)])
def test_the_end_fitted_is_the_last_step_that_fits(plan, seconds_left, step, rate,
                                                  per_evaluation, load):
    """Against the time of each end counted step by step: an evaluation at every interval's end
    before it and one at it, main.py's exit and the margin spare (its floor in seconds where
    the share is less)."""
    each = (budget.planned_evaluation_seconds(plan) * load if per_evaluation is None
            else per_evaluation)
    final = dict(plan.seconds)['whole photos + export'] + budget.EXIT_SECONDS
    spare = seconds_left - final * load
    spare -= max(budget.END_MARGIN * spare, budget.END_MARGIN_SECONDS)  # 10 s for (250, ...).

    def seconds(end):
        crossed = sum(1 for s in range(step + 1, end) if s % plan.eval_interval == 0)
        return (end - step) * 8 / rate + (crossed + 1) * each
    end = budget.fitted_end(plan, seconds_left, step, rate, load, per_evaluation)
    assert end > step + 1 and seconds(end) <= spare
    assert all(seconds(later) > spare for later in range(end + 1, end + 3 * plan.eval_interval))


def test_the_change_is_the_plans_new_steps(plan):
    changed = budget.with_evaluations(plan, 13, 'corrected')
    assert (changed.steps, changed.evaluations, changed.eval_interval) == (1118, 13, 86)
    assert dict(changed.reasons)['steps'] == '1118 steps of 8 images: corrected'
    # Inside an interval: an evaluation more, at the end, in the time and the count.
    inside = budget.with_steps(plan, 1200, 'moved')
    assert (inside.steps, inside.evaluations) == (1200, 14)
    assert dict(inside.seconds)['evaluations'] == pytest.approx(
        14 * budget.planned_evaluation_seconds(plan))
    assert dict(changed.seconds)['training'] == pytest.approx(1118 * 8 / 10.0)
    # What follows the run's length follows the new steps, as the plan sets it: a warm-up
    # (and freeze) of 5% (55.9 -> 56; over one pass, 13 steps, and under a fifth), patience
    # half the 13 evaluations; automl's EMA, whose line says what it spans at the new end:
    # 1 / (1 - 1119 / 1128) = 125.3 steps.
    assert (plan.warmup_steps, plan.ema_decay, plan.early_stop_patience) == (43, 0.9998, 5)
    assert (changed.warmup_steps, changed.freeze_steps, changed.ema_decay,
            changed.early_stop_patience) == (56, 56, 0.9998, 6)
    reasons = dict(changed.reasons)
    assert reasons['EMA'].endswith('so at step 1118 it spans about the last 125 steps')
    assert reasons['freezing'].startswith('backbone frozen for the first 56 steps')
    assert reasons['early stop'] == 'after 6 evaluations in a row without a better AP'


def test_the_probe_decides_past_the_freeze_before_the_first_evaluation(plan, tmp_path):
    said, moves = [], []

    def move(decision, current):  # As correction.move_in_place; None: a restart is needed.
        moves.append(decision['end'])
        return dataclasses.replace(current, steps=decision['end']) if in_place else None
    in_place = True
    probe = probe_lib.RateProbe(plan, str(tmp_path), time.time() + 600, first_step=0,
                             say=said.append, move=move)
    log = tmp_path / 'train_log.jsonl'

    def logged(*records):
        log.write_text(''.join(json.dumps(r) + '\n' for r in records))

    def train(step, rate, seconds):
        return {'event': 'train', 'step': step, 'images_per_sec': rate,
                'time': probe.started + seconds}

    # The first record holds the first step's one-off cost (its rate is not used); the backbone
    # is frozen for 43 steps, and the record at step 40 inside it, faster, is not read either;
    # the first evaluation comes at step 86.
    records = [train(25, 3.0, 42.5), train(40, 30.0, 46.5), train(50, 16.0, 51.5),
               train(60, 16.0, 56.5)]
    logged(*records)
    assert probe('a line without a rate') is False and probe.decision is None
    # Two records past the freeze: one more is read before deciding.
    assert probe('step 60/860 loss 1.0 ... 16.00 images/s ETA 0:00:10') is False
    assert probe.decision is None
    records.append(train(70, 16.0, 61.5))
    logged(*records)
    # Decided at step 70, before any evaluation: 16 images/s (0.5 s a step) over the three
    # records past the freeze; start-up 42.5 - 25 x 0.5 = 30 s (the table's: load 1); an
    # evaluation the table's 2.67 s times the load, none measured. About 600 s left less the
    # whole photos, export and exit (116 s) and 3% spare: 469.48 s. The 11th interval's end,
    # 946, fits with its 11 evaluations: 876 x 0.5 + 11 x 2.67 = 467.33 s; an end past it
    # costs a 12th and reaches 70 + (469.48 - 12 x 2.67) / 0.5 = 944 only: 946, 11
    # evaluations. The end moves there in place.
    assert probe('step 70/860 loss 1.0 ... 16.00 images/s ETA 0:00:10') is False
    assert moves == [946]
    assert probe.decision == {'evaluations': 11, 'step': 70, 'rate': 16.0, 'startup': 30.0,
                              'evaluation': 2.7, 'evaluated': 0, 'load': 1.0, 'fit': 11,
                              'restart': False, 'end': 946, 'in_place': True}
    assert probe('step 80/860 ... images/s') is False  # Decided once.
    # Said as it is decided (once), not when training ends.
    assert said == [probe_lib.steps_line(plan, probe.decision)]
    assert ('measured at step 70: 16.0 training images/s (planned 10.0), start-up 30 s '
            '(planned 30; the end estimated x1.00), an evaluation 2.7 s (planned 2.7; none '
            "measured yet: the plan's times the start-up's x1.00): 946 steps instead of 860: "
            'the run ends there') in said[0]
    # Where the move cannot be made in place (a frozen backbone's steps it would shift), a
    # restart waits for a record past the first evaluation (measured 78.5 - 66.5 - 20 x 0.5 =
    # 2 s): about 600 s left less the whole photos and export, 488, less the rest of the
    # interval to 172 (72 x 0.5 + 2 = 38 s) 450: 10 more intervals of 86 x 0.5 + 2 = 45 s (not
    # half of an 11th): 12 evaluations fit; after the restart's 30 s, 420 / 45 = 9.3: 9, 11
    # evaluations.
    in_place, moves[:] = False, []
    restarted = probe_lib.RateProbe(plan, str(tmp_path), time.time() + 600, first_step=0,
                                 move=move)
    restarted.started = probe.started
    assert restarted('step 70/860 ... images/s') is False and restarted.decision is None
    assert moves == [946]  # Tried.
    records += [train(80, 16.0, 66.5), {'event': 'eval', 'step': 86},
                train(100, 16.0, 78.5)]
    logged(*records)
    assert restarted('step 100/860 ... images/s') is True
    assert restarted.decision == {'evaluations': 11, 'step': 100, 'rate': 16.0,
                                  'startup': 30.0, 'evaluation': 2.0, 'evaluated': 1,
                                  'load': 1.0, 'fit': 12, 'restart': True}
    # An evaluation measured at 6 s (56 - 40 - 25 x 8 / 20) holds the first one's graph: the
    # table's 2.67 s caps it.
    capped = probe_lib.RateProbe(plan, str(tmp_path), time.time() + 600, first_step=0)
    capped.started = probe.started
    logged(train(25, 3.0, 40), {'event': 'eval', 'step': 30}, train(50, 20.0, 56),
           train(75, 20.0, 66), train(105, 20.0, 78))
    capped('step 105/860 ... images/s')
    assert (capped.decision['step'], capped.decision['evaluation']) == (105, 2.7)
    assert capped.decision['evaluated'] == 1


def test_the_evaluation_is_the_pause_around_it_not_the_window_less_its_steps(plan, tmp_path):
    """Training slows after the evaluation (10 images/s from step 100). The rate over the
    records past the freeze (43 steps), 10 steps at 20 images/s and 25 each at 20, 20 and 10,
    is 85 / 5.5 = 15.45 images/s: the log from its first record less its steps at that rate,
    90 - 40 - 100 x 8 / 15.45 = -1.8 s (the frozen steps ran faster), would read as no
    evaluation at all. The log interval around it, at the rate logged after it: 60 - 48 - 25 x
    8 / 20 = 2 s."""
    probe = probe_lib.RateProbe(plan, str(tmp_path), time.time() + 600, first_step=0)

    def train(step, rate, seconds):
        return {'event': 'train', 'step': step, 'images_per_sec': rate,
                'time': probe.started + seconds}
    (tmp_path / 'train_log.jsonl').write_text(''.join(json.dumps(r) + '\n' for r in (
        train(25, 3.0, 40), train(40, 30.0, 44), train(50, 20.0, 48),
        {'event': 'eval', 'step': 50}, train(75, 20.0, 60), train(100, 20.0, 70),
        train(125, 10.0, 90))))
    probe('step 125/860 ... images/s')
    assert (probe.decision['rate'], probe.decision['evaluation']) == (15.45, 2.0)


def test_fewer_steps_restart_unless_the_cut_is_within_the_tolerance(plan):
    # The plan's 10 evaluations of 86 steps; (after a restart, without one). A time-budget stop
    # would cut the cosine's end and the steps after the last evaluation: any cut over 5% of
    # the 860 steps (43) restarts, even one that the restart makes two evaluations deep.
    assert budget.worth_restarting(plan, 8, 9)
    assert budget.worth_restarting(plan, 6, 7)
    assert not budget.worth_restarting(plan, 9, 10)  # All fit without a restart.
    assert budget.worth_restarting(plan, 12, 13) and not budget.worth_restarting(plan, 10, 11)
    twenty = dataclasses.replace(plan, steps=1720, eval_interval=86)  # 20 evaluations.
    assert not budget.worth_restarting(twenty, 19, 19)  # 86 steps: within 5% of 1720 (86).
    line = probe_lib.steps_line(twenty, {'evaluations': 19, 'fit': 19, 'step': 50, 'rate': 8.0,
                                      'startup': 30.0, 'load': 1.0, 'restart': False})
    assert line.endswith('about 1634 of the planned 1720 steps fit (within 5%): the time '
                         'budget stops training')


def test_a_restart_that_would_end_at_the_step_reached_goes_on_instead(plan):
    """CI's four-minute run on a slow VM: an evaluation pause of 16 s (planned 1.4) put the run
    behind at step 300 of 600; a restart to 300 steps would have stopped it there and left the
    30 s its start-up was kept for unused (3.4 of 4 min). Going on reaches another evaluation
    before the time-budget stop. Here: at step 430 (5 of 10 evaluations), 5 after a restart,
    7 without one."""
    assert budget.ends_here(plan, 5, 7, 430)
    assert not budget.worth_restarting(plan, 5, 7, 430)
    line = probe_lib.steps_line(plan, {'evaluations': 5, 'fit': 7, 'step': 430, 'rate': 8.0,
                                    'startup': 30.0, 'load': 1.0, 'restart': False})
    assert line.endswith('about 602 of the planned 860 steps fit; a restart to fewer would end '
                         'at this step, so training goes on until the time budget stops it')
    # Nothing more fits either way: the run stops at the step reached, as before.
    assert not budget.ends_here(plan, 5, 5, 430) and budget.worth_restarting(plan, 5, 5, 430)
    # A restart that still trains past the step reached goes as the rule says.
    assert not budget.ends_here(plan, 6, 7, 430) and budget.worth_restarting(plan, 6, 7, 430)


def test_steps_asked_with_the_flag_stay(plan):
    asked = dataclasses.replace(plan, reasons=tuple(
        (topic, '860 steps of 8 images: asked with --steps' if topic == 'steps' else text)
        for topic, text in plan.reasons))
    assert budget.steps_asked(asked) and not budget.steps_asked(plan)
    assert not budget.worth_changing(asked, 13)


def test_the_time_budget_stop_leaves_the_end_times_the_load_the_probe_measured():
    """training_stop: the seconds to the stop, the end's estimate before the deadline; once the
    probe has a decision, that estimate times its load (a busy machine stops sooner)."""
    class _Probe:
        decision = None
    probe = _Probe()
    deadline = time.time() + 600.0
    stop = budget.training_stop(deadline, 60.0, probe, floor=100.0)
    assert 539.0 < stop() <= 540.0  # Before a decision: the estimate as it is.
    probe.decision = {'load': 2.0}
    assert 479.0 < stop() <= 480.0
    probe.decision = {'load': 0.5}
    assert 569.0 < stop() <= 570.0
    assert budget.training_stop(time.time() + 120.0, 60.0, None, floor=100.0)() == 100.0


def test_before_the_probe_decides_the_stop_leaves_the_end_times_the_stages_load():
    """The stages before training ran 2.5 times their estimate: until the first steps measure
    the load, the stop leaves the end 2.5 times its estimate (a busy machine's end is slow too:
    a four-minute run planned from a table four times too fast ended at 4.9 min when it left
    the estimate as it was)."""
    class _Probe:
        decision = None
    probe = _Probe()
    stop = budget.training_stop(time.time() + 600.0, 60.0, probe, floor=100.0, load=2.5)
    assert 449.0 < stop() <= 450.0
    probe.decision = {'load': 2.0}
    assert 479.0 < stop() <= 480.0  # The probe's, once measured.
    assert 449.0 < budget.training_stop(time.time() + 600.0, 60.0, None, 100.0, 2.5)() <= 450.0


def test_the_closing_line_says_how_much_of_the_budget_was_used():
    assert budget.used_line(19.4, 20, 'completed') == '  budget: 19.4 of 20 min used (97%)'
    assert budget.used_line(12.0, 20, 'early stop').endswith(
        'training ended early: the AP stopped rising (early stop)')
    assert 'outside 10%: the stages took longer' in budget.used_line(23.0, 20, 'completed')
    # Training ran faster than the rate its steps were set from (the first steps' rate still
    # rising, or another job ended since): said, with both rates; slower, the other way round.
    assert budget.used_line(3.3, 4, 'completed', {'planned': 36.55, 'measured': 55.17}).endswith(
        'outside 10%: training ran at 55.2 images/s, faster than the 36.5 its steps were set '
        'from (a rate still rising when measured, or a machine quieter since)')
    assert budget.used_line(4.6, 4, 'completed', {'planned': 50.0, 'measured': 40.0}).endswith(
        'training ran at 40.0 images/s, slower than the 50.0 its steps were set from (a machine '
        'busier since)')
    assert 'the stages took less time' in budget.used_line(
        3.3, 4, 'completed', {'planned': 50.0, 'measured': 52.0})


class _Runner:
    """A runner whose stages took `elapsed` seconds; says lines into `said`."""

    def __init__(self, root, elapsed):
        from efficientdet_hpu.finetune import runner as runner_lib
        self.layout, self._elapsed, self.said = runner_lib.Layout(str(root)), elapsed, []

    def elapsed(self):
        return self._elapsed

    def say(self, text=''):
        self.said.append(text)


def _written(plan, root):
    from efficientdet_hpu.finetune import plan_file
    runner_root = root / 'out'
    runner_root.mkdir()
    content = plan_file.recipe(plan, '/r/train-*', '/r/val-*', '/r/val.json')
    (runner_root / 'plan.yaml').write_text(plan_file.yaml_text(content, 'python main.py ...'))
    return runner_root


def test_before_training_the_stages_measured_set_the_evaluations(plan, tmp_path):
    from efficientdet_hpu.finetune import plan_file
    root = _written(plan, tmp_path)
    # The data stage was planned at 36 s and took 36 (load 1); 500 s are left: 500 - 112 - 30
    # (the start-up) = 358 s; an interval is 86 x 8 / 10 + 2.67 = 71.47 s: 5 of them (5.01).
    runner = _Runner(root, 36.0)
    corrected = budget.before_training(runner, plan, time.time() + 500, None, 36.0)
    assert (corrected.evaluations, corrected.steps) == (5, 430)
    assert plan_file.planned_num_epochs(str(root / 'plan.yaml')) == 5
    # The keys that follow the steps, rewritten for 430: a warm-up of 22 steps (5%, 21.5
    # rounded to even), in evaluations of 86, automl's EMA decay, no early stop in 5
    # evaluations.
    with open(root / 'plan.yaml') as stream:
        recipe = yaml.safe_load(stream)
    assert (recipe['lr_warmup_epoch'], recipe['var_freeze_steps'], recipe['moving_average_decay'],
            recipe['early_stop_patience']) == (plan_file.warmup_epochs(22, 86), 22, 0.9998, 0)
    with open(root / 'plan.json') as stream:
        assert json.load(stream)['steps'] == 430
    assert runner.said[0].startswith('  430 steps instead of 860: 8.3 min left')


def test_before_training_a_slow_data_stage_slows_the_rest(plan, tmp_path):
    # The data stage took 72 s, twice the 36 planned: the start-up 60 s, the end 224, an
    # evaluation 5.33 and the rate the table's 10 images/s over 2, 5: 500 - 224 - 60 = 216 s;
    # an interval 86 x 8 / 5 + 5.33 = 142.93 s: 1.51, 2 of them (with the table's rate, 86 x
    # 8 / 10 + 5.33 = 74.13 s, 2.91: 3 would be planned).
    runner = _Runner(_written(plan, tmp_path), 72.0)
    corrected = budget.before_training(runner, plan, time.time() + 500, None, 72.0)
    assert corrected.evaluations == 2 and corrected.images_per_second == 5.0
    assert dict(corrected.seconds)['training'] == pytest.approx(2 * 86 * 8 / 5.0)  # At that rate.
    assert ('2.0 times the estimate: the start-up, evaluations and export estimated as slow, '
            'the training rate as the table\'s 10.0 over 2.0') in runner.said[0]


def test_before_training_a_fast_data_stage_does_not_speed_the_training(plan, tmp_path):
    # The data stage took 20 s of the 36 planned (0.56): the start-up, the end and an
    # evaluation are estimated as fast, but the training stays at the table's 10 images/s (a
    # Xeon's faster stages came with slower training than the EPYC's table): 500 - (112 + 30)
    # x 20 / 36 = 421.11 s, an evaluation 2.67 x 20 / 36 = 1.48 s. At 20 images/s, intervals
    # of 86 x 8 / 20 + 1.48 = 35.88 s, the 500 s would hold 11.7, 12 of them; at 10, over
    # 68.8 + 1.48 = 70.28 s intervals: 5.99, 6.
    runner = _Runner(_written(plan, tmp_path), 20.0)
    corrected = budget.before_training(runner, plan, time.time() + 500, None, 20.0)
    assert corrected.images_per_second == 10.0 and corrected.evaluations == 6
    assert ('0.6 times the estimate: the start-up, evaluations and export estimated as fast, '
            'the training rate the table\'s (faster stages are not read as faster training)'
            ) in runner.said[0]


def test_before_training_a_rate_measured_in_model_dir_is_not_scaled(plan, tmp_path):
    # A search's winner logged 8 images/s in model/: that rate is the machine's own, so the
    # stages' ratio of 2 scales the end (224 s) and start-up (60 s) but not it: 216 s over
    # intervals of 86 x 8 / 8 + 5.33 = 91.33 s: 2.37, 2 of them (at 8 over 2, 4 images/s,
    # intervals of 177.33 s: 1.22, 1).
    root = _written(plan, tmp_path)
    (root / 'model').mkdir()
    (root / 'model' / 'train_log.jsonl').write_text(json.dumps(
        {'event': 'train', 'time': 1.0, 'step': 20, 'images_per_sec': 8.0}) + '\n')
    runner = _Runner(root, 72.0)
    corrected = budget.before_training(runner, plan, time.time() + 500, None, 72.0)
    assert corrected.evaluations == 2 and corrected.images_per_second == 8.0
    assert 'at 8.0 images/s (measured)' in runner.said[0] and 'over 2.0' not in runner.said[0]


def test_a_value_hparams_set_stays_when_the_steps_change(plan, tmp_path):
    """--hparams=moving_average_decay=0.9 is in plan.yaml over the plan's: the correction
    rewrites the warm-up and patience for the new steps, and leaves the user's decay."""
    from efficientdet_hpu.finetune import plan_file
    root = tmp_path / 'out'
    root.mkdir()
    content = plan_file.recipe(plan, '/r/train-*', '/r/val-*', '/r/val.json',
                               (('moving_average_decay', 0.9),))
    (root / 'plan.yaml').write_text(plan_file.yaml_text(content, 'python main.py ...'))
    changed = budget.with_evaluations(plan, 5, 'corrected')
    plan_file.set_num_epochs(str(root / 'plan.yaml'), 5, (),
                              plan_file.length_keys(plan, changed))
    with open(root / 'plan.yaml') as stream:
        recipe = yaml.safe_load(stream)
    assert recipe['moving_average_decay'] == 0.9
    assert (recipe['num_epochs'], recipe['var_freeze_steps'], recipe['early_stop_patience']) == (
        5, 22, 0)
