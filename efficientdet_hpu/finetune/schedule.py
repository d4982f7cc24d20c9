"""The plan's numbers over time: what the whole command costs for a number of steps (from the
cost table, finetune/costs.py), the steps that fit a budget, the evaluations, warm-up, EMA,
early stop, the learning rate and the augmentation. Pure: no TensorFlow, no files.
"""
import math

from efficientdet_hpu.config import hparams_config

PASSES = 100  # Passes over the training images (Ultralytics' 100 epochs; trees peaked at ~80).
MIN_STEPS, MAX_STEPS = 300, 50000
MIN_BUDGET_STEPS = 20
EVALUATIONS, MIN_EVAL_INTERVAL = 10, 50
WARMUP_SHARE = 0.05  # make trees: 100 warm-up steps of 2000.
# automl's moving average counts its updates: at step n its decay is min(EMA_DECAY,
# (1 + n) / (10 + n)), so the count rules until step ~45,000 and a lower decay changes nothing
# in a run shorter than 9 / (1 - decay) steps (docs/training.md). The plan keeps automl's.
EMA_DECAY = hparams_config.get_efficientdet_config().moving_average_decay
# From pretrained weights: configs/trees-lite0.yaml (automl's fine-tune rate, per 64 images).
# From random weights: configs/demo.yaml's measured from-scratch rate, 16 times higher, with a
# quarter of the run as warm-up (docs/demo.md).
FINE_TUNE_RATE = dict(learning_rate=0.08, lr_warmup_init=0.008)
SCRATCH_RATE = dict(learning_rate=1.28, lr_warmup_init=0.128)
SCRATCH_WARMUP_SHARE = 0.25
# cosine_from_warmup_end: the rate ends at 0 on the last step (automl's cosine, counted from
# step 0, reaches 0 a warm-up early and rises again: a run of a few hundred steps feels it).
COSINE = dict(lr_decay_method='cosine', cosine_from_warmup_end=True)
JITTER = (0.8, 1.2)  # Trees' and the demo's scale jitter.
# Few whole photos seen many times: a wider jitter shows each at more scales.
WIDE_JITTER, FEW_PHOTOS, MANY_PASSES = (0.7, 1.3), 200, 100


def evaluations_for(steps) -> int:
    return min(EVALUATIONS, max(1, steps // MIN_EVAL_INTERVAL))


def seconds(table, rate, startup, global_batch, train_images, val_images, steps,
            search_seconds=0.0) -> tuple:
    """[(part, seconds)] of the whole command for `steps` training steps at `rate` training
    images/s: the data stage, the training process's start-up, a search's runs that are not
    continued, the training, its evaluations (of `val_images` images or tiles), and the
    whole-photo evaluation with the export."""
    parts = [('data', table.data_seconds(train_images + val_images)), ('start-up', startup)]
    if search_seconds:
        parts.append(('search', search_seconds))
    return tuple(parts + [
        ('training', steps * global_batch / rate),
        ('evaluations', evaluations_for(steps) * table.evaluation_seconds(rate, val_images)),
        ('whole photos + export', table.final_seconds(rate, val_images))])


def wanted_steps(train_images, global_batch, passes=PASSES) -> int:
    return min(MAX_STEPS, max(MIN_STEPS, int(math.ceil(passes * train_images / global_batch))))


def fitting_steps(budget_seconds, fixed_seconds, rate, global_batch, evaluation_seconds) -> int:
    """Steps whose training and evaluations fit `budget_seconds` after `fixed_seconds`."""
    steps = int((budget_seconds - fixed_seconds) * rate / global_batch)
    for _ in range(3):  # The evaluations depend on the steps; a few rounds settle it.
        spare = budget_seconds - fixed_seconds - evaluations_for(steps) * evaluation_seconds
        steps = int(spare * rate / global_batch)
    return steps


def schedule_numbers(steps, train_images, global_batch, warmup_share=WARMUP_SHARE) -> tuple:
    """(steps, evaluation interval, warm-up steps, early-stop patience): up to EVALUATIONS
    evaluations at least MIN_EVAL_INTERVAL steps apart, the steps a multiple of the interval;
    warm-up `warmup_share` of the steps but at least one pass over the images and at most a
    fifth of the steps (a quarter from random weights); patience half the evaluations."""
    evaluations = evaluations_for(steps)
    interval = max(1, steps // evaluations)
    steps = interval * evaluations
    return (steps, interval) + horizon(steps, evaluations, train_images, global_batch,
                                       warmup_share)


def horizon(steps, evaluations, train_images, global_batch, warmup_share=WARMUP_SHARE) -> tuple:
    """(warm-up steps, early-stop patience) of a run of `steps` in `evaluations`:
    what follows the run's length, so a budget that changes the steps changes them too."""
    one_pass = int(math.ceil(train_images / float(global_batch)))
    cap = max(1, steps // 4 if warmup_share > 0.2 else steps // 5)
    warmup = min(max(one_pass, int(round(warmup_share * steps))), cap)
    patience = evaluations // 2 if evaluations >= 6 else 0
    return warmup, patience


def ema_span(steps, decay=EMA_DECAY) -> int:
    """The steps the moving average spans (1 / (1 - its decay)) at a run's last step."""
    return int(round(1.0 / (1.0 - min(decay, (1.0 + steps) / (10.0 + steps)))))


def learning_rate(weights_kind) -> tuple:
    """(recipe keys, warm-up share, why) for pretrained or random weights."""
    if weights_kind:
        return dict(FINE_TUNE_RATE, **COSINE), WARMUP_SHARE, (
            'learning rate 0.08 per 64 images, warm-up from 0.008 per 64 over %d%% of the '
            'steps (at least one pass over the images), cosine from its end to 0: make trees\' '
            'measured fine-tune' % (100 * WARMUP_SHARE))
    return dict(SCRATCH_RATE, **COSINE), SCRATCH_WARMUP_SHARE, (
        'learning rate 1.28 per 64 images, warm-up from 0.128 per 64 over a quarter of the '
        'steps, cosine from its end to 0: configs/demo.yaml\'s measured training from random '
        'weights (a fine-tune\'s 0.08 is 16 times too low for random heads and backbone)')


def jitter(tiled, train_images, passes) -> tuple:
    """((jitter_min, jitter_max), why)."""
    if not tiled and train_images < FEW_PHOTOS and passes >= MANY_PASSES:
        return WIDE_JITTER, ('horizontal flips, scale jitter %g-%g: %d photos seen about %d '
                             'times each; more scales against learning them by heart' % (
                                 WIDE_JITTER + (train_images, passes)))
    return JITTER, ('horizontal flips, scale jitter %g-%g (trees\' and the demo\'s; automl\'s '
                    '0.1-2.0 is for long training from scratch)' % JITTER)


def trade_line(steps, global_batch, train_images, wanted) -> str:
    """What a budget that holds fewer steps than wanted trades, or ''."""
    if steps >= wanted:
        return ''
    passes = steps * global_batch / float(train_images)
    return ('; the budget holds %.0f passes of the %d wanted: the AP is likely below what a '
            'longer run reaches (a larger --max_minutes buys passes)' % (passes, PASSES))
