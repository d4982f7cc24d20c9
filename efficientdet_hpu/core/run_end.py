"""The record that moves a running training's end (main.py --steps_file, whose graph side is
training/steps_file.py): {"total_steps": N, "warmup_steps": W, "moving_average_decay": d}
(the last two optional), written whole by another process (efficientdet-finetune) and read
by the run. Without TensorFlow, so the writer imports none."""
import json
import os
import re

from efficientdet_hpu.core import atomic_file

TOTAL_STEPS, WARMUP_STEPS, EMA_DECAY = 'total_steps', 'warmup_steps', 'moving_average_decay'
# Training runs at least this long under a budget: main.py's start-up takes 30-60 s (Lite0 on a
# busy machine: 52 s), and a stop before its first step would leave nothing to evaluate.
MIN_TRAINING_SECONDS = 180


def write(path, total_steps, warmup_steps=None, ema_decay=None):
    """The file a running main.py --steps_file=path reads (written whole: atomic rename)."""
    record = {TOTAL_STEPS: int(total_steps)}
    if warmup_steps is not None:
        record[WARMUP_STEPS] = int(warmup_steps)
    if ema_decay is not None:
        record[EMA_DECAY] = float(ema_decay)
    atomic_file.write_json_atomically(path, record)


def read(path):
    """{'total_steps': int, 'warmup_steps': int or None, 'moving_average_decay': float or
    None} of the file, or None when it is absent or not (yet) a whole, valid record."""
    try:
        with open(path, encoding='utf-8') as stream:
            record = json.load(stream)
        values = {TOTAL_STEPS: int(record[TOTAL_STEPS])}
        for key, kind in ((WARMUP_STEPS, int), (EMA_DECAY, float)):
            values[key] = None if record.get(key) is None else kind(record[key])
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    decay, warmup = values[EMA_DECAY], values[WARMUP_STEPS]
    if (values[TOTAL_STEPS] < 1 or (decay is not None and not 0.0 <= decay < 1.0)
            or (warmup is not None and warmup < 0)):
        return None
    return values


def target_steps(path, total_steps):
    """The run's last step: the file's when it holds one, else `total_steps` (the plan's)."""
    record = read(path) if path else None
    return record[TOTAL_STEPS] if record else total_steps


def newest_checkpoint(model_dir):
    """The name in model_dir's `checkpoint` index (TensorFlow's, read without importing it),
    or None."""
    try:
        with open(os.path.join(model_dir, 'checkpoint'), encoding='utf-8') as stream:
            found = re.search(r'^model_checkpoint_path: "([^"]*)"', stream.read(), re.M)
    except OSError:
        return None
    return os.path.basename(found.group(1)) if found else None


def latest_step(model_dir):
    """The step of model_dir's newest checkpoint (the number its name ends with), or None."""
    name = newest_checkpoint(model_dir)
    found = re.search(r'(\d+)$', name) if name else None
    return int(found.group(1)) if found else None
