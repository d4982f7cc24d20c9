"""`bench.py train_and_eval`: what train_and_eval's evaluations cost a training run.

The same short run twice, back to back, each a main.py process under a deadline
(core/processes.py): `--mode=train_and_eval` (N evaluations, one every S steps, of V generated
validation images) and `--mode=train` of the same steps and flags. Both wall times (process
start to exit, measured here) and their ratio, each process's CPU time, peak host memory and
where its wall time went (the run's `wall_time` record in its train_log.jsonl,
engine/wall_time.py).
"""
import json
import os
import sys
import tempfile

from efficientdet_hpu.benchmarks import report
from efficientdet_hpu.benchmarks.report import BenchError
from efficientdet_hpu.core import processes

COLUMNS = (('mode', 'mode', '%s'), ('wall s', 'process_wall_sec', '%.1f'),
           ('CPU s', 'cpu_sec', '%.1f'), ('start-up s', 'startup_sec', '%.1f'),
           ('steps s', 'steps_sec', '%.1f'), ('evaluations s', 'evaluations_sec', '%.1f'),
           ('checkpoints s', 'checkpoints_sec', '%.1f'), ('other s', 'other_sec', '%.1f'),
           ('peak host MB', 'peak_host_memory_mb', '%.0f'))
MODES = ('train_and_eval', 'train')


def make_records(directory, num_val, num_train=0):
    """Generated images (dataset.synthetic_coco) converted to TFRecords under directory;
    returns {'val_pattern', 'val_json', 'train_pattern' (None without training images)}."""
    from efficientdet_hpu.datatools import synthetic_coco  # pylint: disable=import-outside-toplevel
    synthetic_coco.generate(directory, num_train=num_train, num_val=num_val, seed=0)
    found = {'train_pattern': None}
    for split in ('val', 'train') if num_train else ('val',):
        annotations = os.path.join(directory, 'annotations', 'instances_%s.json' % split)
        prefix = os.path.join(directory, 'records', split)
        command = [sys.executable, '-m', 'dataset.create_coco_tfrecord',
                   '--image_dir=%s' % os.path.join(directory, split),
                   '--object_annotations_file=%s' % annotations,
                   '--output_file_prefix=%s' % prefix, '--num_shards=1']
        result = processes.run(command, report.STEP_SECONDS, cwd=report.REPO)
        if result.returncode != 0:
            raise BenchError('`%s` failed (exit %d):\n%s' % (
                ' '.join(command), result.returncode, result.stdout[-3000:]))
        found[split + '_pattern'] = prefix + '-*.tfrecord'
        if split == 'val':
            found['val_json'] = annotations
    return found


def main_flags(model_dir, records, *, model_name, image_size, hparams, batch_size,
               steps_per_eval, evaluations):
    """main.py's flags, the mode's excepted, of the run both modes make."""
    overrides = ','.join(part for part in ('image_size=%s' % image_size, hparams) if part)
    flags = ['--model_dir=%s' % model_dir, '--model_name=%s' % model_name,
             '--hparams=%s' % overrides, '--train_batch_size=%d' % batch_size,
             '--eval_batch_size=%d' % batch_size,
             '--num_examples_per_epoch=%d' % (steps_per_eval * batch_size),
             '--num_epochs=%d' % evaluations, '--log_every_n_steps=%d' % steps_per_eval,
             '--validation_file_pattern=%s' % records['val_pattern'],
             '--val_json_file=%s' % records['val_json']]
    if records['train_pattern']:
        return flags + ['--training_file_pattern=%s' % records['train_pattern']]
    return flags + ['--use_fake_data']


def _wall_time_record(model_dir):
    with open(os.path.join(model_dir, 'train_log.jsonl')) as f:
        found = [json.loads(line) for line in f if '"wall_time"' in line]
    if not found:
        raise BenchError('the run in %s wrote no wall_time record' % model_dir)
    return found[-1]


def run_mode(mode, flags, env):
    """One main.py process of `mode`; its row: the wall_time record, the process's wall time
    (start to exit) and its command."""
    command = [sys.executable, 'main.py', '--mode=%s' % mode] + flags
    wall, _ = report.run_step(command, env)
    model_dir = next(f.split('=', 1)[1] for f in flags if f.startswith('--model_dir='))
    return dict(_wall_time_record(model_dir), process_wall_sec=wall, command=' '.join(command))


def run_pair(steps_per_eval, evaluations, eval_images, env, use_fake_data=True, **run_options):
    """Both runs, train_and_eval first; returns the result (rows, ratios, the CPU)."""
    rows = []
    with tempfile.TemporaryDirectory(prefix='bench-train-and-eval-') as directory:
        records = make_records(os.path.join(directory, 'data'), eval_images,
                               num_train=0 if use_fake_data else 64)
        for mode in MODES:
            model_dir = os.path.join(directory, mode)
            rows.append(run_mode(mode, main_flags(
                model_dir, records, steps_per_eval=steps_per_eval, evaluations=evaluations,
                **run_options), env))
    both, alone = rows
    return {'bench': 'train_and_eval', 'cpu': report.cpu_description(), 'rows': rows,
            'steps': steps_per_eval * evaluations, 'steps_per_evaluation': steps_per_eval,
            'evaluations': both['evaluations'], 'eval_images': eval_images,
            'wall_ratio': both['process_wall_sec'] / alone['process_wall_sec'],
            'cpu_ratio': both['cpu_sec'] / alone['cpu_sec'],
            'extra_wall_sec': both['process_wall_sec'] - alone['process_wall_sec'],
            'use_fake_data': use_fake_data, **run_options}


def ratio_line(result):
    """'train_and_eval / train: wall 1.25x (+30.1 s), CPU 1.20x; 4 evaluations ...'."""
    both = result['rows'][0]
    return ('train_and_eval / train: wall %.2fx (%+.1f s), CPU %.2fx; %d evaluations of %d '
            'images, one every %d steps: %.1f s (%.1f s each)' % (
                result['wall_ratio'], result['extra_wall_sec'], result['cpu_ratio'],
                result['evaluations'], result['eval_images'], result['steps_per_evaluation'],
                both['evaluations_sec'], both['evaluations_sec'] / max(1, both['evaluations'])))
