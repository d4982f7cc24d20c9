"""What a resumed run tells the user: the schedule that changed since the checkpoint's run
(another rank count or per-card batch changes the global batch, hence the scaled learning rate,
the steps per epoch and the total steps), and a run that has nothing left to train.

The schedule of each run is model_dir/schedule.json, written by rank 0 at start (engine/setup.py)
from config/settings.schedule_record."""
import json
import os

from efficientdet_hpu.core import atomic_file

SCHEDULE_FILE = 'schedule.json'
# (key, what the line calls it, format)
_FIELDS = (('global_batch', 'global batch', '%d'), ('learning_rate', 'learning rate', '%.4g'),
           ('steps_per_epoch', 'steps per epoch', '%d'), ('total_steps', 'total steps', '%d'))


def read_schedule(model_dir):
    """The previous run's schedule record, or None (none written, or unreadable)."""
    try:
        with open(os.path.join(model_dir, SCHEDULE_FILE), encoding='utf-8') as stream:
            record = json.load(stream)
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def write_schedule(model_dir, record):
    atomic_file.write_json_atomically(os.path.join(model_dir, SCHEDULE_FILE), record)


def _ranks_times_batch(record):
    return '%s x %s' % (record.get('ranks'), record.get('per_rank_batch'))


def change_line(previous, current, checkpoint):
    """One line of what changes from the checkpoint's run when its global batch changes
    (another rank count or batch per rank), else None.
    previous/current: schedule records; checkpoint: the prefix resumed from."""
    if not previous or previous.get('global_batch') == current['global_batch']:
        return None  # More epochs alone are the usual way to go on: nothing to point out.
    changes = ['%s %s -> %s' % (label, fmt % previous[key], fmt % current[key])
               for key, label, fmt in _FIELDS
               if key in previous and _differs(previous[key], current[key])]
    return ('resuming %s with another schedule than its run: %s (ranks x batch per rank %s -> '
            '%s)' % (os.path.basename(checkpoint), ', '.join(changes),
                     _ranks_times_batch(previous), _ranks_times_batch(current)))


def _differs(before, after):
    if isinstance(before, float) or isinstance(after, float):
        return abs(float(before) - float(after)) > 1e-9 * max(abs(float(before)), 1e-12)
    return before != after


def nothing_to_train_line(checkpoint, step, total_steps):
    """The line of a training run whose checkpoint is at (or past) its last step."""
    where = 'at' if step == total_steps else 'past'
    return ('%s is already %s the last step (%d of %d): nothing to train; raise --num_epochs '
            'to go on' % (os.path.basename(checkpoint), where, step, total_steps))
