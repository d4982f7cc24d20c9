"""Train and evaluate EfficientDet: `python main.py --mode=train_and_eval ...`.

Flags are named as in the google/automl and Habana ports. `--hparams` takes a YAML recipe, an
`a=1,b.c=2` string, or both (`recipe.yaml,a=1`). A YAML recipe may also set any flag of this
file (e.g. `train_batch_size: 8`): the YAML wins over a flag's default, a flag typed on the
command line wins over the YAML.
"""
import json
import os
import sys

from absl import app, flags, logging

import tf_env  # noqa: F401  (before anything imports tensorflow)
import hparams_config
import run_setup

FLAGS = flags.FLAGS

flags.DEFINE_enum('mode', 'train', ['train', 'eval', 'train_and_eval'], 'What to run.')
flags.DEFINE_string('model_name', 'efficientdet-d0', 'Variant: efficientdet-d0 ... d7x.')
flags.DEFINE_string('model_dir', None, 'Checkpoints, logs, config and metrics go here.')
flags.DEFINE_string('hparams', '', 'YAML recipe path and/or "a=1,b.c=2" overrides.')
flags.DEFINE_string('backbone_ckpt', '', 'EfficientNet checkpoint: initialises the backbone.')
flags.DEFINE_string('ckpt', '', 'Detector checkpoint to fine-tune from (class head is '
                    're-initialised when the class count differs).')
flags.DEFINE_integer('train_batch_size', 64, 'Global training batch (all ranks together).')
flags.DEFINE_integer('eval_batch_size', 8, 'Global evaluation batch.')
flags.DEFINE_integer('eval_samples', 0, 'Evaluate on the first N images (0: all).')
flags.DEFINE_string('training_file_pattern', None, 'Glob of training TFRecords.')
flags.DEFINE_string('validation_file_pattern', None, 'Glob of validation TFRecords.')
flags.DEFINE_string('val_json_file', None, 'COCO instances JSON of the validation set; '
                    'without it the ground truth comes from the validation TFRecords.')
flags.DEFINE_string('testdev_dir', None, 'Write test-dev detections JSON here instead of '
                    'computing metrics.')
flags.DEFINE_integer('num_examples_per_epoch', 0, 'Images per epoch (0: read from the '
                     'converter summary beside the training shards, else count records).')
flags.DEFINE_integer('num_epochs', None, 'Epochs to train (default: hparams num_epochs).')
flags.DEFINE_integer('iterations_per_loop', 100, 'Steps between TensorBoard summaries.')
flags.DEFINE_integer('log_every_n_steps', 100, 'Steps between log lines.')
flags.DEFINE_integer('cp_every_n_steps', 1000, 'Steps between checkpoints.')
flags.DEFINE_integer('keep_checkpoint_max', 5, 'Checkpoints kept (plus model_dir/best).')
flags.DEFINE_integer('min_eval_interval', 180, 'eval mode: seconds between checkpoint polls.')
flags.DEFINE_integer('eval_timeout', None, 'eval mode: stop after this many seconds without '
                     'a new checkpoint.')
flags.DEFINE_bool('eval_after_training', False, 'mode=train: evaluate the final checkpoint.')
flags.DEFINE_bool('use_fake_data', False, 'Feed synthetic tensors (benchmarking, no I/O).')
flags.DEFINE_bool('use_amp', False, 'Mixed precision: bfloat16 on CPU/HPU, float16 on GPU.')
flags.DEFINE_bool('use_xla', False, 'XLA auto-clustering of the graph (meant for GPU). On '
                  'CPU TensorFlow clusters nothing without TF_XLA_FLAGS=--tf_xla_cpu_global_jit, '
                  'and D0 training then measured 9.6x slower (docs/training-step-profile.md).')
flags.DEFINE_bool('deterministic', False, 'Seeded, ordered input and deterministic ops.')
flags.DEFINE_integer('seed', None, 'Random seed (default 0 with --deterministic).')
flags.DEFINE_bool('use_horovod', None, 'Force Horovod on (default: on when run by mpirun '
                  'with more than one rank).')
flags.DEFINE_bool('no_hpu', False, 'Do not use a Habana Gaudi HPU even when present.')
flags.DEFINE_enum('device', None, ['HPU', 'GPU', 'CPU', 'hpu', 'gpu', 'cpu'],
                  'Require this device; an error if it is absent.')
flags.DEFINE_bool('benchmark', False, 'Train for --benchmark_steps and report throughput.')
flags.DEFINE_integer('benchmark_steps', 20, 'Steps measured by --benchmark (after warm-up).')
flags.DEFINE_integer('benchmark_warmup_steps', 5, 'Steps excluded from --benchmark figures.')
flags.DEFINE_string('profile_steps', None, 'START,END: profiler trace of those steps.')

# Flags a YAML recipe may set. Everything else in the recipe is an hparams key.
RECIPE_FLAGS = (
    'mode', 'model_name', 'train_batch_size', 'eval_batch_size', 'eval_samples',
    'training_file_pattern', 'validation_file_pattern', 'val_json_file',
    'num_examples_per_epoch', 'num_epochs', 'iterations_per_loop', 'log_every_n_steps',
    'cp_every_n_steps', 'keep_checkpoint_max', 'eval_after_training', 'use_amp', 'use_xla',
    'deterministic', 'seed', 'backbone_ckpt', 'ckpt', 'min_eval_interval', 'eval_timeout')


def split_hparams_flag(text):
    """'recipe.yaml,a=1' -> ('recipe.yaml', 'a=1'); 'a=1' -> (None, 'a=1')."""
    text = (text or '').strip()
    head, _, rest = text.partition(',')
    if hparams_config.is_yaml_path(head):
        return head, rest
    return None, text


def apply_recipe_flags(recipe):
    """Moves flag keys of a YAML recipe onto FLAGS unless typed on the command line.

    Returns the remaining keys (hparams overrides)."""
    remaining = {}
    for key, value in recipe.items():
        if key not in RECIPE_FLAGS:
            remaining[key] = value
            continue
        if FLAGS[key].present:
            continue
        if value is None:
            continue
        text = str(value).lower() if isinstance(value, bool) else str(value)
        try:
            FLAGS[key].parse(text)
        except (ValueError, TypeError) as e:
            raise hparams_config.ConfigError('recipe key %s: %s' % (key, e))
    return remaining


def resolve_config():
    """Flags + recipe + overrides -> (config, overrides that were set explicitly)."""
    recipe_path, override_text = split_hparams_flag(FLAGS.hparams)
    recipe = hparams_config.load_yaml(recipe_path) if recipe_path else {}
    hparam_values = apply_recipe_flags(recipe)
    config = hparams_config.get_efficientdet_config(FLAGS.model_name)
    config.override(hparam_values)
    config.override(override_text)
    if FLAGS.use_amp:
        config.mixed_precision = True
    explicit = set(hparam_values) | set(hparams_config.parse_override_string(override_text))
    return config, explicit


def main(argv):
    if len(argv) > 1:
        raise app.UsageError('unexpected arguments: %s (flags are --name=value)' % argv[1:])
    try:
        config, explicit_keys = resolve_config()
        run = run_setup.prepare(FLAGS, config, explicit_keys)
        return run_setup.execute(run)
    except run_setup.USER_ERRORS as error:
        logging.error('%s', error)
        print('error: %s' % error, file=sys.stderr)
        return 2


def run():
    app.run(main)


if __name__ == '__main__':
    run()
