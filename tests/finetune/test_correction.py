"""finetune/correction.py with probe.RateProbe: fewer or more steps fit than planned, so the
running main.py's end is moved through its --steps_file (no restart) to the step that fits,
inside an interval, the plan rewritten to what it now trains (num_epochs a fraction main.py
counts to that step), and moved again after a later evaluation; a freeze the move would shift
before it is over still restarts. On the plan of ORTHO in 15 min (tests/finetune/test_budget.py:
860 steps in 10 evaluations of 86)."""
import dataclasses
import json
import os
import time

import pytest
import yaml

from efficientdet_hpu.core import run_end
from efficientdet_hpu.finetune import budget
from efficientdet_hpu.finetune import probe as probe_lib
from efficientdet_hpu.finetune import correction
from efficientdet_hpu.finetune import plan as plan_lib
from efficientdet_hpu.finetune import plan_file
from efficientdet_hpu.finetune import runner as runner_lib
from finetune_cases import LITE0_PTH, ORTHO, ROOMY, TABLE


@pytest.fixture(scope='module')
def plan():
    made = plan_lib.make_plan(ORTHO, ROOMY, plan_lib.Request(weights=LITE0_PTH, max_minutes=15),
                              table=TABLE)
    assert (made.steps, made.eval_interval, made.evaluations, made.freeze_steps) == (
        860, 86, 10, 43)
    return made


class Runner:
    def __init__(self, root, plan):
        self.layout = runner_lib.Layout(str(root))
        with open(self.layout.plan_yaml, 'w') as stream:
            yaml.safe_dump(plan_file.recipe(plan, 'train-*', 'val-*', 'val.json'), stream)


def _probe(plan, tmp_path, rate, move):
    """A probe whose log shows `rate` images/s from step 110 on, 600 s before the deadline."""
    probe = probe_lib.RateProbe(plan, str(tmp_path), time.time() + 600, first_step=0,
                                move=move)

    def train(step, seconds):
        return {'event': 'train', 'step': step, 'images_per_sec': rate,
                'time': probe.started + seconds}
    seconds = 8 * 25 / rate
    records = [train(25, 30 + seconds), train(50, 30 + 2 * seconds), {'event': 'eval',
                                                                      'step': 50}]
    records += [train(50 + 25 * k, 32 + (2 + k) * seconds) for k in (1, 2, 3)]
    (tmp_path / 'train_log.jsonl').write_text(''.join(json.dumps(r) + '\n' for r in records))
    return probe


def _main_py_steps(recipe):
    """The steps main.py trains from the recipe: int(num_epochs x steps per epoch), the steps
    per epoch 86.0 (config/settings.py; tests/finetune/test_plan.py reads a moved plan through
    it)."""
    return int(recipe['num_epochs'] * (recipe['num_examples_per_epoch'] / 8.0))


def _fits_to_a_step(moved, probe, from_step):
    """The end of `moved` fits the time left from `from_step` (at the probe's measured rate and
    evaluation, as budget.fitted_end counts them, and main.py's exit) with END_MARGIN of it
    spare, and to a step: one more would not fit, nor would one past the next evaluation (an
    end just past an interval's end costs an evaluation more)."""
    decision = probe.decision
    there = probe.deadline - time.time() - (
        dict(moved.seconds)['whole photos + export'] + budget.EXIT_SECONDS) * decision['load']
    there -= max(budget.END_MARGIN * there, budget.END_MARGIN_SECONDS)
    boundaries = sum(1 for k in range(1, moved.evaluations + 1)
                     if from_step < k * 86 < moved.steps)
    step_seconds = 8 / decision['rate']
    used = (moved.steps - from_step) * step_seconds + (boundaries + 1) * decision['evaluation']
    assert there - step_seconds - decision['evaluation'] - 0.2 <= used <= there + 0.2


def test_fewer_steps_fit_the_running_main_py_is_cut_in_place(plan, tmp_path):
    runner = Runner(tmp_path, plan)
    asked = []

    def move(decision, current):
        asked.append(dict(decision))
        return correction.move_in_place(runner, current, decision)
    probe = _probe(plan, tmp_path, 8.0, move)
    assert probe('step 125/860 ... 8.00 images/s') is False  # Not stopped: no restart.
    decision = probe.decision
    assert decision['in_place'] and not decision['restart']
    # Cut to the step that fits without a restart (the restart's start-up is not spent),
    # inside an interval: an evaluation at each interval's end and at the end.
    cut = probe.moved
    assert cut.steps == decision['end'] == asked[0]['end'] < 860 and cut.steps % 86
    assert decision['evaluations'] == decision['fit'] == cut.evaluations == -(-cut.steps // 86)
    _fits_to_a_step(cut, probe, 125)
    # The file main.py reads: the cut plan's end, warm-up and moving average.
    assert run_end.read(runner.layout.steps_file) == {
        'total_steps': cut.steps, 'warmup_steps': cut.warmup_steps,
        'moving_average_decay': cut.ema_decay}
    assert cut.ema_decay == plan.ema_decay and cut.warmup_steps < plan.warmup_steps
    # plan.yaml says what now trains: a rerun resumes with it; patience stays main.py's.
    with open(runner.layout.plan_yaml) as stream:
        recipe = yaml.safe_load(stream)
    assert int(recipe['num_epochs']) == cut.steps // 86 and _main_py_steps(recipe) == cut.steps
    assert recipe['moving_average_decay'] == cut.ema_decay
    assert int(recipe['lr_warmup_epoch'] * 86) == cut.warmup_steps
    assert recipe['early_stop_patience'] == plan.early_stop_patience == cut.early_stop_patience
    with open(runner.layout.plan_json) as stream:
        assert json.load(stream)['steps'] == cut.steps
    assert 'without a restart' in probe_lib.steps_line(plan, decision)


def test_a_move_main_py_reads_past_its_step_leaves_the_plan_at_the_step_reached(plan, tmp_path):
    """main.py reads a move to a step it has passed at the step it is at, and ends there
    (training/steps_file.py): plan.json and plan.yaml then say that step, so that a rerun of
    plan.yaml ends there too; nothing else in them changes."""
    runner = Runner(tmp_path, plan)
    cut = correction.move_in_place(runner, plan, {'end': 695, 'step': 650, 'rate': 8.0,
                                                  'startup': 30.0})
    assert cut.steps == 695
    with open(runner.layout.plan_yaml) as stream:
        before = yaml.safe_load(stream)
    assert correction.as_reached(runner, cut, 695) is cut  # Ended where asked: as it was.
    assert correction.as_reached(runner, cut, None) is cut
    reached = correction.as_reached(runner, cut, 701)
    assert reached.steps == 701 and reached.eval_interval == cut.eval_interval == 86
    assert (reached.warmup_steps, reached.ema_decay, reached.freeze_steps) == (
        cut.warmup_steps, cut.ema_decay, cut.freeze_steps)  # As main.py kept them.
    assert dict(reached.reasons)['steps'].endswith(
        '; main.py ended at step 701, the move to 695 having reached it after that step')
    assert reached.total_seconds > cut.total_seconds
    with open(runner.layout.plan_json) as stream:
        assert json.load(stream)['steps'] == 701
    with open(runner.layout.plan_yaml) as stream:
        recipe = yaml.safe_load(stream)
    assert _main_py_steps(recipe) == 701
    assert {k: v for k, v in recipe.items() if k != 'num_epochs'} == {
        k: v for k, v in before.items() if k != 'num_epochs'}


def test_training_that_ended_past_a_moved_end_is_recorded_at_the_step_reached(plan, tmp_path):
    """What the fine-tune does when main.py ends (stages.training_ended): the move's file asked
    695, main.py's last checkpoint is of step 701: training completed, at 701, and plan.json
    says 701; a run stopped by the time budget before its end leaves the plan as it was."""
    from efficientdet_hpu.finetune import stages  # pylint: disable=import-outside-toplevel
    runner = Runner(tmp_path, plan)
    runner.say = lambda text='': None
    os.makedirs(runner.layout.model_dir)
    cut = correction.move_in_place(runner, plan, {'end': 695, 'step': 650, 'rate': 8.0,
                                                  'startup': 30.0})
    checkpoint = os.path.join(runner.layout.model_dir, 'checkpoint')

    def ended(step, stopped):
        with open(checkpoint, 'w') as stream:
            stream.write('model_checkpoint_path: "model.ckpt-%d"\n' % step)
        record = stages.training_ended(runner, cut, stopped, 4.0, before=plan)
        with open(runner.layout.plan_json) as stream:
            return record['ended'], record['step'], json.load(stream)['steps']
    assert ended(650, True) == ('stopped at the time budget', 650, 695)
    assert ended(701, True) == ('completed', 701, 701)
    with open(runner.layout.training_json) as stream:
        assert json.load(stream)['step'] == 701


def test_a_move_later_that_came_once_main_py_had_ended_leaves_the_plan_it_trained(plan,
                                                                                   tmp_path):
    """A move later written while main.py made its last exit (after its last evaluation read
    the file): main.py completed at the end before the move; plan.json and plan.yaml go back
    to the plan it trained, their warm-up with it, the reason and a line saying so."""
    from efficientdet_hpu.finetune import stages  # pylint: disable=import-outside-toplevel
    runner = Runner(tmp_path, plan)
    said = []
    runner.say = said.append
    os.makedirs(runner.layout.model_dir)
    cut = correction.move_in_place(runner, plan, {'end': 695, 'step': 650, 'rate': 8.0,
                                                  'startup': 30.0})
    with open(runner.layout.plan_yaml) as stream:
        trained = yaml.safe_load(stream)
    later = correction.move_in_place(runner, cut, {'end': 760, 'step': 690, 'rate': 9.0,
                                                   'startup': 30.0})
    assert later.steps == 760 and later.warmup_steps != cut.warmup_steps
    with open(os.path.join(runner.layout.model_dir, 'checkpoint'), 'w') as stream:
        stream.write('model_checkpoint_path: "model.ckpt-695"\n')
    record = stages.training_ended(runner, later, False, 4.0, before=cut)
    assert (record['ended'], record['step']) == ('completed', 695)
    with open(runner.layout.plan_json) as stream:
        written = json.load(stream)
    assert written['steps'] == 695 and written['warmup_steps'] == cut.warmup_steps
    assert dict(written['reasons'])['steps'].endswith(
        '; main.py ended at step 695 before the move to 760 reached it')
    with open(runner.layout.plan_yaml) as stream:
        assert yaml.safe_load(stream) == trained
    assert ('  main.py ended at step 695 before the move to 760 reached it: plan.yaml holds 695'
            in said)
    # Without the plan before, or at another step, nothing is rewritten.
    assert correction.as_reached(runner, later, 695) is later
    assert correction.as_reached(runner, later, 700, cut) is later


def test_more_steps_fit_the_end_moves_later_in_place(plan, tmp_path):
    runner = Runner(tmp_path, plan)
    faster = _probe(plan, tmp_path, 40.0, lambda d, current: correction.move_in_place(
        runner, current, d))
    assert faster('step 125/860 ... 40.00 images/s') is False  # No restart.
    assert faster.decision['in_place'] and not faster.decision['restart']
    later = faster.moved
    assert later.evaluations == faster.decision['evaluations'] > 10
    assert run_end.read(runner.layout.steps_file)['total_steps'] == later.steps > 860
    with open(runner.layout.plan_yaml) as stream:
        assert _main_py_steps(yaml.safe_load(stream)) == later.steps


def test_a_freeze_the_move_would_shift_before_it_is_over_restarts(plan, tmp_path):
    runner = Runner(tmp_path, plan)
    # A freeze of 200 steps, not over at step 125, which the move would shift.
    frozen = dataclasses.replace(plan, freeze_steps=200)
    decision = {'end': 445, 'step': 125, 'rate': 8.0, 'startup': 30.0}
    assert correction.move_in_place(runner, frozen, decision) is None
    assert run_end.read(runner.layout.steps_file) is None  # Nothing written.
    assert correction.move_in_place(runner, plan, dict(decision, end=860)) is None
    # A probe whose move cannot be made: more fit by more than the tolerance, a restart.
    probe = _probe(plan, tmp_path, 40.0, lambda d, current: None)
    assert probe('step 125/860 ... 40.00 images/s') is True
    assert not probe.decision.get('in_place') and probe.moved is None


def test_each_later_evaluation_moves_the_end_again(plan, tmp_path):
    """Cut to what fits at 8 images/s; after the evaluation at step 172 the run is seen to go at
    16: the end moves later, to the step that fits, and a line says so; with nothing new (no
    evaluation since) it stays."""
    runner = Runner(tmp_path, plan)
    said = []
    probe = _probe(plan, tmp_path, 8.0, lambda d, current: correction.move_in_place(
        runner, current, d))
    probe.say = said.append
    probe('step 125/860 ... 8.00 images/s')
    first = probe.moved
    assert first.evaluations < 10 and len(said) == 1
    log = tmp_path / 'train_log.jsonl'
    text = log.read_text()
    last = json.loads(text.splitlines()[-1])

    def train(step, seconds):
        return json.dumps({'event': 'train', 'step': step, 'images_per_sec': 16.0,
                           'time': last['time'] + seconds}) + '\n'
    log.write_text(text + train(150, 12.5) + train(172, 23.5))
    probe('step 172/860 ... 16.00 images/s')
    assert probe.moved is first and len(said) == 1  # No evaluation since the decision.
    log.write_text(log.read_text() + json.dumps({'event': 'eval', 'step': 172}) + '\n'
                   + train(200, 40) + train(225, 52.5) + train(250, 65))
    probe('step 250/860 ... 16.00 images/s')
    again = probe.moved
    assert again.evaluations > first.evaluations and len(said) == 2
    assert probe.decision['step'] == 250 and probe.decision['in_place']
    assert '%d steps instead of %d: the run ends there' % (again.steps, first.steps) in said[1]
    assert run_end.read(runner.layout.steps_file)['total_steps'] == again.steps
    # The end fits the time left from step 250 to a step, END_MARGIN of it spare: the budget
    # is used, and the time-budget stop does not come first.
    _fits_to_a_step(again, probe, 250)


def test_a_move_needs_seconds_of_steps_and_a_share_of_those_to_go(plan):
    """At 8 images/s of 8 (a step a second), from the plan's 860 steps: a move needs 5 s of
    steps (MOVE_MIN_SECONDS, under the end's 10 s margin) and 2% of the steps to go."""
    assert not probe_lib.worth_moving(863, plan, 125, 8.0)  # 3 steps, 14.7 the share.
    assert not probe_lib.worth_moving(846, plan, 125, 8.0)  # 14 steps, still under it.
    assert probe_lib.worth_moving(845, plan, 125, 8.0)
    assert not probe_lib.worth_moving(864, plan, 830, 8.0)  # 0.6 the share: 5 s decide.
    assert probe_lib.worth_moving(865, plan, 830, 8.0) and probe_lib.worth_moving(
        855, plan, 830, 8.0)
    assert not probe_lib.worth_moving(830, plan, 830, 8.0)  # Not to the step reached.


def test_a_value_hparams_set_stays_in_the_running_main_py(plan, tmp_path):
    """moving_average_decay set by --hparams stays in plan.yaml when the steps change, so the
    file does not move it in main.py either; the warm-up, the plan's, moves."""
    runner = Runner(tmp_path, plan)
    with open(runner.layout.plan_yaml) as stream:
        recipe = yaml.safe_load(stream)
    recipe['moving_average_decay'] = 0.95
    with open(runner.layout.plan_yaml, 'w') as stream:
        yaml.safe_dump(recipe, stream)
    cut = correction.move_in_place(
        runner, plan, {'end': 534, 'step': 125, 'rate': 8.0, 'startup': 30.0})
    assert cut.steps == 534
    assert run_end.read(runner.layout.steps_file) == {
        'total_steps': 534, 'warmup_steps': cut.warmup_steps, 'moving_average_decay': 0.95}


def test_steps_the_user_set_are_not_cut(plan, tmp_path):
    """--steps (the plan's steps line says so) or num_epochs by --hparams (plan.yaml's differs
    from the plan's): the time budget stops such a run, nothing cuts it."""
    runner = Runner(tmp_path, plan)
    asked = dataclasses.replace(plan, reasons=tuple(
        (topic, '860 steps of 8 images: asked with --steps' if topic == 'steps' else text)
        for topic, text in plan.reasons))
    called = []
    probe = _probe(asked, tmp_path, 8.0, lambda decision, current: called.append(decision))
    probe('step 125/860 ... 8.00 images/s')
    assert probe.decision['fit'] < 10 and not called and probe.moved is None
    decision = {'end': 534, 'step': 125, 'rate': 8.0, 'startup': 30.0}
    assert correction.move_in_place(runner, asked, decision) is None
    plan_file.set_num_epochs(runner.layout.plan_yaml, 12)  # As --hparams num_epochs=12.
    assert correction.move_in_place(runner, plan, decision) is None
    assert run_end.read(runner.layout.steps_file) is None


def test_a_stop_after_the_last_steps_checkpoint_leaves_training_completed(tmp_path):
    """The time-budget stop can come in main.py's last evaluation or its exit, once the
    checkpoint of its last step is written: the run's last step is its --steps_file's (a move
    in place), else its schedule.json's."""
    from efficientdet_hpu.finetune import stages  # pylint: disable=import-outside-toplevel
    layout = runner_lib.Layout(str(tmp_path))
    os.makedirs(layout.model_dir)

    def checkpoint(step):
        with open(os.path.join(layout.model_dir, 'checkpoint'), 'w') as stream:
            stream.write('model_checkpoint_path: "model.ckpt-%d"\n' % step)

    def ended(stopped):
        return stages.training_record(layout.model_dir, stopped, 4.0,
                                      stages.last_step(layout))['ended']
    with open(os.path.join(layout.model_dir, 'schedule.json'), 'w') as stream:
        json.dump({'total_steps': 1200}, stream)
    checkpoint(1200)
    assert (ended(True), ended(False)) == ('completed', 'completed')
    checkpoint(1100)
    assert ended(True) == 'stopped at the time budget'
    run_end.write(layout.steps_file, 681, warmup_steps=170, ema_decay=0.997)
    checkpoint(681)
    assert ended(True) == 'completed'
    checkpoint(650)
    assert ended(True) == 'stopped at the time budget'
