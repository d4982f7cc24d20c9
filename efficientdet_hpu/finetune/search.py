"""Choosing by measuring where the plan's rules cannot decide (finetune/sizing.py): a few
candidate plans, each main.py run by the runner as the training is (same deadlines, SIGTERM to
stop, a checkpoint at the stop), scored on the validation images, the weaker half stopped at
each rung (successive halving, as Hyperband's inner loop and Optuna's SuccessiveHalvingPruner),
the best one continued from its own model_dir.

A rung is a candidate's k-th evaluation: each candidate's steps fit the same budget, so the
k-th evaluation comes at the same share of each one's planned run (a tenth for the first); the
fit before the search (_fitted) cuts whole evaluations, so a candidate cut more has its rung
later in what it will run. Scores are the AP50 of that evaluation (tiles when tiled). AP50s
equal to the decimals printed, or all under SCORE_FLOOR, are a tie, which the training loss at
the rung breaks (the detection loss, L2 left out: the median of the train records in the second
half of the steps to the rung) where one candidate's is LOSS_MARGIN under the plan's own's; else
a tie goes to the plan's own choice, the first candidate.

Candidates differ in input size or, beside an ImageNet backbone, start from random weights
(plan.candidate_name: '192px', '192px-random').

With one rung (two or three candidates, as the plan makes them) the last candidate is trained
as the run's training itself (Last, stages.training_stage), in output_dir/model: at its rung it
is ranked with the others, and when it wins it goes on in the same process, saving a resumed
run's start-up (its steps were fitted without one); when it loses it stops there and the
winner resumes.

Files: candidates/<name>/{plan.yaml, plan.json, model/} (written with the plan), search.json
(what was tried, each one's score, the winner and why) once the search is over; the winner's
model/ then becomes output_dir/model and its plan the plan. While candidates/ exists without
search.json the search is undecided (rerun.search_undecided): a rerun searches again.
"""
import dataclasses
import json
import os
import shutil
import statistics
import time

from efficientdet_hpu.core import atomic_file
from efficientdet_hpu.finetune import budget
from efficientdet_hpu.finetune import plan as plan_lib
from efficientdet_hpu.finetune import plan_file
from efficientdet_hpu.finetune import rerun

GRACE_SECONDS = 900
MIN_RUN_SECONDS = 180  # A candidate's run under the budget: main.py's start-up and its rung.


# Scores equal to the decimals the run prints are a tie (AP50 0.0004 against 0.0001 is noise),
# and so are all under SCORE_FLOOR: a detector that early has not begun to rank its boxes (on
# classes-20 the two starts' rung AP50s, all under it, came out either way; docs/dev/history.md).
SCORE_DECIMALS = 3
SCORE_FLOOR = 0.01
# A tie's training losses closer than this share are a tie too: a median of five single-batch
# losses varies by about 1.5% (docs/dev/history.md).
LOSS_MARGIN = 0.025
# A candidate logs ten times to its rung, so the loss that breaks a tie is a median of five.
RUNG_LOG_RECORDS = 10


def _rounded(value):
    return 0.0 if 0.0 <= value < SCORE_FLOOR else round(value, SCORE_DECIMALS)


def loss_first(tied, losses):
    """`tied` (names, the plan's order) with the one whose loss (losses {name: float or None})
    is lowest first where it is LOSS_MARGIN under the first's; else as they are."""
    first = losses.get(tied[0])
    known = [name for name in tied if losses.get(name) is not None]
    if first is None or not known:
        return list(tied)
    lowest = min(known, key=lambda name: losses[name])
    if losses[lowest] >= (1.0 - LOSS_MARGIN) * first:
        return list(tied)
    return [lowest] + [name for name in tied if name != lowest]


def successive_halving(names, score, rungs, loss=lambda name, rung: None):
    """Runs the rungs: every name alive is scored (score(name, rung) -> float), the better half
    (at least one) goes on; ties (to SCORE_DECIMALS, or all under SCORE_FLOOR) in `names`'
    order but for the one
    loss_first puts first (loss(name, rung): its training loss at the rung, or None). Returns
    (winner, [(rung, name, score)])."""
    alive, history = list(names), []
    for rung in range(rungs):
        scored = [(score(name, rung), name) for name in alive]
        history += [(rung, name, value) for value, name in scored]
        ranked = []
        for value in sorted({_rounded(value) for value, _ in scored}, reverse=True):
            tied = [name for found, name in scored if _rounded(found) == value]
            ranked += loss_first(tied, {name: loss(name, rung) for name in tied})
        alive = ranked[:max(1, len(alive) // 2)]
        if len(alive) == 1:
            break
    return alive[0], history


def rungs_for(count) -> int:
    """Rungs that take `count` candidates down to one, keeping half (rounded down) at each:
    2-3 -> 1, 4-7 -> 2."""
    rungs = 0
    while count > 1:
        count, rungs = count // 2, rungs + 1
    return rungs


def candidate_dir(layout, name):
    return layout.path('candidates', name)


def write_candidates(layout, named, recipe_of):
    """Writes each candidate's plan.yaml and plan.json ([(name, plan)]; recipe_of(plan) ->
    YAML text)."""
    for name, plan in named:
        directory = candidate_dir(layout, name)
        os.makedirs(directory, exist_ok=True)
        atomic_file.write_text_atomically(os.path.join(directory, 'plan.yaml'), recipe_of(plan))
        atomic_file.write_json_atomically(os.path.join(directory, 'plan.json'),
                                          dataclasses.asdict(plan))


def evaluation_score(model_dir, step):
    """AP50 (and AP) of model_dir's evaluation at `step`, or None when there is none."""
    try:
        with open(os.path.join(model_dir, 'eval', 'metrics-%d.json' % step)) as stream:
            metrics = json.load(stream)['metrics']
    except (OSError, ValueError, KeyError):
        return None
    return metrics.get('AP50'), metrics.get('AP')


def rung_loss(model_dir, step):
    """The detection loss (the loss less its L2 term) of model_dir's training to `step`: the
    median of main.py's train records in the second half of the steps, or None."""
    losses = [r['loss'] - r.get('l2_loss', 0.0) for r in budget.train_records(model_dir)
              if step / 2.0 < r.get('step', 0) <= step and r.get('loss') is not None]
    return statistics.median(losses) if losses else None


class _Candidates:
    """Runs candidates to their rungs; remembers each one's score, step and minutes."""

    def __init__(self, runner, named, deadline, in_place=None):
        self.runner, self.deadline, self.in_place = runner, deadline, in_place
        self.plans = dict(named)
        self.results = {}

    def model_dir(self, name):
        """candidates/<name>/model; the run's model/ for the one trained in place (Last)."""
        if name == self.in_place:
            return self.runner.layout.model_dir
        return os.path.join(candidate_dir(self.runner.layout, name), 'model')

    def rung_step(self, name, rung=0):
        plan = self.plans[name]
        return min(plan.steps, (rung + 1) * plan.eval_interval)

    def args(self, name):
        """main.py's flags for the candidate: its recipe, its model_dir, and a log record every
        tenth of its evaluation interval (the rung's training loss)."""
        return ['--hparams=' + os.path.join(candidate_dir(self.runner.layout, name), 'plan.yaml'),
                '--model_dir=' + self.model_dir(name), '--log_every_n_steps=%d' % max(
                    1, self.plans[name].eval_interval // RUNG_LOG_RECORDS)]

    def announce(self, name, rung=0, more=''):
        self.runner.say('  %s: training to step %d (its evaluation %d of %d)%s' % (
            name, self.rung_step(name, rung), rung + 1, self.plans[name].evaluations, more))

    def score(self, name, rung):
        step, model_dir = self.rung_step(name, rung), self.model_dir(name)
        final = dict(self.plans[name].seconds)['whole photos + export']
        stop_after = (None if self.deadline is None else
                      max(MIN_RUN_SECONDS, self.deadline - time.time() - final))
        started = time.monotonic()
        self.announce(name, rung)
        self.runner.command(
            'search-' + name, 'train', self.args(name), (stop_after or 3 * 3600.0) + GRACE_SECONDS,
            stop_after=stop_after,
            stop_when=lambda line: evaluation_score(model_dir, step) is not None)
        return self.record(name, step, (time.monotonic() - started) / 60.0)

    def record(self, name, step, minutes):
        """Keeps and says the candidate's score at `step` (its AP50, -1 without an evaluation)
        after `minutes` of training to it; returns the AP50."""
        plan, model_dir = self.plans[name], self.model_dir(name)
        found = evaluation_score(model_dir, step)
        ap50 = found[0] if found and found[0] is not None else -1.0
        self.results[name] = {'name': name, 'image_size': plan.image_size,
                              'weights': plan.weights.kind or 'random', 'step': step,
                              'of_steps': plan.steps, 'AP50': ap50,
                              'AP': found[1] if found else None,
                              'loss': rung_loss(model_dir, step),
                              'minutes': round(self.results.get(name, {}).get('minutes', 0)
                                               + minutes, 2)}
        self.runner.say('  %s: AP50 %.3f at step %d (%.0f%% of its %d steps), %.1f min%s' % (
            name, ap50, step, 100.0 * step / plan.steps, plan.steps, minutes, _loss_text(
                self.results[name]['loss'], ', training loss ')))
        return ap50

    def loss(self, name, rung):
        del rung  # The result kept is the rung's just scored.
        return self.results[name]['loss']


def _loss_text(loss, prefix=''):
    return '' if loss is None else '%s%.3f' % (prefix, loss)


def result_line(results, winner) -> str:
    """'tried 192px (AP50 0.312 at step 80 of 800) and 256px (...); 192px won: ...'."""
    tried = ' and '.join('%s (%s at step %d of %d, %.1f min)' % (
        r['name'], 'AP50 %.3f' % r['AP50'] if r['AP50'] >= 0 else
        'no evaluation: stopped by the budget before it', r['step'], r['of_steps'],
        r['minutes']) for r in results)
    best = next(r for r in results if r['name'] == winner)
    tied = [r for r in results if _rounded(r['AP50']) == _rounded(best['AP50'])]
    first = 'the plan\'s own' if tied[0] is results[0] else 'the first in the plan\'s order'
    losses = ' against '.join('%s (%s)' % (_loss_text(r.get('loss')), r['name'])
                              for r in [best] + [r for r in tied if r is not best])
    tie = 'a tie' + (' (AP50s under %g: no ranking yet)' % SCORE_FLOOR
                     if len(tied) > 1 and 0.0 <= best['AP50'] < SCORE_FLOOR else '')
    if len(tied) == 1:
        why = 'the higher AP50 at the same evaluation of its run'
    elif tied[0] is not best:
        why = ('%s in AP50, broken by the training loss up to that evaluation: %s; %g%% '
               'lower or more goes on before %s' % (tie, losses, 100 * LOSS_MARGIN, first))
    elif any(r.get('loss') is None for r in tied):
        why = '%s, which goes to %s' % (tie, first)
    else:
        why = ('%s, which goes to %s: training losses up to that evaluation %s, none %g%% '
               'lower' % (tie, first, losses, 100 * LOSS_MARGIN))
    return 'tried %s; %s goes on: %s' % (tried, winner, why)


def skipped_line(plan, left, load):
    """The `not searched: ...` line where the search no longer fits the run (None where it
    does): its cost, scaled by the stages' ratio `load` (over 1 only), over
    SEARCH_RUN_MAX_SHARE of the training in the `left` seconds (None: no deadline) once the
    end and a start-up are kept."""
    if left is None:
        return None
    parts = dict(plan.seconds)
    cost = parts.get('search', 0.0) * budget.training_load(load)
    training_left = left - (parts['whole photos + export'] + parts['start-up']) * load
    share = plan_lib.SEARCH_RUN_MAX_SHARE
    if cost <= share * training_left:
        return None
    return ('not searched: %.1f min left, and the stages before took %.1f times their estimate: '
            'the search would cost about %.1f min, over %.1f%% of the training left (the plan\'s '
            '%d%%, with room for stages %.1f times their estimate); %s, the plan\'s own, goes on'
            % (left / 60.0, load, cost / 60.0, 100 * share, 100 * plan_lib.SEARCH_MAX_SHARE,
               share / plan_lib.SEARCH_MAX_SHARE, plan.candidates[0]))


def _fitted(runner, named, left, load, last=False):
    """The candidates' steps fitted to the time `left` (budget.before_search): before the
    search, less its cost; `last`, the last candidate's as it starts, the others' runs done
    (it goes on without a restart when it wins). Their plan.yaml and plan.json rewritten; a
    value --hparams set stays."""
    fitted = []
    for name, candidate in named:
        directory = candidate_dir(runner.layout, name)
        recipe = os.path.join(directory, 'plan.yaml')
        now, why = budget.before_search(candidate, left, load, 0.0 if last else dict(
            candidate.seconds).get('search', 0.0))
        if why and plan_file.holds_steps_of(recipe, candidate):
            runner.say('  %s: %d steps instead of %d: %s' % (name, now.steps, candidate.steps,
                                                             why))
            budget.rewrite(recipe, os.path.join(directory, 'plan.json'), now, was=candidate)
            candidate = now
        fitted.append((name, candidate))
    return fitted


def search_stage(runner, plan, deadline, from_record, spent):
    """Runs the search when the plan has candidates and none has run. Returns (plan, last): the
    plan to train, with plan.yaml, plan.json and model/ the winner's, and None; or, with one
    rung, the last candidate's plan and a Last, which stages.training_stage trains as the
    run's training until its rung decides. from_record: plan.json's dict -> Plan; spent: the
    seconds the stages before took."""
    layout = runner.layout
    record_path = layout.path('search.json')
    if not plan.candidates or os.path.exists(record_path):
        shutil.rmtree(layout.path('candidates'), ignore_errors=True)
        return plan, None
    left = None if deadline is None else deadline - time.time()
    load = budget.stages_load(plan, spent)
    line = skipped_line(plan, left, load)
    if line:
        runner.say('  ' + line)
        kept = dataclasses.replace(plan, reasons=tuple(
            (topic, line if topic == 'search' else text) for topic, text in plan.reasons))
        atomic_file.write_json_atomically(layout.plan_json, dataclasses.asdict(kept))
        atomic_file.write_json_atomically(record_path, {'tried': [], 'winner':
                                                        plan.candidates[0], 'line': line})
        shutil.rmtree(layout.path('candidates'), ignore_errors=True)
        return kept, None
    named = []
    for name in plan.candidates:
        with open(os.path.join(candidate_dir(layout, name), 'plan.json')) as stream:
            named.append((name, from_record(json.load(stream))))
    rungs = rungs_for(len(named))
    last = named[-1][0] if rungs == 1 else None
    if left is not None:
        now = named[:-1] if last else named  # The last is fitted as it starts.
        named = _fitted(runner, now, left, load) + named[len(now):]
    runner.say('  search: %s, each trained to its evaluation and compared by AP50; the better '
               'half goes on at each rung' % ' and '.join(plan.candidates))
    candidates = _Candidates(runner, named, deadline, in_place=last)
    for name in candidates.plans:  # A search cut short earlier starts again.
        shutil.rmtree(candidates.model_dir(name), ignore_errors=True)
    if last is None:
        winner, _ = successive_halving(list(candidates.plans), candidates.score, rungs,
                                       candidates.loss)
        return _decided(runner, plan, candidates, winner), None
    for name, _ in named[:-1]:
        candidates.score(name, 0)
    if deadline is not None:
        candidates.plans.update(_fitted(runner, named[-1:], deadline - time.time(), load, True))
    return candidates.plans[last], Last(runner, plan, candidates, deadline, spent)


def _decided(runner, plan, candidates, winner):
    """The search's end: the result line said; the winner's model/ (moved unless trained in
    place), plan.yaml with the line, plan.json and search.json written; the candidates' files
    removed but the one still training in place's plan.yaml. Returns the winner's plan."""
    layout = runner.layout
    results = [candidates.results[name] for name in candidates.plans]
    line = result_line(results, winner)
    runner.say('  ' + line)
    chosen = candidates.plans[winner]
    chosen = dataclasses.replace(chosen, candidates=plan.candidates, reasons=tuple(
        (topic, line if topic == 'search' else text) for topic, text in chosen.reasons))
    source = candidate_dir(layout, winner)
    if winner != candidates.in_place:
        shutil.rmtree(layout.model_dir, ignore_errors=True)
        os.rename(candidates.model_dir(winner), layout.model_dir)
    shutil.copyfile(os.path.join(source, 'plan.yaml'), layout.plan_yaml)
    plan_file.set_num_epochs(layout.plan_yaml, plan_file.num_epochs(chosen), [line])
    atomic_file.write_json_atomically(layout.plan_json, dataclasses.asdict(chosen))
    atomic_file.write_json_atomically(layout.path('search.json'), {
        'tried': results, 'winner': winner, 'line': line})
    if winner == candidates.in_place:  # Its recipe is main.py's until that run ends.
        for name in candidates.plans:
            if name != winner:
                shutil.rmtree(candidate_dir(layout, name), ignore_errors=True)
    else:
        shutil.rmtree(layout.path('candidates'), ignore_errors=True)
    return chosen


class Last:
    """The search's last candidate (one rung) trained as the run's training (stages.
    training_stage): main.py with its recipe in model/ from its first step. At its rung it is
    ranked with the others, scored before it; the winner goes on in the same process, which
    saves the start-up of a resumed run. A loser is stopped there (the stop_when answers True)
    and install() puts the winner's model/ and plan in place, which then resume as after any
    search."""

    def __init__(self, runner, plan, candidates, deadline, spent):
        self.runner, self.plan, self.candidates = runner, plan, candidates
        self.deadline, self.spent = deadline, spent
        self.name = candidates.in_place
        self.step = candidates.rung_step(self.name)
        self.started = None
        self.winner = self.chosen = None

    def args(self):
        """main.py's flags; says what it trains to."""
        self.candidates.announce(self.name, more=', as the training itself: the winner goes '
                                 'on from there without a restart')
        self.started = time.monotonic()
        return self.candidates.args(self.name)

    def stop_when(self, then=None):
        """runner.command's stop_when: until the rung's evaluation is written, watches for it
        and decides there (True: this candidate lost, stop); after a win, `then` (the training's
        RateProbe)."""
        def on_line(line):
            if self.winner is not None:
                return bool(then and then(line))
            if evaluation_score(self.candidates.model_dir(self.name), self.step) is None:
                return False
            return self.decide() != self.name
        return on_line

    def decide(self):
        """Scores this candidate at its rung (-1: none reached) and ranks all; the winner's
        files are written when it is this one. Returns the winner."""
        if self.winner is None:
            self.candidates.record(self.name, self.step,
                                   (time.monotonic() - (self.started or time.monotonic())) / 60.0)
            results = self.candidates.results
            self.winner, _ = successive_halving(
                list(self.candidates.plans), lambda name, rung: results[name]['AP50'], 1,
                self.candidates.loss)
            if self.winner == self.name:
                self.chosen = _decided(self.runner, self.plan, self.candidates, self.winner)
        return self.winner

    def lost(self) -> bool:
        return self.decide() != self.name

    def install(self):
        """After a loss: the winner's model/ and plan in place, its steps fitted to the time
        left at its measured rate (budget.before_training). Returns its plan."""
        chosen = _decided(self.runner, self.plan, self.candidates, self.winner)
        return budget.before_training(self.runner, chosen, self.deadline,
                                      rerun.latest_step(self.runner.layout.model_dir),
                                      self.spent)
