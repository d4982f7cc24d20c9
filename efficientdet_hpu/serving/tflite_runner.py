"""Running a TFLite export (serving/tflite_export.py) with tf.lite.Interpreter.

An export is two TFLite files: the network (model_<precision>.tflite) on a fixed-size input,
float32 [1, h, w, 3], the image already resized, normalised and padded by the dataloader's
eval preprocessing; and the detection post-processing (postprocess_fp32.tflite: decode and
NMS as TFLite builtin ops) on its outputs, in network-input pixels. TFLitePredictor runs both
and does the rest on the host, as the SavedModel's graph does in-graph:
that preprocessing before the interpreter (the same TensorFlow ops, in a tf.function), then
boxes times the image scale, clipped to the image, and labels mapped to category ids. So
`predict` takes and returns what SavedModelPredictor does.

The interpreter uses every core (num_threads = os.cpu_count()) and TensorFlow 2.15's default
XNNPACK delegate. The files' companion `tflite.json` (beside them) says how they were built.
ExportPredictor is everything but the network's runtime: serving/onnx_runner.py runs the ONNX
network file in onnxruntime with the same preprocessing, post-processing file and host end.
"""
import json
import os

import numpy as np
import tensorflow as tf

from efficientdet_hpu.data import dataloader
from efficientdet_hpu.data import record_parser
from efficientdet_hpu.ops import host_postprocess
from efficientdet_hpu.serving.model_spec import InferenceError

METADATA_FILE = 'tflite.json'
OUTPUT_KEYS = ('detection_boxes', 'detection_scores', 'detection_classes', 'num_detections')
# Output tensor names of the converted graph (serving/tflite_export.py names them).
DETECTIONS_OUTPUT = 'detections'          # float32 [1, M, 6] ymin, xmin, ymax, xmax, score, label
NUM_DETECTIONS_OUTPUT = 'num_detections'  # int32 [1]
LOGITS = 'class_logits'  # float32 [1, N, C]: the network's outputs, the post-processing's
CODES = 'box_codes'      # float32 [1, N, 4]  inputs (anchor order).


def read_metadata(model_path, fmt='tflite_fp32'):
    """The tflite.json beside `model_path` (a network file of format `fmt`) as a dict; an
    InferenceError naming it if absent."""
    path = os.path.join(os.path.dirname(os.path.abspath(model_path)), METADATA_FILE)
    if not os.path.isfile(path):
        raise InferenceError('%s does not exist: %s of `python inference.py export '
                             '--formats=%s` needs the %s written beside it'
                             % (path, os.path.basename(model_path), fmt, METADATA_FILE))
    with open(path) as f:
        return json.load(f)


def category_names(metadata):
    """{category_id: name} of the export's label map (empty without one)."""
    return {int(k): v for k, v in metadata.get('category_names', {}).items()}


class Preprocessor:
    """uint8 images (or encoded bytes) -> the TFLite input, by the eval preprocessing itself.

    `__call__(image)`: uint8 [H, W, 3] -> (float32 [1, h, w, 3], image_scale float32 scalar
    with network pixels * scale = image pixels, image_size int32 [2] (height, width)).
    `decode(data)`: JPEG/PNG/GIF/BMP bytes -> the same, decoded as the SavedModel decodes.
    """

    def __init__(self, image_size, mean_rgb, stddev_rgb):
        settings = {'image_size': image_size, 'mean_rgb': list(mean_rgb),
                    'stddev_rgb': list(stddev_rgb)}

        def preprocess(image):
            network_image, scale, size = dataloader.preprocess_for_eval(image, settings)
            return network_image[None], scale, size

        self._pixels = tf.function(preprocess, input_signature=[
            tf.TensorSpec([None, None, 3], tf.uint8)])
        self._encoded = tf.function(
            lambda data: preprocess(record_parser.decode_image(data)),
            input_signature=[tf.TensorSpec([], tf.string)])

    def __call__(self, image):
        return tuple(value.numpy() for value in self._pixels(image))

    def decode(self, data):
        return tuple(value.numpy() for value in self._encoded(data))


def finish_detections(detections, count, image_scale, image_size, category_ids,
                      clip_to_image=True):
    """The in-graph end of serving/detector.py on one image's TFLite outputs.

    detections float32 [M, 6] network pixels [ymin, xmin, ymax, xmax], score, label (class
    index + 1, 0 on padding rows, which are all zero); count: real rows; image_scale float32;
    image_size (height, width); category_ids int64 [C + 1] (entry 0 for padding).
    Returns boxes float32 [M, 4] image pixels, scores float32 [M], classes int64 [M], count.
    Clipped, a box left without area (host_postprocess.has_area) is dropped as in the graph:
    the real rows after it move up, and the count falls.
    """
    if detections.ndim != 2 or detections.shape[1] != 6:
        raise ValueError('detections must be [M, 6], got %s' % (detections.shape,))
    boxes = detections[:, :4] * np.float32(image_scale)
    scores = detections[:, 4]
    labels = np.round(detections[:, 5]).astype(np.int64)
    if clip_to_image:
        height, width = np.asarray(image_size, np.float32)
        boxes = np.minimum(np.maximum(boxes, np.float32(0)),
                           np.array([height, width, height, width], np.float32))
        kept = (np.arange(len(boxes)) < int(count)) & host_postprocess.has_area(boxes)
        order = np.argsort(~kept, kind='stable')  # The kept rows first, in their order.
        boxes, scores, labels = boxes[order], scores[order], labels[order]
        count = int(kept.sum())
        boxes[count:], scores[count:], labels[count:] = 0, 0, 0  # Padding rows: all zero.
    return boxes, scores, np.asarray(category_ids, np.int64)[labels], int(count)


def make_interpreter(model_path=None, model_content=None, num_threads=None):
    """tf.lite.Interpreter over a file or bytes, tensors allocated, XNNPACK (TF's default)."""
    interpreter = tf.lite.Interpreter(model_path=model_path, model_content=model_content,
                                      num_threads=num_threads or os.cpu_count())
    interpreter.allocate_tensors()
    return interpreter


def _load(model_path, model_content, num_threads):
    try:
        return make_interpreter(model_path, model_content, num_threads)
    except (ValueError, RuntimeError) as error:
        raise InferenceError('%s is not a TFLite model this TensorFlow can run (%s)'
                             % (model_path or 'the model', str(error).splitlines()[0])) from error


def _by_name(details):
    return {detail['name']: detail['index'] for detail in details}


class ExportPredictor:
    """Base of the predictors of an export's network file: `predict(images)` -> {OUTPUT_KEYS:
    numpy}, as SavedModelPredictor. A subclass runs the network (`network_outputs`); this
    class runs the preprocessing, the post-processing file and the host-side end.

    images: uint8 [B, H, W, 3] (one size per batch), or an object array of encoded images
    [B]. The network files are batch 1: a batch runs image by image. The post-processing file
    is the one tflite.json names for the model (files[name].postprocess), or
    postprocess_content. FLAG and FORMAT name the command-line flag and export format in
    error messages.
    """
    FLAG = '--tflite'
    FORMAT = 'tflite_fp32'

    def __init__(self, model_path=None, metadata=None, postprocess_content=None,
                 num_threads=None):
        postprocess_path = None
        if model_path is not None:
            if not os.path.isfile(model_path):
                raise InferenceError('%s=%s does not exist; create it with `python '
                                     'inference.py export --formats=%s`'
                                     % (self.FLAG, model_path, self.FORMAT))
            metadata = metadata or read_metadata(model_path, self.FORMAT)
            postprocess_name = metadata.get('files', {}).get(
                os.path.basename(model_path), {}).get('postprocess')
            if not postprocess_name:
                raise InferenceError('%s lists no post-processing file for %s; export it '
                                     'again with `python inference.py export --formats=...`'
                                     % (METADATA_FILE, model_path))
            postprocess_path = os.path.join(os.path.dirname(model_path), postprocess_name)
        self._postprocess = _load(postprocess_path, postprocess_content, num_threads)
        self.metadata = metadata
        self.names = category_names(metadata)
        self._preprocess = Preprocessor(metadata['image_size'], metadata['mean_rgb'],
                                        metadata['stddev_rgb'])
        self._post_inputs = _by_name(self._postprocess.get_input_details())
        self._post_outputs = _by_name(self._postprocess.get_output_details())
        self._category_ids = np.asarray(metadata['category_ids'], np.int64)

    def network_outputs(self, network_image):
        """float32 [1, h, w, 3] preprocessed -> {LOGITS: [1, N, C], CODES: [1, N, 4]}."""
        raise NotImplementedError

    def run_network(self, network_image):
        """float32 [1, h, w, 3] preprocessed -> (detections [M, 6], count) in network pixels."""
        outputs = self.network_outputs(network_image)
        for name in (LOGITS, CODES):
            self._postprocess.set_tensor(self._post_inputs[name], outputs[name])
        self._postprocess.invoke()
        return (self._postprocess.get_tensor(self._post_outputs[DETECTIONS_OUTPUT])[0],
                int(self._postprocess.get_tensor(self._post_outputs[NUM_DETECTIONS_OUTPUT])[0]))

    def predict_one(self, image):
        """uint8 [H, W, 3] or encoded bytes -> (boxes [M, 4], scores [M], classes [M], count)."""
        if isinstance(image, (bytes, np.bytes_)):
            network_image, scale, size = self._preprocess.decode(image)
        else:
            network_image, scale, size = self._preprocess(image)
        detections, count = self.run_network(network_image)
        return finish_detections(detections, count, scale, size, self._category_ids,
                                 self.metadata.get('clip_to_image', True))

    def predict(self, images):
        per_image = [self.predict_one(image) for image in images]
        return {key: np.stack([result[index] for result in per_image]).astype(dtype)
                for index, (key, dtype) in enumerate(zip(
                    OUTPUT_KEYS, (np.float32, np.float32, np.int64, np.int32)))}

    def close(self):
        self._postprocess = None


class TFLitePredictor(ExportPredictor):
    """A TFLite export: the network file in tf.lite.Interpreter (XNNPACK, every core)."""

    def __init__(self, model_path=None, metadata=None, model_content=None,
                 postprocess_content=None, num_threads=None):
        super().__init__(model_path, metadata, postprocess_content, num_threads)
        self._interpreter = _load(model_path, model_content, num_threads)
        (self._input,) = self._interpreter.get_input_details()
        self._outputs = _by_name(self._interpreter.get_output_details())

    def network_outputs(self, network_image):
        self._interpreter.set_tensor(self._input['index'], network_image)
        self._interpreter.invoke()
        return {name: self._interpreter.get_tensor(self._outputs[name])
                for name in (LOGITS, CODES)}

    def close(self):
        super().close()
        self._interpreter = None
