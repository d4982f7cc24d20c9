"""finetune/budget.py: the evaluations that fit the time left, worked out by hand on the plan of
ORTHO in 15 min (finetune_cases.TABLE: 890 steps in 10 evaluations of 89, an evaluation 2.67 s,
the whole photos and export 90.67 s), and the probe reading main.py's first logged rate."""
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
    assert (made.steps, made.eval_interval, made.evaluations) == (890, 89, 10)
    return made


def test_a_faster_machine_gets_more_evaluations(plan):
    # 600 s left at step 100, 20 images/s, a restart of 30 s: 600 - 90.67 - 30 = 479.33 s.
    # The interval in progress (78 steps to 178) and its evaluation: 78 x 8 / 20 + 2.67 =
    # 33.87 s; each further interval 89 x 8 / 20 + 2.67 = 38.27 s: 445.47 / 38.27 = 11.6, 12
    # more (an interval at least half of which fits counts: the time-budget stop ends it).
    # 1 done + 1 + 12 = 14 evaluations, 1246 steps.
    assert budget.corrected_evaluations(plan, 600, 100, 20.0, 30) == 14
    assert budget.worth_changing(plan, 14)
    assert budget.corrected_evaluations(plan, 600 - 0.2 * 38.27, 100, 20.0, 30) == 13  # 11.4.


def test_a_slower_machine_gets_fewer(plan):
    # 700 s left at step 20, 5 images/s: 700 - 90.67 - 30 = 579.33; the first interval's 69
    # steps and evaluation 69 x 8 / 5 + 2.67 = 113.07 s; then 89 x 8 / 5 + 2.67 = 145.07 s each:
    # 466.27 / 145.07 = 3.2, 3 more: 4 evaluations.
    assert budget.corrected_evaluations(plan, 700, 20, 5.0, 30) == 4


def test_a_busy_machine_scales_the_other_stages(plan):
    # Load 2: the final stages 181.33 s and each evaluation 5.33: 600 - 181.33 - 30 = 388.67;
    # the interval in progress 31.2 + 5.33 = 36.53; each further 35.6 + 5.33 = 40.93:
    # 352.13 / 40.93 = 8.6, 9 more: 1 + 1 + 9 = 11.
    assert budget.corrected_evaluations(plan, 600, 100, 20.0, 30, load=2.0) == 11
    assert not budget.worth_changing(plan, 10)
    assert budget.load_factor(60, 30) == 2.0 and budget.load_factor(300, 30) == 3.0
    assert budget.load_factor(None, 30) == 1.0


def test_no_time_left_still_finishes_the_interval_in_progress(plan):
    assert budget.corrected_evaluations(plan, 10, 100, 20.0, 30) == 2


def test_an_end_at_any_step_by_hand(plan):
    # 600 s left at step 100, 20 images/s, no restart: (600 - 90.67 - 4) x 0.97 = 490.17 s
    # (the whole photos with the export, main.py's exit, the margin). To the interval's end at
    # 178 (78 x 0.4 + 2.67 = 33.87 s), then 38.27 s an interval: 11 more end at 1157 after
    # 454.84 s; an end past it costs its steps and an evaluation more: (490.17 - 454.84 - 2.67)
    # / 0.4 = 81.7 steps, before the next interval's end at 1246: so 1238.
    assert budget.fitted_end(plan, 600, 100, 20.0) == 1238
    # 70 s less: 422.27 s; 10 more intervals end at 1068 after 416.57 s; (422.27 - 416.57 -
    # 2.67) / 0.4 = 7.6: 1075.
    assert budget.fitted_end(plan, 530, 100, 20.0) == 1075
    # Nothing fits: one step on, which the probe does not move to.
    assert budget.fitted_end(plan, 60, 100, 20.0) == 101


@pytest.mark.parametrize('seconds_left,step,rate,per_evaluation,load', [
    (600, 100, 20.0, None, 1.0), (437.5, 0, 7.3, 11.0, 1.4), (900, 355, 41.0, 0.0, 0.8),
    (250, 177, 12.0, 30.0, 1.0), (1200, 178, 33.3, 4.2, 1.2)])
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
    assert (changed.steps, changed.evaluations, changed.eval_interval) == (1157, 13, 89)
    assert dict(changed.reasons)['steps'] == '1157 steps of 8 images: corrected'
    # Inside an interval: an evaluation more, at the end, in the time and the count.
    inside = budget.with_steps(plan, 1200, 'moved')
    assert (inside.steps, inside.evaluations) == (1200, 14)
    assert dict(inside.seconds)['evaluations'] == pytest.approx(
        14 * budget.planned_evaluation_seconds(plan))
    assert dict(changed.seconds)['training'] == pytest.approx(1157 * 8 / 10.0)
    # What follows the run's length follows the new steps, as the plan sets it: a warm-up
    # (and freeze) of 5% (57.85 -> 58; over one pass, 13 steps, and under a fifth), patience
    # half the 13 evaluations; automl's EMA, whose line says what it spans at the new end:
    # 1 / (1 - 1158 / 1167) = 129.7 steps.
    assert (plan.warmup_steps, plan.ema_decay, plan.early_stop_patience) == (44, 0.9998, 5)
    assert (changed.warmup_steps, changed.freeze_steps, changed.ema_decay,
            changed.early_stop_patience) == (58, 58, 0.9998, 6)
    reasons = dict(changed.reasons)
    assert reasons['EMA'].endswith('so at step 1157 it spans about the last 130 steps')
    assert reasons['freezing'].startswith('backbone frozen for the first 58 steps')
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
    # is frozen for 44 steps, and the record at step 40 inside it, faster, is not read either;
    # the first evaluation comes at step 89.
    records = [train(25, 3.0, 42.5), train(40, 30.0, 46.5), train(50, 16.0, 51.5),
               train(60, 16.0, 56.5)]
    logged(*records)
    assert probe('a line without a rate') is False and probe.decision is None
    # Two records past the freeze: one more is read before deciding.
    assert probe('step 60/890 loss 1.0 ... 16.00 images/s ETA 0:00:10') is False
    assert probe.decision is None
    records.append(train(70, 16.0, 61.5))
    logged(*records)
    # Decided at step 70, before any evaluation: 16 images/s (0.5 s a step) over the three
    # records past the freeze; start-up 42.5 - 25 x 0.5 = 30 s (the table's: load 1); an
    # evaluation the table's 2.67 s times the load, none measured. About 600 s left less the
    # whole photos, export and exit (94.67 s) and 3% spare: 490.17 s, for 986 steps and the 11
    # evaluations at each interval's end on the way and at 986 (70 + (490.17 - 11 x 2.67) /
    # 0.5). The end moves there in place.
    assert probe('step 70/890 loss 1.0 ... 16.00 images/s ETA 0:00:10') is False
    assert moves == [986]
    assert probe.decision == {'evaluations': 12, 'step': 70, 'rate': 16.0, 'startup': 30.0,
                              'evaluation': 2.7, 'evaluated': 0, 'load': 1.0, 'fit': 12,
                              'restart': False, 'end': 986, 'in_place': True}
    assert probe('step 80/890 ... images/s') is False  # Decided once.
    # Said as it is decided (once), not when training ends.
    assert said == [probe_lib.steps_line(plan, probe.decision)]
    assert ('measured at step 70: 16.0 training images/s (planned 10.0), start-up 30 s '
            '(planned 30; the end estimated x1.00), an evaluation 2.7 s (planned 2.7; none '
            "measured yet: the plan's times the start-up's x1.00): 986 steps instead of 890: "
            'the run ends there') in said[0]
    # Where the move cannot be made in place (a frozen backbone's steps it would shift), a
    # restart waits for a record past the first evaluation (measured 78.5 - 66.5 - 20 x 0.5 =
    # 2 s): about 600 s left less the whole photos and export, 509.33, less the rest of the
    # interval to 178 (78 x 0.5 + 2 = 41 s) 468.33: 10.1 more intervals of 89 x 0.5 + 2 = 46.5
    # s, 10 (half of one fits): 12 evaluations fit; after the restart's 30 s, 438.33 / 46.5 =
    # 9.4: 9, 11 evaluations.
    in_place, moves[:] = False, []
    restarted = probe_lib.RateProbe(plan, str(tmp_path), time.time() + 600, first_step=0,
                                 move=move)
    restarted.started = probe.started
    assert restarted('step 70/890 ... images/s') is False and restarted.decision is None
    assert moves == [986]  # Tried.
    records += [train(80, 16.0, 66.5), {'event': 'eval', 'step': 89},
                train(100, 16.0, 78.5)]
    logged(*records)
    assert restarted('step 100/890 ... images/s') is True
    assert restarted.decision == {'evaluations': 11, 'step': 100, 'rate': 16.0,
                                  'startup': 30.0, 'evaluation': 2.0, 'evaluated': 1,
                                  'load': 1.0, 'fit': 12, 'restart': True}
    # An evaluation measured at 6 s (56 - 40 - 25 x 8 / 20) holds the first one's graph: the
    # table's 2.67 s caps it.
    capped = probe_lib.RateProbe(plan, str(tmp_path), time.time() + 600, first_step=0)
    capped.started = probe.started
    logged(train(25, 3.0, 40), {'event': 'eval', 'step': 30}, train(50, 20.0, 56),
           train(75, 20.0, 66), train(105, 20.0, 78))
    capped('step 105/890 ... images/s')
    assert (capped.decision['step'], capped.decision['evaluation']) == (105, 2.7)
    assert capped.decision['evaluated'] == 1


def test_the_evaluation_is_the_pause_around_it_not_the_window_less_its_steps(plan, tmp_path):
    """Training slows after the evaluation (10 images/s from step 100). The rate over the
    records past the freeze (44 steps), 10 steps at 20 images/s and 25 each at 20, 20 and 10,
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
    probe('step 125/890 ... images/s')
    assert (probe.decision['rate'], probe.decision['evaluation']) == (15.45, 2.0)


def test_fewer_steps_restart_unless_the_cut_is_within_the_tolerance(plan):
    # The plan's 10 evaluations of 89 steps; (after a restart, without one). A time-budget stop
    # would cut the cosine's end and the steps after the last evaluation: any cut over 5% of
    # the 890 steps (44.5) restarts, even one that the restart makes two evaluations deep.
    assert budget.worth_restarting(plan, 8, 9)
    assert budget.worth_restarting(plan, 6, 7)
    assert not budget.worth_restarting(plan, 9, 10)  # All fit without a restart.
    assert budget.worth_restarting(plan, 12, 13) and not budget.worth_restarting(plan, 10, 11)
    twenty = dataclasses.replace(plan, steps=1780, eval_interval=89)  # 20 evaluations.
    assert not budget.worth_restarting(twenty, 19, 19)  # 89 steps: within 5% of 1780 (89).
    line = probe_lib.steps_line(twenty, {'evaluations': 19, 'fit': 19, 'step': 50, 'rate': 8.0,
                                      'startup': 30.0, 'load': 1.0, 'restart': False})
    assert line.endswith('about 1691 of the planned 1780 steps fit (within 5%): the time '
                         'budget stops training')


def test_a_restart_that_would_end_at_the_step_reached_goes_on_instead(plan):
    """CI's four-minute run on a slow VM: an evaluation pause of 16 s (planned 1.4) put the run
    behind at step 300 of 600; a restart to 300 steps would have stopped it there and left the
    30 s its start-up was kept for unused (3.4 of 4 min). Going on reaches another evaluation
    before the time-budget stop. Here: at step 445 (5 of 10 evaluations), 5 after a restart,
    7 without one."""
    assert budget.ends_here(plan, 5, 7, 445)
    assert not budget.worth_restarting(plan, 5, 7, 445)
    line = probe_lib.steps_line(plan, {'evaluations': 5, 'fit': 7, 'step': 445, 'rate': 8.0,
                                    'startup': 30.0, 'load': 1.0, 'restart': False})
    assert line.endswith('about 623 of the planned 890 steps fit; a restart to fewer would end '
                         'at this step, so training goes on until the time budget stops it')
    # Nothing more fits either way: the run stops at the step reached, as before.
    assert not budget.ends_here(plan, 5, 5, 445) and budget.worth_restarting(plan, 5, 5, 445)
    # A restart that still trains past the step reached goes as the rule says.
    assert not budget.ends_here(plan, 6, 7, 445) and budget.worth_restarting(plan, 6, 7, 445)


def test_steps_asked_with_the_flag_stay(plan):
    asked = dataclasses.replace(plan, reasons=tuple(
        (topic, '890 steps of 8 images: asked with --steps' if topic == 'steps' else text)
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
    # The data stage was planned at 36 s and took 36 (load 1); 500 s are left: 500 - 90.67 -
    # 30 (the start-up) = 379.33 s; an interval is 89 x 8 / 10 + 2.67 = 73.87 s: 5 of them.
    runner = _Runner(root, 36.0)
    corrected = budget.before_training(runner, plan, time.time() + 500, None, 36.0)
    assert (corrected.evaluations, corrected.steps) == (5, 445)
    assert plan_file.planned_num_epochs(str(root / 'plan.yaml')) == 5
    # The keys that follow the steps, rewritten for 445: a warm-up of 22 steps (5%), in
    # evaluations of 89, automl's EMA decay, no early stop in 5 evaluations.
    with open(root / 'plan.yaml') as stream:
        recipe = yaml.safe_load(stream)
    assert (recipe['lr_warmup_epoch'], recipe['var_freeze_steps'], recipe['moving_average_decay'],
            recipe['early_stop_patience']) == (plan_file.warmup_epochs(22, 89), 22, 0.9998, 0)
    with open(root / 'plan.json') as stream:
        assert json.load(stream)['steps'] == 445
    assert runner.said[0].startswith('  445 steps instead of 890: 8.3 min left')


def test_before_training_a_slow_data_stage_slows_the_rest(plan, tmp_path):
    # The data stage took 72 s, twice the 36 planned: the start-up 60 s, the end 181.33, an
    # evaluation 5.33 and the rate the table's 10 images/s over 2, 5: 500 - 181.33 - 60 =
    # 258.67 s; an interval 89 x 8 / 5 + 5.33 = 147.73 s: 1.75, 2 of them (with the table's
    # rate, 89 x 8 / 10 + 5.33 = 76.53 s, 3 would be planned).
    runner = _Runner(_written(plan, tmp_path), 72.0)
    corrected = budget.before_training(runner, plan, time.time() + 500, None, 72.0)
    assert corrected.evaluations == 2 and corrected.images_per_second == 5.0
    assert dict(corrected.seconds)['training'] == pytest.approx(2 * 89 * 8 / 5.0)  # At that rate.
    assert ('2.0 times the estimate: the start-up, evaluations and export estimated as slow, '
            'the training rate as the table\'s 10.0 over 2.0') in runner.said[0]


def test_before_training_a_fast_data_stage_does_not_speed_the_training(plan, tmp_path):
    # The data stage took 20 s of the 36 planned (0.56): the start-up, the end and an
    # evaluation are estimated as fast, but the training stays at the table's 10 images/s (a
    # Xeon's faster stages came with slower training than the EPYC's table). At 20 images/s
    # the 500 s would hold 11 intervals; at 10, 432.96 s over 72.68 s intervals: 6.
    runner = _Runner(_written(plan, tmp_path), 20.0)
    corrected = budget.before_training(runner, plan, time.time() + 500, None, 20.0)
    assert corrected.images_per_second == 10.0 and corrected.evaluations == 6
    assert ('0.6 times the estimate: the start-up, evaluations and export estimated as fast, '
            'the training rate the table\'s (faster stages are not read as faster training)'
            ) in runner.said[0]


def test_before_training_a_rate_measured_in_model_dir_is_not_scaled(plan, tmp_path):
    # A search's winner logged 8 images/s in model/: that rate is the machine's own, so the
    # stages' ratio of 2 scales the end (181.33 s) and start-up (60 s) but not it: 258.67 s
    # over intervals of 89 x 8 / 8 + 5.33 = 94.33 s: 2.7, 3 of them.
    root = _written(plan, tmp_path)
    (root / 'model').mkdir()
    (root / 'model' / 'train_log.jsonl').write_text(json.dumps(
        {'event': 'train', 'time': 1.0, 'step': 20, 'images_per_sec': 8.0}) + '\n')
    runner = _Runner(root, 72.0)
    corrected = budget.before_training(runner, plan, time.time() + 500, None, 72.0)
    assert corrected.evaluations == 3 and corrected.images_per_second == 8.0
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
