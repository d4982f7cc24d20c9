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

GLOBAL_BATCH = 8  # make trees' batch; batch norm needs a few images per micro-batch.
MEMORY_SHARE = 0.7  # Of MemAvailable, for the training process (the rest: OS, input, eval).
# The model's own anchor_scale stays while its anchors reach at least this share of the boxes
# (the doctor's mean class coverage): on deepforest the doctor's 1.875 raised coverage from 92%
# to 97% and cost AP50 0.439 -> 0.367 (docs/finetune.md); a scale is worth changing only
# where the model's anchors miss many boxes.
KEEP_SCALE_COVERAGE = 0.9
# A search costs each other candidate's start-up, first evaluation interval and evaluation, and
# a start-up to continue the winner: tried only where that is at most this share of the training.
SEARCH_MAX_SHARE = 0.25
# The run drops a planned search past this share of the training left, its cost scaled by the
# stages' time over their estimate: it goes ahead on stages up to twice their estimate (a VM at
# half the table's speed), not three times: where the start matters, skipping costs more.
SEARCH_RUN_MAX_SHARE = 2.0 * SEARCH_MAX_SHARE
RANDOM_START_MIN_PHOTOS = 500  # Whole photos: fewer, and random weights are not tried (_search).
PASSES, MIN_STEPS, MAX_STEPS = schedule_lib.PASSES, schedule_lib.MIN_STEPS, schedule_lib.MAX_STEPS
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
    ema_decay: float  # automl's, or --hparams' where it sets one.
    early_stop_patience: int
    max_instances: int
    anchors: Tuple[Tuple[str, object], ...]
    images_per_second: float
    seconds: Tuple[Tuple[str, float], ...]
    reasons: Tuple[Tuple[str, str], ...]
    # The recipe keys of the learning rate, its schedule and the augmentation.
    schedule_keys: Tuple[Tuple[str, object], ...] = tuple(SCHEDULE_KEYS.items())
    # The candidates to try before training (finetune/search.py), by name (candidate_name:
    # '192px', '192px-random' for random weights beside --weights), the plan's own first.
    candidates: Tuple[str, ...] = ()
    startup_seconds: float = 45.0
    # Network hparams the plan sets over the model's own (model_choice.activation_keys).
    model_keys: Tuple[Tuple[str, object], ...] = ()

    @property
    def global_batch(self) -> int:
        return self.per_rank_batch * self.accumulation

    @property
    def evaluations(self) -> int:
        return -(-self.steps // self.eval_interval)  # The last at the end, inside one or not.

    @property
    def total_seconds(self) -> float:
        return sum(seconds for _, seconds in self.seconds)


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
    sooner when the AP stops rising), at most MAX_STEPS; --steps wins (said where they overrun)."""
    train_images, val_images, global_batch, rate, startup = sized_inputs
    wanted = schedule_lib.wanted_steps(train_images, global_batch)
    why = '%d passes over the %d training images' % (PASSES, train_images)
    if not request.max_minutes:
        return (request.steps, plan_reasons.ASKED_STEPS) if request.steps else (wanted, why)
    budget = request.max_minutes * 60.0
    parts = schedule_lib.seconds(table, rate, startup, global_batch, train_images, val_images,
                                 0, search_seconds)
    fixed = sum(s for part, s in parts if part not in ('training', 'evaluations'))
    fitting = min(MAX_STEPS, schedule_lib.fitting_steps(
        budget, fixed, rate, global_batch, table.evaluation_seconds(rate, val_images)))
    if request.steps:
        return request.steps, plan_reasons.asked_steps_reason(request, fitting, parts)
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


def _trial_seconds(other, table) -> float:
    """What trying `other` costs and does not keep: its start-up, first evaluation interval and
    evaluation (the search adds one start-up to continue the winner)."""
    steps = other.steps // schedule_lib.evaluations_for(other.steps)
    return (other.startup + steps * other.global_batch / other.rate
            + table.evaluation_seconds(other.rate, other.val_images))


def candidate_name(size, random=False) -> str:
    """A search candidate's name (and directory): '192px', '192px-random' for the start from
    random weights beside --weights."""
    return '%dpx%s' % (size, '-random' if random else '')


def _choose_size(data, hardware, request, table, model, advice):
    """(_Sized, the other size worth trying or 0, [(topic, why)])."""
    native = costs.NATIVE_SIZE.get(model, 512)
    asked = request.hparam('image_size')
    if asked is not None:
        side = asked if isinstance(asked, int) else native
        tiling = sizing.asked_tiling(data, native, side) if isinstance(asked, int) else (
            0, 0, 'whole photos: a non-square --hparams image_size')
        return (_sized(data, hardware, request, table, model, side, tiling[:2]), 0,
                [('image size', '%s px: asked with --hparams' % asked), ('tiling', tiling[2])])
    tiling = sizing.choose_tiling(data, native)
    if tiling[0]:
        return (_sized(data, hardware, request, table, model, native, tiling[:2]), 0,
                [('image size', '%d px: %s\'s own, tiles of it' % (native, model)),
                 ('tiling', tiling[2])])
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
    return _sized(data, hardware, request, table, model, side, (0, 0)), other_side, reasons


def random_start(request, sized) -> bool:
    """Whether the search tries random weights beside --weights: an ImageNet backbone, a budget,
    and RANDOM_START_MIN_PHOTOS whole photos or more (with fewer, or in tiles of large photos,
    the backbone won every set of the suite; from random weights a detector needs many photos,
    He et al. 2019). On photos unlike ImageNet's the backbone can hold a short run back
    (docs/finetune.md): the search measures it."""
    return bool(request.weights.kind == 'backbone' and request.max_minutes and not request.steps
                and not sized.tile and sized.train_images >= RANDOM_START_MIN_PHOTOS)


def _search(data, hardware, request, table, model, own, other_side):
    """(_Sized with the search's cost, candidate names, [(topic, why)], seconds): the other
    size and, from an ImageNet backbone, random weights at the smaller size, each only while
    the search costs at most SEARCH_MAX_SHARE of the training; the size is given up first."""
    tiling = (own.tile, own.overlap)
    others = []
    if other_side:
        others.append((candidate_name(other_side),
                       _sized(data, hardware, request, table, model, other_side, (0, 0))))
    if random_start(request, own):
        side = min(own.size, other_side or own.size)
        others.append((candidate_name(side, True), _sized(
            data, hardware, dataclasses.replace(request, weights=Weights()), table,
            model_choice.RANDOM_START_MODEL, side, tiling)))
    training = own.steps * own.global_batch / own.rate
    tried = []  # (names, cost) of each set over the share, the largest first.
    while others:
        cost = sum(_trial_seconds(other, table) for _, other in others) + own.startup
        if cost <= SEARCH_MAX_SHARE * training:
            break
        tried.append(([name for name, _ in others], cost))
        others = others[1:] if len(others) > 1 else []
    share = '%d%% of the training' % (100 * SEARCH_MAX_SHARE)
    if not others and not tried:
        return own, (), [], 0.0
    if not others:
        names, cost = tried[-1]
        return own, (), [('search', 'none: trying %s beside %dpx would cost %.1f min, over %s'
                          % (' and '.join(names), own.size, cost / 60.0, share))], 0.0
    names = [candidate_name(own.size)] + [name for name, _ in others]
    sized = _sized(data, hardware, request, table, model, own.size, tiling, cost)
    if names[-1].endswith('-random'):
        what = ('%s from the ImageNet backbone against %s from random weights: on photos '
                'unlike ImageNet\'s the backbone can hold a short run back' % (
                    ' and '.join(names[:-1]), names[-1]))
    else:
        what = '%d px against %d px: the rules cannot weigh detail against passes' % (
            own.size, other_side)
    why = ('%s, so each trains to its first evaluation and the one with the higher AP50 on '
           'the validation images goes on, a tie to the lower training loss (%.1f min of the '
           'budget kept for it)' % (what, cost / 60.0))
    if tried:
        why += '; %s not tried: with it the search would cost %.1f min, over %s' % (
            tried[0][0][0], tried[0][1] / 60.0, share)
    return sized, tuple(names), [('search', why)], cost


def make_plan(data, hardware, request, advice=(), coverage=None, table=None) -> Plan:
    """The plan for `data` (stats.DataStats) on `hardware` as `request` asks; `advice`: the
    data doctor's ((key, value), ...) for this plan's model and image size, `coverage` its
    mean class coverage with the model's own anchors (taken_advice); `table`: the cost table
    (costs.load() when None)."""
    table = table or costs.load(hardware.cpu)
    advice, not_taken = taken_advice(advice, coverage)
    model, model_why = model_choice.choose_model(request, data, hardware, table)
    own, other_side, size_reasons = _choose_size(data, hardware, request, table, model, advice)
    sized, candidates, search_reasons, cost = _search(data, hardware, request, table, model, own,
                                                      other_side)
    return plan_at(data, request, table, hardware, model, sized, (candidates, cost),
                   [('model', '%s: %s' % (model, model_why)),
                    ('weights', plan_reasons.weights_reason(request.weights))] + size_reasons
                   + search_reasons,
                   plan_reasons.anchors_reason(
                       tuple((k, v) for k, v in advice if k != 'image_size'), not_taken),
                   advice)


def plan_at(data, request, table, hardware, model, sized, search, reasons, anchors_why,
            advice, network=None):
    """The Plan of `sized` (an input size's numbers) with its schedule and reasons; `search`:
    (the sizes to try, the seconds their search costs); `network`: (hparams, why) if given."""
    candidates, cost = search
    global_batch = sized.global_batch
    rate_keys, warmup_share, rate_why = schedule_lib.learning_rate(request.weights.kind)
    model_keys, activation_why = network or model_choice.activation_keys(model, request)
    steps, interval, warmup, patience = schedule_lib.schedule_numbers(
        sized.steps, sized.train_images, global_batch, warmup_share)
    (jitter_min, jitter_max), jitter_why = schedule_lib.jitter(
        sized.tile, sized.train_images, steps * global_batch / float(max(1, sized.train_images)))
    anchors = tuple((key, value) for key, value in advice if key != 'image_size')
    search = dict(reasons).get('search')
    plan = Plan(model, request.weights, sized.size, sized.tile, sized.overlap,
                sized.train_images, sized.val_images, sized.per_rank, sized.accumulation, steps,
                interval, warmup, warmup if request.weights.kind == 'backbone' else 0,
                float(request.hparam('moving_average_decay', schedule_lib.EMA_DECAY)), patience,
                max(100, stats_lib.most_boxes_per_image(data.train, sized.tile, sized.overlap)),
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


def candidate_plan(plan, data, hardware, request, name, advice=(), coverage=None,
                   table=None) -> Plan:
    """The plan of the search's candidate `name` (candidate_name): `plan`'s at its size, from
    random weights for '-random', its steps fitting the same budget less the same search
    (finetune/search.py)."""
    table, (advice, not_taken) = table or costs.load(hardware.cpu), taken_advice(advice, coverage)
    cost = dict(plan.seconds).get('search', 0.0)
    size, random = int(name.split('px')[0]), name.endswith('-random')
    reasons, model, network = dict(plan.reasons), plan.model_name, None
    if random:
        request = dataclasses.replace(request, weights=Weights())
        model, network, reasons['model'], advice, raised = model_choice.random_start_network(
            request, plan.model_name, advice, stats_lib.sides_at_input(data.train, size))
        not_taken = '; '.join(part for part in (not_taken, raised) if part)
        reasons.update(weights='random initialisation: the search\'s other start beside %s'
                       % plan.weights.path, size='%d px, from random weights: the search\'s '
                       'other start' % size)
    else:
        reasons['size'] = '%d px: the search\'s other candidate beside %d px' % (
            size, plan.image_size)
    sized = _sized(data, hardware, request, table, model, size,
                   (plan.tile_size, plan.tile_overlap), cost)
    return plan_at(data, request, table, hardware, model, sized, ((), cost), [
        ('model', reasons['model']), ('weights', reasons['weights']),
        ('image size', reasons['size']), ('tiling', reasons['tiling']),
        ('search', reasons.get('search', ''))],
        plan_reasons.anchors_reason(tuple((k, v) for k, v in advice if k != 'image_size'),
                                    not_taken), advice, network)
