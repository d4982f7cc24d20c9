"""Writes tests/fixtures/automl_training.{npz,json}: google/automl's own training steps.

Runs automl's Estimator code (det_model_fn.efficientdet_model_fn, its input processor and
anchor labeler, its learning-rate functions) from a checkout of its `efficientdet` directory,
on automl's D0 checkpoint (../shared/automl_ckpt, non-EMA variables and their EMA shadows) and
two generated 512x512 images with ten boxes: a tiny box only the forced match catches, the
same box twice with two classes, a whole-image box and a box on the right and bottom edges
(both clipped to 511), a crowd box per image (labelled as an ordinary box, automl's
skip_crowd_during_training=false). It records the targets per level, the loss components,
the gradient norms per variable and globally (before clipping) and automl's logged
`gradient_norm` (after clipping), then weights, batch-norm statistics and EMA shadows
(sampled) after one and after three SGD-momentum steps on that batch, and the learning rate of
a cosine and a stepwise COCO recipe at the steps that matter. Two runs, the second with each
network input value moved by one float32 unit in the last place (random signs): their
difference is automl's own float32 spread, stored per variable, from which
tests/test_automl_training.py sets its tolerances.

Nothing of this repository is imported: automl's modules own the top-level names
(`dataloader`, `hparams_config`, `utils`, ...). automl 6a54c87 needs nothing beyond
TensorFlow, absl, PyYAML and NumPy (this project's .venv has them).

    git clone https://github.com/google/automl /tmp/automl && git -C /tmp/automl checkout 6a54c87
    .venv/bin/python tools/automl_training_fixture.py --automl_dir=/tmp/automl/efficientdet
"""
import argparse
import json
import os
import sys

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SIZE = 512
LEVELS = range(3, 8)
TRAIN_STEPS = (1, 3)  # Weights, statistics and EMA are recorded after these steps.
SAMPLES_PER_VARIABLE = 16
BATCH = 2
# (image id, [ymin, xmin, ymax, xmax] pixels, label 1..90, is_crowd).
BOXES = (
    (1, [100, 100, 104, 105], 3, 0),     # Tiny: no anchor reaches IoU 0.5; the forced match.
    (1, [200, 150, 300, 260], 5, 0),     # The same box twice, two classes.
    (1, [200, 150, 300, 260], 7, 0),
    (1, [0, 0, 512, 512], 1, 0),         # Whole image: clipped to 511.
    (1, [300, 320, 420, 480], 2, 1),     # Crowd.
    (2, [400, 380, 512, 512], 4, 0),     # On the bottom and right edges: clipped to 511.
    (2, [50, 60, 210, 230], 6, 0),
    (2, [120, 300, 180, 330], 9, 0),
    (2, [10, 10, 40, 70], 90, 0),
    (2, [250, 40, 350, 200], 1, 1),      # Crowd.
)
COCO_EXAMPLES = 118287
RECIPES = {  # automl's defaults with each decay method; batch 64 on COCO, 300 epochs.
    'cosine': dict(lr_decay_method='cosine'),
    'stepwise': dict(lr_decay_method='stepwise'),
}
RECIPE_BASE = dict(learning_rate=0.08, lr_warmup_init=0.008, lr_warmup_epoch=1.0,
                   first_lr_drop_epoch=200.0, second_lr_drop_epoch=250.0, num_epochs=300,
                   batch_size=64, num_examples_per_epoch=COCO_EXAMPLES)


def image_pixels(image_id):
    """uint8 [512, 512, 3]: a gradient, an 8-pixel checker texture and each box filled with
    a colour of its label (PNG-compressible, yet structured for the network)."""
    y = np.arange(SIZE)[:, None] / SIZE
    x = np.arange(SIZE)[None, :] / SIZE
    checker = ((np.arange(SIZE)[:, None] // 8 + np.arange(SIZE)[None, :] // 8) % 2) * 24.0
    pixels = np.stack(np.broadcast_arrays(90 + 80 * y + checker, 90 + 80 * x + 0 * y,
                                          120 + 40 * (y - x) + checker), -1)
    for box_image, box, label, _ in BOXES:
        if box_image == image_id:
            ymin, xmin, ymax, xmax = box
            colour = [(37 * label) % 256, (91 * label) % 256, (53 * label + 100) % 256]
            pixels[ymin + 1:ymax - 1, xmin + 1:xmax - 1] = colour
    return np.clip(pixels, 0, 255).astype(np.uint8)


def image_boxes(image_id):
    """(float32 [N, 4] normalised boxes, int [N] labels, int [N] crowd flags) of one image."""
    rows = [(box, label, crowd) for i, box, label, crowd in BOXES if i == image_id]
    boxes = np.array([box for box, _, _ in rows], np.float32) / SIZE
    return boxes, np.array([r[1] for r in rows]), np.array([r[2] for r in rows])


def sample_indices(size):
    """The flat element indices sampled of a variable of `size` elements."""
    return np.unique(np.linspace(0, size - 1, min(size, SAMPLES_PER_VARIABLE)).round()
                     .astype(np.int64))


class Automl:
    """automl's modules, imported from `automl_dir` (its efficientdet directory)."""

    def __init__(self, automl_dir):
        sys.path.insert(0, os.path.abspath(automl_dir))
        import tensorflow.compat.v1 as tf  # pylint: disable=import-outside-toplevel
        tf.disable_eager_execution()  # As automl's main.py.
        import dataloader  # pylint: disable=import-outside-toplevel,import-error
        import det_model_fn  # pylint: disable=import-outside-toplevel,import-error
        import hparams_config  # pylint: disable=import-outside-toplevel,import-error
        from tf2 import anchors  # pylint: disable=import-outside-toplevel,import-error
        self.tf, self.dataloader, self.det_model_fn = tf, dataloader, det_model_fn
        self.hparams_config, self.anchors = hparams_config, anchors

    def params(self, config_yaml):
        """automl's params for `efficientdet_model_fn` as its main.py builds them, from the
        checkpoint's config.yaml; training with skip_crowd_during_training=false."""
        config = self.hparams_config.get_detection_config('efficientdet-d0')
        config.override(config_yaml)
        config.override(dict(skip_crowd_during_training=False, input_rand_hflip=False,
                             jitter_min=1.0, jitter_max=1.0, image_size=SIZE))
        return dict(config.as_dict(), model_name='efficientdet-d0', iterations_per_loop=1,
                    model_dir=None, num_shards=1, num_examples_per_epoch=1000, strategy=None,
                    backbone_ckpt=None, ckpt=None, val_json_file=None, testdev_dir=None,
                    profile=False, mode='train', batch_size=BATCH, use_tpu=False)

    def example(self, png, image_id, params, labeler):
        """automl's dataset_parser, training branch: targets of one decoded PNG."""
        tf = self.tf
        boxes, labels, _ = image_boxes(image_id)
        image = tf.io.decode_png(tf.constant(png), channels=3)
        processor = self.dataloader.DetectionInputProcessor(
            image, params['image_size'], tf.constant(boxes),
            tf.constant(labels.reshape(-1, 1), tf.float32))
        processor.normalize_image(params['mean_rgb'], params['stddev_rgb'])
        processor.set_training_random_scale_factors(params['jitter_min'], params['jitter_max'])
        image = processor.resize_and_crop_image()
        boxes, classes = processor.resize_and_crop_boxes()
        cls_targets, box_targets, num_positives = labeler.label_anchors(boxes, classes)
        return image, cls_targets, box_targets, num_positives, boxes

    def batch(self, pngs, params):
        """(images [2, 512, 512, 3], labels as automl's process_example, clipped boxes)."""
        tf = self.tf
        anchors = self.anchors.Anchors(params['min_level'], params['max_level'],
                                       params['num_scales'], params['aspect_ratios'],
                                       params['anchor_scale'], params['image_size'])
        labeler = self.anchors.AnchorLabeler(anchors, params['num_classes'])
        examples = [self.example(png, i + 1, params, labeler) for i, png in enumerate(pngs)]
        labels = {}
        for level in LEVELS:
            labels['cls_targets_%d' % level] = tf.stack([e[1][level] for e in examples])
            labels['box_targets_%d' % level] = tf.stack([e[2][level] for e in examples])
        positives = tf.stack([tf.cast(e[3], tf.float32) for e in examples])
        labels['mean_num_positives'] = tf.tile(tf.reshape(tf.reduce_mean(positives), [1]),
                                               [BATCH])
        return tf.stack([e[0] for e in examples]), labels, positives, [e[4] for e in examples]

    def learning_rates(self, recipe):
        """(automl's schedule parameters, {step: learning rate}) of a COCO recipe."""
        tf = self.tf
        params = dict(RECIPE_BASE, strategy=None, **RECIPES[recipe])
        self.det_model_fn.update_learning_rate_schedule_parameters(params)
        warmup, total = params['lr_warmup_step'], params['total_steps']
        first, second = params['first_lr_drop_step'], params['second_lr_drop_step']
        steps = sorted({0, warmup - 1, warmup, (warmup + total) // 2, first - 1, first,
                        second - 1, second, total - 1, total})
        with tf.Graph().as_default():
            step = tf.placeholder(tf.int64, [])
            rate = self.det_model_fn.learning_rate_schedule(params, step)
            with tf.Session() as session:
                rates = [float(session.run(rate, {step: s})) for s in steps]
        keys = ('steps_per_epoch', 'lr_warmup_step', 'first_lr_drop_step',
                'second_lr_drop_step', 'total_steps', 'adjusted_learning_rate',
                'adjusted_lr_warmup_init')
        return {k: params[k] for k in keys}, steps, rates


def _summary_tensors(tf):
    """{summary tag: the scalar tensor automl logs under it}."""
    tensors = {}
    for summary in tf.get_collection(tf.GraphKeys.SUMMARIES):
        op = summary.op
        tag = op.inputs[0].op.get_attr('value').string_val[0].decode()
        tensors[tag] = op.inputs[1]
    return tensors


def _model_variables(tf):
    """automl's EMA'd variables (weights and batch-norm statistics), sorted by name."""
    names = {v.op.name: v for v in tf.trainable_variables()}
    names.update({v.op.name: v for v in tf.global_variables()
                  if v.op.name.endswith(('/moving_mean', '/moving_variance'))})
    return [names[n] for n in sorted(names)]


def _restore(tf, session, ckpt):
    reader = tf.train.load_checkpoint(ckpt)
    restored = {v.op.name: v for v in tf.global_variables() if reader.has_tensor(v.op.name)}
    tf.train.Saver(restored).restore(session, ckpt)
    return sorted(v.op.name for v in tf.global_variables() if v.op.name not in restored)


def _samples(session, variables, shadows):
    values, ema = session.run(([v for v in variables], [s for s in shadows]))
    pick = lambda arrays: np.concatenate([a.reshape(-1)[sample_indices(a.size)]
                                          for a in arrays])
    return pick(values), pick(ema)


def automl_run(automl, pngs, ckpt, config_yaml, last_bit=False):
    """One run of automl's code; a dict of named arrays. last_bit: each value of the network
    input moved by one float32 unit in the last place up, down or not (fixed random signs):
    what float32 rounding alone changes in automl's numbers, ties of the max-pools in flat
    image regions included (two runs of identical inputs on this CPU agree to ~1e-5 on every
    gradient norm, less than two float32 implementations can)."""
    tf = automl.tf
    out = {}
    with tf.Graph().as_default():
        params = automl.params(config_yaml)
        images, labels, positives, clipped = automl.batch(pngs, params)
        if last_bit:
            signs = np.random.RandomState(0).randint(-1, 2, size=images.shape.as_list())
            images = images * tf.constant(1.0 + 2.0 ** -23 * signs, tf.float32)
        spec = automl.det_model_fn.efficientdet_model_fn(
            images, labels, tf.estimator.ModeKeys.TRAIN, params)
        trainable = tf.trainable_variables()
        grads = tf.gradients(spec.loss, trainable)
        summaries = _summary_tensors(tf)
        variables = _model_variables(tf)
        by_name = {v.op.name: v for v in tf.global_variables()}
        shadows = [by_name[v.op.name + '/ExponentialMovingAverage'] for v in variables]
        assert all(s.shape == v.shape for s, v in zip(shadows, variables))
        with tf.Session() as session:
            session.run(tf.global_variables_initializer())
            out['not_in_checkpoint'] = _restore(tf, session, ckpt)
            fetched = session.run(dict(
                labels=labels, positives=positives, clipped=clipped,
                grad_norms=[tf.norm(g) for g in grads], global_norm=tf.linalg.global_norm(grads),
                **{k: summaries[k] for k in ('trainloss/cls_loss', 'trainloss/box_loss',
                                             'trainloss/det_loss', 'trainloss/reg_l2_loss',
                                             'trainloss/loss', 'lrn_rate', 'clip/gradient_norm')}))
            for step in range(1, max(TRAIN_STEPS) + 1):
                session.run(spec.train_op)
                if step in TRAIN_STEPS:
                    out['weights_%d' % step], out['ema_%d' % step] = _samples(
                        session, variables, shadows)
    for key, value in fetched['labels'].items():
        out[key] = value
    out['num_positives'] = fetched['positives']
    for i, boxes in enumerate(fetched['clipped']):
        out['clipped_boxes_%d' % i] = boxes
    out['grad_norms'] = np.array(fetched['grad_norms'], np.float32)
    out['global_grad_norm'] = np.float32(fetched['global_norm'])
    for key in ('cls_loss', 'box_loss', 'det_loss', 'reg_l2_loss', 'loss'):
        out[key] = np.float32(fetched['trainloss/' + key])
    out['learning_rate'] = np.float32(fetched['lrn_rate'])
    out['logged_gradient_norm'] = np.float32(fetched['clip/gradient_norm'])
    out['variable_names'] = [v.op.name for v in variables]
    out['trainable_names'] = [v.op.name for v in trainable]
    return out


def _spread(first, second):
    """Largest |difference| of each numeric array between two runs."""
    return {key: float(np.max(np.abs(np.asarray(first[key], np.float64)
                                     - np.asarray(second[key], np.float64))))
            for key, value in first.items()
            if isinstance(value, (np.ndarray, np.floating)) and value.dtype.kind == 'f'}


def _pngs(automl):
    tf = automl.tf
    with tf.Graph().as_default(), tf.Session() as session:
        return [session.run(tf.io.encode_png(image_pixels(i))) for i in (1, 2)]


def _arguments():
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--automl_dir', required=True,
                        help="automl's efficientdet directory (commit 6a54c87)")
    parser.add_argument('--ckpt_dir', default=os.path.join(REPO, '..', 'shared', 'automl_ckpt'),
                        help="automl's D0 checkpoint with its automl_config.yaml")
    parser.add_argument('--output', default=os.path.join(REPO, 'tests', 'fixtures',
                                                         'automl_training'),
                        help='path prefix of the .npz and .json written')
    return parser.parse_args()


def main():
    args = _arguments()
    automl = Automl(args.automl_dir)
    ckpt = automl.tf.train.latest_checkpoint(args.ckpt_dir)
    config_yaml = os.path.join(args.ckpt_dir, 'automl_config.yaml')
    pngs = _pngs(automl)
    runs = [automl_run(automl, pngs, ckpt, config_yaml, last_bit) for last_bit in (False, True)]
    first = runs[0]
    meta = {key: first.pop(key) for key in ('variable_names', 'trainable_names',
                                             'not_in_checkpoint')}
    for run in runs[1:]:
        for key in meta:
            run.pop(key)
    scalars = {k: float(v) for k, v in first.items() if np.ndim(v) == 0}
    arrays = {k: v for k, v in first.items() if np.ndim(v) > 0}
    schedules = {}
    for recipe in RECIPES:
        settings, steps, rates = automl.learning_rates(recipe)
        schedules[recipe] = dict(settings, steps=steps, learning_rates=rates)
    meta.update(
        automl_commit='6a54c87', checkpoint=os.path.basename(ckpt), image_size=SIZE,
        batch=BATCH, boxes=[dict(image_id=i, box=b, label=l, is_crowd=c)
                            for i, b, l, c in BOXES],
        train_steps=list(TRAIN_STEPS), samples_per_variable=SAMPLES_PER_VARIABLE,
        sample_rule='unique(round(linspace(0, size - 1, min(size, 16)))) of each flattened '
                    'variable, variables in variable_names order, concatenated',
        scalars=scalars, run_to_run_spread=_spread(first, runs[1]),
        learning_rate_recipes=dict(base=RECIPE_BASE, schedules=schedules),
        spread_runs='run 2: each network input value times 1 + 2^-23 * (-1, 0 or +1), fixed '
                    'random signs; targets are run 1\'s',
        settings='automl config.yaml of the checkpoint, skip_crowd_during_training=false, '
                 'input_rand_hflip=false, jitter 1..1, batch 2, strategy None, '
                 'num_examples_per_epoch=1000; SGD momentum; step = checkpoint global_step')
    for key in ('grad_norms', 'weights_1', 'ema_1', 'weights_3', 'ema_3'):
        arrays[key + '_spread'] = np.abs(first[key] - runs[1][key])
    arrays.update({'png_%d' % i: np.frombuffer(png, np.uint8) for i, png in enumerate(pngs)})
    np.savez_compressed(args.output + '.npz', **arrays)
    with open(args.output + '.json', 'w') as f:
        json.dump(meta, f, indent=1, sort_keys=True)
    print('wrote %s.npz (%d bytes) and .json; spread %s' % (
        args.output, os.path.getsize(args.output + '.npz'),
        json.dumps(meta['run_to_run_spread'])))


if __name__ == '__main__':
    main()
