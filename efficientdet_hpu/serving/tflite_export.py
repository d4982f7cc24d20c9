"""TFLite export of a trained detector (`python inference.py export --formats=tflite_fp32,...`).

Two files, both TFLite builtin ops only (no SELECT_TF_OPS):

  model_<precision>.tflite   the network, the checkpoint's EMA weights frozen in
    input   images        float32 [1, h, w, 3]  the eval preprocessing's output: resized to
                                               fit h x w, normalised by mean_rgb/stddev_rgb,
                                               zero-padded bottom/right (dataloader.
                                               preprocess_for_eval; tflite_runner.py runs it)
    outputs class_logits  float32 [1, N, C]     anchor order (level, y, x, anchor)
            box_codes     float32 [1, N, 4]     [ty, tx, th, tw]
  postprocess_fp32.tflite    the config's post-processing on them (modeling/postprocess.py:
                             decode, per-class or class-agnostic, hard or Gaussian soft NMS as
                             NON_MAX_SUPPRESSION_V5, a TFLite builtin), float32
    outputs detections     float32 [1, M, 6]    [ymin, xmin, ymax, xmax] network-input
                                               pixels, score, label (class index + 1); zero
                                               rows pad
            num_detections int32   [1]          real rows

Why two files: the converter does put the post-processing in the network's file, but its
loops have dynamic shapes and TF 2.15's interpreter then applies no XNNPACK delegate to the
whole model (the network ran 2-3x slower), and the int8 calibrator crashes on them. Scaling
boxes to the image, clipping and mapping labels to category ids are left to the host.

Precisions of the network file:
  tflite_fp32  model_fp32.tflite  plain conversion
  tflite_fp16  model_fp16.tflite  float16 weights (computed in float32)
  tflite_int8  model_int8.tflite  post-training quantization: int8 weights and activations,
                                  ranges calibrated on --calibration_file_pattern images
                                  (default 200), float32 in and out
The ONNX file of the same network (onnx_fp32, model_fp32.onnx: serving/onnx_export.py) is
written here too, beside them, with the same post-processing file.
export_dir/tflite.json holds what the host needs (input size, normalisation, category ids and
names, clip_to_image) and how each file was made, the ONNX file included. Files are written
atomically.
"""
import glob
import json
import os
import time

import tensorflow as tf

from efficientdet_hpu.config import hparams_config
from efficientdet_hpu.core import atomic_file
from efficientdet_hpu.core import tf_env
from efficientdet_hpu.data import tfrecord_format
from efficientdet_hpu.network import efficientdet_arch
from efficientdet_hpu.ops import anchors
from efficientdet_hpu.ops import postprocess
from efficientdet_hpu.serving import detector
from efficientdet_hpu.serving import model_spec
from efficientdet_hpu.serving import onnx_export
from efficientdet_hpu.serving import predict
from efficientdet_hpu.serving import tflite_runner
from efficientdet_hpu.serving.formats import (  # noqa: F401  (this module's names too)
    DEFAULT_CALIBRATION_COUNT, FORMATS, NETWORK_FILES, SAVED_MODEL, TFLITE_FILES)
from efficientdet_hpu.serving.model_spec import InferenceError

tf1 = tf.compat.v1

POSTPROCESS_FILE = 'postprocess_fp32.tflite'  # Every network file's post-processing.


def parse_formats(text, flag='--formats'):
    """'saved_model,tflite_int8' -> ['saved_model', 'tflite_int8'] (order kept, no repeats)."""
    formats = []
    for name in (part.strip() for part in (text or '').split(',')):
        if name and name not in formats:
            formats.append(name)
    unknown = [name for name in formats if name not in FORMATS]
    if unknown or not formats:
        raise InferenceError('%s=%s: %s; choose from %s' % (
            flag, text, 'unknown format %s' % ', '.join(unknown) if unknown else 'empty',
            ','.join(FORMATS)))
    return formats


# ----------------------------------------------------------------------------- graph

def _detection_outputs(class_outputs, box_outputs, config):
    """The config's post-processing in network pixels: [detections, num_detections]."""
    height, width = hparams_config.parse_image_size(config.image_size)
    anchor_boxes = anchors.generate_anchor_boxes(height, width,
                                                 **hparams_config.anchor_settings(config))
    nms = hparams_config.nms_settings(config)
    nms.pop('clip_to_image')  # Done on the host, where the image size is known.
    # Image scale 1: rows come back in network-input pixels.
    rows, count = postprocess.generate_detections(
        class_outputs, box_outputs, anchor_boxes, tf.zeros([1], tf.int64), tf.ones([1]),
        None, num_classes=config.num_classes, network_size=(height, width), **nms)
    return [tf.identity(rows[..., 1:], name=tflite_runner.DETECTIONS_OUTPUT),
            tf.identity(count, name=tflite_runner.NUM_DETECTIONS_OUTPUT)]


def build_tflite_graph(spec, part):
    """A frozen graph of `spec` for conversion: (graph, [input tensors], [output tensors]).

    part 'network': images -> class_logits float32 [1, N, C], box_codes float32 [1, N, 4]
    (anchor order); 'postprocess': class_logits, box_codes -> detections, num_detections.
    """
    config = spec.config
    height, width = hparams_config.parse_image_size(config.image_size)
    num_anchors = len(anchors.generate_anchor_boxes(height, width,
                                                    **hparams_config.anchor_settings(config)))
    with tf.Graph().as_default():
        if part == 'postprocess':
            logits = tf1.placeholder(tf.float32, [1, num_anchors, config.num_classes],
                                     name=tflite_runner.LOGITS)
            codes = tf1.placeholder(tf.float32, [1, num_anchors, 4], name=tflite_runner.CODES)
            inputs = [logits, codes]
            # One "level" holding every anchor: flatten_levels leaves it as it is.
            outputs = _detection_outputs({config.min_level: logits}, {config.min_level: codes},
                                         config)
        else:
            inputs = [tf1.placeholder(tf.float32, [1, height, width, 3], name='images')]
            class_outputs, box_outputs = efficientdet_arch.build_model(
                inputs[0], config, is_training=False, compute_dtype='float32')
            outputs = [
                tf.identity(postprocess.flatten_levels(class_outputs, config.num_classes),
                            name=tflite_runner.LOGITS),
                tf.identity(postprocess.flatten_levels(box_outputs, 4), name=tflite_runner.CODES)]
        with tf1.Session() as session:
            if part != 'postprocess':
                detector.initialize_weights(session, spec)
            graph_def = detector.freeze(session, outputs)
    tensors = dict(enumerate(inputs + outputs))
    graph, tensors = detector.import_frozen(graph_def, tensors)
    return graph, [tensors[i] for i in range(len(inputs))], [
        tensors[i] for i in range(len(inputs), len(tensors))]


def convert(spec, fmt, representative_images=None):
    """The network file's bytes of `spec` in format `fmt` (a NETWORK_FILES key). tflite_int8
    needs representative_images: a callable returning an iterable of float32 [1, h, w, 3]."""
    if fmt in onnx_export.ONNX_FILES:
        return onnx_export.convert_graph(*build_tflite_graph(spec, 'network'))
    if fmt not in TFLITE_FILES:
        raise ValueError('not a network file format: %r' % fmt)
    if fmt == 'tflite_int8' and representative_images is None:
        raise ValueError('tflite_int8 needs representative_images')
    return _convert(spec, 'network', fmt, representative_images)


def convert_postprocess(spec):
    """The float32 post-processing file's bytes (the same for every precision)."""
    return _convert(spec, 'postprocess', 'tflite_fp32')


def _convert(spec, part, fmt, representative_images=None):
    graph, inputs, outputs = build_tflite_graph(spec, part)
    with graph.as_default(), tf1.Session(graph=graph) as session:
        converter = tf1.lite.TFLiteConverter.from_session(session, inputs, outputs)
        converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS]
        if fmt == 'tflite_fp16':
            converter.optimizations = [tf.lite.Optimize.DEFAULT]
            converter.target_spec.supported_types = [tf.float16]
        elif fmt == 'tflite_int8':
            converter.optimizations = [tf.lite.Optimize.DEFAULT]
            converter.representative_dataset = lambda: ([image] for image in
                                                        representative_images())
        with tf_env.quiet_native_output():
            return converter.convert()


# ----------------------------------------------------------------------------- calibration

def _encoded_images_of_records(file_pattern, count):
    """Up to `count` encoded images of the TFRecords matching file_pattern (files in order)."""
    files = sorted(tf.io.gfile.glob(file_pattern))
    if not files:
        raise InferenceError('--calibration_file_pattern=%s matches no file; give TFRecords '
                             '(e.g. data/train-*.tfrecord) or a directory of images'
                             % file_pattern)
    features = {tfrecord_format.IMAGE_ENCODED: tf.io.FixedLenFeature([], tf.string, '')}
    dataset = tf.data.TFRecordDataset(files).take(count).map(
        lambda raw: tf.io.parse_single_example(raw, features)[tfrecord_format.IMAGE_ENCODED])
    try:
        return [data for data in dataset.as_numpy_iterator() if data]
    except tf.errors.DataLossError as error:
        raise InferenceError('--calibration_file_pattern=%s: a file is not a TFRecord (%s)'
                             % (file_pattern, error.message.splitlines()[0])) from error


def calibration_images(source, config, count=DEFAULT_CALIBRATION_COUNT):
    """float32 [1, h, w, 3] network inputs of up to `count` images of `source` (a directory
    of image files, or a TFRecord file pattern), preprocessed as at inference."""
    preprocessor = tflite_runner.Preprocessor(config.image_size, config.mean_rgb,
                                              config.stddev_rgb)
    if os.path.isdir(source):
        images = [preprocessor(predict.read_rgb(path))[0]
                  for path in predict.list_images(source)[:count]]
    else:
        images = [preprocessor.decode(data)[0]
                  for data in _encoded_images_of_records(source, count)]
    if not images:
        raise InferenceError('--calibration_file_pattern=%s holds no image' % source)
    return images


def default_calibration_source(model_dir):
    """The training TFRecords model_dir/flags.json names (what main.py trained on), or None."""
    pattern = model_spec.run_flags(model_dir).get('training_file_pattern')
    return pattern if pattern and glob.glob(pattern) else None


# ----------------------------------------------------------------------------- files

def export_metadata(spec):
    """tflite.json's content shared by every precision of `spec`."""
    config = spec.config
    table = detector.category_id_table(spec.label_map, config.num_classes)
    return {
        'model_name': config.name, 'image_size': config.image_size,
        'mean_rgb': list(config.mean_rgb), 'stddev_rgb': list(config.stddev_rgb),
        'num_classes': config.num_classes, 'category_ids': table.tolist(),
        'category_names': {str(k): v for k, v in predict.category_names(
            spec.label_map).items()},
        'clip_to_image': bool(config.nms_configs.clip_to_image),
        'nms': hparams_config.nms_settings(config), 'checkpoint': spec.checkpoint,
        'input': 'images float32 [1, %d, %d, 3]: dataloader.preprocess_for_eval output'
                 % hparams_config.parse_image_size(config.image_size),
        'outputs': 'detections float32 [1, M, 6] network pixels ymin, xmin, ymax, xmax, '
                   'score, label; num_detections int32 [1]',
    }


def _write_metadata(export_dir, spec, files):
    path = os.path.join(export_dir, tflite_runner.METADATA_FILE)
    previous = {}
    if os.path.isfile(path):
        with open(path) as f:
            previous = json.load(f).get('files', {})
    metadata = dict(export_metadata(spec), files=dict(previous, **files))
    atomic_file.write_json_atomically(path, metadata, indent=1, sort_keys=True)


def export_network_files(spec, export_dir, formats, calibration_source=None,
                         calibration_count=DEFAULT_CALIBRATION_COUNT, log=print):
    """Writes export_dir/model_<precision>.tflite or .onnx for each TFLite or ONNX format in
    `formats`, the post-processing file and export_dir/tflite.json; returns the written paths."""
    formats = [fmt for fmt in formats if fmt in NETWORK_FILES]
    if not formats:
        return []
    if spec.checkpoint is None:
        raise InferenceError('refusing to export random weights: give a checkpoint')
    representative = None
    if 'tflite_int8' in formats:
        if not calibration_source:
            raise InferenceError('tflite_int8 needs calibration images: pass '
                                 '--calibration_file_pattern=TFRECORD_GLOB or an image directory')
        images = calibration_images(calibration_source, spec.config, calibration_count)
        log('calibrating int8 on %d images of %s' % (len(images), calibration_source))
        representative = lambda: iter(images)
    os.makedirs(export_dir, exist_ok=True)
    written, files = [], {}
    for fmt in formats:
        start = time.time()
        name = NETWORK_FILES[fmt]
        files[name] = {'format': fmt, 'exported_at': time.strftime('%Y-%m-%dT%H:%M:%S%z')}
        content = convert(spec, fmt, representative)
        files[name].update(bytes=len(content), postprocess=POSTPROCESS_FILE)
        if fmt in onnx_export.ONNX_FILES:
            files[name]['converter'] = 'tf2onnx, opset %d' % onnx_export.OPSET
        if fmt == 'tflite_int8':
            files[name]['calibration'] = {'source': calibration_source, 'images': len(images)}
        written.append(_write_file(os.path.join(export_dir, name), content))
        log('wrote %s (%.1f MB, %.0f s)' % (written[-1], len(content) / 2.0 ** 20,
                                            time.time() - start))
    written.append(_write_file(os.path.join(export_dir, POSTPROCESS_FILE),
                               convert_postprocess(spec)))
    _write_metadata(export_dir, spec, files)
    return written


def _write_file(path, content):
    with atomic_file.replacing(path) as temporary:
        with open(temporary, 'wb') as f:
            f.write(content)
    return path
