"""The budget used: the plan's steps corrected from what the run measures as it goes, so that
the command ends within about 10% of --max_minutes (or earlier by early stop).

  before training  the time left after the data, doctor and converter stages, measured, sets
                   the number of evaluations (the interval stays: the steps are whole
                   evaluations until a move in place ends them at any step); their time
                   against the estimate scales the estimates of the start-up, evaluations and
                   export, and divides the cost table's training rate: on the suite's sets a
                   machine whose stages ran 1.2-1.7 times their estimate trained at 0.58-0.85
                   of the table's rate, so the first steps confirm the steps more often than
                   they cut them (a rate measured in model_dir, e.g. by the search, is taken
                   as it is)
  while training   main.py's own log corrects the steps as it trains, moving its end in
                   place (finetune/probe.py). A restart costs a start-up, but a time-budget
                   stop costs more: it cuts the cosine before its rate reaches zero, where
                   these runs gain the most, and the steps after the last evaluation are never
                   scored. The start-up's ratio to the table's scales the estimate of the
                   whole-photo evaluation with the export (a busier or slower machine slows
                   them alike), and so moves the time-budget stop (training_stop)
The arithmetic is pure (`corrected_evaluations`); probe.RateProbe reads main.py's
train_log.jsonl.
"""
import dataclasses
import math
import os
import statistics
import time

from efficientdet_hpu.core import json_log

TOLERANCE = 0.05  # A change of steps under this share of the plan is not worth a restart.
# The run's rate off the one its steps were set from by more than this: the closing line says so.
TOLERANCE_RATE = 0.1
LOAD_RANGE = (0.5, 3.0)  # The start-up ratio applied to the other stages, clamped.
FIT_SHARE = 0.5  # The share of an evaluation interval that must fit for it to be planned.
# The share of the time left that an end fitted at any step (fitted_end) leaves spare, and at
# least these seconds: the time-budget stop, at the same estimates, would otherwise come first
# in about half the runs, and late in a run, during its last evaluation.
END_MARGIN = 0.03
END_MARGIN_SECONDS = 10.0
# main.py's tail after its last evaluation (its final weights, its summary, TensorFlow's
# teardown: 3.5 s at a load of 1.12 on the 2-core EPYC), in no stage's estimate; times the load.
EXIT_SECONDS = 4.0


def load_factor(measured_startup, planned_startup) -> float:
    """How much slower (> 1) or faster this machine runs now than the cost table says."""
    if not measured_startup or not planned_startup:
        return 1.0
    return min(LOAD_RANGE[1], max(LOAD_RANGE[0], measured_startup / planned_startup))


def planned_evaluation_seconds(plan) -> float:
    """One evaluation's seconds as the plan estimates them."""
    return dict(plan.seconds)['evaluations'] / max(1, plan.evaluations)


def corrected_evaluations(plan, seconds_left, step, rate, restart_seconds, load=1.0,
                          per_evaluation=None) -> int:
    """The evaluations (of plan.eval_interval steps each) that fit `seconds_left` from `step`
    on at `rate` training images/s, after a restart of `restart_seconds` (0: none), the
    remaining evaluations (`per_evaluation` seconds each when measured) and the whole-photo
    evaluation with the export (the plan's estimates times `load`); at least one more than
    those done. An interval counts when FIT_SHARE, half, of it fits: the time-budget stop then
    ends it early, cutting the cosine where its rate is near zero, where leaving it out would
    leave up to a whole interval of the budget unused (a move in place, later and better
    measured, ends at any step: fitted_end)."""
    parts = dict(plan.seconds)
    final = parts['whole photos + export'] * load
    if per_evaluation is None:
        per_evaluation = planned_evaluation_seconds(plan) * load
    per_interval = plan.eval_interval * plan.global_batch / rate + per_evaluation
    spare = seconds_left - final - restart_seconds
    # The interval in progress finishes first (its evaluation too).
    done = step // plan.eval_interval
    left_in_interval = (plan.eval_interval - step % plan.eval_interval) % plan.eval_interval
    spare -= left_in_interval * plan.global_batch / rate + (per_evaluation if left_in_interval
                                                            else 0.0)
    more = int(math.floor(spare / per_interval + 1.0 - FIT_SHARE)) if spare > 0 else 0
    return max(done + (1 if left_in_interval else 0) + more, done + 1, 1)


def fitted_end(plan, seconds_left, step, rate, load=1.0, per_evaluation=None,
               margin=END_MARGIN) -> int:
    """The last step that fits `seconds_left` from `step` on at `rate` training images/s, an
    evaluation at each interval's end on the way and one at the end (`per_evaluation` seconds
    each when measured), main.py's exit, then the whole-photo evaluation with the export (the
    estimates times `load`), `margin` of the time left spare (at least END_MARGIN_SECONDS); at
    least `step` + 1. A run moved in place ends there (finetune/probe.py): main.py evaluates at
    any end."""
    if per_evaluation is None:
        per_evaluation = planned_evaluation_seconds(plan) * load
    per_step = plan.global_batch / rate
    spare = seconds_left - (dict(plan.seconds)['whole photos + export'] + EXIT_SECONDS) * load
    spare -= max(margin * spare, END_MARGIN_SECONDS)
    interval, end = plan.eval_interval, step + 1
    boundary = (step // interval + 1) * interval  # The first interval's end past `step`.
    crossed = 0  # The intervals' ends before the end, each an evaluation.
    while True:
        reach = step + int((spare - per_evaluation * (crossed + 1)) / per_step)
        if reach <= boundary:
            return max(end, reach)
        end, boundary, crossed = boundary, boundary + interval, crossed + 1


def steps_asked(plan) -> bool:
    """True when --steps set the steps: they stay (the time budget still stops training)."""
    from efficientdet_hpu.finetune import plan_reasons  # pylint: disable=import-outside-toplevel
    return dict(plan.reasons).get('steps', '').endswith(plan_reasons.ASKED_STEPS)


def worth_changing(plan, evaluations) -> bool:
    return (not steps_asked(plan) and evaluations != plan.evaluations
            and abs(evaluations - plan.evaluations) * plan.eval_interval
            > TOLERANCE * plan.steps)


def training_log(model_dir):
    """main.py's records in model_dir/train_log.jsonl (core/json_log.py), those with an event."""
    return [record for record in json_log.read(model_dir)
            if isinstance(record, dict) and 'event' in record]


def train_records(model_dir, since=0.0, log=None):
    """main.py's 'train' records in model_dir's log written after `since` (time.time())."""
    return [r for r in (training_log(model_dir) if log is None else log)
            if r.get('event') == 'train' and r.get('time', 0) >= since]


def training_stop(deadline, final_seconds, probe=None, floor=60.0, load=1.0):
    """run_streaming's stop_after for training: a function answering the seconds from now to
    the time-budget stop, which leaves the whole-photo evaluation with the export
    (`final_seconds`) before the deadline, times the load: the one `probe` measured once it
    has, before that `load` (the stages before training's, stages_load), so that a busier
    machine stops training sooner; at least `floor`."""
    started = time.time()

    def seconds():
        measured = probe.decision['load'] if probe is not None and probe.decision else load
        return max(floor, deadline - started - final_seconds * measured)
    return seconds


def worth_restarting(plan, evaluations, fit, step=0) -> bool:
    """Whether stopping main.py at `step` to train `evaluations` evaluations (what fits after a
    restart) beats going on with the plan's, of which `fit` fit the time left without one: more
    steps when they add more than TOLERANCE of the plan's; fewer when the plan overruns and the
    cut is more than TOLERANCE of its steps (a time-budget stop would cost the end of the cosine
    and the steps after the last evaluation: module docstring). Never when the restart would
    end at `step` or before while going on reaches another evaluation (ends_here)."""
    if ends_here(plan, evaluations, fit, step):
        return False
    return ((evaluations > plan.evaluations or fit < plan.evaluations)
            and worth_changing(plan, evaluations))


def ends_here(plan, evaluations, fit, step) -> bool:
    """Whether a restart to `evaluations` evaluations would train nothing past `step`, the
    step reached, while going on trains to another evaluation (`fit`) before the time-budget
    stop: a one-off slow pause can put a run there, and stopping would leave the time its
    restart was to take unused."""
    return evaluations * plan.eval_interval <= step < fit * plan.eval_interval


def with_evaluations(plan, evaluations, why):
    """with_steps at `evaluations` whole intervals."""
    return with_steps(plan, evaluations * plan.eval_interval, why)


def with_steps(plan, steps, why, interval=None):
    """The plan with `steps` (an evaluation at each interval's end and at the last step; every
    `interval` steps, default the plan's); its time, its warm-up (and freeze) and early-stop
    patience set for the new steps as the plan sets them, and their lines updated (the EMA's
    says what the average spans at the new last step). A run under way takes them on at its
    restart or its move in place: a warm-up planned for more steps would hold the shortened
    run's rate low."""
    from efficientdet_hpu.finetune import plan_reasons  # pylint: disable=import-outside-toplevel
    from efficientdet_hpu.finetune import schedule  # pylint: disable=import-outside-toplevel
    interval = interval or plan.eval_interval
    evaluations = -(-steps // interval)
    warmup, patience = schedule.horizon(
        steps, evaluations, plan.train_images, plan.global_batch,
        schedule.learning_rate(plan.weights.kind)[1])
    freeze = warmup if plan.freeze_steps else 0
    lines = {'steps': '%d steps of %d images: %s' % (steps, plan.global_batch, why),
             'EMA': plan_reasons.ema_reason(steps, plan.ema_decay),
             'evaluation': plan_reasons.evaluation_reason(evaluations, interval,
                                                          plan.val_images),
             'freezing': plan_reasons.freezing_reason(freeze),
             'early stop': plan_reasons.early_stop_reason(patience)}
    reasons = tuple((topic, lines.get(topic, text)) for topic, text in plan.reasons)
    return dataclasses.replace(
        plan, steps=steps, eval_interval=interval, reasons=reasons, warmup_steps=warmup,
        freeze_steps=freeze, early_stop_patience=patience, seconds=seconds_with(
            plan, training=training_seconds(plan, steps),
            evaluations=planned_evaluation_seconds(plan) * evaluations))


def training_seconds(plan, steps):
    """The seconds `steps` of the plan's batch take at its planned rate."""
    return steps * plan.global_batch / plan.images_per_second


def seconds_with(plan, **parts):
    """plan.seconds, its parts in their order, with those named replaced."""
    return tuple((name, parts.get(name, seconds)) for name, seconds in plan.seconds)


def measured_rate(model_dir, log=None):
    """The median training images/s of model_dir's log records (`log`: its training_log, read
    already) past the first, which can hold a start's slower steps; or None."""
    rates = [r['images_per_sec'] for r in train_records(model_dir, log=log)
             if r.get('images_per_sec')]
    return statistics.median(rates[1:] or rates) if rates else None


def rewrite(plan_yaml, plan_json, plan, notes=(), was=None):
    """The recipe at `plan_yaml`: num_epochs (and, from `was`, the plan before, the keys that
    follow the steps); `plan_json` from `plan`. The run's (the Layout's) or a candidate's."""
    from efficientdet_hpu.core import atomic_file  # pylint: disable=import-outside-toplevel
    from efficientdet_hpu.finetune import plan_file  # pylint: disable=import-outside-toplevel
    plan_file.set_num_epochs(plan_yaml, plan_file.num_epochs(plan), notes,
                             plan_file.length_keys(was, plan) if was else None)
    atomic_file.write_json_atomically(plan_json, dataclasses.asdict(plan))


def stages_load(plan, spent) -> float:
    """The stages before training's measured time (`spent` seconds) over their estimate
    (load_factor), 1.0 on a rerun (their results reused: no measurement)."""
    planned = dict(plan.seconds)['data']
    return load_factor(spent, planned) if spent > 0.5 * planned else 1.0


def training_load(load) -> float:
    """The stages' ratio as the training's rate takes it: a slower start (> 1) slows the
    training too (a busy machine); a faster one (< 1) is not read as faster training, the
    stages and the training not speeding up alike across machines (docs/finetune.md)."""
    return max(1.0, load)


def before_training(runner, plan, deadline, step, spent):
    """The plan's evaluations set to what fits the time left now: the stages before measured
    (their time against the estimate also scales the start-up, the rate and the end, a busy
    machine slowing them alike; not on a rerun, whose stages were reused), the rate the one
    measured in model_dir when there is one (e.g. a search's winner), else the table's over
    that ratio; plan.yaml and plan.json rewritten when that changes them. `spent`: the seconds
    the stages before training took. Returns the plan."""
    from efficientdet_hpu.finetune import plan_file  # pylint: disable=import-outside-toplevel
    layout = runner.layout
    if deadline is None or os.path.exists(layout.training_json) or steps_asked(plan):
        return plan
    if not plan_file.holds_steps_of(layout.plan_yaml, plan):
        runner.say('  steps as --hparams set them: not corrected to the time left')
        return plan
    load = stages_load(plan, spent)
    measured = measured_rate(layout.model_dir)
    rate = measured or plan.images_per_second / training_load(load)
    left = deadline - time.time()
    evaluations = corrected_evaluations(plan, left, step or 0, rate, plan.startup_seconds * load,
                                        load)
    if evaluations == plan.evaluations:
        return plan
    scaled = abs(load - 1.0) >= 0.05
    rate_why = '' if measured else (
        ', the training rate as the table\'s %.1f over %.1f' % (plan.images_per_second, load)
        if load > 1 else ', the training rate the table\'s (faster stages are not read as '
        'faster training)')
    why = ('%.1f min left after the stages before training, at %.1f images/s%s' % (
        left / 60.0, rate, ' (measured)' if measured else '') + (
            '; they took %.1f min, %.1f times the estimate: the start-up, evaluations and '
            'export estimated as %s%s' % (spent / 60.0, load, 'slow' if load > 1 else 'fast',
                                          rate_why) if scaled else ''))
    corrected = with_evaluations(dataclasses.replace(plan, images_per_second=rate), evaluations,
                                 why)
    runner.say('  %d steps instead of %d: %s' % (corrected.steps, plan.steps, why))
    rewrite(layout.plan_yaml, layout.plan_json, corrected, was=plan)
    return corrected


def before_search(candidate, seconds_left, load, search_seconds):
    """A search candidate's plan with the evaluations that fit `seconds_left` once
    `search_seconds` (the estimate of the search's other runs and the continuation's start-up;
    0 for the last candidate, fitted as it starts) are spent, its evaluations spread over them
    anew (rescheduled), at the table's rate over the stages' ratio `load` where it is over 1
    (training_load; as before_training sets the winner's). Returns (plan, why) or (candidate,
    None) where that is within TOLERANCE. The winner then goes on under the warm-up its rung
    trained under: a random start begun under a longer run's warm-up, its steps cut after the
    search, stayed far behind (docs/dev/history.md)."""
    rate = candidate.images_per_second / training_load(load)
    evaluations = corrected_evaluations(candidate,
                                        seconds_left - search_seconds * training_load(load), 0,
                                        rate, candidate.startup_seconds * load, load)
    if not worth_changing(candidate, evaluations):
        return candidate, None
    when = ('before the search to the %.1f min left, less the search\'s %.1f' % (
        seconds_left / 60.0, search_seconds * training_load(load) / 60.0)
            if search_seconds else
            'as it starts to the %.1f min left, the search\'s other runs done' % (
                seconds_left / 60.0))
    why = 'fitted %s, at %.1f images/s (the table\'s %.1f%s)' % (
        when, rate, candidate.images_per_second, ' over the stages\' ratio %.2f' % load
        if load > 1 else '; the stages\' ratio %.2f is not read as faster training' % load)
    return rescheduled(dataclasses.replace(candidate, images_per_second=rate),
                       evaluations * candidate.eval_interval, why), why


def rescheduled(plan, steps, why):
    """with_steps for a run not yet started: the evaluations spread over `steps` as the plan
    spreads them (schedule.schedule_numbers), so that a search's rung, its first evaluation,
    stays the same share of each candidate's run when the stages' measured time cuts it."""
    from efficientdet_hpu.finetune import schedule  # pylint: disable=import-outside-toplevel
    steps, interval = schedule.schedule_numbers(steps, plan.train_images, plan.global_batch)[:2]
    return with_steps(plan, steps, why, interval)


def used_line(minutes, max_minutes, ended, rates=None) -> str:
    """The closing line: how much of the budget the run used, and why less or more when it did.
    `rates`: {'planned', 'measured'} training images/s: the rate the steps were last set from,
    and the run's median."""
    share = minutes / max_minutes
    line = '  budget: %.1f of %g min used (%.0f%%)' % (minutes, max_minutes, 100 * share)
    planned, measured = (rates or {}).get('planned'), (rates or {}).get('measured')
    if ended == 'early stop' and share < 0.9:
        line += '; training ended early: the AP stopped rising (early stop)'
    elif share > 1.1 or share < 0.9:
        changed = planned and measured and abs(measured / planned - 1.0) > TOLERANCE_RATE
        if changed:
            line += ('; outside 10%%: training ran at %.1f images/s, %s than the %.1f its '
                     'steps were set from (%s)' % (
                         measured, 'faster' if measured > planned else 'slower', planned,
                         'a rate still rising when measured, or a machine quieter since'
                         if measured > planned else 'a machine busier since'))
        else:
            line += ('; outside 10%%: the stages took %s than the estimates and the first '
                     'steps said' % ('longer' if share > 1 else 'less time'))
    return line
