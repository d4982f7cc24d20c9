"""The plan as the training steps' measurement (probe.RateProbe) corrects it: for a restart of
main.py with the new steps (after_probe), or, where only the end moves, in the running main.py
through its --steps_file (move_in_place; training/steps_file.py)."""
import dataclasses

import yaml

from efficientdet_hpu.core import run_end
from efficientdet_hpu.finetune import budget
from efficientdet_hpu.finetune import plan_file


def _probed(plan, decision, steps):
    why = 'corrected at step %d from the measured %.1f images/s and %.0f s start-up' % (
        decision['step'], decision['rate'], decision['startup'])
    return budget.with_steps(
        dataclasses.replace(plan, images_per_second=decision['rate']), steps, why)


def after_probe(runner, plan, decision):
    """The plan with the probe's evaluations, written (the probe said its line)."""
    if not decision['restart']:
        return plan
    corrected = _probed(plan, decision, decision['evaluations'] * plan.eval_interval)
    budget.rewrite(runner.layout.plan_yaml, runner.layout.plan_json, corrected, was=plan)
    return corrected


def move_in_place(runner, plan, decision):
    """Where the probe moves the end: the running main.py told through its --steps_file
    (training/steps_file.py: its end, warm-up, cosine, moving average's decay and evaluations
    move to the new plan's, as a restart with it would set them, without the restart), and the
    plan rewritten to what it now trains (its early-stop patience kept: main.py's flag).
    Returns that plan, or None where a restart is needed: a frozen backbone's steps the move
    would shift that are not over. decision: probe.RateProbe's, its 'end' the new last step
    (any step: main.py evaluates there)."""
    if (decision['end'] == plan.steps or budget.steps_asked(plan)
            or not plan_file.holds_steps_of(runner.layout.plan_yaml, plan)):
        return None  # Steps that --steps or --hparams set stay (the time budget stops them).
    corrected = _probed(plan, decision, decision['end'])
    if (corrected.freeze_steps != plan.freeze_steps
            and max(corrected.freeze_steps, plan.freeze_steps) > decision['step']):
        return None
    kept = dict(plan.reasons).get('early stop')
    corrected = dataclasses.replace(
        corrected, early_stop_patience=plan.early_stop_patience, reasons=tuple(
            (topic, kept if topic == 'early stop' else text)
            for topic, text in corrected.reasons))
    budget.rewrite(runner.layout.plan_yaml, runner.layout.plan_json, corrected, was=plan)
    run_end.write(runner.layout.steps_file, corrected.steps, *_as_main_py_reads(
        runner.layout.plan_yaml, corrected))
    return corrected


def as_reached(runner, plan, step, before=None):
    """The plan with the step main.py ended at, where a move in place asked for a step it had
    already passed (training/steps_file.py then ends at the step reached, and says so), or,
    given `before` (the plan main.py trained before the move), where the move came once
    main.py had ended at before's end: plan.json and plan.yaml rewritten to it, so that they
    say what was trained and a rerun of plan.yaml ends there too. Returns the plan, unchanged
    where `step` is neither."""
    if step is None or step == plan.steps:
        return plan
    if step < plan.steps:
        if before is None or step != before.steps:
            return plan
        text = '; main.py ended at step %d before the move to %d reached it' % (step, plan.steps)
        reached = dataclasses.replace(before, reasons=tuple(
            (topic, value + text if topic == 'steps' else value)
            for topic, value in before.reasons))
        budget.rewrite(runner.layout.plan_yaml, runner.layout.plan_json, reached, was=plan)
        return reached
    reasons = tuple((topic, text if topic != 'steps' else
                     '%s; main.py ended at step %d, the move to %d having reached it after that '
                     'step' % (text, step, plan.steps)) for topic, text in plan.reasons)
    reached = dataclasses.replace(plan, steps=step, reasons=reasons, seconds=budget.seconds_with(
        plan, training=budget.training_seconds(plan, step)))
    budget.rewrite(runner.layout.plan_yaml, runner.layout.plan_json, reached, was=plan)
    return reached


def _as_main_py_reads(plan_yaml, plan):
    """(warm-up steps, moving_average_decay) as main.py computes them from the rewritten
    recipe: a value --hparams set stayed there, and stays in the running main.py."""
    with open(plan_yaml, encoding='utf-8') as stream:
        recipe = yaml.safe_load(stream)
    epochs, decay = recipe.get('lr_warmup_epoch'), recipe.get('moving_average_decay')
    return (None if epochs is None else int(float(epochs) * plan.eval_interval),
            None if decay is None else float(decay))
