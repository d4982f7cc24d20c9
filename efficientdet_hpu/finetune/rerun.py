"""What a rerun of the fine-tune on an existing --output_dir reuses, redoes or refuses.

The saved request (request.json) is compared by what changes the result: the data (--data,
--val_data, --val_photos, --single_class), the model, the weights, --steps and --hparams
(less the log spacing, LOG_KEYS). The budget (--max_minutes, --images_per_second) is an input
of the plan, not of the result: before training has written a checkpoint a changed budget
plans again; after, the plan (plan.json) stands and the new budget bounds this run only.

The data stage is keyed on the input's files (their paths, sizes and modification times:
data/input_files.json): a changed folder is read again, and
  - the same photos and boxes: the split and the plan stand (the records are converted again
    unless a model was trained on them);
  - other photos or boxes: the split, the data doctor, the plan and the records are redone,
    unless model/ holds a checkpoint: that model learnt the old data, so the run is refused,
    naming the command that starts afresh in another folder.
A changed result key with nothing trained plans again; with a checkpoint it is refused, naming
the command that resumes (the saved flags). A refused rerun writes nothing.
"""
import os
import shlex
import shutil

from efficientdet_hpu.config import hparams_config
from efficientdet_hpu.core import run_end

# model_dir's newest checkpoint step (its `checkpoint` index), or None.
latest_step = run_end.latest_step

DATA_KEYS = ('data', 'val_data', 'val_photos', 'single_class')
RESULT_KEYS = DATA_KEYS + ('weights', 'model_name', 'steps', 'hparams')
BUDGET_KEYS = ('max_minutes', 'images_per_second')
LOG_KEYS = ('log_every_n_steps',)  # --hparams that change how often it logs, not the result.
FLAG_ORDER = ('data', 'val_data', 'val_photos', 'single_class', 'drop_orphan_labels',
              'weights', 'model_name', 'max_minutes', 'images_per_second', 'steps', 'hparams')
SHOWN_FILES = 3


def _hparams(text, with_logs):
    values = hparams_config.parse_override_string(text or '')
    return values if with_logs else {k: v for k, v in values.items() if k not in LOG_KEYS}


def changes(saved, wanted, keys, with_logs=False):
    """[(key, saved value, wanted value)] of `keys` that differ ('hparams' compared parsed,
    without LOG_KEYS unless with_logs); a key a saved request lacks counts as its default."""
    found = []
    for key in keys:
        was, now = saved.get(key, _DEFAULTS.get(key)), wanted.get(key, _DEFAULTS.get(key))
        if key == 'hparams':
            if _hparams(was, with_logs) != _hparams(now, with_logs):
                found.append((key, was, now))
        elif was != now:
            found.append((key, was, now))
    return found


_DEFAULTS = {'val_data': '', 'val_photos': [], 'single_class': '', 'weights': '',
             'model_name': '', 'steps': 0, 'hparams': '', 'max_minutes': 0.0,
             'images_per_second': 0.0, 'drop_orphan_labels': False}


def describe(found) -> str:
    """"model_name: was '', now 'efficientdet-d0'; steps: was 0, now 2"."""
    return '; '.join('%s: was %r, now %r' % item for item in found)


def search_undecided(layout) -> bool:
    """True while a search is under way (finetune/search.py): its candidates written, no
    search.json yet. model/ then holds the last candidate's training, if any, not the run's: a
    rerun searches again."""
    return (os.path.isdir(layout.path('candidates'))
            and not os.path.exists(layout.path('search.json')))


def trained_step(layout):
    """The step of the run's newest checkpoint in model/, or None (none, or a search's)."""
    return None if search_undecided(layout) else latest_step(layout.model_dir)


def command_line(request, output_dir) -> str:
    """`python finetune.py --data=... --output_dir=...` asking `request` (request.json's keys;
    defaults left out)."""
    parts = ['python', 'finetune.py']
    for key in FLAG_ORDER:
        value = request.get(key, _DEFAULTS.get(key))
        if key == 'data':
            parts.append('--data=%s' % shlex.quote(value))
            parts.append('--output_dir=%s' % shlex.quote(output_dir))
        elif value == _DEFAULTS.get(key) or value in ('', None):
            continue
        elif value is True:
            parts.append('--' + key)
        else:
            text = ','.join(value) if isinstance(value, list) else '%g' % value if isinstance(
                value, float) else str(value)
            parts.append('--%s=%s' % (key, shlex.quote(text)))
    return ' '.join(parts)


def fresh_dir(root) -> str:
    """root-2 (or -3, ...): a folder that does not exist yet, beside root."""
    number = 2
    while os.path.exists('%s-%d' % (root.rstrip('/'), number)):
        number += 1
    return '%s-%d' % (root.rstrip('/'), number)


def input_files(roots, extra=(), skip=()):
    """{absolute path: [size, mtime_ns]} of every file under `roots` (folders walked, files
    as they are; hidden names and the folders in `skip`, such as --output_dir, left out) and
    of the `extra` files (photos a COCO JSON names outside its folder). A missing file is
    left out: removed."""
    found, skip = {}, {os.path.abspath(path) for path in skip}

    def add(path):
        try:
            stat = os.stat(path)
        except OSError:
            return
        found[path] = [stat.st_size, stat.st_mtime_ns]
    for root in roots:
        root = os.path.abspath(root)
        if os.path.isfile(root):
            add(root)
        for directory, subdirectories, names in os.walk(root):
            subdirectories[:] = sorted(name for name in subdirectories if not name.startswith('.')
                                       and os.path.join(directory, name) not in skip)
            for name in names:
                if not name.startswith('.'):
                    add(os.path.join(directory, name))
    for path in extra:
        if path not in found:
            add(os.path.abspath(path))
    return found


def files_change(old, new) -> str:
    """'1 file removed (bad.jpg); 2 added (a.jpg, b.jpg); 1 changed (instances.json)' or ''."""
    parts = []
    for what, paths in (('removed', sorted(set(old) - set(new))),
                        ('added', sorted(set(new) - set(old))),
                        ('changed', sorted(p for p in set(old) & set(new) if old[p] != new[p]))):
        if paths:
            shown = ', '.join(os.path.basename(path) for path in paths[:SHOWN_FILES])
            parts.append('%d%s %s (%s%s)' % (
                len(paths), ' file' + ('' if len(paths) == 1 else 's') if not parts else '', what,
                shown, ', ...' if len(paths) > SHOWN_FILES else ''))
    return '; '.join(parts)


def clear(layout, data=False):
    """Removes what a new plan (and with `data` a new split) makes stale: plan.json, plan.yaml,
    the doctor's files, the records, a model/ without a checkpoint (main.py's config.yaml there
    would refuse another model); with `data` also the split and the input's fingerprint.
    Never a checkpoint: callers refuse a rerun whose model/ has one."""
    assert trained_step(layout) is None, 'clear() on a trained model_dir'
    paths = [layout.plan_json, layout.plan_yaml, layout.doctor_input, layout.doctor_json,
             layout.records, layout.model_dir, layout.path('candidates'),
             layout.path('search.json')]  # The search's candidates were of the old plan.
    if data:
        paths += [layout.inputs_json, input_files_json(layout), layout.train_json,
                  layout.val_json, layout.val_photos]
    for path in paths:
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        elif os.path.lexists(path):
            os.remove(path)


def input_files_json(layout) -> str:
    return layout.path('data', 'input_files.json')
