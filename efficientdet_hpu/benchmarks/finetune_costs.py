"""`bench.py finetune_costs`: what each stage of `efficientdet-finetune` costs on this machine,
measured, as the table its plan reads (finetune/costs.py).

On generated photos (dataset.synthetic_coco: 160-320 px, 4 classes), each step a process of
its own under a deadline, timed from its start to its exit:
  - the converter (images/s) and the data doctor (seconds);
  - `main.py --benchmark` on the converted records for each model and input size of the grid
    (training images/s at batch 8 over the steps after warm-up, and the start-up: the process's
    start to its first step done);
  - two short `main.py --mode=train_and_eval` runs of 2 evaluations each, of a quarter of the
    validation photos and of all: an evaluation's fixed seconds and its images/s, as a multiple
    of training's (`inference_speedup`); the converter's two splits likewise give its start-up
    and images/s;
  - `inference.py predict` on the validation photos and the error analysis (cli/analyze) of its
    detections, `inference.py export` as SavedModel then TFLite fp32: seconds each.
Writes the table as JSON (default ~/.cache/efficientdet_hpu/finetune-costs.json, which the
plan reads on this CPU) with the CPU, the date and the load average at the start.
"""
import json
import os
import pprint
import sys
import tempfile
import time

from efficientdet_hpu.benchmarks import report
from efficientdet_hpu.benchmarks.report import BenchError
from efficientdet_hpu.benchmarks import train_eval_bench
from efficientdet_hpu.core import atomic_file

# (model, input sizes): the plan's sizes for Lite0 (finetune/plan.py SIZE_LADDER) and each
# larger variant at its own size; the others are interpolated or scaled by multiply-adds.
GRID = (('efficientdet-lite0', (128, 192, 256, 320, 384, 512)),
        ('efficientdet-lite1', (384,)), ('efficientdet-lite2', (448,)),
        ('efficientdet-d0', (512,)))
QUICK_GRID = (('efficientdet-lite0', (128,)),)
# --quick checks that the command runs, not its figures: Lite0's backbone with a small BiFPN and
# heads on levels 3-5, so that each of its main.py processes starts in about half the time.
QUICK_NETWORK = ('min_level=3,max_level=5,fpn_num_filters=16,fpn_cell_repeats=1,'
                 'box_class_repeats=1')
BATCH = 8
MEASURE_SECONDS = 40  # Measured steps per entry: about this long at the expected rate.
EVAL_IMAGES, TRAIN_IMAGES = 32, 64
USER_TABLE = os.path.join('~', '.cache', 'efficientdet_hpu', 'finetune-costs.json')
MODULE_HEADER = ('"""The cost table shipped with the package (finetune/costs.py reads it where no '
                 'table measured on\nthis CPU is found). Written by `python bench.py '
                 'finetune_costs\n--output=efficientdet_hpu/finetune/cost_table.py` (the wheel '
                 'holds only Python modules)."""\n')


def _timed(command, env, what):
    """Runs `command` from the repository root; returns (seconds, its output)."""
    return report.run_step(command, env, what)


def _two_points(small, large, seconds_small, seconds_large):
    """(fixed seconds, items/s) of a cost `fixed + items / rate` timed at two item counts."""
    extra = max(seconds_large - seconds_small, 1e-3)
    rate = min(1000.0, max(0.5, (large - small) / extra))
    return max(0.0, seconds_small - small / rate), rate


def make_data(directory, env, num_train, num_val):
    """Generated photos converted to records, each split timed: (paths, converter start-up
    seconds, converter images/s, doctor seconds)."""
    from efficientdet_hpu.datatools import synthetic_coco  # pylint: disable=import-outside-toplevel
    paths = synthetic_coco.generate(directory, num_train=num_train, num_val=num_val, seed=0)
    seconds = {}
    for split in ('train', 'val'):
        seconds[split], _ = _timed([
            sys.executable, '-m', 'dataset.create_coco_tfrecord',
            '--image_dir=%s' % paths[split + '_image_dir'],
            '--object_annotations_file=%s' % paths[split + '_annotations'],
            '--output_file_prefix=%s' % os.path.join(directory, 'records', split),
            '--num_shards=2'], env, 'the converter')
    fixed, rate = _two_points(num_val, num_train, seconds['val'], seconds['train'])
    doctor, _ = _timed([sys.executable, '-m', 'dataset.doctor',
                        '--annotations=%s' % paths['train_annotations'],
                        '--model_name=efficientdet-lite0', '--advise=aspect_ratios,anchor_scale',
                        '--report_json=%s' % os.path.join(directory, 'doctor.json')],
                       env, 'the data doctor')
    paths.update(train_pattern=os.path.join(directory, 'records', 'train-*.tfrecord'),
                 val_pattern=os.path.join(directory, 'records', 'val-*.tfrecord'))
    return paths, fixed, rate, doctor


def _expected_rate(model, size):
    """A first guess (images/s) to size the measured steps: Lite0 at 320 px trains about 10
    images/s on 2 cores; others by multiply-adds and pixels."""
    flops = {'efficientdet-lite0': 0.99, 'efficientdet-lite1': 2.01,
             'efficientdet-lite2': 3.43, 'efficientdet-d0': 2.54}.get(model, 5.0)
    native = {'efficientdet-lite1': 384, 'efficientdet-lite2': 448,
              'efficientdet-d0': 512}.get(model, 320)
    return 10.0 * 0.99 / flops * (native / float(size)) ** 2


def training_rate(model, size, paths, env, quick):
    """One `main.py --benchmark` on the records: {model, image_size, images_per_second,
    startup_seconds, peak_host_memory_mb}."""
    steps = 3 if quick else max(5, min(40, int(MEASURE_SECONDS * _expected_rate(model, size)
                                               / BATCH)))
    warmup = 1 if quick else 3
    with tempfile.TemporaryDirectory(prefix='finetune-costs-') as model_dir:
        _, output = _timed([
            sys.executable, 'main.py', '--mode=train', '--benchmark',
            '--model_dir=%s' % model_dir, '--model_name=%s' % model,
            '--train_batch_size=%d' % BATCH, '--benchmark_steps=%d' % steps,
            '--benchmark_warmup_steps=%d' % warmup, '--log_every_n_steps=%d' % (steps + warmup),
            '--training_file_pattern=%s' % paths['train_pattern'],
            '--hparams=image_size=%d%s' % (size, ',' + QUICK_NETWORK if quick else '')], env,
            'training %s at %d px' % (model, size))
    found = report.parse_result_lines(output)
    if not found:
        raise BenchError('training %s at %d px printed no BENCHMARK line:\n%s' % (
            model, size, output[-3000:]))
    result = found[0]
    return {'model': model, 'image_size': size,
            'images_per_second': round(result['images_per_sec_global'], 3),
            'startup_seconds': round(result['startup_sec'], 1),
            'peak_host_memory_mb': round(result['peak_host_memory_mb'])}


def _evaluations(paths, model_dir, env, size, steps, eval_samples, quick):
    """A train_and_eval run of 2 evaluations: (seconds per evaluation, training images/s)."""
    flags = train_eval_bench.main_flags(
        model_dir, {'train_pattern': paths['train_pattern'], 'val_pattern': paths['val_pattern'],
                    'val_json': paths['val_annotations']},
        model_name='efficientdet-lite0', image_size=size,
        hparams=QUICK_NETWORK if quick else '', batch_size=BATCH,
        steps_per_eval=steps, evaluations=2)
    row = train_eval_bench.run_mode('train_and_eval', flags + ['--eval_samples=%d' % eval_samples],
                                    env)
    return (row['evaluations_sec'] / max(1, row['evaluations']),
            BATCH * row['training_steps'] / max(row['steps_sec'], 1e-6))


def stage_costs(paths, directory, env, quick):
    """The evaluation in the session (two short train_and_eval runs of Lite0, evaluating a
    quarter of the validation images and all of them), the whole-photo prediction, the
    analysis and the export of the second run's model."""
    size, steps = (128, 2) if quick else (320, 10)
    with open(paths['val_annotations']) as stream:
        images = len(json.load(stream)['images'])
    model_dir = os.path.join(directory, 'run')
    few = max(1, images // 4)
    seconds_few, _ = _evaluations(paths, os.path.join(directory, 'few'), env, size, steps, few,
                                  quick)
    seconds_all, train_rate = _evaluations(paths, model_dir, env, size, steps, images, quick)
    fixed, eval_rate = _two_points(few, images, seconds_few, seconds_all)
    output = os.path.join(directory, 'predict')
    predict, _ = _timed([sys.executable, 'inference.py', 'predict', '--model_dir=%s' % model_dir,
                         '--input=%s' % paths['val_image_dir'], '--output_dir=%s' % output,
                         '--annotations_file=%s' % paths['val_annotations']], env,
                        'inference.py predict')
    analysis, _ = _timed([sys.executable, '-m', 'efficientdet_hpu.cli.analyze',
                          '--detections_json=%s' % os.path.join(output, 'detections.json'),
                          '--val_json_file=%s' % paths['val_annotations'],
                          '--image_dir=%s' % paths['val_image_dir'], '--max_dets=0',
                          '--worst=1', '--output_dir=%s' % os.path.join(output, 'analysis')],
                         env, 'the error analysis')
    export = 0.0
    for formats in ('saved_model', 'tflite_fp32'):
        seconds, _ = _timed([sys.executable, 'inference.py', 'export',
                             '--model_dir=%s' % model_dir,
                             '--export_dir=%s' % os.path.join(directory, 'export'),
                             '--formats=%s' % formats], env, 'inference.py export')
        export += seconds
    return {'evaluation_fixed_seconds': round(fixed, 2),
            'inference_speedup': round(eval_rate / train_rate, 3),
            'predict_seconds': round(max(1.0, predict - images / eval_rate), 1),
            'analysis_seconds': round(analysis, 1), 'export_seconds': round(export, 1),
            'evaluation_seconds': [round(seconds_few, 2), round(seconds_all, 2)],
            'evaluation_images': [few, images], 'evaluation_model': 'efficientdet-lite0',
            'evaluation_image_size': size,
            'train_and_eval_images_per_second': round(train_rate, 3)}


def load_average():
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None


def measure(quick=False, grid=None):
    """The table (a dict, finetune/costs.py's format)."""
    from efficientdet_hpu.benchmarks import train_bench  # pylint: disable=import-outside-toplevel
    env = train_bench.child_env(True)
    load = load_average()
    started = time.time()
    with tempfile.TemporaryDirectory(prefix='finetune-costs-') as directory:
        paths, convert_fixed, convert_rate, doctor = make_data(
            os.path.join(directory, 'data'), env, 16 if quick else TRAIN_IMAGES,
            8 if quick else EVAL_IMAGES)
        rows = [training_rate(model, size, paths, env, quick)
                for model, sizes in (grid or (QUICK_GRID if quick else GRID)) for size in sizes]
        stages = stage_costs(paths, directory, env, quick)
    stages.update(convert_seconds=round(convert_fixed, 1),
                  convert_images_per_second=round(convert_rate, 2), doctor_seconds=round(doctor, 1))
    return {'machine': report.cpu_description(), 'cores': os.cpu_count(),
            'date': time.strftime('%Y-%m-%d'), 'command': 'python bench.py finetune_costs' + (
                ' --quick' if quick else ''),
            'load_average_at_start': load, 'load_average_at_end': load_average(),
            'minutes': round((time.time() - started) / 60.0, 1), 'quick': quick,
            'training': rows, 'stages': stages}


COLUMNS = (('model', 'model', '%s'), ('px', 'image_size', '%d'),
           ('images/s', 'images_per_second', '%.2f'), ('start-up s', 'startup_seconds', '%.0f'),
           ('peak host MB', 'peak_host_memory_mb', '%.0f'))


def write(table, output=None):
    """Writes the table (JSON; a Python module, TABLE = {...}, when `output` ends in .py: the
    form the package ships, finetune/cost_table.py); returns its path."""
    path = os.path.expanduser(output or USER_TABLE)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    if path.endswith('.py'):
        atomic_file.write_text_atomically(path, MODULE_HEADER + 'TABLE = %s\n' % pprint.pformat(
            table, width=96, sort_dicts=False))
    else:
        atomic_file.write_json_atomically(path, table, indent=1)
    return path
