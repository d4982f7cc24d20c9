"""The training's steps corrected while main.py runs, from its own log (train_log.jsonl).

  first steps      once main.py has logged PROBE_RECORDS records past the frozen backbone's
                   steps (and PROBE_STEPS in), whether or not it has evaluated yet: its rate
                   (over the steps of its records past those, the first record holding the
                   first step's one-off cost), its start-up and an evaluation's seconds (the
                   pauses measured at the evaluations so far, at most the table's; the table's
                   times the load before the first) against the cost table's. Where the end
                   that fits (budget.fitted_end: any step, END_MARGIN of the time left spare, at
                   least END_MARGIN_SECONDS) differs from the plan's by MOVE_SHARE of the time
                   to go (and MOVE_MIN_SECONDS), the running main.py is told through its
                   --steps_file (finetune/correction.py): it ends there, sooner or later, its
                   warm-up, cosine and evaluations following, with no restart
                   (an evaluation at the new end, its cosine at zero; plan.yaml's num_epochs a
                   fraction where the end falls inside an interval). Where it cannot (a frozen
                   backbone's steps the move would shift, still to come), the decision waits
                   for a record past the first evaluation, then training is stopped when the
                   steps differ from the plan's by more than TOLERANCE (SIGTERM: a
                   checkpoint), plan.yaml gets the new number of evaluations and main.py
                   resumes from the checkpoint; fewer fit by less: the time-budget stop ends
                   training (a checkpoint) a little before the plan's last step, as it does
                   where a restart would end at the step reached (budget.ends_here)
  each evaluation  after it, the same arithmetic over all the records (and the evaluations'
                   measured pauses) moves the end again: the later the measurement, the nearer
                   the end lands to the budget, and the first evaluation replaces the table's
                   estimate of its time
"""
import time

from efficientdet_hpu.finetune.budget import (
    END_MARGIN, END_MARGIN_SECONDS, TOLERANCE, corrected_evaluations, ends_here, fitted_end,
    load_factor, planned_evaluation_seconds, steps_asked, train_records, training_log,
    worth_restarting)

PROBE_STEPS = 10  # The rate is read from log records at least this many steps in,
PROBE_RECORDS = 3  # and past the freeze: the first decision once this many are logged.
# A move in place is made when the end that fits differs from the current one by this share of
# the time still to train, and by at least MOVE_MIN_SECONDS of steps: under END_MARGIN and
# END_MARGIN_SECONDS, so that an end found too late is always moved sooner before the
# time-budget stop comes first, and a few steps' change is no move.
MOVE_SHARE = 0.02
MOVE_MIN_SECONDS = 5.0
assert MOVE_SHARE < END_MARGIN and MOVE_MIN_SECONDS < END_MARGIN_SECONDS


def _pauses(logged, evaluated, last_step, batch):
    """The seconds training paused at each evaluation before `last_step`: the time between
    the train records around it less their steps at the rate of the record after it (main.py
    measures that rate from the step after the pause). Over one log interval, not the whole
    window: a rate a few percent off over hundreds of steps would hide a pause of seconds."""
    pauses = []
    for step in (step for step in evaluated if step < last_step):
        before = [r for r in logged if r['step'] <= step]
        after = [r for r in logged if r['step'] > step]
        if before and after and after[0].get('images_per_sec'):
            pauses.append(max(0.0, after[0]['time'] - before[-1]['time'] - (
                after[0]['step'] - before[-1]['step']) * batch / after[0]['images_per_sec']))
    return pauses


def _evaluation_seconds(pauses, plan, load):
    """An evaluation's measured seconds, at most the plan's times `load` (that, before the first
    is measured): the first evaluation also builds its graph (a one-off of a few seconds), so
    the measured mean is an upper bound."""
    planned = planned_evaluation_seconds(plan) * load
    return min(sum(pauses) / len(pauses), planned) if pauses else planned


def worth_moving(end, current, step, rate) -> bool:
    """Whether a move in place of plan `current`'s end to step `end`, at `step` and `rate`
    training images/s, is worth making (MOVE_SHARE, MOVE_MIN_SECONDS)."""
    return end > step and abs(end - current.steps) >= max(
        1, MOVE_MIN_SECONDS * rate / current.global_batch, MOVE_SHARE * (current.steps - step))


class RateProbe:
    """A stop_when for runner.command (module docstring): answers True (stop and restart) when
    the first steps show a restart worth its cost. `decision` then holds {'evaluations',
    'step', 'rate', 'startup', 'evaluation', 'evaluated', 'load', 'restart', 'fit'}: 'evaluated'
    the evaluations measured ('evaluation' the table's times the load while none), 'fit' the
    evaluations that fit without a restart; and 'in_place' and 'end' (the step) once `move`
    (decision with 'end', plan -> the plan moved in place, or None where it cannot) moved the
    running run's end (`moved`: the plan it trains now). `say`, when given, prints steps_line
    as soon as it decides."""

    def __init__(self, plan, model_dir, deadline, first_step, say=None, move=None):
        self.plan, self.model_dir, self.deadline, self.say = plan, model_dir, deadline, say
        self.move = move
        self.moved = None
        self.first_step = first_step or 0
        self.from_step = self.first_step + PROBE_STEPS
        if self.first_step < plan.freeze_steps:  # The frozen steps run at another rate.
            self.from_step = max(self.from_step, plan.freeze_steps + 1)
        self.started = time.time()
        self.decision = None
        self._evaluations_seen = 0

    def _window(self, least=PROBE_RECORDS):
        """(first record, last record, the rate over the records past the freeze and
        PROBE_STEPS, the evaluations' measured pauses, the evaluated steps), or None before
        `least` such records."""
        log = training_log(self.model_dir)
        logged = [r for r in train_records(self.model_dir, self.started, log)
                  if r.get('images_per_sec')]
        if len(logged) < 2:
            return None
        first = logged[0]
        evaluated = [r['step'] for r in log if r.get('event') == 'eval'
                     and r.get('step', 0) > first['step']]
        index = [i for i, r in enumerate(logged) if i and r['step'] >= self.from_step]
        if len(index) < least:
            return None
        record = logged[index[-1]]
        # Each record's rate weighted by its steps: the one logged at an evaluation's step may
        # hold a step or two and the checkpoint written before it.
        spans = [(logged[i]['step'] - logged[i - 1]['step'], logged[i]['images_per_sec'])
                 for i in index]
        rate = sum(steps for steps, _ in spans) / sum(steps / each for steps, each in spans)
        pauses = _pauses(logged, evaluated, record['step'], self.plan.global_batch)
        return first, record, rate, pauses, evaluated

    def __call__(self, line):
        if 'images/s' not in line:
            return False
        if self.decision is not None:
            self._again()
            return False
        window = self._window()
        if window is None:
            return False
        first, record, rate, pauses, evaluated = window
        self._evaluations_seen = len(evaluated)
        batch = self.plan.global_batch
        # Start-up: the process's start to its first step, less the steps logged since.
        startup = max(1.0, first['time'] - self.started
                      - (first['step'] - self.first_step) * batch / rate)
        load = load_factor(startup, self.plan.startup_seconds)
        evaluation = _evaluation_seconds(pauses, self.plan, load)
        left = self.deadline - time.time()
        fit, evaluations = (corrected_evaluations(self.plan, left, record['step'], rate, restart,
                                                  load, evaluation)
                            for restart in (0.0, startup))
        self.decision = {'evaluations': evaluations, 'step': record['step'],
                         'rate': round(rate, 2), 'startup': round(startup, 1),
                         'evaluation': round(evaluation, 1), 'evaluated': len(pauses),
                         'load': round(load, 2), 'fit': fit,
                         'restart': worth_restarting(self.plan, evaluations, fit,
                                                     record['step'])}
        end = fitted_end(self.plan, left, record['step'], rate, load, evaluation)
        if (end > record['step'] and not worth_moving(end, self.plan, record['step'], rate)
                and not steps_asked(self.plan)):  # Fits as planned.
            self.decision.update(evaluations=self.plan.evaluations, fit=self.plan.evaluations,
                                 restart=False)
        elif self._move_to(end, record['step']):
            self._moved_to(end)
        elif self.decision['restart'] and not pauses:
            # A restart costs a start-up: not on the first records alone (a pipeline still
            # filling can slow them); a record past the first evaluation decides it.
            self.decision = None
            return False
        if self.say:  # As it is decided, not when training ends.
            self.say(steps_line(self.plan, self.decision))
        return self.decision['restart']

    def _move_to(self, end, step):
        """Moves the running main.py's end to step `end` (the plan it trains now stays
        otherwise); True when it did."""
        current = self.moved or self.plan
        if (self.move is None or steps_asked(self.plan)
                or not worth_moving(end, current, step, self.decision['rate'])):
            return False
        moved = self.move(dict(self.decision, end=end), current)
        if moved is None:
            return False
        self.moved = moved
        return True

    def _moved_to(self, end):
        evaluations = self.moved.evaluations
        self.decision.update(end=end, evaluations=evaluations, fit=evaluations, restart=False,
                             in_place=True)

    def _again(self):
        """After each evaluation past the first decision: the end that fits from all the
        records since, moved there when it differs enough (a line says so)."""
        if self.move is None or self.decision['restart']:  # Stopped for a restart.
            return
        window = self._window(least=1)
        if window is None or len(window[4]) <= self._evaluations_seen:
            return
        _, record, rate, pauses, evaluated = window
        if record['step'] <= evaluated[-1]:  # A record past the newest evaluation first.
            return
        self._evaluations_seen = len(evaluated)
        current, load = self.moved or self.plan, self.decision['load']
        evaluation = _evaluation_seconds(pauses, current, load)
        end = fitted_end(current, self.deadline - time.time(), record['step'], rate, load,
                         evaluation)
        before = dict(self.decision)
        self.decision.update(step=record['step'], rate=round(rate, 2),
                             evaluation=round(evaluation, 1), evaluated=len(pauses))
        if self._move_to(end, record['step']):
            self._moved_to(end)
            if self.say:
                self.say(steps_line(current, self.decision))
        else:
            self.decision = before


def steps_line(plan, decision) -> str:
    """The line the run prints when the measured steps change (or keep) the planned steps."""
    fit = decision.get('fit', decision['evaluations'])
    if decision.get('in_place'):
        verdict = ('%d steps instead of %d: the run ends there, its warm-up and cosine '
                   'following, without a restart' % (decision['end'], plan.steps))
    elif decision['restart']:
        verdict = ('%d steps instead of %d: training stops, writes its checkpoint and goes on '
                   'with the new number' % (decision['evaluations'] * plan.eval_interval,
                                            plan.steps))
    elif not steps_asked(plan) and ends_here(plan, decision['evaluations'], fit,
                                             decision['step']):
        verdict = ('about %d of the planned %d steps fit; a restart to fewer would end at this '
                   'step, so training goes on until the time budget stops it' % (
                       fit * plan.eval_interval, plan.steps))
    elif fit < plan.evaluations and not steps_asked(plan):
        verdict = ('about %d of the planned %d steps fit (within %d%%): the time budget stops '
                   'training' % (fit * plan.eval_interval, plan.steps, 100 * TOLERANCE))
    else:
        verdict = 'the planned %d steps fit (within %d%%)' % (plan.steps, 100 * TOLERANCE)
    evaluation = ('' if decision.get('evaluation') is None else
                  ', an evaluation %.1f s (planned %.1f%s)' % (
                      decision['evaluation'], planned_evaluation_seconds(plan),
                      '' if decision.get('evaluated', 1) else
                      '; none measured yet: the plan\'s times the start-up\'s x%.2f'
                      % decision['load']))
    return ('  measured at step %d: %.1f training images/s (planned %.1f), start-up %.0f s '
            '(planned %.0f; the end estimated x%.2f)%s: %s' % (
                decision['step'], decision['rate'], plan.images_per_second, decision['startup'],
                plan.startup_seconds, decision['load'], evaluation, verdict))

