"""The fine-tune plan: from the data's statistics, the hardware, the measured costs and the
time budget, every choice a fine-tune makes, each with its reason. Pure (no TensorFlow, no
files): the stages (finetune/stages.py) gather the facts and run what this decides;
docs/finetune.md explains the rules.

Starting point: configs/trees-lite0.yaml, the measured hand-tuned fine-tune of `make trees`,
and configs/demo.yaml's training from random weights, made to follow the data and the budget:
the input size (finetune/sizing.py), the steps, rate, warm-up and augmentation
(finetune/schedule.py), and where a rule cannot settle the size, two sizes tried
(finetune/search.py).
"""
import dataclasses
import math
from typing import Tuple

from efficientdet_hpu.core.errors import UserError
from efficientdet_hpu.finetune import costs
from efficientdet_hpu.finetune import model_choice
from efficientdet_hpu.finetune import plan_reasons
from efficientdet_hpu.finetune import schedule as schedule_lib
from efficientdet_hpu.finetune import sizing
from efficientdet_hpu.finetune import stats as stats_lib

SMALL_AT_INPUT = 16.0  # px: under it a box is below Lite0's smallest anchor (24 px) by far.
LARGE_PHOTO = 2.0  # Photos at least this many times the input side are worth tiling.
GLOBAL_BATCH = 8  # make trees' batch; batch norm needs a few images per micro-batch.
MEMORY_SHARE = 0.7  # Of MemAvailable, for the training process (the rest: OS, input, eval).
# The model's own anchor_scale stays while its anchors reach at least this share of the boxes
# (the doctor's mean class coverage): on deepforest the doctor's 1.875 raised coverage from 92%
# to 97% and cost AP50 0.439 -> 0.367 (docs/finetune.md); a scale is worth changing only
# where the model's anchors miss many boxes.
KEEP_SCALE_COVERAGE = 0.9
# A search of two sizes costs the second's start-up, first evaluation interval and evaluation,
# and a start-up to continue the winner: tried only where that is at most this share of the
# training time.
SEARCH_MAX_SHARE = 0.25
# Kept for callers of the earlier names.
PASSES, MIN_STEPS, MAX_STEPS = schedule_lib.PASSES, schedule_lib.MIN_STEPS, schedule_lib.MAX_STEPS
EVALUATIONS, MIN_EVAL_INTERVAL = schedule_lib.EVALUATIONS, schedule_lib.MIN_EVAL_INTERVAL
SCHEDULE_KEYS = dict(schedule_lib.FINE_TUNE_RATE, **schedule_lib.COSINE, jitter_min=0.8,
                     jitter_max=1.2)


class PlanError(UserError):
    """A budget or a machine the fine-tune cannot fit; the message says what would."""


@dataclasses.dataclass(frozen=True)
class Hardware:
    """cores: CPU cores; memory_gb: MemAvailable; accelerator: '', 'GPU' or 'HPU'; cpu: the
    CPU's description (benchmarks/report.cpu_description), to match a cost table."""
    cores: int
    memory_gb: float
    accelerator: str = ''
    cpu: str = ''


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
    # The recipe keys of the learning rate, its schedule and the augmentation.
    schedule_keys: Tuple[Tuple[str, object], ...] = tuple(SCHEDULE_KEYS.items())
    # Input sizes to try before training (finetune/search.py), the plan's own first; () none.
    candidates: Tuple[int, ...] = ()
    startup_seconds: float = 45.0
    # Network hparams the plan sets over the model's own (model_choice.activation_keys).
    model_keys: Tuple[Tuple[str, object], ...] = ()

    @property
    def global_batch(self) -> int:
        return self.per_rank_batch * self.accumulation

    @property
    def evaluations(self) -> int:
        return self.steps // self.eval_interval

    @property
    def total_seconds(self) -> float:
        return sum(seconds for _, seconds in self.seconds)


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




@dataclasses.dataclass(frozen=True)
class _Sized:
    """A plan's numbers at one input size: images, batch, rate and budgeted steps."""
    size: int
    tile: int
    overlap: int
    train_images: int
    val_images: int
    per_rank: int
    accumulation: int
    batch_why: str
    rate: float
    rate_source: str
    startup: float
    steps: int
    steps_why: str

    @property
    def global_batch(self):
        return self.per_rank * self.accumulation

    @property
    def passes(self):
        return self.steps * self.global_batch / float(max(1, self.train_images))


def choose_steps(request, sized_inputs, table, search_seconds=0.0) -> tuple:
    """(steps, why): without a budget PASSES over the training images within [MIN_STEPS,
    MAX_STEPS]; with one (--max_minutes) the steps that fill it (early stopping ends the run
    sooner when the AP stops rising), at most MAX_STEPS; --steps wins."""
    train_images, val_images, global_batch, rate, startup = sized_inputs
    if request.steps:
        return request.steps, 'asked with --steps'
    wanted = schedule_lib.wanted_steps(train_images, global_batch)
    why = '%d passes over the %d training images' % (PASSES, train_images)
    if not request.max_minutes:
        return wanted, why
    budget = request.max_minutes * 60.0
    parts = schedule_lib.seconds(table, rate, startup, global_batch, train_images, val_images,
                                 0, search_seconds)
    fixed = sum(s for part, s in parts if part not in ('training', 'evaluations'))
    fitting = min(MAX_STEPS, schedule_lib.fitting_steps(
        budget, fixed, rate, global_batch, table.evaluation_seconds(rate, val_images)))
    if fitting < schedule_lib.MIN_BUDGET_STEPS:
        raise PlanError('--max_minutes=%g is too short: the stages besides training take about '
                        '%.0f min here; give at least %.0f' % (
                            request.max_minutes, fixed / 60.0, math.ceil(
                                (fixed + schedule_lib.MIN_BUDGET_STEPS * global_batch / rate
                                 + table.evaluation_seconds(rate, val_images)) / 60.0)))
    if fitting < wanted:
        return fitting, '%s would take %d steps; %d fit --max_minutes=%g%s' % (
            why, wanted, fitting, request.max_minutes, schedule_lib.trade_line(
                fitting, global_batch, train_images, wanted))
    return fitting, ('%d fill --max_minutes=%g: %.0f passes over the %d training images (%d '
                     'wanted); early stopping ends the run sooner when the AP stops rising' % (
                         fitting, request.max_minutes, fitting * global_batch / float(
                             train_images), train_images, PASSES))


def _sized(data, hardware, request, table, model, size, tiling, search_seconds=0.0):
    tile, overlap = tiling
    train_images = stats_lib.tile_count(data.train, tile, overlap) if tile else len(data.train)
    val_images = stats_lib.tile_count(data.val, tile, overlap) if tile else len(data.val)
    per_rank, accumulation, batch_why = choose_batch(model, size, train_images, hardware)
    rate, rate_source = ((float(request.images_per_second), 'stated with --images_per_second')
                         if request.images_per_second else
                         table.images_per_second(model, size, hardware.cores))
    startup = table.startup_seconds(model, size)
    steps, steps_why = choose_steps(request, (train_images, val_images, per_rank * accumulation,
                                              rate, startup), table, search_seconds)
    return _Sized(size, tile, overlap, train_images, val_images, per_rank, accumulation,
                  batch_why, rate, rate_source, startup, steps, steps_why)


def search_seconds(own, other, table) -> float:
    """What trying `other` beside `own` costs and does not keep: its start-up, first evaluation
    interval and evaluation, and a start-up to continue the winner."""
    steps = other.steps // schedule_lib.evaluations_for(other.steps)
    return (other.startup + steps * other.global_batch / other.rate
            + table.evaluation_seconds(other.rate, other.val_images) + own.startup)


def _choose_size(data, hardware, request, table, model, advice):
    """(_Sized, candidates, [(topic, why)], seconds of the search)."""
    native = costs.NATIVE_SIZE.get(model, 512)
    asked = request.hparam('image_size')
    if asked is not None:
        side = asked if isinstance(asked, int) else native
        tiling = choose_tiling(data, side) if isinstance(asked, int) else (
            0, 0, 'whole photos: a non-square --hparams image_size')
        return (_sized(data, hardware, request, table, model, side, tiling[:2]), (),
                [('image size', '%s px: asked with --hparams' % asked), ('tiling', tiling[2])], 0.0)
    tiling = choose_tiling(data, native)
    if tiling[0]:
        return (_sized(data, hardware, request, table, model, native, tiling[:2]), (),
                [('image size', '%d px: %s\'s own, tiles of it' % (native, model)),
                 ('tiling', tiling[2])], 0.0)
    floor, top, bounds_why = sizing.bounds(data.train, native)
    budgeted = request.max_minutes and not request.steps

    def trained_at(side):
        if not budgeted:
            return None
        try:
            sized = _sized(data, hardware, request, table, model, side, (0, 0))
        except PlanError:
            return 0.0, 0
        return sized.passes, sized.steps
    side, other_side, why = sizing.choose(floor, top, trained_at)
    reasons = [('image size', '%d px: %s; %s' % (side, why, bounds_why)), ('tiling', tiling[2])]
    advised = dict(advice).get('image_size')
    if isinstance(advised, int):  # The doctor, run at `side`, found it too small for anchors.
        reasons[0] = ('image size', '%d px: the data doctor\'s advice (more of the boxes reach '
                                    'an anchor) over the %d px of the rule (%s)' % (
                                        advised, side, why))
        side, other_side = advised, (side if budgeted and side < advised else 0)
    sized = _sized(data, hardware, request, table, model, side, (0, 0))
    if not other_side:
        return sized, (), reasons, 0.0
    other = _sized(data, hardware, request, table, model, other_side, (0, 0))
    cost = search_seconds(sized, other, table)
    training = sized.steps * sized.global_batch / sized.rate
    if cost > SEARCH_MAX_SHARE * training:
        return sized, (), reasons + [('search', 'none: trying %d px beside %d would cost %.1f '
                                                'min, over %d%% of the training' % (
                                                    other_side, side, cost / 60.0,
                                                    100 * SEARCH_MAX_SHARE))], 0.0
    sized = _sized(data, hardware, request, table, model, side, (0, 0), cost)
    return sized, (side, other_side), reasons + [('search', (
        '%d px against %d px: the rules cannot weigh detail against passes, so both train to '
        'their first evaluation and the one with the higher AP50 on the validation images '
        'goes on (%.1f min of the budget kept for it)' % (side, other_side, cost / 60.0)))], cost


def make_plan(data, hardware, request, advice=(), coverage=None, table=None) -> Plan:
    """The plan for `data` (stats.DataStats) on `hardware` as `request` asks; `advice`: the
    data doctor's ((key, value), ...) for this plan's model and image size, `coverage` its
    mean class coverage with the model's own anchors (taken_advice); `table`: the cost table
    (costs.load() when None)."""
    table = table or costs.load(hardware.cpu)
    advice, not_taken = taken_advice(advice, coverage)
    model, model_why = model_choice.choose_model(request, data, hardware, table)
    sized, candidates, size_reasons, cost = _choose_size(data, hardware, request, table, model,
                                                         advice)
    return plan_at(data, request, table, hardware, model, sized, (candidates, cost),
                   [('model', '%s: %s' % (model, model_why)),
                    ('weights', plan_reasons.weights_reason(request.weights))] + size_reasons,
                   plan_reasons.anchors_reason(tuple((k, v) for k, v in advice if k != 'image_size'),
                                   not_taken), advice)


def plan_at(data, request, table, hardware, model, sized, search, reasons, anchors_why,
            advice):
    """The Plan of `sized` (an input size's numbers) with its schedule and reasons; `search`:
    (the sizes to try, the seconds their search costs)."""
    candidates, cost = search
    global_batch = sized.global_batch
    rate_keys, warmup_share, rate_why = schedule_lib.learning_rate(request.weights.kind)
    model_keys, activation_why = model_choice.activation_keys(model, request)
    steps, interval, warmup, ema, patience = schedule_lib.schedule_numbers(
        sized.steps, sized.train_images, global_batch, warmup_share)
    (jitter_min, jitter_max), jitter_why = schedule_lib.jitter(
        sized.tile, sized.train_images, steps * global_batch / float(max(1, sized.train_images)))
    anchors = tuple((key, value) for key, value in advice if key != 'image_size')
    search = dict(reasons).get('search')
    plan = Plan(model, request.weights, sized.size, sized.tile, sized.overlap,
                sized.train_images, sized.val_images, sized.per_rank, sized.accumulation, steps,
                interval, warmup, warmup if request.weights.kind == 'backbone' else 0, ema,
                patience, max(100, stats_lib.most_boxes_per_image(data.train, sized.tile,
                                                                   sized.overlap)),
                anchors, sized.rate, schedule_lib.seconds(
                    table, sized.rate, sized.startup, global_batch, sized.train_images,
                    sized.val_images, steps, cost), (),
                tuple(dict(rate_keys, jitter_min=jitter_min, jitter_max=jitter_max).items()),
                tuple(candidates), sized.startup, model_keys)
    head = [item for item in reasons if item[0] != 'search']
    if activation_why:
        head.insert(2, ('activation', activation_why))
    head += [('anchors', anchors_why), ('batch', sized.batch_why)]
    if request.hparams:
        head.append(('overrides', '%s from --hparams, in plan.yaml over the values below'
                     % ', '.join('%s=%s' % item for item in request.hparams)))
    tail = plan_reasons.schedule_reasons(plan, sized.steps_why, rate_why, jitter_why,
                                         sized.rate_source, costs.for_machine(table, hardware.cpu))
    if search:
        tail.insert(-1, ('search', search))
    return dataclasses.replace(plan, reasons=tuple(head + tail))


def candidate_plan(plan, data, hardware, request, image_size, advice=(), coverage=None,
                   table=None) -> Plan:
    """The plan of a search's other candidate: `plan`'s, at `image_size`, its steps fitting
    the same budget less the same search (finetune/search.py)."""
    table = table or costs.load(hardware.cpu)
    advice, not_taken = taken_advice(advice, coverage)
    cost = dict(plan.seconds).get('search', 0.0)
    sized = _sized(data, hardware, request, table, plan.model_name, image_size, (0, 0), cost)
    reasons = dict(plan.reasons)
    return plan_at(data, request, table, hardware, plan.model_name, sized, ((), cost), [
        ('model', reasons['model']), ('weights', reasons['weights']),
        ('image size', '%d px: the search\'s other candidate beside %d px' % (
            image_size, plan.image_size)), ('tiling', reasons['tiling']),
        ('search', reasons.get('search', ''))],
        plan_reasons.anchors_reason(tuple((k, v) for k, v in advice if k != 'image_size'),
                                    not_taken), advice)
