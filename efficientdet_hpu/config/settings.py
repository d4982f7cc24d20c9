"""A run's configuration, finalised once: the hparams Config frozen, and every value derived
from it and the run's facts computed by `finalize` and nowhere else.

How a `main.py` run's configuration travels (docs/architecture.md, "Configuration"):
  1. cli/main.py: absl flags + `--hparams` (config/recipe.py: YAML recipe and overrides; a
     recipe's run keys set flags not typed) -> RunOptions and a Config of hparams;
  2. engine/setup.prepare: the model_dir's automl config.yaml and the label map fill in
     the hparams the user did not set; the run's facts are gathered (ranks, device, batch per
     rank, images per epoch) -> `finalize(config, RunFacts)` -> Settings (frozen);
  3. the Estimator gets the Settings as its `params`: model_fn(features, labels, mode, params)
     and the input_fn read it as it is (no dict, no rebuilding); the run's first line,
     model_dir/config.yaml, schedule.json and the training log read it too.
Tools that build a model without training (export, predict, bench, model_inspect) take a
frozen Config from config/recipe.resolve and compute in float32.

Derived values, each computed in `finalize` only (tests/config/test_settings.py keeps it so):
  batch.global_size = per-rank batch x ranks x accumulation steps; batch.accumulation_steps
  (from --global_batch_size, --gradient_accumulation_steps or the recipe);
  schedule.steps_per_epoch = images per epoch / global batch (a float, as automl);
  schedule.total_steps = int(epochs x steps per epoch), at least 1;
  schedule.learning_rate, schedule.warmup_init = the config's, x global batch /
  lr_base_batch_size; schedule.warmup_steps, first_drop_step, second_drop_step =
  int(epochs x steps per epoch); the Runtime's compute_dtype = the device's half type when
  mixed_precision (or --use_amp), else float32 (the network reads only this), its
  cross_rank_batch_norm = sync_batch_norm with more than one rank, and its seed.
"""
import dataclasses
from typing import Optional

from efficientdet_hpu.config import hparams_config
from efficientdet_hpu.core.errors import UserError


class SettingsError(UserError, ValueError):
    """A run's batch arithmetic that cannot work; the message names the flag and the fix."""


@dataclasses.dataclass(frozen=True)
class RunFacts:
    """What a run is asked and what it found, before anything is derived.

    per_rank_batch: --train_batch_size; eval_per_rank_batch: --eval_batch_size (None: the
    training one); accumulation_steps / global_batch_size: the flags (None: not given; the
    recipe's gradient_accumulation_steps then); examples_per_epoch: images in the training
    data; num_epochs: --num_epochs (None: the recipe's); half_dtype: the device's mixed
    precision type (runtime.devices.mixed_precision_dtype); use_amp: --use_amp."""
    ranks: int = 1
    per_rank_batch: int = 1
    eval_per_rank_batch: Optional[int] = None
    accumulation_steps: Optional[int] = None
    global_batch_size: Optional[int] = None
    examples_per_epoch: int = 1000
    num_epochs: Optional[float] = None
    half_dtype: str = 'bfloat16'
    use_amp: bool = False
    seed: Optional[int] = None
    model_dir: str = ''
    backbone_ckpt: str = ''
    ckpt: str = ''
    steps_file: str = ''


@dataclasses.dataclass(frozen=True)
class Batch:
    """per_rank: images per rank and micro-batch; accumulation_steps: micro-batches per
    optimizer step; ranks; global_size: images per optimizer step over all ranks and
    micro-batches (the learning rate scales with it); eval_per_rank: evaluation images per
    rank."""
    per_rank: int
    accumulation_steps: int
    ranks: int
    global_size: int
    eval_per_rank: int

    @property
    def step_size(self):
        """Training images per rank and optimizer step (all micro-batches)."""
        return self.per_rank * self.accumulation_steps


@dataclasses.dataclass(frozen=True)
class Schedule:
    """Optimizer steps and the learning rate scaled to the global batch (automl's counting)."""
    steps_per_epoch: float
    total_steps: int
    learning_rate: float
    warmup_init: float
    warmup_steps: int
    first_drop_step: int
    second_drop_step: int


@dataclasses.dataclass(frozen=True)
class Runtime:
    """compute_dtype: 'float32', 'bfloat16' or 'float16', what training computes in (the one
    precision field; evaluation and export compute in float32). backbone_ckpt, ckpt: warm
    starts ('' for none), applied only while model_dir holds no checkpoint. steps_file: the
    file that may move the run's end while it trains ('' for none; training/steps_file.py)."""
    compute_dtype: str
    cross_rank_batch_norm: bool
    seed: Optional[int]
    model_dir: str
    backbone_ckpt: str
    ckpt: str
    steps_file: str = ''


@dataclasses.dataclass(frozen=True)
class Settings:
    """A finalised run configuration: `config` (a frozen Config of hparams) and the derived
    parts. Immutable, so the Estimator's deep copies of its params are the object itself."""
    config: hparams_config.Config
    batch: Batch
    schedule: Schedule
    runtime: Runtime

    def __deepcopy__(self, memo):
        return self


def _positive(name, value):
    if value is None or value < 1:
        raise SettingsError('--%s=%s must be a positive number of images per rank (the global '
                            'batch is it times the number of ranks)' % (name, value))
    return value


def accumulation_steps(facts, recipe_steps):
    """Micro-batches per optimizer step: from --global_batch_size when given, else
    --gradient_accumulation_steps, else the recipe's gradient_accumulation_steps."""
    asked, wanted = facts.accumulation_steps, facts.global_batch_size
    if asked is not None and asked < 1:
        raise SettingsError('--gradient_accumulation_steps=%d must be >= 1 (1: no '
                            'accumulation)' % asked)
    if wanted is None:
        return asked or recipe_steps
    per_micro_batch = facts.per_rank_batch * facts.ranks
    ranks = '%d %s' % (facts.ranks, 'rank' if facts.ranks == 1 else 'ranks')
    if wanted < 1 or wanted % per_micro_batch:
        raise SettingsError(
            '--global_batch_size=%d is not a multiple of %s x --train_batch_size=%d = %d '
            'images; ask for a multiple of %d or change --train_batch_size'
            % (wanted, ranks, facts.per_rank_batch, per_micro_batch, per_micro_batch))
    if asked is not None and asked != wanted // per_micro_batch:
        raise SettingsError(
            '--gradient_accumulation_steps=%d disagrees with --global_batch_size=%d (%s x %d x '
            '%d = %d); give only one of them' % (asked, wanted, ranks, facts.per_rank_batch,
                                                 asked, per_micro_batch * asked))
    return wanted // per_micro_batch


def _batch(facts, recipe_steps):
    per_rank = _positive('train_batch_size', facts.per_rank_batch)
    eval_per_rank = _positive('eval_batch_size', facts.eval_per_rank_batch
                              if facts.eval_per_rank_batch is not None else per_rank)
    accumulated = accumulation_steps(facts, recipe_steps)
    return Batch(per_rank=per_rank, accumulation_steps=accumulated, ranks=facts.ranks,
                 global_size=per_rank * facts.ranks * accumulated, eval_per_rank=eval_per_rank)


def _schedule(config, facts, global_size):
    """automl's counting: the steps per epoch stay a float (118287 / 64 = 1848.23 on COCO); the
    total and every epoch boundary are int(epochs x that), the total at least 1."""
    steps_per_epoch = facts.examples_per_epoch / float(global_size)
    num_epochs = facts.num_epochs if facts.num_epochs is not None else config.num_epochs
    scale = global_size / float(config.lr_base_batch_size)
    return Schedule(
        steps_per_epoch=steps_per_epoch,
        total_steps=max(1, int(num_epochs * steps_per_epoch)),
        learning_rate=config.learning_rate * scale, warmup_init=config.lr_warmup_init * scale,
        warmup_steps=int(config.lr_warmup_epoch * steps_per_epoch),
        first_drop_step=int(config.first_lr_drop_epoch * steps_per_epoch),
        second_drop_step=int(config.second_lr_drop_epoch * steps_per_epoch))


def finalize(config, facts=RunFacts()):
    """The one step from a Config of hparams and the run's facts to the frozen Settings.

    Validates the config; records in it what the run decided (gradient_accumulation_steps,
    mixed_precision with --use_amp) so model_dir/config.yaml says it; raises ConfigError or
    SettingsError (one line, naming the key or flag) for what cannot work."""
    config = hparams_config.Config(config.as_dict())
    batch = _batch(facts, config.gradient_accumulation_steps)
    config.override(dict(gradient_accumulation_steps=batch.accumulation_steps,
                         mixed_precision=bool(config.mixed_precision or facts.use_amp)))
    hparams_config.validate(config)
    if facts.steps_file and facts.ranks > 1:
        raise SettingsError('--steps_file is for one process; this run has %d ranks (they would '
                            'read it at different steps): leave it out' % facts.ranks)
    runtime = Runtime(
        compute_dtype=facts.half_dtype if config.mixed_precision else 'float32',
        # Synchronised batch norm only means something with more than one rank.
        cross_rank_batch_norm=bool(config.sync_batch_norm and facts.ranks > 1),
        seed=facts.seed, model_dir=facts.model_dir, backbone_ckpt=facts.backbone_ckpt,
        ckpt=facts.ckpt, steps_file=facts.steps_file)
    return Settings(config.frozen(), batch, _schedule(config, facts, batch.global_size), runtime)


def schedule_record(settings):
    """The schedule a resumed run compares with its checkpoint's (engine/resume_check.py)."""
    return dict(ranks=settings.batch.ranks, per_rank_batch=settings.batch.per_rank,
                global_batch=settings.batch.global_size,
                learning_rate=float(settings.schedule.learning_rate),
                steps_per_epoch=settings.schedule.steps_per_epoch,
                total_steps=settings.schedule.total_steps)
