r"""Benchmarks. Every subcommand prints a table and one line `BENCHMARK {json}`.

    python bench.py train --batch_sizes=2,4 --steps=20 --warmup=5 [--use_fake_data] \
        [--model_name=efficientdet-d0] [--hparams=...] [--num_ranks=1]
    python bench.py infer --batch_sizes=1,2,4,8 (--model_dir=DIR | --random_weights) \
        [--source=random|image:IMG|repeat:IMG|dir:DIR] [--postprocess=graph,host,none] \
        --steps=50 --warmup=5
    python bench.py infer --random_weights --batch_sizes=1 \
        --formats=saved_model,tflite_fp32,tflite_fp16,tflite_int8,onnx_fp32  (a line each)
    python bench.py input --file_pattern='data/train-*.tfrecord' --batch_size=4 \
        --num_batches=50 [--is_training]
    python bench.py suite --output=docs/benchmarks-$(hostname).md     (what `make bench` runs)
    python bench.py coco_eval --images=5000 --detections=100
    python bench.py train_and_eval [--steps=50] [--evaluations=4] [--eval_images=16] \
        [--batch_sizes=8] [--model_name=efficientdet-lite0] [--image_size=320]
    python bench.py finetune_costs [--output=PATH] [--quick]
    python bench.py finetune_suite [--sets=NAME,...] [--output=PATH] [--quick]
    python bench.py review_planted [--data=easy|synthetic|DIR] [--photos=200] [--steps=N] \
        [--folds=5] [--output_dir=runs/review_planted] [--noclean] [--quick]

train: `main.py --benchmark` per batch size in a subprocess (benchmarks/train_bench.py):
images/s per rank and global over the steps after warm-up, time per step, peak host memory.
infer: benchmarks/infer_bench.py. input: the tf.data pipeline alone (benchmarks/input_bench.py).
coco_eval: pycocotools and faster-coco-eval on one generated COCO-size detection set
(benchmarks/coco_eval_bench.py).
train_and_eval: the same short run as --mode=train_and_eval and as --mode=train, back to back
in processes of their own; both wall times, their ratio, and where each one's time went
(benchmarks/train_eval_bench.py).
finetune_costs: what each stage of efficientdet-finetune costs here (training images/s per
model and input size, start-up, evaluation, export), written as the table its plan reads
(benchmarks/finetune_costs.py). finetune_suite: the one command against the best hand recipe
on labelled sets that differ as users' data differ (benchmarks/finetune_suite.py).
review_planted: errors planted in a clean set (5% of the boxes dropped, 5% swapped, 5% shifted
to IoU 0.4-0.6), the label review on it and on the clean set, and per kind how many planted
errors the review ranks in its first 2N rows (review/planted.py, docs/review.md).
Every subcommand names the CPU first (model, cores, AVX2 / AVX-512).
"""
import os
import sys

from absl import app, flags

from efficientdet_hpu.benchmarks import report
from efficientdet_hpu.benchmarks.report import BenchError, emit, parse_batch_sizes
from efficientdet_hpu.config import recipe
from efficientdet_hpu.core import command_help
from efficientdet_hpu.core import errors
from efficientdet_hpu.core import processes

FLAGS = flags.FLAGS
STOP_GRACE_SECONDS = 60  # A benchmark run keeps nothing: a short wait for its clean end.


def define_flags():
    """Defined when bench.py runs, so importing it defines nothing."""
    flags.DEFINE_string('model_name', 'efficientdet-d0', 'Variant, efficientdet-d0 .. d7x, '
                        'efficientdet-lite0 .. lite4 (train_and_eval: efficientdet-lite0 unless '
                        'given).')
    flags.DEFINE_string('hparams', '', 'Recipe YAML and/or overrides, e.g. image_size=640 '
                        '(infer/input/train).')
    flags.DEFINE_string('image_size', None, "infer/input/train_and_eval: network input, 512 or "
                        "'WIDTHxHEIGHT' (default: the variant's; train_and_eval: 320).")
    flags.DEFINE_string('batch_sizes', None, 'train/infer: comma-separated batch sizes (train: '
                        'images per rank, as main.py --train_batch_size). Default train 2,4; '
                        'infer 1,2,4,8; train_and_eval 8 (the first only).')
    flags.DEFINE_integer('steps', 20, 'Measured steps per batch size (train_and_eval: steps '
                         'between evaluations, 50 unless given).', lower_bound=1)
    flags.DEFINE_integer('warmup', 5, 'Steps run before measuring.', lower_bound=0)
    flags.DEFINE_bool('use_fake_data', True, 'train: synthetic tensors instead of TFRecords. '
                      'input: only when given, or without --file_pattern. train_and_eval: '
                      'training on synthetic tensors, else on 64 generated images.')
    flags.DEFINE_string('training_file_pattern', None, 'train without fake data: TFRecords.')
    flags.DEFINE_integer('num_ranks', 1, 'train: ranks on this box (Horovod, mpirun).',
                         lower_bound=1)
    flags.DEFINE_string('model_dir', None, 'infer: trained run directory (EMA weights).')
    flags.DEFINE_string('checkpoint', None, 'infer: checkpoint (default: latest in model_dir).')
    flags.DEFINE_bool('random_weights', False, 'infer: randomly initialised weights.')
    flags.DEFINE_string('source', 'random',
                        'infer: random | image:PATH | repeat:PATH | dir:PATH.')
    flags.DEFINE_string('postprocess', 'graph', 'infer: comma list of graph, host, none.')
    flags.DEFINE_string('formats', None, 'infer: comma list of saved_model, tflite_fp32, '
                        'tflite_fp16, tflite_int8, onnx_fp32, each timed end to end in this '
                        'run, one BENCHMARK line per format (instead of --postprocess modes).')
    flags.DEFINE_string('file_pattern', None, 'input: TFRecords to read.')
    flags.DEFINE_integer('batch_size', 4, 'input: batch size.', lower_bound=1)
    flags.DEFINE_integer('num_batches', 50, 'input: batches to time.', lower_bound=1)
    flags.DEFINE_bool('is_training', True, 'input: the training pipeline (augmentation, '
                      'targets) rather than the eval one.')
    flags.DEFINE_string('output', None, 'suite: markdown file to write; finetune_costs: the table '
                        '(default ~/.cache/efficientdet_hpu/finetune-costs.json); '
                        'finetune_suite: a markdown report.')
    flags.DEFINE_bool('onednn', True, 'Run TensorFlow with its oneDNN CPU kernels '
                      '(TF_ENABLE_ONEDNN_OPTS=1; TF 2.15 turns them on by itself only on CPUs '
                      'with AVX512-VNNI/BF16/AMX). Applies to this process and the training runs.')
    flags.DEFINE_bool('verbose', False, "TensorFlow's own log lines, and tracebacks with "
                      'error messages.')
    flags.DEFINE_integer('images', 5000, 'coco_eval: images of the generated set.',
                         lower_bound=1)
    flags.DEFINE_integer('detections', 100, 'coco_eval: detections per image.', lower_bound=1)
    flags.DEFINE_integer('evaluations', 4, 'train_and_eval: evaluations (epochs) of the run.',
                         lower_bound=1)
    flags.DEFINE_integer('eval_images', 16, 'train_and_eval: generated validation images.',
                         lower_bound=1)
    flags.DEFINE_bool('quick', False, 'suite, finetune_costs, finetune_suite, review_planted: '
                      'few steps and images, and finetune_costs a smaller network (checks that '
                      'the command runs; not for numbers).')
    flags.DEFINE_list('sets', [], 'finetune_suite: the sets to run (default: all).')
    flags.DEFINE_string('work_dir', None, 'finetune_suite: where its data and runs are kept and '
                        'reused (default runs/finetune-suite, -quick with --quick).')
    flags.DEFINE_string('data', 'easy', 'review_planted: the clean set, easy, synthetic or a '
                        'COCO folder.')
    flags.DEFINE_integer('photos', 200, 'review_planted: photos of a generated set.',
                         lower_bound=2)
    flags.DEFINE_string('output_dir', 'runs/review_planted', 'review_planted: its sets and '
                        'reviews.')
    flags.DEFINE_integer('folds', 0, 'review_planted: the review\'s --folds.', lower_bound=0)
    flags.DEFINE_string('weights', None, 'review_planted: the review\'s --weights.')
    flags.DEFINE_float('max_minutes', 0, 'review_planted: the budget of each review.',
                       lower_bound=0)
    flags.DEFINE_bool('clean', True, 'review_planted: also review the clean set (its rows are '
                      'the false alarms; --noclean halves the time, the column stays empty).')
    flags.DEFINE_float('share', 0.05, 'review_planted: the share of the boxes of each error.',
                       lower_bound=0, upper_bound=0.3)


def resolve_config():
    return recipe.resolve(FLAGS.model_name, FLAGS.hparams, image_size=FLAGS.image_size)


# ----------------------------------------------------------------------------- train

def cmd_train():
    from efficientdet_hpu.benchmarks import train_bench  # pylint: disable=import-outside-toplevel
    rows = train_bench.run_train_benchmark(
        parse_batch_sizes(FLAGS.batch_sizes, '2,4'), FLAGS.steps, FLAGS.warmup,
        onednn=FLAGS.onednn, model_name=FLAGS.model_name, hparams=FLAGS.hparams,
        use_fake_data=FLAGS.use_fake_data, training_file_pattern=FLAGS.training_file_pattern,
        num_ranks=FLAGS.num_ranks)
    emit({'bench': 'train', 'model_name': FLAGS.model_name, 'rows': rows}, rows,
         train_bench.TRAIN_COLUMNS)


# ----------------------------------------------------------------------------- infer

INFER_COLUMNS = (('batch', 'batch_size', '%d'), ('postprocess', 'postprocess', '%s'),
                 ('images/s', 'images_per_sec', '%.2f'), ('avg ms', 'latency_avg_ms', '%.1f'),
                 ('p50 ms', 'latency_p50_ms', '%.1f'), ('p90 ms', 'latency_p90_ms', '%.1f'),
                 ('p95 ms', 'latency_p95_ms', '%.1f'), ('p99 ms', 'latency_p99_ms', '%.1f'),
                 ('peak host MB', 'peak_host_memory_mb', '%.0f'))


def _infer_spec():
    from efficientdet_hpu.serving import model_spec  # pylint: disable=import-outside-toplevel
    if FLAGS.model_dir:
        return model_spec.load_model_spec(FLAGS.model_dir, FLAGS.checkpoint, FLAGS.hparams,
                                          random_weights=FLAGS.random_weights)
    if not FLAGS.random_weights:
        raise BenchError('infer needs --model_dir=DIR (trained weights) or --random_weights')
    return model_spec.ModelSpec(resolve_config(), None, None)


def _infer_header(spec):
    return {'bench': 'infer', 'model_name': spec.config.name,
            'image_size': spec.config.image_size, 'source': FLAGS.source,
            'weights': 'random' if spec.checkpoint is None else spec.checkpoint}


def cmd_infer_formats():
    """--formats: each format end to end, one table and BENCHMARK line per format; the line's
    images_per_sec is its first batch size's."""
    from efficientdet_hpu.benchmarks import infer_bench  # pylint: disable=import-outside-toplevel
    from efficientdet_hpu.serving import tflite_export  # pylint: disable=import-outside-toplevel
    if FLAGS['postprocess'].present:
        raise BenchError('--formats times each format end to end (NMS included); drop '
                         '--postprocess=%s or --formats' % FLAGS.postprocess)
    formats = tflite_export.parse_formats(FLAGS.formats)
    if 'onnx_fp32' in formats:  # A missing package is said before anything is timed.
        from efficientdet_hpu.serving import onnx_export, onnx_runner  # pylint: disable=import-outside-toplevel
        onnx_export.import_tf2onnx()
        onnx_runner.import_onnxruntime()
    batch_sizes = parse_batch_sizes(FLAGS.batch_sizes, '1,2,4,8')
    source = infer_bench.parse_source(FLAGS.source)
    spec = _infer_spec()
    columns = (('format', 'format', '%s'),) + INFER_COLUMNS[:1] + INFER_COLUMNS[2:]
    for fmt in formats:
        rows = infer_bench.benchmark_format(spec, fmt, batch_sizes, source, FLAGS.steps,
                                            FLAGS.warmup)
        for row in rows:
            row['onednn'] = FLAGS.onednn
        emit(dict(_infer_header(spec), format=fmt, batch_size=rows[0]['batch_size'],
                  images_per_sec=rows[0]['images_per_sec'], rows=rows), rows, columns)


def cmd_infer():
    if FLAGS.formats is not None:
        cmd_infer_formats()
        return
    from efficientdet_hpu.benchmarks import infer_bench  # pylint: disable=import-outside-toplevel
    modes = [m.strip() for m in FLAGS.postprocess.split(',') if m.strip()]
    unknown = sorted(set(modes) - set(infer_bench.POSTPROCESS_MODES))
    if unknown or not modes:
        raise BenchError('--postprocess=%s: choose from %s' % (
            FLAGS.postprocess, ', '.join(infer_bench.POSTPROCESS_MODES)))
    source = infer_bench.parse_source(FLAGS.source)
    spec = _infer_spec()
    rows = []
    for batch_size in parse_batch_sizes(FLAGS.batch_sizes, '1,2,4,8'):
        rows.extend(infer_bench.benchmark_batch_size(spec, batch_size, source, modes,
                                                     FLAGS.steps, FLAGS.warmup))
    for row in rows:
        row['onednn'] = FLAGS.onednn
    emit(dict(_infer_header(spec), rows=rows), rows, INFER_COLUMNS)


# ----------------------------------------------------------------------------- input

def cmd_input():
    from efficientdet_hpu.benchmarks import input_bench  # pylint: disable=import-outside-toplevel
    use_fake_data = FLAGS.use_fake_data and (FLAGS['use_fake_data'].present
                                             or not FLAGS.file_pattern)
    if not FLAGS.file_pattern and not use_fake_data:
        raise BenchError('input needs --file_pattern=GLOB of TFRecords (or --use_fake_data)')
    config = resolve_config()
    result = input_bench.measure(FLAGS.file_pattern, config, FLAGS.batch_size,
                                 FLAGS.num_batches, FLAGS.is_training,
                                 use_fake_data=use_fake_data, warmup=FLAGS.warmup)
    row = dict(result, batch_size=FLAGS.batch_size, is_training=FLAGS.is_training,
               use_fake_data=use_fake_data, image_size=config.image_size)
    columns = [(key, key, '%.2f' if isinstance(value, float) else '%s')
               for key, value in sorted(row.items()) if not isinstance(value, (list, dict))]
    emit(dict(row, bench='input', file_pattern=FLAGS.file_pattern), [row], columns)


def cmd_suite():
    from efficientdet_hpu.benchmarks import suite  # pylint: disable=import-outside-toplevel
    if not FLAGS.output:
        raise BenchError('suite needs --output=docs/benchmarks-HOST.md')
    suite.run_suite(FLAGS.output, quick=FLAGS.quick)


def cmd_coco_eval():
    from efficientdet_hpu.benchmarks import coco_eval_bench  # pylint: disable=import-outside-toplevel
    rows = coco_eval_bench.rows(coco_eval_bench.measure(FLAGS.images, FLAGS.detections))
    emit({'bench': 'coco_eval', 'images': FLAGS.images, 'detections': FLAGS.detections,
          'rows': rows}, rows, coco_eval_bench.COLUMNS)


# train_and_eval's run when not given: issue 32's fine-tuning case (Lite0 at 320 px, batch 8,
# an evaluation every 50 steps).
TRAIN_AND_EVAL_DEFAULTS = {'model_name': 'efficientdet-lite0', 'image_size': '320',
                           'batch_sizes': '8', 'steps': 50}


def _given_or(name):
    return FLAGS[name].value if FLAGS[name].present else TRAIN_AND_EVAL_DEFAULTS[name]


def cmd_train_and_eval():
    from efficientdet_hpu.benchmarks import train_bench  # pylint: disable=import-outside-toplevel
    from efficientdet_hpu.benchmarks import train_eval_bench  # pylint: disable=import-outside-toplevel
    if FLAGS['training_file_pattern'].present:
        raise BenchError('train_and_eval trains on fake data or on generated records '
                         '(--nouse_fake_data); drop --training_file_pattern')
    result = train_eval_bench.run_pair(
        _given_or('steps'), FLAGS.evaluations, FLAGS.eval_images,
        train_bench.child_env(FLAGS.onednn), use_fake_data=FLAGS.use_fake_data,
        model_name=_given_or('model_name'), image_size=_given_or('image_size'),
        hparams=FLAGS.hparams, batch_size=parse_batch_sizes(_given_or('batch_sizes'), '8')[0])
    print(train_eval_bench.ratio_line(result))
    emit(result, result['rows'], train_eval_bench.COLUMNS)


def cmd_finetune_costs():
    from efficientdet_hpu.benchmarks import finetune_costs  # pylint: disable=import-outside-toplevel
    table = finetune_costs.measure(quick=FLAGS.quick)
    path = finetune_costs.write(table, FLAGS.output)
    print('wrote %s (the plan of efficientdet-finetune reads it on this CPU)' % path)
    emit(dict(table, bench='finetune_costs', path=path), table['training'],
         finetune_costs.COLUMNS)


def cmd_finetune_suite():
    from efficientdet_hpu.benchmarks import finetune_suite  # pylint: disable=import-outside-toplevel
    result = finetune_suite.run(FLAGS.sets, quick=FLAGS.quick, output=FLAGS.output,
                                work=FLAGS.work_dir)
    emit(result, result['rows'], finetune_suite.COLUMNS)
def cmd_review_planted():
    from efficientdet_hpu.review import planted  # pylint: disable=import-outside-toplevel
    settings = planted.settings(
        FLAGS.output_dir, FLAGS.quick, data=FLAGS.data, photos=FLAGS.photos, share=FLAGS.share,
        folds=FLAGS.folds, steps=FLAGS.steps if FLAGS['steps'].present else 0,
        model_name=FLAGS.model_name if FLAGS['model_name'].present else '',
        weights=FLAGS.weights or '', hparams=FLAGS.hparams, max_minutes=FLAGS.max_minutes,
        clean=FLAGS.clean, verbose=FLAGS.verbose)
    record = planted.benchmark(settings)
    emit(dict(record, bench='review_planted'), record['rows'], planted.COLUMNS)


COMMANDS = {'train': cmd_train, 'infer': cmd_infer, 'input': cmd_input, 'suite': cmd_suite,
            'coco_eval': cmd_coco_eval, 'train_and_eval': cmd_train_and_eval,
            'finetune_costs': cmd_finetune_costs, 'finetune_suite': cmd_finetune_suite,
            'review_planted': cmd_review_planted}


# What a stop keeps, by command: the two that keep their runs' work under their folders go on.
KEPT_AT_A_STOP = {
    None: 'its runs were ended and no result is kept (results are printed and written once '
          'every run has ended); rerun the same command to measure',
    'finetune_suite': 'the sides that finished are kept in --work_dir (the table is printed '
                      'once every side has run); rerun the same command to go on',
    'review_planted': 'its reviews keep the folds trained and the step reached in '
                      '--output_dir (the table is printed once both have run); rerun the same '
                      'command to go on',
}


def main(argv):
    errors.check_command(argv, COMMANDS)
    if len(argv) != 2 or argv[1] not in COMMANDS:
        raise app.UsageError('usage: bench.py {%s} --flags...' % ','.join(COMMANDS))
    # Read by TensorFlow when it initialises: set before anything imports it.
    os.environ['TF_ENABLE_ONEDNN_OPTS'] = '1' if FLAGS.onednn else '0'
    from efficientdet_hpu.core import tf_env  # pylint: disable=import-outside-toplevel
    tf_env.quiet_python_logging(FLAGS.verbose)
    user_errors = [errors.UserError, FileNotFoundError]
    if argv[1] == 'suite':
        from efficientdet_hpu.benchmarks import suite  # pylint: disable=import-outside-toplevel
        user_errors.append(suite.SuiteError)
    print('CPU: %s' % report.cpu_description(), flush=True)
    try:
        # SIGTERM, SIGINT, SIGHUP: passed on to the benchmark run in progress (main.py and
        # the launcher end at it), its temporary folder removed; then one line and 128+N.
        with processes.stops_forwarded('bench.py', STOP_GRACE_SECONDS):
            COMMANDS[argv[1]]()
    except processes.Stopped as stop:
        stop.where = '`bench.py %s`' % argv[1]
        stop.kept = KEPT_AT_A_STOP.get(argv[1], KEPT_AT_A_STOP[None])
        print(stop.line('bench.py'), file=sys.stderr, flush=True)
        return stop.exit_status
    except tuple(user_errors) as error:
        return errors.fail('bench.py', error, FLAGS.verbose)
    return 0


def entry_point():
    """Parses the command line and runs the command (the module's `main`)."""
    define_flags()
    command_help.install(__name__, subcommands=COMMANDS)
    app.run(main, flags_parser=errors.parse_flags)


if __name__ == '__main__':
    entry_point()
