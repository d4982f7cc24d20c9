r"""Inference: the detection graph of a trained model, its SavedModel export, prediction on
image files.

    python inference.py export --model_dir=runs/demo --export_dir=runs/demo/saved_model
    python inference.py predict --saved_model=runs/demo/saved_model --input=photos/ \
        --output_dir=runs/demo/predictions [--repeat=10] [--min_score=0.3]
    python inference.py predict --model_dir=runs/demo --input=photo.jpg --output_dir=out

The graph takes uint8 images of any size, preprocesses each exactly as evaluation does (the
dataloader's own eval function: resize keeping the aspect ratio, pad, normalise), runs the
network with the exponential-moving-average weights (frozen in as constants), decodes and
applies NMS in the graph (postprocess.generate_detections) and maps labels to the dataset's
category ids (label map baked in as a constant). Boxes come back in pixels of the input
image, [ymin, xmin, ymax, xmax]. The model comes from model_dir/config.yaml (written by
main.py), the label map from the `training_file_pattern` in model_dir/flags.json (or
--label_map).
"""
import dataclasses
import json
import os
import sys

import tf_env  # noqa: F401  (before anything imports tensorflow)
import numpy as np
import tensorflow as tf
from absl import app, flags, logging

import anchors
import dataloader
import det_model_fn
import efficientdet_arch
import hparams_config
import postprocess
from dataset import label_map as label_map_lib

tf1 = tf.compat.v1

OUTPUT_KEYS = ('detection_boxes', 'detection_scores', 'detection_classes', 'num_detections')
# Raw outputs the host post-processing of bench.py needs (not part of the SavedModel).
RAW_KEYS = ('class_logits', 'box_codes', 'image_scales', 'image_sizes')


class InferenceError(ValueError):
    """A user mistake (missing model_dir files, bad paths); the message names the fix."""


@dataclasses.dataclass
class ModelSpec:
    """What an inference graph is built from."""
    config: hparams_config.Config
    label_map: object  # dataset.label_map.LabelMap, or None: category id = label.
    checkpoint: str  # None: random weights (benchmarking only).
    label_map_path: str = None


def _read_config(model_dir, hparams):
    path = os.path.join(model_dir, 'config.yaml')
    if not os.path.isfile(path):
        raise InferenceError('%s does not exist; --model_dir must be a directory main.py '
                             'trained into (it writes config.yaml there)' % path)
    with open(path) as f:
        config = hparams_config.Config.from_yaml(f.read())
    if hparams:
        config.override(hparams)
    return hparams_config.validate(config)


def _find_label_map_path(model_dir):
    path = os.path.join(model_dir, 'flags.json')
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        run_flags = json.load(f)
    for key in ('training_file_pattern', 'validation_file_pattern'):
        if run_flags.get(key):
            found = label_map_lib.label_map_path_for(run_flags[key])
            if found:
                return found
    return None


def _checkpoint_path(model_dir, checkpoint):
    if checkpoint:
        if os.path.isdir(checkpoint):
            checkpoint = tf.train.latest_checkpoint(checkpoint) or checkpoint
        if not tf.io.gfile.glob(checkpoint + '.index'):
            raise InferenceError('--checkpoint=%s is not a checkpoint (give the prefix, e.g. '
                                 '%s/model.ckpt-1000)' % (checkpoint, model_dir))
        return checkpoint
    latest = tf.train.latest_checkpoint(model_dir)
    if latest is None:
        raise InferenceError('no checkpoint in --model_dir=%s; train first or pass '
                             '--checkpoint' % model_dir)
    return latest


def load_model_spec(model_dir, checkpoint=None, hparams='', label_map_path=None,
                    random_weights=False):
    """Config, label map and checkpoint of a training run directory."""
    config = _read_config(model_dir, hparams)
    label_map_path = label_map_path or _find_label_map_path(model_dir)
    label_map = label_map_lib.load_label_map(label_map_path) if label_map_path else None
    if label_map is None:
        logging.warning('no label map found for %s (pass --label_map): classes are reported '
                        'as labels 1..%d', model_dir, config.num_classes)
    elif label_map.num_classes > config.num_classes:
        raise InferenceError('label map %s has %d classes but the model has num_classes=%d'
                             % (label_map_path, label_map.num_classes, config.num_classes))
    return ModelSpec(config, label_map,
                     None if random_weights else _checkpoint_path(model_dir, checkpoint),
                     label_map_path)


def category_id_table(label_map, num_classes):
    """int64 [num_classes + 1]: entry `label` is that label's category id, entry 0 (the
    padding rows' label) is 0. Without a label map the category id is the label itself."""
    table = np.arange(num_classes + 1, dtype=np.int64)
    if label_map is not None:
        for label, category_id in label_map.label_to_category_id.items():
            table[label] = category_id
    return table


def _map_preprocess(fn, inputs, config):
    height, width = hparams_config.parse_image_size(config.image_size)
    return tf.map_fn(fn, inputs, fn_output_signature=(
        tf.TensorSpec([height, width, 3], tf.float32), tf.TensorSpec([], tf.float32),
        tf.TensorSpec([2], tf.int32)))


def preprocess_images(images, config):
    """uint8 [B, H, W, 3] (any H, W) -> network input float32 [B, h, w, 3], image_scales
    float32 [B] (network pixels * scale = input pixels), image_sizes int32 [B, 2]."""
    return _map_preprocess(lambda image: dataloader.preprocess_for_eval(image, config),
                           images, config)


def decode_and_preprocess(encoded, config):
    """string [B] of JPEG/PNG/GIF/BMP bytes (sizes may differ) -> preprocess_images' outputs,
    decoded by the dataloader's own decoder."""
    return _map_preprocess(
        lambda data: dataloader.preprocess_for_eval(dataloader.decode_image(data), config),
        encoded, config)


def build_detector(net_images, image_scales, image_sizes, config, label_map, reuse=False):
    """Network + in-graph NMS on preprocessed images; returns {OUTPUT_KEYS + RAW_KEYS: tensor}.

    detection_boxes float32 [B, M, 4] input pixels [ymin, xmin, ymax, xmax]; detection_scores
    float32 [B, M]; detection_classes int64 [B, M] category ids (0 on padding rows);
    num_detections int32 [B]; class_logits [B, N, C], box_codes [B, N, 4] (anchor order).
    """
    with tf1.variable_scope(tf1.get_variable_scope(), reuse=reuse):
        class_outputs, box_outputs = efficientdet_arch.build_model(
            net_images, config, is_training=False, compute_dtype='float32')
    height, width = hparams_config.parse_image_size(config.image_size)
    anchor_boxes = anchors.generate_anchor_boxes(
        height, width, config.min_level, config.max_level, config.num_scales,
        config.aspect_ratios, config.anchor_scale)
    nms = config.nms_configs
    batch = tf.shape(net_images)[0]
    detections, num_detections = postprocess.generate_detections(
        class_outputs, box_outputs, anchor_boxes, tf.zeros([batch], tf.int64), image_scales,
        image_sizes, num_classes=config.num_classes, method=nms.method,
        iou_thresh=nms.iou_thresh, score_thresh=nms.score_thresh, sigma=nms.sigma,
        max_nms_inputs=nms.max_nms_inputs, max_output_size=nms.max_output_size)
    table = tf.constant(category_id_table(label_map, config.num_classes))
    labels = tf.cast(tf.round(detections[..., 6]), tf.int32)
    return {
        'detection_boxes': tf.identity(detections[..., 1:5], name='detection_boxes'),
        'detection_scores': tf.identity(detections[..., 5], name='detection_scores'),
        'detection_classes': tf.gather(table, labels, name='detection_classes'),
        'num_detections': tf.identity(num_detections, name='num_detections'),
        'class_logits': postprocess.flatten_levels(class_outputs, config.num_classes),
        'box_codes': postprocess.flatten_levels(box_outputs, 4),
        'image_scales': image_scales, 'image_sizes': image_sizes,
    }


def inference_config(config):
    """Exported graphs compute in float32 (the checkpoint's master weights are float32)."""
    config = hparams_config.Config(config.as_dict())
    config.mixed_precision = False
    return config


def restore_ema_weights(session, config, checkpoint):
    """Loads the EMA shadow values of `checkpoint` into the graph's model variables, as
    det_model_fn's eval/predict scaffold does."""
    ema = tf1.train.ExponentialMovingAverage(config.moving_average_decay)
    saver = tf1.train.Saver(ema.variables_to_restore(det_model_fn.ema_variables()))
    saver.restore(session, checkpoint)


def initialize_weights(session, spec):
    if spec.checkpoint:
        restore_ema_weights(session, spec.config, spec.checkpoint)
    else:
        session.run(tf1.global_variables_initializer())


def freeze(session, output_tensors):
    """A GraphDef of the session's graph pruned to `output_tensors`, every variable replaced
    by a constant holding its current value. Constant weights let TensorFlow's graph
    optimiser fold each batch norm into the convolution before it (about 15% faster on CPU)."""
    names = sorted({tensor.op.name for tensor in output_tensors})
    return tf1.graph_util.convert_variables_to_constants(
        session, session.graph.as_graph_def(), names)


def import_frozen(graph_def, tensors):
    """Imports a frozen GraphDef into a new graph; returns it and `tensors` (a dict of
    tensors of the original graph) mapped to their counterparts in it."""
    graph = tf.Graph()
    with graph.as_default():
        tf1.import_graph_def(graph_def, name='')
    return graph, {key: graph.get_tensor_by_name(t.name) for key, t in tensors.items()}


def build_frozen_graph(spec, batch_size=None, encoded=False):
    """The inference graph of `spec` with its weights frozen in: (graph, {'inputs': uint8
    [B, H, W, 3] or string [B] placeholder, OUTPUT_KEYS..., RAW_KEYS...: tensors})."""
    config = inference_config(spec.config)
    with tf.Graph().as_default():
        if encoded:
            inputs = tf1.placeholder(tf.string, [batch_size], 'encoded_images')
            preprocessed = decode_and_preprocess(inputs, config)
        else:
            inputs = tf1.placeholder(tf.uint8, [batch_size, None, None, 3], 'images')
            preprocessed = preprocess_images(inputs, config)
        outputs = build_detector(*preprocessed, config, spec.label_map)
        with tf1.Session() as session:
            initialize_weights(session, spec)
            graph_def = freeze(session, outputs.values())
    return import_frozen(graph_def, dict(outputs, inputs=inputs))


class GraphPredictor:
    """A session over the frozen inference graph; `predict(inputs)` -> numpy dict. inputs:
    uint8 images [B, H, W, 3], or with encoded=True JPEG/PNG bytes [B]."""

    def __init__(self, spec, batch_size=None, session_config=None, encoded=False):
        self.graph, self.outputs = build_frozen_graph(spec, batch_size, encoded)
        self.inputs = self.outputs.pop('inputs')
        self.session = tf1.Session(graph=self.graph, config=session_config)
        self.graph.finalize()

    def predict(self, inputs, keys=OUTPUT_KEYS):
        return self.session.run({k: self.outputs[k] for k in keys}, {self.inputs: inputs})

    def close(self):
        self.session.close()


class SavedModelPredictor:
    """The exported SavedModel's serving_default signature, loaded with tf.saved_model.load."""

    def __init__(self, export_dir):
        if not tf.saved_model.contains_saved_model(export_dir):
            raise InferenceError('--saved_model=%s holds no SavedModel; create one with '
                                 '`python inference.py export`' % export_dir)
        self._model = tf.saved_model.load(export_dir)
        self._serve = self._model.signatures['serving_default']

    def predict(self, images):
        outputs = self._serve(images=tf.constant(images, tf.uint8))
        return {key: outputs[key].numpy() for key in OUTPUT_KEYS}

    def close(self):
        pass


FLAGS = flags.FLAGS


def define_flags():
    flags.DEFINE_string('model_dir', None, 'Training run directory (config.yaml, checkpoints).')
    flags.DEFINE_string('checkpoint', None, 'Checkpoint prefix (default: latest in model_dir).')
    flags.DEFINE_string('hparams', '', 'Overrides on top of model_dir/config.yaml, e.g. '
                        'nms_configs.score_thresh=0.05.')
    flags.DEFINE_string('label_map', None, 'Label map JSON (default: beside the training '
                        'TFRecords named in model_dir/flags.json).')
    flags.DEFINE_string('export_dir', None, 'export: SavedModel directory to write.')
    flags.DEFINE_string('saved_model', None, 'predict: use this SavedModel (else model_dir).')
    flags.DEFINE_string('input', None, 'predict: an image file or a directory of images.')
    flags.DEFINE_string('output_dir', None, 'predict: annotated images + detections.json.')
    flags.DEFINE_integer('repeat', 1, 'predict: run each image N times, report latency.',
                         lower_bound=1)
    flags.DEFINE_float('min_score', 0.3, 'predict: draw detections scoring at least this '
                       '(the JSON keeps every detection).')


def _require(*names):
    missing = [name for name in names if not FLAGS[name].value]
    if missing:
        raise InferenceError('missing %s' % ', '.join('--' + name for name in missing))


def _spec_from_flags():
    _require('model_dir')
    return load_model_spec(FLAGS.model_dir, FLAGS.checkpoint, FLAGS.hparams, FLAGS.label_map)


def run_export():
    import export_model  # pylint: disable=import-outside-toplevel
    _require('model_dir', 'export_dir')
    path = export_model.export_saved_model(_spec_from_flags(), FLAGS.export_dir)
    print('exported %s' % path)
    return 0


def run_predict():
    import predict  # pylint: disable=import-outside-toplevel
    _require('input', 'output_dir')
    if FLAGS.saved_model:
        predictor = SavedModelPredictor(FLAGS.saved_model)
        names = predict.category_names_of_saved_model(FLAGS.saved_model)
    else:
        if not FLAGS.model_dir:
            raise InferenceError('predict needs --saved_model=DIR (an export) or '
                                 '--model_dir=DIR (a training run)')
        spec = _spec_from_flags()
        predictor, names = GraphPredictor(spec, batch_size=1), predict.category_names(
            spec.label_map)
    try:
        return predict.predict_files(predictor, names, FLAGS.input, FLAGS.output_dir,
                                     repeat=FLAGS.repeat, min_score=FLAGS.min_score)
    finally:
        predictor.close()


COMMANDS = {'export': run_export, 'predict': run_predict}


def main(argv):
    if len(argv) != 2 or argv[1] not in COMMANDS:
        raise app.UsageError('usage: inference.py {%s} --flags...' % ','.join(COMMANDS))
    tf.get_logger().setLevel('ERROR')  # TF1 SavedModel/Saver progress lines drown the output.
    try:
        return COMMANDS[argv[1]]()
    except (InferenceError, hparams_config.ConfigError, label_map_lib.LabelMapError,
            FileNotFoundError) as error:
        print('error: %s' % error, file=sys.stderr)
        return 2


if __name__ == '__main__':
    define_flags()
    app.run(main)
