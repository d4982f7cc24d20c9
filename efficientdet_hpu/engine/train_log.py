"""The run's own records in model_dir: the JSON log (one object a line: train steps, evaluations)
and the host memory CSV, plus the memory probe that feeds them.

Lines are appended, so a crash can at worst cut the last line short; readers skip it.
"""
import json
import os
import resource
import time

import tensorflow as tf

from efficientdet_hpu.core import json_log

JSON_LOG = json_log.JSON_LOG
MEMORY_CSV = 'memory.csv'


def append_json_log(model_dir, record):
    """Appends one JSON object as one line."""
    with open(os.path.join(model_dir, JSON_LOG), 'a') as f:
        f.write(json.dumps(record, sort_keys=True) + '\n')


def read_json_log(model_dir):
    """Returns the records of model_dir's JSON log, skipping a torn last line."""
    return json_log.read(model_dir)


def training_final_step(model_dir):
    """The final step the latest training in model_dir ran towards (its last 'train' record's
    total_steps in the JSON log, or the step of an 'early_stop' record after it), or None
    when the log has none."""
    final = None
    for record in read_json_log(model_dir):
        if record.get('event') == 'train' and record.get('total_steps'):
            final = int(record['total_steps'])
        elif record.get('event') == 'early_stop':
            final = int(record['step'])
    return final


def host_memory_mb():
    """(current RSS, peak RSS) of this process in MiB."""
    with open('/proc/self/statm') as f:
        rss_pages = int(f.read().split()[1])
    current = rss_pages * os.sysconf('SC_PAGE_SIZE') / 2.0 ** 20
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    return current, peak


def process_age_sec():
    """Seconds since this process started (Linux /proc), or None where that is unknown."""
    try:
        with open('/proc/self/stat') as f:
            start_ticks = int(f.read().rsplit(')', 1)[1].split()[19])
        with open('/proc/uptime') as f:
            uptime = float(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return uptime - start_ticks / os.sysconf('SC_CLK_TCK')


def device_memory_mb():
    """Peak device memory where the device reports it (GPU/HPU), else None."""
    for device in tf.config.list_logical_devices():
        if device.device_type in ('GPU', 'HPU'):
            try:
                info = tf.config.experimental.get_memory_info(device.name)
                return info['peak'] / 2.0 ** 20
            except (ValueError, tf.errors.OpError):
                return None
    return None


def append_memory_csv(model_dir, step, current, peak, device_peak):
    path = os.path.join(model_dir, MEMORY_CSV)
    new = not os.path.exists(path)
    with open(path, 'a') as f:
        if new:
            f.write('step,time,host_rss_mb,host_peak_rss_mb,device_peak_mb\n')
        f.write('%d,%.1f,%.1f,%.1f,%s\n' % (step, time.time(), current, peak,
                                            '' if device_peak is None else '%.1f' % device_peak))

