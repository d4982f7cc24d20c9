"""`bench.py train`: `main.py --benchmark` in a subprocess per batch size (under
demo_efficientdet.py --use_horovod N when num_ranks > 1), so the memory figures are the training
process's own; reads the BENCHMARK line engine/throughput.py prints."""
import os
import subprocess
import sys
import tempfile

from efficientdet_hpu.benchmarks import profile_summary
from efficientdet_hpu.benchmarks.report import REPO, STEP_SECONDS, BenchError
from efficientdet_hpu.benchmarks.report import parse_result_lines
from efficientdet_hpu.core import processes

TRAIN_COLUMNS = (('batch/rank', 'batch_per_rank', '%d'), ('ranks', 'ranks', '%d'),
                 ('global batch', 'global_batch', '%d'),
                 ('images/s/rank', 'images_per_sec_per_rank', '%.2f'),
                 ('images/s', 'images_per_sec_global', '%.2f'),
                 ('ms/step', 'step_time_ms', '%.0f'), ('p90 ms', 'step_time_p90_ms', '%.0f'),
                 ('fwd %', 'forward_percent', '%.0f'), ('bwd %', 'backward_percent', '%.0f'),
                 ('opt+EMA %', 'update_percent', '%.0f'), ('input %', 'input_percent', '%.0f'),
                 ('peak host MB', 'peak_host_memory_mb', '%.0f'),
                 # Process start to the end of the first step; the first step alone.
                 ('start-up s', 'startup_sec', '%.0f'),
                 ('first step s', 'first_step_sec', '%.0f'),
                 ('wall s', 'wall_time_sec', '%.0f'))


def train_command(batch_size, model_dir, steps, warmup, *, model_name, hparams='',
                  use_fake_data=True, training_file_pattern=None, num_ranks=1):
    """The command line of one training benchmark run."""
    main_args = ['main.py', '--mode=train', '--benchmark', '--model_dir=%s' % model_dir,
                 '--model_name=%s' % model_name, '--train_batch_size=%d' % batch_size,
                 '--benchmark_steps=%d' % steps, '--benchmark_warmup_steps=%d' % warmup,
                 '--log_every_n_steps=%d' % (steps + warmup)]
    if warmup >= 2:  # The last warm-up step is traced (not a measured one, not the first).
        main_args.append('--profile_steps=%d,%d' % (warmup, warmup))
    if hparams:
        main_args.append('--hparams=%s' % hparams)
    if use_fake_data:
        main_args.append('--use_fake_data')
    else:
        if not training_file_pattern:
            raise BenchError('--nouse_fake_data needs --training_file_pattern')
        main_args.append('--training_file_pattern=%s' % training_file_pattern)
    if num_ranks > 1:
        return [sys.executable, 'demo_efficientdet.py',
                '--use_horovod=%d' % num_ranks] + main_args[1:]
    return [sys.executable] + main_args


def child_env(onednn):
    """Environment of a benchmark subprocess: TensorFlow's C++ notices off, oneDNN as asked."""
    return dict(os.environ, TF_CPP_MIN_LOG_LEVEL='2', TF_ENABLE_ONEDNN_OPTS='1' if onednn else '0')


def _train_row(batch_size, per_rank, command, onednn):
    main_result = min(per_rank, key=lambda r: r.get('rank', 0))
    accumulated = main_result.get('accumulation_steps', 1)  # --hparams=gradient_accumulation_steps
    row = dict(main_result, batch_per_rank=batch_size,
               global_batch=batch_size * len(per_rank) * accumulated,
               onednn=onednn,
               peak_host_memory_mb=max(r['peak_host_memory_mb'] for r in per_rank),
               command=' '.join(command))
    if len(per_rank) > 1:
        row['images_per_sec_per_rank_all'] = [r['images_per_sec_per_rank'] for r in per_rank]
    return row


def step_split(model_dir):
    """Where the traced step's op time went, from the profiler trace under model_dir/profile
    (benchmarks/profile_summary.py): percent forward, backward, optimizer + EMA and input
    pipeline; {} when no trace was taken."""
    try:
        parts = profile_summary.summarize(profile_summary.find_trace(
            os.path.join(model_dir, 'profile')), steps=1)['parts']
    except (profile_summary.ProfileError, OSError):
        return {}
    split = {}
    for key, group in (('forward', 'forward'), ('backward', 'backward'),
                       ('update', 'update'), ('input', 'input')):
        split[key + '_percent'] = sum(p['percent'] for p in parts if p['group'] == group)
    return split


def run_train_benchmark(batch_sizes, steps, warmup, onednn=True, **command_options):
    """One row per batch size; command_options: train_command's keyword arguments."""
    rows = []
    for batch_size in batch_sizes:
        with tempfile.TemporaryDirectory(prefix='bench-train-') as model_dir:
            command = train_command(batch_size, model_dir, steps, warmup, **command_options)
            print('$ ' + ' '.join(command), flush=True)
            try:
                result = processes.run(command, STEP_SECONDS, cwd=REPO, env=child_env(onednn))
            except subprocess.TimeoutExpired:
                raise BenchError('training benchmark at batch %d did not end in %d s; it was '
                                 'stopped: %s' % (batch_size, STEP_SECONDS, ' '.join(command)))
            split = step_split(model_dir) if result.returncode == 0 else {}
        per_rank = parse_result_lines(result.stdout)
        if result.returncode != 0 or not per_rank:
            raise BenchError('training benchmark at batch %d failed (exit %d):\n%s'
                             % (batch_size, result.returncode, result.stdout[-3000:]))
        rows.append(dict(_train_row(batch_size, per_rank, command, onednn), **split))
    return rows
