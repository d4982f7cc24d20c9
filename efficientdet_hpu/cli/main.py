"""Train and evaluate EfficientDet: `python main.py --mode=train_and_eval ...`.

Flags are named as in the google/automl and Habana ports. `--hparams` takes a YAML recipe, an
`a=1,b.c=2` string, or both (`recipe.yaml,a=1`). A YAML recipe may also set any flag of this
file (e.g. `train_batch_size: 8`): the YAML wins over a flag's default, a flag typed on the
command line wins over the YAML.
"""
import sys

from absl import app, flags

from efficientdet_hpu.core import tf_env  # noqa: F401  (before anything imports tensorflow)
from efficientdet_hpu.config import hparams_config
from efficientdet_hpu.config import legacy_flags
from efficientdet_hpu.config import recipe
from efficientdet_hpu.config.options import RunOptions
from efficientdet_hpu.core import command_help
from efficientdet_hpu.core import errors

FLAGS = flags.FLAGS


def define_flags():
    """main.py's flags; defined when main.py runs, so importing it defines nothing."""
    flags.DEFINE_enum('mode', 'train', ['train', 'eval', 'train_and_eval'], 'What to run.')
    flags.DEFINE_string('model_name', 'efficientdet-d0', 'Variant: efficientdet-d0 ... d7x, efficientdet-lite0 ... lite4.')
    flags.DEFINE_string('model_dir', None, 'Checkpoints, logs, config and metrics go here.')
    flags.DEFINE_string('hparams', '', 'YAML recipe path and/or "a=1,b.c=2" overrides.')
    flags.DEFINE_string('backbone_ckpt', '', 'EfficientNet checkpoint (or an EfficientNet-Lite .pth): initialises the backbone.')
    flags.DEFINE_string('ckpt', '', 'Detector checkpoint to fine-tune from (class head is '
                        're-initialised when the class count differs).')
    flags.DEFINE_integer('train_batch_size', 64, 'Training images per rank (per card); the '
                         'global batch is this times the number of ranks.')
    flags.DEFINE_integer('gradient_accumulation_steps', None, 'Micro-batches of '
                         '--train_batch_size per rank summed into one optimizer step: the '
                         'global batch is ranks x train_batch_size x this (default: the '
                         "recipe's gradient_accumulation_steps, 1).")
    flags.DEFINE_integer('global_batch_size', None, "A recipe's global batch: the run derives "
                         '--gradient_accumulation_steps = this / (ranks x train_batch_size), '
                         'an error when that is not a whole number.')
    flags.DEFINE_integer('eval_batch_size', 8, 'Evaluation images per rank.')
    flags.DEFINE_integer('eval_samples', 0, 'Evaluate on the first N images (0: all).')
    flags.DEFINE_string('training_file_pattern', None, 'Glob of training TFRecords.')
    flags.DEFINE_string('validation_file_pattern', None, 'Glob of validation TFRecords.')
    flags.DEFINE_string('val_json_file', None, 'COCO instances JSON of the validation set; '
                        'without it the ground truth comes from the validation TFRecords.')
    flags.DEFINE_string('testdev_dir', None, 'Write test-dev detections JSON here instead of '
                        'computing metrics.')
    flags.DEFINE_integer('num_examples_per_epoch', 0, 'Images per epoch (0: read from the '
                         'converter summary beside the training shards, else count records).')
    flags.DEFINE_float('num_epochs', None, 'Epochs to train (default: hparams num_epochs); a '
                       'fraction ends inside an epoch, at int(epochs x steps per epoch).')
    flags.DEFINE_integer('iterations_per_loop', 100, 'Steps between TensorBoard summaries.')
    flags.DEFINE_integer('log_every_n_steps', 100, 'Steps between log lines.')
    flags.DEFINE_integer('cp_every_n_steps', 1000, 'Steps between checkpoints.')
    flags.DEFINE_integer('keep_checkpoint_max', 5, 'Checkpoints kept (plus model_dir/best).')
    flags.DEFINE_bool('save_graph_def', False, 'Also write model_dir/graph.pbtxt and a .meta '
                      'graph beside each checkpoint, as a plain Estimator does (D0: ~10 s more '
                      'at start, seconds per checkpoint). The graph is in the TensorBoard events '
                      'either way; checkpoints restore without them.')
    flags.DEFINE_integer('min_eval_interval', 180, 'eval mode: seconds between checkpoint polls.')
    flags.DEFINE_integer('eval_timeout', None, 'eval mode: stop after this many seconds without '
                         'a new checkpoint.')
    flags.DEFINE_bool('eval_after_training', False, 'mode=train: evaluate the final checkpoint.')
    flags.DEFINE_integer('early_stop_patience', 0, 'mode=train_and_eval: stop training when '
                         'this many evaluations in a row have not beaten the best AP (0: '
                         'never); model_dir/best keeps the best checkpoint.', lower_bound=0)
    flags.DEFINE_bool('use_fake_data', False, 'Feed synthetic tensors (benchmarking, no I/O).')
    flags.DEFINE_bool('use_amp', False, 'Mixed precision: bfloat16 on CPU/HPU, float16 on GPU.')
    flags.DEFINE_bool('use_xla', False, 'XLA auto-clustering of the graph (meant for GPU). '
                      'On CPU TensorFlow clusters nothing without '
                      'TF_XLA_FLAGS=--tf_xla_cpu_global_jit, and D0 training then measured '
                      '9.6x slower (docs/dev/training-step-profile.md).')
    flags.DEFINE_bool('deterministic', False, 'Seeded, ordered input and deterministic ops.')
    flags.DEFINE_integer('seed', None, 'Random seed (default 0 with --deterministic).')
    # Habana's spellings: --use_horovod, --use_horovod=8, --use_horovod 8; --dump_all_ranks;
    # and the TPU-era flags of the seed's scripts (accepted; a TPU request is an error).
    legacy_flags.define_use_horovod_flag()
    legacy_flags.define_dump_all_ranks_flag()
    legacy_flags.define_tpu_era_flags()
    flags.adopt_module_key_flags(legacy_flags)
    flags.DEFINE_bool('no_hpu', False, 'Do not use a Habana Gaudi HPU even when present.')
    flags.DEFINE_enum('device', None, ['HPU', 'GPU', 'CPU', 'hpu', 'gpu', 'cpu'],
                      'Require this device; an error if it is absent.')
    flags.DEFINE_bool('benchmark', False, 'Train for --benchmark_steps and report throughput.')
    flags.DEFINE_integer('benchmark_steps', 20, 'Steps measured by --benchmark (after warm-up).')
    flags.DEFINE_integer('benchmark_warmup_steps', 5, 'Steps excluded from --benchmark figures.')
    flags.DEFINE_string('profile_steps', None, 'START,END: profiler trace of those steps.')
    flags.DEFINE_bool('skip_bad_records', False, 'Check every shard at start and leave out the '
                      'records that cannot be read or decoded (named in the log, at the end of '
                      'the run and in train_log.jsonl). Off: a bad record stops the run with '
                      'its shard and index named.')
    flags.DEFINE_string('steps_file', None, 'A JSON file another process may write while this '
                        'run trains, {"total_steps": N, "warmup_steps": W, '
                        '"moving_average_decay": D}: the run then ends at step N, sooner or '
                        'later, its warm-up, cosine, moving average and evaluations following, '
                        'without a restart. efficientdet-finetune writes it; one process only.')
    flags.DEFINE_bool('verbose', False, "TensorFlow's own log lines and deprecation notices, "
                      'and tracebacks with error messages.')


def apply_recipe_options(run_options):
    """Sets the flags a YAML recipe names unless they were typed on the command line."""
    for key, value in run_options.items():
        if FLAGS[key].present or value is None:
            continue
        text = str(value).lower() if isinstance(value, bool) else str(value)
        try:
            FLAGS[key].parse(text)
        except (ValueError, TypeError) as e:
            raise hparams_config.ConfigError('recipe key %s: %s' % (key, e))


def resolve():
    """Flags + recipe + overrides -> (RunOptions, config, hparams keys set explicitly); the
    run's setup finalises the config (config/settings.py)."""
    recipe_values = recipe.read_recipe(FLAGS.hparams)
    apply_recipe_options(recipe_values.run_options)
    options = RunOptions.from_values({name: FLAGS[name].value for name in RunOptions.names()})
    config = recipe.build_config(options.model_name, recipe_values)
    return options, config, recipe_values.explicit_keys


def run_modules():
    """The run's modules. They import TensorFlow, seconds that --help does without."""
    # pylint: disable=import-outside-toplevel
    from efficientdet_hpu.engine import loops, preemption, setup
    from efficientdet_hpu.runtime import distributed
    return loops, preemption, setup, distributed


def main(argv):
    loops, preemption, setup, distributed = run_modules()
    if len(argv) > 1:
        raise app.UsageError('unexpected arguments: %s (flags are --name=value)' % argv[1:])
    tf_env.quiet_python_logging(FLAGS.verbose)
    distributed.configure_logging(verbose=FLAGS.verbose)
    try:
        legacy_flags.check_tpu_era_flags(FLAGS)
        options, config, explicit_keys = resolve()
        run = setup.prepare(options, config, explicit_keys)
        try:
            return loops.execute(run)
        finally:
            run.close()
    except preemption.Stopped as stop:  # Not an error: the work is kept; status 128+N.
        if distributed.is_main():
            print('main.py: %s' % stop, file=sys.stderr, flush=True)
        return stop.exit_status
    except errors.UserError as error:
        return errors.fail('main.py', error, FLAGS.verbose)
    except Exception as error:  # pylint: disable=broad-except
        message = loops.disk_full_message(error, FLAGS.model_dir)
        if message is None:
            raise  # A bug: keep the traceback.
        return errors.fail('main.py', message, FLAGS.verbose)


def entry_point():
    define_flags()
    command_help.install(__name__)
    if not command_help.asks_for_help():
        run_modules()  # TensorFlow's own absl flags exist before parsing, as they always have
    app.run(main, flags_parser=legacy_flags.parse_flags)


if __name__ == '__main__':
    entry_point()
