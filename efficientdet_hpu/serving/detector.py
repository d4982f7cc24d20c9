"""The detection graph of a trained model: in-graph preprocessing (the dataloader's own eval
function), the network with its exponential-moving-average weights frozen in as constants,
decode and NMS in the graph, labels mapped to the dataset's category ids. Boxes come back in
pixels of the input image, [ymin, xmin, ymax, xmax].

GraphPredictor runs it in a session; SavedModelPredictor runs an export of it (serving/export.py).
"""
import numpy as np
import tensorflow as tf

from efficientdet_hpu.config import hparams_config
from efficientdet_hpu.data import dataloader
from efficientdet_hpu.data import record_parser
from efficientdet_hpu.network import efficientdet_arch
from efficientdet_hpu.ops import anchors
from efficientdet_hpu.ops import postprocess
from efficientdet_hpu.serving.model_spec import InferenceError
from efficientdet_hpu.checkpoints import checkpoints

tf1 = tf.compat.v1

OUTPUT_KEYS = ('detection_boxes', 'detection_scores', 'detection_classes', 'num_detections')
# Raw outputs the host post-processing of bench.py needs (not part of the SavedModel).
RAW_KEYS = ('class_logits', 'box_codes', 'image_scales', 'image_sizes')


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
        lambda data: dataloader.preprocess_for_eval(record_parser.decode_image(data), config),
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
    anchor_boxes = anchors.generate_anchor_boxes(height, width,
                                                 **hparams_config.anchor_settings(config))
    batch = tf.shape(net_images)[0]
    detections, num_detections = postprocess.generate_detections(
        class_outputs, box_outputs, anchor_boxes, tf.zeros([batch], tf.int64), image_scales,
        image_sizes, num_classes=config.num_classes, **hparams_config.nms_settings(config))
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


def initialize_weights(session, spec):
    """The checkpoint's EMA weights (as evaluation uses them), or random ones without one."""
    if spec.checkpoint:
        checkpoints.ema_restore_saver(spec.config.moving_average_decay).restore(
            session, spec.checkpoint)
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
    config = spec.config  # Computed in float32 whatever it trained in.
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
