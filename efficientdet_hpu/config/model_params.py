"""What the Estimator hands model_fn and input_fn as `params`, read as a typed view.

tf.compat.v1.estimator passes `params` as a plain dict (TPUEstimator's
`model_fn(features, labels, mode, params)` convention, which automl's and Habana's ports keep).
A run writes it with `to_estimator(config, run)`: the model config's keys (hparams_config)
plus the run's own settings (RunParams). model_fn and input_fn read it back with `view(params)`:
the config as a Config and the run settings as a RunParams, so no code reads run settings out
of an untyped dict, and the factories (anchor and NMS settings) take a Config only.
"""
import dataclasses
from typing import Optional

from efficientdet_hpu.config import hparams_config


@dataclasses.dataclass(frozen=True)
class RunParams:
    """The run's settings beside the model config.

    batch_size: images per rank and micro-batch (--train_batch_size). accumulation_steps:
    micro-batches per optimizer step (gradient accumulation; the training input batch per rank
    is batch_size x accumulation_steps). global_batch_size: images per optimizer step over all
    ranks and micro-batches (the learning rate scales with it). steps_per_epoch (a float, as
    automl), total_steps: optimizer steps. seed: graph seed or None. backbone_ckpt, ckpt: warm
    starts ('' for none), applied only while model_dir (the run's) holds no checkpoint.
    compute_dtype: 'float32', 'bfloat16' or 'float16' for training. cross_rank_batch_norm:
    batch norm statistics over all ranks (the config's sync_batch_norm with more than one rank).
    """
    batch_size: int
    global_batch_size: Optional[int] = None
    steps_per_epoch: Optional[float] = None
    total_steps: Optional[int] = None
    seed: Optional[int] = None
    backbone_ckpt: str = ''
    ckpt: str = ''
    compute_dtype: str = 'float32'
    cross_rank_batch_norm: bool = False
    accumulation_steps: int = 1
    model_dir: str = ''

    @property
    def step_batch_size(self):
        """Training images per rank and optimizer step (all micro-batches)."""
        return self.batch_size * self.accumulation_steps


@dataclasses.dataclass(frozen=True)
class ModelParams:
    """params as model_fn and input_fn read it: `config` (hparams_config.Config) and `run`."""
    config: hparams_config.Config
    run: RunParams


_RUN_KEYS = tuple(field.name for field in dataclasses.fields(RunParams))


def to_estimator(config, run: RunParams) -> dict:
    """The Estimator's `params` dict for `config` (a Config) and `run`."""
    clash = sorted(set(config.keys()) & set(_RUN_KEYS))
    if clash:
        raise ValueError('run settings %s clash with config keys' % clash)
    return dict(config.as_dict(), **dataclasses.asdict(run))


def view(params) -> ModelParams:
    """The typed view of an Estimator `params` dict (a ModelParams passes through).

    Raises ValueError naming a key that is neither a config key nor a run setting, or a
    missing batch_size: both are bugs of the code that built the dict.
    """
    if isinstance(params, ModelParams):
        return params
    config_keys = set(hparams_config.get_efficientdet_config().keys())
    unknown = sorted(set(params) - config_keys - set(_RUN_KEYS))
    if unknown:
        raise ValueError('params keys %s are neither hparams nor run settings (%s)'
                         % (unknown, ', '.join(_RUN_KEYS)))
    if 'batch_size' not in params:
        raise ValueError('params has no batch_size (images per rank)')
    config = hparams_config.Config({k: v for k, v in params.items() if k in config_keys})
    run = RunParams(**{k: params[k] for k in _RUN_KEYS if k in params})
    return ModelParams(config, run)
