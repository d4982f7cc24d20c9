"""`Detector`: a trained detector in a Python process, as the field's one-liners go
(`Detector(path).predict(source)`, like Ultralytics' `YOLO(path).predict(src)`).

    from efficientdet_hpu import Detector
    detector = Detector('runs/demo')                 # or a SavedModel dir, .tflite, .onnx
    for found in detector.predict('photos/'):        # path, glob, folder, PIL, NumPy, list
        print(found.path, found.boxes, found.class_names)   # x1, y1, x2, y2 pixels
        found.save('out/' + os.path.basename(found.path))

The path's kind is read from what it holds: a training run directory (config.yaml and
checkpoints: its own config and label map, the EMA weights), a SavedModel directory, a .tflite
or .onnx file of `inference.py export`. Each runs through the predictor `inference.py predict`
uses for it (serving/detector.py, tflite_runner.py, onnx_runner.py, tiled_predict.py), on
images read as it reads them (serving/sources.py), so both give the same detections.
"""
import os

import numpy as np

from efficientdet_hpu.core import tf_env  # (before anything imports tensorflow)
from absl import logging

from efficientdet_hpu.serving import detector as detector_lib
from efficientdet_hpu.serving import model_spec
from efficientdet_hpu.serving import onnx_runner
from efficientdet_hpu.serving import predict
from efficientdet_hpu.serving import sources
from efficientdet_hpu.serving import tflite_runner
from efficientdet_hpu.serving import tiled_predict
from efficientdet_hpu.serving.model_spec import InferenceError
from efficientdet_hpu.serving.results import Detections

FORMATS = ('model_dir', 'saved_model', 'tflite', 'onnx')
ACCEPTED = ('a training run directory (config.yaml and checkpoints, as main.py writes it), a '
            'SavedModel directory, or a .tflite or .onnx file of `python inference.py export`')
BEST_DIR = 'best'  # Where evaluation keeps the best checkpoint (engine/checkpoint_eval.py).
TFLITE_MAGIC = b'TFL3'  # The flatbuffer file identifier, bytes 4-8 of every .tflite file.
DEFAULT_SCORE_THRESHOLD = 0.3  # inference.py predict's --min_score: what it draws and counts.


def _is_tflite(path):
    with open(path, 'rb') as f:
        return f.read(8)[4:8] == TFLITE_MAGIC


def sniff(path):
    """Which of FORMATS `path` holds; InferenceError naming what it is otherwise."""
    path = os.fspath(path)
    if os.path.isdir(path):
        if os.path.isfile(os.path.join(path, 'config.yaml')):
            return 'model_dir'
        if os.path.isfile(os.path.join(path, 'saved_model.pb')):
            return 'saved_model'
        raise InferenceError('Detector(%r): a directory with neither config.yaml nor '
                             'saved_model.pb; pass %s' % (path, ACCEPTED))
    if not os.path.exists(path):
        raise InferenceError('Detector(%r): no such file or directory; pass %s'
                             % (path, ACCEPTED))
    if path.lower().endswith('.onnx'):
        return 'onnx'
    if path.lower().endswith('.tflite') or _is_tflite(path):
        return 'tflite'
    if '.ckpt' in os.path.basename(path):
        raise InferenceError('Detector(%r): a checkpoint file; pass the training run directory '
                             'holding it, with checkpoint=PREFIX or a step for one other than '
                             'the newest' % path)
    raise InferenceError('Detector(%r): a file that is neither a TFLite nor an ONNX model; pass '
                         '%s' % (path, ACCEPTED))


def _checkpoint_of(model_dir, checkpoint):
    """The checkpoint prefix `checkpoint` names in model_dir: 'latest' (None: the newest, as
    inference.py), 'best' (model_dir/best, kept by evaluation), a step or a prefix."""
    if checkpoint in (None, 'latest'):
        return None
    if checkpoint == 'best':
        best = os.path.join(model_dir, BEST_DIR)
        if not os.path.isfile(os.path.join(best, 'checkpoint')):
            raise InferenceError(
                "checkpoint='best': %s does not exist; evaluation keeps the best checkpoint "
                "there (--mode=train_and_eval or --mode=eval); use checkpoint='latest'" % best)
        return best
    if isinstance(checkpoint, int):
        return os.path.join(model_dir, 'model.ckpt-%d' % checkpoint)
    return os.fspath(checkpoint)


def _open_model_dir(path, checkpoint, hparams, label_map):
    spec = model_spec.load_model_spec(path, _checkpoint_of(path, checkpoint), hparams,
                                      label_map)
    # Batch of any size: whole images one at a time, tiles in batches.
    return (detector_lib.GraphPredictor(spec, batch_size=None),
            predict.category_names(spec.label_map), spec.checkpoint)


def open_predictor(path, kind, checkpoint='latest', hparams='', label_map=None):
    """(predictor, {category_id: name}, checkpoint prefix or None) of a sniffed path."""
    if kind != 'model_dir' and (checkpoint not in (None, 'latest') or hparams or label_map):
        raise InferenceError('checkpoint, hparams and label_map apply to a training run '
                             'directory; %s is a %s export' % (path, kind))
    if kind == 'model_dir':
        return _open_model_dir(path, checkpoint, hparams, label_map)
    if kind == 'saved_model':
        return (detector_lib.SavedModelPredictor(path),
                predict.category_names_of_saved_model(path), None)
    runner = tflite_runner.TFLitePredictor if kind == 'tflite' else onnx_runner.ONNXPredictor
    predictor = runner(path)
    return predictor, predictor.names, None


def _keep(outputs, score_threshold, max_detections):
    """(boxes [ymin, xmin, ymax, xmax], scores, classes) of image 0 of `outputs`, scoring at
    least score_threshold, the max_detections best (None: all), best first."""
    count = int(outputs['num_detections'][0])
    boxes = outputs['detection_boxes'][0][:count]
    scores = outputs['detection_scores'][0][:count]
    classes = outputs['detection_classes'][0][:count]
    order = np.argsort(-scores, kind='stable')  # Predictors give best first; the cap relies on it.
    order = order[scores[order] >= score_threshold][:max_detections]
    return boxes[order], scores[order], classes[order]


class Detector:
    """A trained EfficientDet, loaded from `path` (see the module docstring for the kinds).

    Args:
      path: training run directory, SavedModel directory, .tflite or .onnx file.
      checkpoint: for a training run: 'latest' (the newest checkpoint, as inference.py uses;
        the default), 'best' (model_dir/best, the best AP evaluation kept), a step (1000) or a
        checkpoint prefix. The weights are its exponential moving averages.
      hparams: for a training run: overrides on its config.yaml ('nms_configs.iou_thresh=0.6').
      label_map: for a training run: a label map JSON instead of its own.
      verbose: keep TensorFlow's Python log (quieted to errors by default, as the commands do).
    Attributes: path, format (one of FORMATS), checkpoint (prefix used, or None for an
      export), names ({category_id: name}).
    """

    def __init__(self, path, checkpoint='latest', hparams='', label_map=None, verbose=False):
        tf_env.quiet_python_logging(verbose)
        self.path = os.fspath(path)
        self.format = sniff(self.path)
        self._predictor, self.names, self.checkpoint = open_predictor(
            self.path, self.format, checkpoint, hparams, label_map)
        if self.checkpoint:
            logging.info('Detector: %s, checkpoint %s', self.path, self.checkpoint)

    def __repr__(self):
        weights = ', checkpoint %s' % os.path.basename(self.checkpoint) if self.checkpoint else ''
        return '<Detector %s (%s%s), %d class names>' % (self.path, self.format, weights,
                                                         len(self.names))

    def predict(self, source, score_threshold=DEFAULT_SCORE_THRESHOLD, max_detections=None,
                tile_size=None, tile_overlap=64, tile_batch_size=4, stream=False):
        """Detections per image of `source`: a file path, a glob, a folder, a PIL image, a
        uint8 RGB array [H, W, 3] or a batch [N, H, W, 3], or a list of them.

        score_threshold: keep detections scoring at least this (0: everything the model
          returns, as detections.json holds; its config's NMS threshold is 0.001).
        max_detections: keep at most this many per image (None: the model's cap,
          nms_configs.max_output_size, 100 by default; with tiles no cap).
        tile_size: run overlapping tiles of this many pixels and merge them over the photo
          (for photos much larger than the model's input; any pixel count is then read), as
          `inference.py predict --tile_size`; tile_overlap and tile_batch_size as its flags.
        stream: return a generator (one image in memory at a time) instead of a list.
        Returns a list of Detections (serving/results.py), in input order. A file that
        cannot be decoded is skipped with a warning, as inference.py skips it; when no image
        at all could be read, InferenceError.
        """
        if tile_size and not 0 <= tile_overlap < tile_size:
            raise InferenceError('tile_overlap=%d must be at least 0 and smaller than '
                                 'tile_size=%d' % (tile_overlap, tile_size))
        if self._predictor is None:
            raise InferenceError('this Detector of %s was closed; create a new one' % self.path)
        items = sources.expand(source)
        results = self._results(items, score_threshold, max_detections,
                                (tile_size, tile_overlap, tile_batch_size))
        return results if stream else list(results)

    __call__ = predict

    def _results(self, items, score_threshold, max_detections, tiles):
        tile_size, tile_overlap, tile_batch_size = tiles
        predictor = self._predictor
        if tile_size:
            predictor = tiled_predict.TiledPredictor(self._predictor, tile_size, tile_overlap,
                                                     tile_batch_size,
                                                     max_detections=max_detections)
        produced = 0
        for item in items:
            pixels, problem = sources.read(item, any_size=bool(tile_size))
            if pixels is None:
                logging.warning('skipped %s: cannot decode it (%s)', item.path, problem)
                continue
            boxes, scores, classes = _keep(predictor.predict(pixels[None]), score_threshold,
                                           max_detections)
            produced += 1
            yield Detections(boxes, scores, classes, self.names, pixels.shape[1],
                             pixels.shape[0], path=item.path, position=item.position,
                             pixels=item.pixels, any_size=bool(tile_size))
        if not produced:
            raise InferenceError('none of the %d file(s) given could be decoded as an image'
                                 % len(items))

    def close(self):
        """Frees the predictor's session or interpreter; the Detector is unusable after."""
        if self._predictor is not None:
            self._predictor.close()
            self._predictor = None

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.close()
