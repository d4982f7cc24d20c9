"""SavedModel export of a trained detector (`python detector.py export ...`).

One meta graph, tag "serve", two signatures sharing one set of variables:

  serving_default   inputs  images          uint8  [B, H, W, 3]  (any H, W; one size per batch)
  serving_encoded   inputs  encoded_images  string [B]           (JPEG/PNG/GIF/BMP, sizes mixed)
  both              outputs detection_boxes    float32 [B, M, 4]  [ymin, xmin, ymax, xmax],
                                                                  pixels of each input image
                            detection_scores   float32 [B, M]     descending, 0 on padding
                            detection_classes  int64   [B, M]     dataset category ids
                            num_detections     int32   [B]        real rows per image

The weights are the checkpoint's exponential moving averages, frozen into the graph as
constants (no variables: nothing to restore, and the graph optimiser can fold batch norms
into convolutions). assets.extra/ keeps label_map.json, config.yaml and
export.json (checkpoint, time). The directory is written under a temporary name beside
export_dir and renamed into place, so a reader never sees a half-written model; an existing
export_dir is replaced.
"""
import json
import os
import shutil
import time

import tensorflow as tf

from efficientdet_hpu.serving import detector
from efficientdet_hpu.serving.model_spec import InferenceError

tf1 = tf.compat.v1

EXTRA_DIR = 'assets.extra'
SIGNATURE_PIXELS = 'serving_default'
SIGNATURE_ENCODED = 'serving_encoded'


def _build_and_freeze(spec):
    """Both input paths on one set of weights, restored and frozen: (GraphDef, tensors)."""
    config = spec.config
    with tf.Graph().as_default():
        images = tf1.placeholder(tf.uint8, [None, None, None, 3], name='images')
        encoded = tf1.placeholder(tf.string, [None], name='encoded_images')
        tensors = {'images': images, 'encoded_images': encoded}
        for prefix, preprocessed, reuse in (
                ('pixels/', detector.preprocess_images(images, config), False),
                ('encoded/', detector.decode_and_preprocess(encoded, config), True)):
            outputs = detector.build_detector(*preprocessed, config, spec.label_map, reuse=reuse)
            tensors.update({prefix + key: outputs[key] for key in detector.OUTPUT_KEYS})
        with tf1.Session() as session:
            detector.initialize_weights(session, spec)
            graph_def = detector.freeze(session, [tensors[k] for k in tensors
                                                   if '/' in k])
    return graph_def, tensors


def _build_and_save(spec, staging_dir):
    graph, tensors = detector.import_frozen(*_build_and_freeze(spec))
    signatures = {}
    with graph.as_default(), tf1.Session(graph=graph) as session:
        for name, input_key, prefix in ((SIGNATURE_PIXELS, 'images', 'pixels/'),
                                        (SIGNATURE_ENCODED, 'encoded_images', 'encoded/')):
            signatures[name] = tf1.saved_model.predict_signature_def(
                inputs={input_key: tensors[input_key]},
                outputs={key: tensors[prefix + key] for key in detector.OUTPUT_KEYS})
        builder = tf1.saved_model.Builder(staging_dir)
        builder.add_meta_graph_and_variables(
            session, [tf1.saved_model.tag_constants.SERVING], signature_def_map=signatures,
            strip_default_attrs=True)
        builder.save()


def _write_extras(spec, staging_dir):
    extra = os.path.join(staging_dir, EXTRA_DIR)
    os.makedirs(extra, exist_ok=True)
    with open(os.path.join(extra, 'config.yaml'), 'w') as f:
        f.write(spec.config.to_yaml())
    if spec.label_map is not None:
        with open(os.path.join(extra, 'label_map.json'), 'w') as f:
            json.dump(spec.label_map.to_json_dict(), f, indent=2)
    with open(os.path.join(extra, 'export.json'), 'w') as f:
        json.dump({'checkpoint': spec.checkpoint, 'label_map': spec.label_map_path,
                   'model_name': spec.config.name, 'image_size': spec.config.image_size,
                   'exported_at': time.strftime('%Y-%m-%dT%H:%M:%S%z'),
                   'signatures': [SIGNATURE_PIXELS, SIGNATURE_ENCODED]}, f, indent=1)


def _swap_into_place(staging_dir, export_dir):
    retired = None
    if os.path.exists(export_dir):
        retired = '%s.old-%d' % (export_dir, os.getpid())
        os.rename(export_dir, retired)
    os.rename(staging_dir, export_dir)
    if retired:
        shutil.rmtree(retired, ignore_errors=True)


# What an export directory holds (a SavedModel, the .tflite / .onnx files beside it and their
# notes): an export_dir holding anything else is not replaced.
EXPORT_ENTRIES = ('saved_model.pb', 'fingerprint.pb', 'variables', 'assets', 'assets.extra')
EXPORT_SUFFIXES = ('.tflite', '.onnx', '.json')


def check_export_dir(export_dir):
    """Raises InferenceError where export_dir is a file, or a directory holding more than an
    earlier export (a model_dir, a folder of photos): an export replaces its directory."""
    if os.path.exists(export_dir) and not os.path.isdir(export_dir):
        raise InferenceError('export directory %s is a file; give a new directory' % export_dir)
    if not os.path.isdir(export_dir):
        return
    other = sorted(name for name in os.listdir(export_dir) if name not in EXPORT_ENTRIES
                   and not name.endswith(EXPORT_SUFFIXES))
    if other:
        raise InferenceError('export directory %s holds %s, not an earlier export, and an export '
                             'replaces its directory; give a new or empty directory'
                             % (export_dir, ', '.join(other[:3]) + (', ...' if other[3:] else '')))


def export_saved_model(spec, export_dir):
    """Writes the SavedModel of `spec` (a serving.model_spec.ModelSpec) to export_dir, which
    it replaces (check_export_dir); returns its path."""
    if spec.checkpoint is None:
        raise InferenceError('refusing to export random weights: give a checkpoint')
    check_export_dir(export_dir)
    export_dir = os.path.abspath(export_dir)
    parent, name = os.path.split(export_dir)
    os.makedirs(parent, exist_ok=True)
    staging_dir = os.path.join(parent, '.%s.tmp-%d' % (name, os.getpid()))
    shutil.rmtree(staging_dir, ignore_errors=True)
    try:
        _build_and_save(spec, staging_dir)
        _write_extras(spec, staging_dir)
        _swap_into_place(staging_dir, export_dir)
    finally:
        shutil.rmtree(staging_dir, ignore_errors=True)
    return export_dir
