"""`main.py --benchmark`: trains warm-up + measured steps and reports throughput as one
`BENCHMARK {json}` line (bench.py train reads it) and model_dir/benchmark_train.json."""
import json
import os
import time

import numpy as np
import tensorflow as tf

from efficientdet_hpu.core import atomic_file
from efficientdet_hpu.runtime import distributed
from efficientdet_hpu.engine import hooks
from efficientdet_hpu.engine import train_log
from efficientdet_hpu.engine.setup import train_input_fn

tf1 = tf.compat.v1


class StepTimerHook(tf1.train.SessionRunHook):
    """Wall time of each run() call."""

    def __init__(self):
        self.durations = []
        self.first_step_done_sec = None  # Process age when the first step ended.

    def before_run(self, run_context):
        self._start = time.perf_counter()

    def after_run(self, run_context, run_values):
        self.durations.append(time.perf_counter() - self._start)
        if self.first_step_done_sec is None:
            self.first_step_done_sec = train_log.process_age_sec()


def benchmark_summary(durations, warmup_steps, per_rank_batch, world):
    """Throughput over the steps after warm-up."""
    measured = np.asarray(durations[warmup_steps:], np.float64)
    if measured.size == 0:
        raise ValueError('no steps measured after %d warm-up steps' % warmup_steps)
    step_time = float(measured.mean())
    return {'steps': int(measured.size), 'warmup_steps': warmup_steps,
            'step_time_ms': step_time * 1e3,
            'step_time_p50_ms': float(np.percentile(measured, 50)) * 1e3,
            'step_time_p90_ms': float(np.percentile(measured, 90)) * 1e3,
            'images_per_sec_per_rank': per_rank_batch / step_time,
            'images_per_sec_global': per_rank_batch * world / step_time,
            'per_rank_batch': per_rank_batch, 'ranks': world}


def run_benchmark(run):
    """Trains warm-up + benchmark_steps steps and reports throughput (JSON line)."""
    options = run.options
    timer = StepTimerHook()
    start = time.time()
    steps = options.benchmark_warmup_steps + options.benchmark_steps
    train_hooks = [timer] + hooks.make_training_hooks(run, steps)
    run.estimator.train(train_input_fn(run), steps=steps, hooks=train_hooks)
    # A step trains every accumulated micro-batch: images per step and rank = b x K.
    summary = benchmark_summary(timer.durations, options.benchmark_warmup_steps,
                                run.settings.batch.step_size, distributed.size())
    current, peak = train_log.host_memory_mb()
    summary.update(mode='train', model_name=run.config.name, image_size=run.config.image_size,
                   accumulation_steps=run.settings.batch.accumulation_steps,
                   use_fake_data=options.use_fake_data,
                   compute_dtype=run.settings.runtime.compute_dtype,
                   wall_time_sec=time.time() - start, peak_host_memory_mb=peak,
                   startup_sec=timer.first_step_done_sec, first_step_sec=timer.durations[0],
                   rank=distributed.rank())
    print('BENCHMARK ' + json.dumps(summary, sort_keys=True), flush=True)
    if distributed.is_main():
        atomic_file.write_json_atomically(os.path.join(options.model_dir, 'benchmark_train.json'),
                                          summary, sort_keys=True)
    return 0
