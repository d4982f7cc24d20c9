"""Damaged checkpoints: a data file cut by a node that died mid-copy, an index that is missing
or unreadable, a tensor the index names that the data files do not hold.

`damage(prefix)` reads the index and every tensor (TensorFlow checks each tensor's size and
CRC32C against the index as it reads it), so a checkpoint it passes restores. That reads the
whole data file once: measured in docs/troubleshooting.md (a 300 MB checkpoint: well under a
few seconds). Training (`recover`) moves a damaged newest checkpoint aside and resumes from the
newest intact one of `checkpoint`'s list; evaluation and export name the damaged file.
"""
import os

import tensorflow as tf
from absl import logging

from efficientdet_hpu.checkpoints import checkpoints

tf1 = tf.compat.v1

DAMAGED_DIR = 'damaged'  # model_dir/damaged: where training moves a damaged checkpoint.


def _first_line(error):
    text = str(getattr(error, 'message', '') or error).strip().splitlines()
    return text[0] if text else type(error).__name__


def damage(prefix):
    """Why the checkpoint `prefix` (e.g. model_dir/model.ckpt-20) cannot be restored, as a few
    words naming the file; None when every tensor reads back whole."""
    index = prefix + '.index'
    if not tf.io.gfile.exists(index):
        return 'its index %s is missing' % os.path.basename(index)
    try:
        reader = tf.train.load_checkpoint(prefix)
        names = sorted(reader.get_variable_to_shape_map())
    except Exception as error:  # pylint: disable=broad-except
        return 'its index %s is unreadable (%s)' % (os.path.basename(index), _first_line(error))
    for name in names:
        try:
            reader.get_tensor(name)
        except Exception as error:  # pylint: disable=broad-except
            # TensorFlow's reader raises IndexError for a cut file, OpErrors for bad bytes.
            files = sorted(tf.io.gfile.glob(prefix + '.data-*'))
            data = ', '.join('%s (%d bytes)' % (os.path.basename(path),
                                                tf.io.gfile.stat(path).length) for path in files)
            return 'tensor %s cannot be read from %s: %s' % (
                name, data or 'its data file (none there)', _first_line(error))
    return None


def listed_checkpoints(model_dir):
    """Checkpoint prefixes `model_dir/checkpoint` lists, newest first (its
    model_checkpoint_path first, whether or not the files are there)."""
    try:
        state = tf1.train.get_checkpoint_state(model_dir)
    except (tf.errors.OpError, ValueError):
        return []
    if state is None or not state.model_checkpoint_path:
        return []
    # get_checkpoint_state already puts model_dir before the file's relative paths (joining
    # again gave runs/demo/runs/demo/model.ckpt-N for a relative --model_dir).
    listed = [state.model_checkpoint_path] + list(reversed(state.all_model_checkpoint_paths))
    return list(dict.fromkeys(listed))


def _missing_tensors(prefix, older):
    """Tensors an older intact checkpoint of the run holds that `prefix` lacks (the same run
    saves the same variables each time)."""
    try:
        have = set(tf.train.load_checkpoint(prefix).get_variable_to_shape_map())
        had = set(tf.train.load_checkpoint(older).get_variable_to_shape_map())
    except (tf.errors.OpError, ValueError):
        return []
    return sorted(had - have)


def newest_intact(model_dir):
    """(newest intact checkpoint prefix or None, [(damaged prefix, why)] newer than it)."""
    listed = listed_checkpoints(model_dir)
    damaged = []
    for position, prefix in enumerate(listed):
        why = damage(prefix)
        if why is None and position + 1 < len(listed):
            missing = _missing_tensors(prefix, listed[position + 1])
            if missing:
                why = 'it lacks tensor %s that %s holds' % (
                    missing[0], os.path.basename(listed[position + 1]))
        if why is None:
            return prefix, damaged
        damaged.append((prefix, why))
    return None, damaged


def describe(damaged):
    return '; '.join('%s is damaged: %s' % (os.path.basename(p), why) for p, why in damaged)


def recover(model_dir):
    """Before a training run resumes (rank 0): a damaged newest checkpoint is moved to
    model_dir/damaged and `checkpoint` is rewritten to list the intact ones, so the Estimator
    resumes from the newest intact checkpoint. Returns a line saying so, or None when the newest
    is intact (or there is none). Raises CheckpointError when none is intact."""
    intact, damaged = newest_intact(model_dir)
    if not damaged:
        return None
    if intact is None:
        raise checkpoints.CheckpointError(
            '--model_dir=%s holds no intact checkpoint (%s); restore a copy of one, or move '
            'them away to train from the start' % (model_dir, describe(damaged)))
    aside = os.path.join(model_dir, DAMAGED_DIR)
    os.makedirs(aside, exist_ok=True)
    for prefix, _ in damaged:
        for path in tf.io.gfile.glob(prefix + '.*'):
            os.replace(path, os.path.join(aside, os.path.basename(path)))
    older = [p for p in listed_checkpoints(model_dir) if p not in dict(damaged)]
    tf1.train.update_checkpoint_state(
        model_dir, os.path.basename(intact),
        all_model_checkpoint_paths=[os.path.basename(p) for p in reversed(older)])
    return '%s (moved to %s); resuming from %s' % (describe(damaged), aside,
                                                   os.path.basename(intact))


def check_for_reading(checkpoint, argument=None):
    """Raises CheckpointError naming `checkpoint` when it is damaged (evaluation, export);
    the message names the newest intact checkpoint beside it, if any: to pass as `argument`
    (a format of one path: '--checkpoint=%s' for a flag, "checkpoint='%s'" in Python), or
    (argument None) to move the damaged one aside for."""
    why = damage(checkpoint)
    if why is None:
        return
    intact, _ = newest_intact(os.path.dirname(checkpoint))
    if intact is None or intact == checkpoint:
        hint = 'restore a copy of it'
    elif argument:
        hint = 'pass %s (the newest intact checkpoint there) or restore a copy' % (
            argument % intact)
    else:
        hint = ('restore a copy, or move its files aside to use %s (the newest intact one '
                'there)' % os.path.basename(intact))
    raise checkpoints.CheckpointError('%s is damaged: %s; %s' % (checkpoint, why, hint))
