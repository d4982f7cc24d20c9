"""Builds an EfficientDet graph (never runs it) and prints one JSON line describing it; with
--runmode, google/automl's run modes (export, inference, benchmark: cli/inspect_modes.py).

    python model_inspect.py --model_name=efficientdet-d3 [--image_size=640x384]
        [--hparams=fpn_num_filters=128,...] [--num_classes=90]
    python model_inspect.py --runmode=saved_model --ckpt_path=DIR --saved_model_dir=DIR
    python model_inspect.py --runmode=infer --ckpt_path=DIR --input_image=IMG --output_image_dir=DIR

Without --runmode this counts parameters; automl's default runmode is `dry` (build, run once
with random weights and save a checkpoint to --logdir), which is not carried.

Output keys: model_name, image_size [h, w], params (trainable variables, the papers'
convention), flops (multiply-adds, i.e. half the floating-point operations of a batch-1
inference pass, as the paper reports), levels {"3": {"class": [1, h, w, A*C], "box": [...]}}.
FLOPs come from the shape-inference statistics TensorFlow registers per op (the numbers the
tf.compat.v1.profiler float_ops report sums), read directly from the graph: that is the same
count, without the profiler's per-node bookkeeping, so D7x takes seconds, not minutes.
"""
import json

from efficientdet_hpu.core import tf_env  # (before anything imports tensorflow)
import numpy as np
import tensorflow as tf
from absl import app
from absl import flags
from tensorflow.python.framework import ops as tf_ops  # get_stats_for_node_def: no public API.

from efficientdet_hpu.cli import inspect_modes
from efficientdet_hpu.config import hparams_config
from efficientdet_hpu.config import recipe
from efficientdet_hpu.config import settings
from efficientdet_hpu.core import command_help
from efficientdet_hpu.core import errors
from efficientdet_hpu.network import efficientdet_arch

tf1 = tf.compat.v1

FLAGS = flags.FLAGS


def define_flags():
    """Defined when model_inspect.py runs, so importing it defines nothing."""
    flags.DEFINE_string('model_name', 'efficientdet-d0', 'efficientdet-d0 .. d7x, efficientdet-lite0 .. lite4.')
    flags.DEFINE_string('image_size', None, "Square size (512) or 'WIDTHxHEIGHT' (640x384); "
                        'default: the variant\'s size.')
    flags.DEFINE_string('hparams', '', "Overrides 'a=1,b=2' and/or a YAML file.")
    flags.DEFINE_integer('num_classes', None, 'Number of classes (default: the config, 90).')
    inspect_modes.define_flags()
    flags.adopt_module_key_flags(inspect_modes)  # automl's run modes: a group of --help


def resolve_config(model_name, image_size=None, hparams='', num_classes=None):
    """Variant defaults <- --hparams <- --image_size / --num_classes."""
    return recipe.resolve(model_name, hparams, image_size=image_size,
                                  num_classes=num_classes)


def count_trainable_params(graph):
    with graph.as_default():
        return int(sum(np.prod(v.shape.as_list()) for v in tf1.trainable_variables()))


def count_float_ops(graph):
    """Sum of the registered 'flops' statistic over the graph's ops (0 for ops without one).

    The graph must have fully defined shapes (batch 1 here)."""
    total = 0
    for op in graph.get_operations():
        try:
            stats = tf_ops.get_stats_for_node_def(graph, op.node_def, 'flops')
        except ValueError:  # Shape not fully defined: not counted, as the profiler does.
            continue
        total += stats.value or 0
    return int(total)


def build_inspection_graph(config):
    """Returns (graph, class_outputs, box_outputs) of a batch-1 inference graph."""
    height, width = hparams_config.parse_image_size(config.image_size)
    # As a CPU run of this config would compute (bfloat16 with mixed_precision).
    compute_dtype = settings.finalize(config).runtime.compute_dtype
    graph = tf.Graph()
    with graph.as_default():
        images = tf1.placeholder(tf.float32, [1, height, width, 3], name='images')
        class_outputs, box_outputs = efficientdet_arch.build_model(
            images, config, is_training=False, compute_dtype=compute_dtype)
    return graph, class_outputs, box_outputs


def inspect_model(config, built=None):
    """Returns the JSON-ready description of `config`'s network (batch 1, inference).

    built: optional build_inspection_graph(config) result, to reuse a graph."""
    graph, class_outputs, box_outputs = built or build_inspection_graph(config)
    levels = {str(level): {'class': class_outputs[level].shape.as_list(),
                           'box': box_outputs[level].shape.as_list()}
              for level in sorted(class_outputs)}
    return {'model_name': config.name,
            'image_size': list(hparams_config.parse_image_size(config.image_size)),
            'params': count_trainable_params(graph), 'flops': count_float_ops(graph) // 2,
            'levels': levels}


def main(argv):
    if len(argv) > 1:
        raise app.UsageError('unexpected arguments: %s' % argv[1:])
    tf_env.quiet_python_logging()  # Keep stdout/stderr to the one JSON line or an error.
    if FLAGS.runmode is not None:
        return inspect_modes.run(FLAGS.runmode)
    try:
        inspect_modes.check_flags(None)
        config = resolve_config(FLAGS.model_name, FLAGS.image_size, FLAGS.hparams,
                                FLAGS.num_classes)
    except errors.UserError as error:
        return errors.fail('model_inspect.py', error)
    print(json.dumps(inspect_model(config)))
    return 0


def entry_point():
    """Parses the command line and runs the command (the module's `main`)."""
    define_flags()
    command_help.install(__name__)
    app.run(main, flags_parser=errors.parse_flags)


if __name__ == '__main__':
    entry_point()
