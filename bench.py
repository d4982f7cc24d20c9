r"""Benchmarks. Every subcommand prints a table and one line `BENCHMARK {json}`.

    python bench.py train --batch_sizes=2,4 --steps=20 --warmup=5 [--use_fake_data] \
        [--model_name=efficientdet-d0] [--hparams=...] [--num_ranks=1]
    python bench.py infer --batch_sizes=1,2,4,8 (--model_dir=DIR | --random_weights) \
        [--source=random|image:IMG|repeat:IMG|dir:DIR] [--postprocess=graph,host,none] \
        --steps=50 --warmup=5
    python bench.py input --file_pattern='data/train-*.tfrecord' --batch_size=4 \
        --num_batches=50 [--is_training]
    python bench.py suite --output=docs/benchmarks-$(hostname).md     (what `make bench` runs)

train runs `main.py --benchmark` in a subprocess per batch size (under
demo_efficientdet.py --use_horovod N when --num_ranks > 1), so the memory figures are the
training process's own, and reads the BENCHMARK line train_hooks.run_benchmark prints:
images/s per rank and global over the steps after warm-up, time per step, peak host memory.
infer: see bench_infer.py. input: the tf.data pipeline alone (bench_input.measure).
"""
import json
import os
import subprocess
import sys
import tempfile

from absl import app, flags

import hparams_config

REPO = os.path.dirname(os.path.abspath(__file__))
RESULT_PREFIX = 'BENCHMARK '
FLAGS = flags.FLAGS


def define_flags():
    """Defined only when run as a program: bench_suite and the tests import this module."""
    flags.DEFINE_string('model_name', 'efficientdet-d0', 'Variant, efficientdet-d0 .. d7x.')
    flags.DEFINE_string('hparams', '', 'Overrides, e.g. image_size=640 (infer/input/train).')
    flags.DEFINE_string('batch_sizes', None, 'train/infer: comma-separated batch sizes '
                        '(train: global batch). Default train 2,4; infer 1,2,4,8.')
    flags.DEFINE_integer('steps', 20, 'Measured steps per batch size.', lower_bound=1)
    flags.DEFINE_integer('warmup', 5, 'Steps run before measuring.', lower_bound=0)
    flags.DEFINE_bool('use_fake_data', True, 'train: synthetic tensors instead of TFRecords.')
    flags.DEFINE_string('training_file_pattern', None, 'train without fake data: TFRecords.')
    flags.DEFINE_integer('num_ranks', 1, 'train: ranks on this box (Horovod, mpirun).',
                         lower_bound=1)
    flags.DEFINE_string('model_dir', None, 'infer: trained run directory (EMA weights).')
    flags.DEFINE_string('checkpoint', None, 'infer: checkpoint (default: latest in model_dir).')
    flags.DEFINE_bool('random_weights', False, 'infer: randomly initialised weights.')
    flags.DEFINE_string('source', 'random',
                        'infer: random | image:PATH | repeat:PATH | dir:PATH.')
    flags.DEFINE_string('postprocess', 'graph', 'infer: comma list of graph, host, none.')
    flags.DEFINE_string('file_pattern', None, 'input: TFRecords to read.')
    flags.DEFINE_integer('batch_size', 4, 'input: batch size.', lower_bound=1)
    flags.DEFINE_integer('num_batches', 50, 'input: batches to time.', lower_bound=1)
    flags.DEFINE_bool('is_training', True, 'input: the training pipeline (augmentation, '
                      'targets) rather than the eval one.')
    flags.DEFINE_string('output', None, 'suite: markdown file to write.')
    flags.DEFINE_bool('onednn', True, 'Run TensorFlow with its oneDNN CPU kernels '
                      '(TF_ENABLE_ONEDNN_OPTS=1; TF 2.15 turns them on by itself only on CPUs '
                      'with AVX512-VNNI/BF16/AMX). Applies to this process and the training runs.')
    flags.DEFINE_bool('quick', False, 'suite: few steps (checks that the suite runs; not for '
                      'numbers).')


class BenchError(ValueError):
    """A user mistake in the flags; the message names the fix."""


def parse_batch_sizes(text, default):
    try:
        sizes = [int(v) for v in (text or default).split(',') if v.strip()]
    except ValueError:
        sizes = []
    if not sizes or min(sizes) < 1:
        raise BenchError('--batch_sizes=%s must be positive integers, e.g. 1,2,4,8' % text)
    return sizes


def resolve_config():
    config = hparams_config.get_efficientdet_config(FLAGS.model_name)
    config.override(FLAGS.hparams)
    return hparams_config.validate(config)


def format_table(rows, columns):
    """Plain-text table; columns are (header, key, format)."""
    cells = [[header for header, _, _ in columns]]
    for row in rows:
        cells.append([fmt % row[key] if row.get(key) is not None else '-'
                      for _, key, fmt in columns])
    widths = [max(len(line[i]) for line in cells) for i in range(len(columns))]
    lines = ['  '.join(cell.rjust(width) for cell, width in zip(line, widths)) for line in cells]
    lines.insert(1, '  '.join('-' * width for width in widths))
    return '\n'.join(lines)


def markdown_table(header, rows, text_columns=0):
    """A markdown table of str()-ed cells; the first text_columns columns are left-aligned,
    the rest right-aligned."""
    lines = ['| ' + ' | '.join(header) + ' |',
             '|' + '|'.join(':---' if i < text_columns else '---:'
                            for i in range(len(header))) + '|']
    return '\n'.join(lines + ['| ' + ' | '.join(str(c) for c in row) + ' |' for row in rows])


def emit(result, rows, columns):
    print(format_table(rows, columns))
    print(RESULT_PREFIX + json.dumps(result, sort_keys=True), flush=True)


# ----------------------------------------------------------------------------- train

TRAIN_COLUMNS = (('batch', 'global_batch', '%d'), ('ranks', 'ranks', '%d'),
                 ('images/s/rank', 'images_per_sec_per_rank', '%.2f'),
                 ('images/s', 'images_per_sec_global', '%.2f'),
                 ('ms/step', 'step_time_ms', '%.0f'), ('p90 ms', 'step_time_p90_ms', '%.0f'),
                 ('peak host MB', 'peak_host_memory_mb', '%.0f'),
                 ('wall s', 'wall_time_sec', '%.0f'))


def train_command(batch_size, model_dir, steps, warmup):
    """The command line of one training benchmark run."""
    main_args = ['main.py', '--mode=train', '--benchmark', '--model_dir=%s' % model_dir,
                 '--model_name=%s' % FLAGS.model_name, '--train_batch_size=%d' % batch_size,
                 '--benchmark_steps=%d' % steps, '--benchmark_warmup_steps=%d' % warmup,
                 '--log_every_n_steps=%d' % (steps + warmup)]
    if FLAGS.hparams:
        main_args.append('--hparams=%s' % FLAGS.hparams)
    if FLAGS.use_fake_data:
        main_args.append('--use_fake_data')
    else:
        if not FLAGS.training_file_pattern:
            raise BenchError('--nouse_fake_data needs --training_file_pattern')
        main_args.append('--training_file_pattern=%s' % FLAGS.training_file_pattern)
    if FLAGS.num_ranks > 1:
        return [sys.executable, 'demo_efficientdet.py',
                '--use_horovod=%d' % FLAGS.num_ranks] + main_args[1:]
    return [sys.executable] + main_args


def onednn_setting():
    return '1' if FLAGS.onednn else '0'


def _child_env():
    return dict(os.environ, TF_CPP_MIN_LOG_LEVEL='2', TF_ENABLE_ONEDNN_OPTS=onednn_setting())


def parse_result_lines(output):
    """The JSON objects of every `BENCHMARK {json}` line in a process's output. Text around
    the object (mpirun --tag-output's '[1,0]<stdout>:' tags) is ignored."""
    decoder, results = json.JSONDecoder(), []
    for line in output.splitlines():
        position = line.find(RESULT_PREFIX + '{')
        if position >= 0:
            result, _ = decoder.raw_decode(line, position + len(RESULT_PREFIX))
            results.append(result)
    return results


def _train_row(batch_size, per_rank, command):
    main_result = min(per_rank, key=lambda r: r.get('rank', 0))
    row = dict(main_result, global_batch=batch_size, onednn=FLAGS.onednn,
               peak_host_memory_mb=max(r['peak_host_memory_mb'] for r in per_rank),
               command=' '.join(command))
    if len(per_rank) > 1:
        row['images_per_sec_per_rank_all'] = [r['images_per_sec_per_rank'] for r in per_rank]
    return row


def run_train_benchmark(batch_sizes, steps, warmup):
    rows = []
    for batch_size in batch_sizes:
        with tempfile.TemporaryDirectory(prefix='bench-train-') as model_dir:
            command = train_command(batch_size, model_dir, steps, warmup)
            print('$ ' + ' '.join(command), flush=True)
            result = subprocess.run(command, cwd=REPO, stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, text=True, env=_child_env())
        per_rank = parse_result_lines(result.stdout)
        if result.returncode != 0 or not per_rank:
            raise BenchError('training benchmark at batch %d failed (exit %d):\n%s'
                             % (batch_size, result.returncode, result.stdout[-3000:]))
        rows.append(_train_row(batch_size, per_rank, command))
    return rows


def cmd_train():
    rows = run_train_benchmark(parse_batch_sizes(FLAGS.batch_sizes, '2,4'), FLAGS.steps,
                               FLAGS.warmup)
    emit({'bench': 'train', 'model_name': FLAGS.model_name, 'rows': rows}, rows, TRAIN_COLUMNS)


# ----------------------------------------------------------------------------- infer

INFER_COLUMNS = (('batch', 'batch_size', '%d'), ('postprocess', 'postprocess', '%s'),
                 ('images/s', 'images_per_sec', '%.2f'), ('avg ms', 'latency_avg_ms', '%.1f'),
                 ('p50 ms', 'latency_p50_ms', '%.1f'), ('p90 ms', 'latency_p90_ms', '%.1f'),
                 ('p95 ms', 'latency_p95_ms', '%.1f'), ('p99 ms', 'latency_p99_ms', '%.1f'),
                 ('peak host MB', 'peak_host_memory_mb', '%.0f'))


def _infer_spec():
    import inference  # pylint: disable=import-outside-toplevel
    if FLAGS.model_dir:
        return inference.load_model_spec(FLAGS.model_dir, FLAGS.checkpoint, FLAGS.hparams,
                                         random_weights=FLAGS.random_weights)
    if not FLAGS.random_weights:
        raise BenchError('infer needs --model_dir=DIR (trained weights) or --random_weights')
    return inference.ModelSpec(resolve_config(), None, None)


def cmd_infer():
    import bench_infer  # pylint: disable=import-outside-toplevel
    modes = [m.strip() for m in FLAGS.postprocess.split(',') if m.strip()]
    unknown = sorted(set(modes) - set(bench_infer.POSTPROCESS_MODES))
    if unknown or not modes:
        raise BenchError('--postprocess=%s: choose from %s' % (
            FLAGS.postprocess, ', '.join(bench_infer.POSTPROCESS_MODES)))
    source = bench_infer.parse_source(FLAGS.source)
    spec = _infer_spec()
    rows = []
    for batch_size in parse_batch_sizes(FLAGS.batch_sizes, '1,2,4,8'):
        rows.extend(bench_infer.benchmark_batch_size(spec, batch_size, source, modes,
                                                     FLAGS.steps, FLAGS.warmup))
    config = spec.config
    for row in rows:
        row['onednn'] = FLAGS.onednn
    emit({'bench': 'infer', 'model_name': config.name, 'image_size': config.image_size,
          'weights': 'random' if spec.checkpoint is None else spec.checkpoint,
          'source': FLAGS.source, 'rows': rows}, rows, INFER_COLUMNS)


# ----------------------------------------------------------------------------- input

def cmd_input():
    import bench_input  # pylint: disable=import-outside-toplevel
    if not FLAGS.file_pattern:
        raise BenchError('input needs --file_pattern=GLOB of TFRecords')
    config = resolve_config()
    result = bench_input.measure(FLAGS.file_pattern, config, FLAGS.batch_size,
                                 FLAGS.num_batches, FLAGS.is_training)
    row = dict(result, batch_size=FLAGS.batch_size, is_training=FLAGS.is_training,
               image_size=config.image_size)
    columns = [(key, key, '%.2f' if isinstance(value, float) else '%s')
               for key, value in sorted(row.items()) if not isinstance(value, (list, dict))]
    emit(dict(row, bench='input', file_pattern=FLAGS.file_pattern), [row], columns)


def cmd_suite():
    import bench_suite  # pylint: disable=import-outside-toplevel
    if not FLAGS.output:
        raise BenchError('suite needs --output=docs/benchmarks-HOST.md')
    bench_suite.run_suite(FLAGS.output, quick=FLAGS.quick)


COMMANDS = {'train': cmd_train, 'infer': cmd_infer, 'input': cmd_input, 'suite': cmd_suite}


def main(argv):
    if len(argv) != 2 or argv[1] not in COMMANDS:
        raise app.UsageError('usage: bench.py {%s} --flags...' % ','.join(COMMANDS))
    # Read by TensorFlow when it initialises: set before anything imports it.
    os.environ['TF_ENABLE_ONEDNN_OPTS'] = onednn_setting()
    user_errors = [BenchError, hparams_config.ConfigError, FileNotFoundError]
    if argv[1] == 'suite':
        import bench_suite  # pylint: disable=import-outside-toplevel
        user_errors.append(bench_suite.SuiteError)
    if argv[1] == 'infer':
        import bench_infer  # pylint: disable=import-outside-toplevel
        import inference  # pylint: disable=import-outside-toplevel
        import tensorflow as tf  # pylint: disable=import-outside-toplevel
        tf.get_logger().setLevel('ERROR')  # TF1 deprecation notices drown the table.
        user_errors += [bench_infer.BenchError, inference.InferenceError]
    try:
        COMMANDS[argv[1]]()
    except tuple(user_errors) as error:
        print('error: %s' % error, file=sys.stderr)
        return 2
    return 0


if __name__ == '__main__':
    define_flags()
    app.run(main)
