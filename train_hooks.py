"""Session hooks of a training run: the log line and JSON log, host memory CSV, the profiler
window, and the --benchmark measurement.

Only rank 0 writes files; every rank logs (other ranks to stderr with their rank tag).
"""
import json
import os
import resource
import time

import numpy as np
import tensorflow as tf
from absl import logging

import det_model_fn
import runtime

tf1 = tf.compat.v1

JSON_LOG = 'train_log.jsonl'
MEMORY_CSV = 'memory.csv'


def append_json_log(model_dir, record):
    """Appends one JSON object as one line (a crash can at worst cut the last line short)."""
    with open(os.path.join(model_dir, JSON_LOG), 'a') as f:
        f.write(json.dumps(record, sort_keys=True) + '\n')


def read_json_log(model_dir):
    """Returns the records of model_dir's JSON log, skipping a torn last line."""
    records = []
    path = os.path.join(model_dir, JSON_LOG)
    if not os.path.exists(path):
        return records
    with open(path) as f:
        for line in f:
            try:
                records.append(json.loads(line))
            except ValueError:
                continue
    return records


def host_memory_mb():
    """(current RSS, peak RSS) of this process in MiB."""
    with open('/proc/self/statm') as f:
        rss_pages = int(f.read().split()[1])
    current = rss_pages * os.sysconf('SC_PAGE_SIZE') / 2.0 ** 20
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    return current, peak


def _device_memory_mb():
    """Peak device memory where the device reports it (GPU/HPU), else None."""
    for device in tf.config.list_logical_devices():
        if device.device_type in ('GPU', 'HPU'):
            try:
                info = tf.config.experimental.get_memory_info(device.name)
                return info['peak'] / 2.0 ** 20
            except (ValueError, tf.errors.OpError):
                return None
    return None


def weights_checksum():
    """float64 sum of |w| over the trainable variables (one number to compare across ranks)."""
    return tf.add_n([tf.reduce_sum(tf.abs(tf.cast(v, tf.float64)))
                     for v in tf1.trainable_variables()])


class TrainLogHook(tf1.train.SessionRunHook):
    """Every n steps: step, losses, learning rate, images/s and ETA, to the log and as JSON."""

    def __init__(self, model_dir, global_batch, total_steps, every_n_steps, write_files,
                 last_step=None):
        """total_steps: the run's final step (for the ETA); last_step: where this train()
        call stops (always logged)."""
        self._model_dir, self._global_batch = model_dir, global_batch
        self._total_steps, self._every_n = total_steps, max(1, every_n_steps)
        self._last_step = last_step or total_steps
        self._write_files = write_files
        self._last_time = self._last_step = None

    def begin(self):
        self._scalars = tf1.get_collection(det_model_fn.TRAIN_LOG_COLLECTION)
        self._step = tf1.train.get_global_step()
        self._checksum = weights_checksum()

    def end(self, session):
        # Every rank logs it: equal values show the ranks ended with identical weights.
        step, checksum = session.run([self._step, self._checksum])
        logging.info('final weights at step %d: checksum %.12e', step, checksum)

    def before_run(self, run_context):
        return tf1.train.SessionRunArgs([self._step, self._scalars])

    def after_run(self, run_context, run_values):
        step, scalars = run_values.results
        step += 1  # The value fetched is from before this step's update.
        now = time.time()
        if self._last_time is None:
            self._last_time, self._last_step = now, step
            return
        if step % self._every_n and step != self._last_step:
            return
        self._log(step, scalars, now)

    def _log(self, step, scalars, now):
        steps_per_sec = (step - self._last_step) / max(now - self._last_time, 1e-9)
        self._last_time, self._last_step = now, step
        record = dict(zip(det_model_fn.TRAIN_LOG_KEYS, (float(v) for v in scalars)))
        current, peak = host_memory_mb()
        record.update(event='train', step=int(step), time=now,
                      images_per_sec=steps_per_sec * self._global_batch,
                      eta_sec=(self._total_steps - step) / max(steps_per_sec, 1e-9),
                      host_memory_mb=current, peak_host_memory_mb=peak)
        logging.info('step %d/%d loss %.4f (cls %.4f box %.5f) lr %.5f %.2f images/s ETA %s',
                     step, self._total_steps, record['loss'], record['cls_loss'],
                     record['box_loss'], record['learning_rate'], record['images_per_sec'],
                     _format_seconds(record['eta_sec']))
        if self._write_files:
            append_json_log(self._model_dir, record)
            _append_memory_csv(self._model_dir, step, current, peak, _device_memory_mb())
            writer = tf1.summary.FileWriterCache.get(self._model_dir)
            writer.add_summary(tf1.Summary(value=[tf1.Summary.Value(
                tag='train/images_per_sec', simple_value=record['images_per_sec'])]), step)


def _append_memory_csv(model_dir, step, current, peak, device_peak):
    path = os.path.join(model_dir, MEMORY_CSV)
    new = not os.path.exists(path)
    with open(path, 'a') as f:
        if new:
            f.write('step,time,host_rss_mb,host_peak_rss_mb,device_peak_mb\n')
        f.write('%d,%.1f,%.1f,%.1f,%s\n' % (step, time.time(), current, peak,
                                            '' if device_peak is None else '%.1f' % device_peak))


def _format_seconds(seconds):
    seconds = int(seconds)
    return '%d:%02d:%02d' % (seconds // 3600, seconds % 3600 // 60, seconds % 60)


class ProfilerWindowHook(tf1.train.SessionRunHook):
    """Traces this process's training steps START..END (1-based, inclusive) with the TensorFlow
    profiler into logdir, readable in TensorBoard's profile tab."""

    def __init__(self, start, end, logdir):
        self._start, self._end, self._logdir = start, end, logdir
        self._count, self._active = 0, False

    def before_run(self, run_context):
        self._count += 1
        if self._count == self._start:
            tf.profiler.experimental.start(self._logdir)
            self._active = True

    def after_run(self, run_context, run_values):
        if self._count == self._end:
            self.end(None)

    def end(self, session):
        if self._active:
            tf.profiler.experimental.stop()
            self._active = False
            logging.info('profiler trace of steps %d..%d written under %s',
                         self._start, self._end, self._logdir)


def parse_profile_steps(text):
    """'START,END' -> (start, end) with 1 <= start <= end."""
    try:
        start, end = (int(v) for v in text.split(','))
    except ValueError:
        raise ValueError('--profile_steps=%s must be START,END, e.g. 10,15' % text)
    if not 1 <= start <= end:
        raise ValueError('--profile_steps=%s needs 1 <= START <= END' % text)
    return start, end


class NonFiniteLossError(RuntimeError):
    """The loss or the gradients stopped being finite; weights were left untouched."""


class FiniteGuardHook(tf1.train.SessionRunHook):
    """Stops training with NonFiniteLossError at the first step whose loss or gradients are
    not finite. The graph skipped that step's update, so the weights (and any checkpoint
    written later) are the last good ones. Passed to Estimator.train() so it runs before the
    Estimator's own NanTensorHook, which would only raise a bare traceback."""

    def begin(self):
        self._finite, self._loss = tf1.get_collection(det_model_fn.FINITE_GUARD_COLLECTION)
        self._step = tf1.train.get_global_step()

    def before_run(self, run_context):
        return tf1.train.SessionRunArgs([self._finite, self._loss, self._step])

    def after_run(self, run_context, run_values):
        finite, loss, step = run_values.results
        if not finite:
            raise NonFiniteLossError(
                'loss became %s at step %d (the update of that step was skipped); the last '
                'good checkpoint is kept in model_dir. Lower learning_rate or check the data.'
                % (loss, step + 1))


def make_training_hooks(run, max_steps):
    flags = run.flags
    hooks = [FiniteGuardHook(), TrainLogHook(flags.model_dir, flags.train_batch_size,
                          max(run.total_steps, max_steps), flags.log_every_n_steps,
                          write_files=runtime.is_main(), last_step=max_steps)]
    if flags.profile_steps and runtime.is_main():
        start, end = parse_profile_steps(flags.profile_steps)
        hooks.append(ProfilerWindowHook(start, end, os.path.join(flags.model_dir, 'profile')))
    return hooks


class StepTimerHook(tf1.train.SessionRunHook):
    """Wall time of each run() call."""

    def __init__(self):
        self.durations = []

    def before_run(self, run_context):
        self._start = time.perf_counter()

    def after_run(self, run_context, run_values):
        self.durations.append(time.perf_counter() - self._start)


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
    from run_setup import train_input_fn  # Deferred: run_setup imports this module.
    flags = run.flags
    timer = StepTimerHook()
    start = time.time()
    hooks = [timer] + make_training_hooks(run, flags.benchmark_warmup_steps + flags.benchmark_steps)
    run.estimator.train(train_input_fn(run),
                        steps=flags.benchmark_warmup_steps + flags.benchmark_steps, hooks=hooks)
    summary = benchmark_summary(timer.durations, flags.benchmark_warmup_steps,
                                run.params['batch_size'], runtime.size())
    current, peak = host_memory_mb()
    summary.update(mode='train', model_name=run.config.name, image_size=run.config.image_size,
                   use_fake_data=flags.use_fake_data, compute_dtype=run.params['compute_dtype'],
                   wall_time_sec=time.time() - start, peak_host_memory_mb=peak, rank=runtime.rank())
    print('BENCHMARK ' + json.dumps(summary, sort_keys=True), flush=True)
    if runtime.is_main():
        with open(os.path.join(flags.model_dir, 'benchmark_train.json'), 'w') as f:
            json.dump(summary, f, indent=1, sort_keys=True)
    return 0
