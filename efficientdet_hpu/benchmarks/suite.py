"""`bench.py suite` (what `make bench` runs): the standard measurements of this machine as a
markdown report.

EfficientDet-D0 at 512 px: training on fake data at global batch 2 and 4; inference with
random weights at batch 1, 2, 4, 8 with in-graph post-processing, plus host and no
post-processing at batch 1; each export format at batch 1 (SavedModel, TFLite, ONNX); the
input pipeline at batch 4 over a few hundred real JPEG TFRecords generated into a temporary
directory (dataset.synthetic_coco + the converter).
Each measurement is a `bench.py` subprocess whose exact command is listed in the report.
"""
import datetime
import os
import platform
import socket
import subprocess
import sys
import tempfile

from efficientdet_hpu.benchmarks import report
from efficientdet_hpu.core import atomic_file
from efficientdet_hpu.core import processes
from efficientdet_hpu.serving import formats as export_formats

# google/automl efficientdet (TF2) measured on this 2-core machine, for comparison.
REFERENCE = {
    'train': {2: (1.56, 3.7), 4: (1.30, 5.0)},  # images/s, peak host GB
    'infer_batch1_images_per_sec': 7.5,  # end to end incl. NMS (0.13 s per image)
}


class SuiteError(RuntimeError):
    """One of the suite's benchmark runs failed; the message names its command."""


EXPORT_FORMATS = export_formats.FORMATS  # Every format inference.py exports.
FULL = dict(train_steps=10, train_warmup=3, infer_steps=50, infer_warmup=5, input_images=300,
            input_batches=60, formats=EXPORT_FORMATS)
QUICK = dict(train_steps=2, train_warmup=1, infer_steps=3, infer_warmup=1, input_images=12,
             input_batches=4, formats=('tflite_fp32',))


def _run_bench(args):
    """Runs `bench.py args...`; returns (command string with the 1-minute load average before
    it, parsed JSON result)."""
    load = os.getloadavg()[0]
    command = [sys.executable, 'bench.py'] + args
    print('$ ' + ' '.join(command), flush=True)
    result = _run(command, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL='2'))
    print(result.stdout[-4000:], flush=True)
    parsed = report.parse_result_lines(result.stdout)
    if result.returncode != 0 or not parsed:
        raise SuiteError('`%s` failed (exit %d)' % (' '.join(command), result.returncode))
    return 'python bench.py %s    # load %.2f' % (' '.join(args), load), parsed[-1]


def _make_records(directory, num_images):
    """Generates num_images synthetic JPEGs and converts them; returns the shard pattern."""
    from efficientdet_hpu.datatools import synthetic_coco  # pylint: disable=import-outside-toplevel
    synthetic_coco.generate(directory, num_train=num_images, num_val=1, seed=0)
    prefix = os.path.join(directory, 'records', 'train')
    command = [sys.executable, '-m', 'dataset.create_coco_tfrecord',
               '--image_dir=%s' % os.path.join(directory, 'train'),
               '--object_annotations_file=%s' % os.path.join(directory, 'annotations',
                                                             'instances_train.json'),
               '--output_file_prefix=%s' % prefix, '--num_shards=4']
    result = _run(command)
    if result.returncode != 0:
        raise SuiteError('`%s` failed (exit %d):\n%s' % (' '.join(command), result.returncode,
                                                          result.stdout[-3000:]))
    return prefix + '-*.tfrecord'


def _run(command, env=None):
    """One step of the suite, under report.STEP_SECONDS' deadline."""
    try:
        return processes.run(command, report.STEP_SECONDS, cwd=report.REPO, env=env)
    except subprocess.TimeoutExpired:
        raise SuiteError('`%s` did not end in %d s; it was stopped' % (
            ' '.join(command), report.STEP_SECONDS)) from None


def machine_info():
    model, cores = 'unknown', os.cpu_count()
    try:
        with open('/proc/cpuinfo') as f:
            for line in f:
                if line.startswith('model name'):
                    model = line.split(':', 1)[1].strip()
                    break
    except OSError:
        pass
    import numpy  # pylint: disable=import-outside-toplevel
    import tensorflow  # pylint: disable=import-outside-toplevel
    memory_gb = os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2.0 ** 30
    return {'host': socket.gethostname(), 'cpu': model, 'cores': cores,
            'memory_gb': round(memory_gb, 1), 'python': platform.python_version(),
            'tensorflow': tensorflow.__version__, 'numpy': numpy.__version__,
            'os': platform.platform()}


def _onednn(row):
    return 'on' if row.get('onednn', True) else 'off'


def _train_section(results):
    rows = []
    for result in results:
        for row in result['rows']:
            reference = REFERENCE['train'].get(row['global_batch'], (None, None))
            split = ['%.0f' % row[key + '_percent'] if key + '_percent' in row else '-'
                     for key in ('forward', 'backward', 'update', 'input')]
            rows.append([row['global_batch'], _onednn(row),
                         '%.2f' % row['images_per_sec_global'], '%.0f' % row['step_time_ms']]
                        + split + ['%.2f' % (row['peak_host_memory_mb'] / 1024),
                                   _seconds(row.get('startup_sec')),
                                   _seconds(row.get('first_step_sec')),
                                   reference[0] or '-', reference[1] or '-'])
    header = ['global batch', 'oneDNN', 'images/s', 'ms/step', 'fwd %', 'bwd %', 'opt+EMA %',
              'input %', 'peak host GB', 'start-up s', 'first step s', 'automl images/s',
              'automl peak GB']
    return report.markdown_table(header, rows)


def _infer_section(results):
    rows = []
    for result in results:
        for row in result['rows']:
            rows.append([row['batch_size'], row['postprocess'], _onednn(row),
                         '%.2f' % row['images_per_sec'], '%.1f' % row['latency_avg_ms'],
                         '%.1f' % row['latency_p50_ms'], '%.1f' % row['latency_p90_ms'],
                         '%.1f' % row['latency_p95_ms'], '%.1f' % row['latency_p99_ms'],
                         '%.2f' % (row['peak_host_memory_mb'] / 1024)])
    header = ['batch', 'post-processing', 'oneDNN', 'images/s', 'latency avg ms', 'p50 ms',
              'p90 ms', 'p95 ms', 'p99 ms', 'peak host GB']
    return report.markdown_table(header, rows)


def _seconds(value):
    return '-' if value is None else '%.0f' % value


def _formats_section(result):
    rows = [[row['format'], '%.2f' % row['images_per_sec'], '%.1f' % row['latency_avg_ms'],
             '%.1f' % row['latency_p50_ms'], '%.1f' % row['latency_p90_ms'],
             '%.1f' % row['latency_p99_ms'], '%.2f' % (row['peak_host_memory_mb'] / 1024),
             '%.0f' % row['graph_build_sec']] for row in result]
    header = ['format', 'images/s', 'latency avg ms', 'p50 ms', 'p90 ms', 'p99 ms',
              'peak host GB', 'build/convert s']
    return report.markdown_table(header, rows)


def _input_section(result):
    keys = [k for k in sorted(result) if k not in ('bench', 'file_pattern')
            and not isinstance(result[k], (list, dict))]
    return report.markdown_table(keys, [[('%.2f' % result[k]) if isinstance(result[k], float)
                                        else result[k] for k in keys]])


def _measure(settings, records_dir):
    def steps(kind):
        return ['--steps=%d' % settings[kind + '_steps'],
                '--warmup=%d' % settings[kind + '_warmup']]
    train = ['train', '--use_fake_data'] + steps('train')
    runs = {'train': [_run_bench(train + ['--batch_sizes=2,4']),
                      _run_bench(train + ['--batch_sizes=2', '--noonednn'])]}
    infer = ['infer', '--random_weights', '--source=random'] + steps('infer')
    runs['infer'] = [
        _run_bench(infer + ['--batch_sizes=1', '--postprocess=graph,host,none']),
        _run_bench(infer + ['--batch_sizes=2,4,8', '--postprocess=graph']),
        _run_bench(infer + ['--batch_sizes=1', '--postprocess=graph', '--noonednn'])]
    runs['formats'] = [_run_bench(infer + ['--batch_sizes=1', '--formats=%s' % fmt])
                       for fmt in settings['formats']]
    pattern = _make_records(records_dir, settings['input_images'])
    runs['input'] = _run_bench(['input', '--file_pattern=%s' % pattern, '--batch_size=4',
                                '--num_batches=%d' % settings['input_batches'],
                                '--is_training'])
    return runs


def _header(info, settings):
    return [
        '# Benchmarks: %s' % info['host'], '',
        'Measured %s by `make bench` (`bench.py suite`%s). EfficientDet-D0, 512x512, float32.'
        % (datetime.datetime.now().strftime('%Y-%m-%d %H:%M'),
           ' --quick: too few steps for real numbers' if settings is QUICK else ''), '',
        '- Machine: %s, %s logical cores, %s GB RAM, %s' % (
            info['cpu'], info['cores'], info['memory_gb'], info['os']),
        '- Versions: Python %s, TensorFlow %s, NumPy %s' % (
            info['python'], info['tensorflow'], info['numpy']),
        '- Load average (1 min) when the suite started: %.2f, when it ended: %.2f, and before '
        'each command (under Commands). The suite itself adds about one per busy core; other '
        'work on the machine would slow every number below.'
        % (info['load_before'], info.get('load_after', float('nan'))),
        '- oneDNN: `TF_ENABLE_ONEDNN_OPTS=1` unless the row says off (bench.py --noonednn); '
        'TensorFlow 2.15 leaves oneDNN off by default on CPUs without AVX512-VNNI/BF16/AMX.', '']


def render(runs, info, settings):
    """The markdown report."""
    input_cmd, input_result = runs['input']
    batch1 = [r for r in runs['infer'][0][1]['rows'] if r['postprocess'] == 'graph'][0]
    commands = ([c for c, _ in runs['train']] + [c for c, _ in runs['infer']]
                + [c for c, _ in runs['formats']] + [input_cmd])
    formats = [row for _, result in runs['formats'] for row in result['rows']]
    return '\n'.join(_header(info, settings) + [
        '## Training (fake data, mean over %d steps after %d warm-up steps)'
        % (settings['train_steps'], settings['train_warmup']), '',
        _train_section([r for _, r in runs['train']]), '',
        'Peak host memory is the training process\'s maximum resident set size. fwd/bwd/'
        'opt+EMA/input %: where the op time of the last warm-up step went (profiler trace). '
        'Start-up s: process start to the end of the first step (graph building, session '
        'creation, the first step itself); first step s: that step alone. google/automl\'s '
        'start-up here: 60-75 s.', '',
        'Where a training step\'s time goes, and what would buy the next 1.5x: '
        '[dev/training-step-profile.md](dev/training-step-profile.md).', '',
        '## Inference (random weights, random 512x512 uint8 input, %d timed batches)'
        % settings['infer_steps'], '',
        'Wall time of `session.run` per batch: in-graph resize + normalise, network and, for '
        '`graph`, decode + per-class NMS; `host` fetches the raw outputs and runs decode + NMS '
        'in NumPy; `none` stops at the raw outputs. Images/s = batch / mean latency. Peak '
        'host GB: the benchmark process\'s maximum resident set size so far (batch 1 runs in '
        'its own process; batches 2, 4, 8 share one, in that order).', '',
        _infer_section([r for _, r in runs['infer']]), '',
        'Batch 1 end to end incl. NMS: %.2f images/s (%.0f ms); google/automl on this machine: '
        '%.1f images/s (130 ms).' % (batch1['images_per_sec'], batch1['latency_avg_ms'],
                                     REFERENCE['infer_batch1_images_per_sec']), '',
        '## Export formats (batch 1, end to end: preprocessing, network, post-processing)',
        '', 'Each format timed in its own process on the same random input, post-processing '
        'the config\'s (per-class soft-NMS; with random weights every anchor passes the score '
        'threshold). TFLite: XNNPACK on every core; ONNX: onnxruntime CPU, then the TFLite '
        'post-processing file.', '', _formats_section(formats), '',
        '## Input pipeline (training preprocessing, 512 px, batch 4, %d generated JPEGs)'
        % settings['input_images'], '', _input_section(input_result), '',
        '## Commands', '',
        'Run from the repository root with `.venv/bin/python`; the input records were '
        'generated into a temporary directory (dataset.synthetic_coco, then '
        'dataset.create_coco_tfrecord with 4 shards).', '', '```'] + commands + ['```', ''])


def run_suite(output, quick=False):
    settings = QUICK if quick else FULL
    info = dict(machine_info(), load_before=os.getloadavg()[0])
    with tempfile.TemporaryDirectory(prefix='bench-suite-') as records_dir:
        runs = _measure(settings, records_dir)
    info['load_after'] = os.getloadavg()[0]
    text = render(runs, info, settings)
    atomic_file.write_text_atomically(output, text)
    print(text)
    print(report.RESULT_PREFIX + '{"bench": "suite", "output": "%s"}' % output, flush=True)
