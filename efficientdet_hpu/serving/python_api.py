"""`Detector`: a trained detector in a Python process, as the field's one-liners go
(`Detector(path).predict(source)`, like Ultralytics' `YOLO(path).predict(src)`).

    from efficientdet_hpu import Detector
    detector = Detector('runs/demo')                 # or a SavedModel dir, .tflite, .onnx
    for found in detector.predict('photos/'):        # path, glob, folder, PIL, NumPy, list
        print(found.path, found.boxes, found.class_names)   # x1, y1, x2, y2 pixels
        found.save('out/' + os.path.basename(found.path))

The path's kind is read from what it holds: a training run directory (config.yaml and
checkpoints: its own config and label map, the EMA weights), a fine-tune's --output_dir (its
model/ run at the checkpoint it evaluated and exported, tiled as its plan tiles), a SavedModel
directory, a .tflite or .onnx file of `inference.py export`. Each runs through the predictor
`inference.py predict` uses for it (serving/detector.py, tflite_runner.py, onnx_runner.py,
tiled_predict.py), on images read as it reads them (serving/sources.py), so both give the same
detections.
"""
import json
import os
import re

import numpy as np

from efficientdet_hpu.core import tf_env  # (before anything imports tensorflow)
from absl import logging

from efficientdet_hpu.serving import detector as detector_lib
from efficientdet_hpu.serving import flip_predict
from efficientdet_hpu.serving import model_spec
from efficientdet_hpu.serving import onnx_runner
from efficientdet_hpu.serving import predict
from efficientdet_hpu.serving import sources
from efficientdet_hpu.serving import tflite_runner
from efficientdet_hpu.serving import tiled_predict
from efficientdet_hpu.serving.model_spec import InferenceError
from efficientdet_hpu.serving.results import Detections

FORMATS = ('model_dir', 'saved_model', 'tflite', 'onnx')
FINETUNE = 'finetune'  # A fine-tune's --output_dir: its model/ is a FORMATS' model_dir.
ACCEPTED = ('a training run directory (config.yaml and checkpoints, as main.py writes it), a '
            'fine-tune\'s --output_dir, a SavedModel directory, or a .tflite or .onnx file of '
            '`python inference.py export`')
BEST_DIR = 'best'  # Where evaluation keeps the best checkpoint (engine/checkpoint_eval.py).
# A fine-tune's --output_dir (finetune/runner.py's Layout): the plan and the main.py run.
FINETUNE_PLAN, FINETUNE_MODEL, FINETUNE_SUMMARY = 'plan.json', 'model', 'summary.json'
DEFAULT_TILE_OVERLAP = 64  # inference.py predict's --tile_overlap.
CHECKPOINT_INDEX = re.compile(r'model\.ckpt-(\d+)\.index')
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
        if os.path.isfile(os.path.join(path, FINETUNE_PLAN)):
            if not os.path.isfile(os.path.join(path, FINETUNE_MODEL, 'config.yaml')):
                raise InferenceError('Detector(%r): a fine-tune that has not trained yet (no '
                                     '%s/config.yaml); rerun its finetune.py command to finish '
                                     'it' % (path, FINETUNE_MODEL))
            return FINETUNE
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


def _steps_held(model_dir):
    """'steps 0, 2' (the checkpoints model_dir holds), or 'no checkpoint'."""
    steps = sorted(int(found.group(1)) for found in map(CHECKPOINT_INDEX.fullmatch,
                                                        os.listdir(model_dir)) if found)
    return 'steps %s' % ', '.join(map(str, steps)) if steps else 'no checkpoint'


def _checkpoint_of(model_dir, checkpoint):
    """The checkpoint prefix `checkpoint` names in model_dir: 'latest' (None: the newest, as
    inference.py), 'best' (model_dir/best, kept by evaluation), a step (int or digits), or a
    prefix (as given, else in model_dir)."""
    if checkpoint in (None, 'latest'):
        if not checkpoints_held(model_dir):
            raise InferenceError('%s holds no checkpoint yet; train into it first (a '
                                 'fine-tune: rerun its command)' % model_dir)
        return None
    if checkpoint == 'best':
        best = os.path.join(model_dir, BEST_DIR)
        if not os.path.isfile(os.path.join(best, 'checkpoint')):
            raise InferenceError(
                "checkpoint='best': %s does not exist; evaluation keeps the best checkpoint "
                "there (--mode=train_and_eval or --mode=eval); use checkpoint='latest'" % best)
        return best
    if isinstance(checkpoint, int) or str(checkpoint).isdigit():
        prefix = os.path.join(model_dir, 'model.ckpt-%d' % int(checkpoint))
    else:
        prefix = os.fspath(checkpoint)
        if not os.path.exists(prefix + '.index') and not os.path.isdir(prefix):
            prefix = os.path.join(model_dir, prefix)
    if '://' not in prefix and not (os.path.exists(prefix + '.index') or os.path.isdir(prefix)):
        raise InferenceError('checkpoint=%r: no checkpoint %s; %s holds %s (pass a step, '
                             "'latest' or 'best')" % (checkpoint, prefix, model_dir,
                                                     _steps_held(model_dir)))
    return prefix


def checkpoints_held(model_dir):
    """True when model_dir's `checkpoint` file or a model.ckpt-N.index is there."""
    return (os.path.isfile(os.path.join(model_dir, 'checkpoint'))
            or _steps_held(model_dir) != 'no checkpoint')


def _open_model_dir(path, checkpoint, hparams, label_map):
    if label_map is not None and not os.path.isfile(label_map):
        raise InferenceError('label_map=%r: no such file; pass a label map JSON (main.py '
                             'writes one as model_dir/label_map.json)' % os.fspath(label_map))
    spec = model_spec.load_model_spec(path, _checkpoint_of(path, checkpoint), hparams,
                                      label_map, checkpoint_argument="checkpoint='%s'")
    # Batch of any size: whole images one at a time, tiles in batches.
    return (detector_lib.GraphPredictor(spec, batch_size=None),
            predict.category_names(spec.label_map), spec.checkpoint)


def finetune_model(path, checkpoint=None):
    """(model_dir, checkpoint, (tile_size, tile_overlap), tta) of a fine-tune's --output_dir:
    its main.py run at the checkpoint the fine-tune evaluated and exported (best/ when
    evaluation kept one, else the newest) unless `checkpoint` names another, its plan's tiles
    ((None, None) when the plan does not tile), and whether it chose flips at test time (its
    summary.json's `tta`: its evaluation measured both; False before it finished)."""
    model_dir = os.path.join(path, FINETUNE_MODEL)
    with open(os.path.join(path, FINETUNE_PLAN)) as stream:
        plan = json.load(stream)
    try:
        with open(os.path.join(path, FINETUNE_SUMMARY)) as stream:
            tta = bool(json.load(stream).get('tta'))
    except (OSError, ValueError):
        tta = False
    if checkpoint is None and os.path.isfile(os.path.join(model_dir, BEST_DIR, 'checkpoint')):
        checkpoint = 'best'
    tile_size = plan.get('tile_size') or None
    tiles = (tile_size, plan.get('tile_overlap') if tile_size else None)
    return model_dir, checkpoint, tiles, tta


def open_predictor(path, kind, checkpoint=None, hparams='', label_map=None):
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


def _is_number(value, low, high):
    return (isinstance(value, (int, float, np.integer, np.floating))
            and not isinstance(value, bool) and low <= value <= high)


def _is_whole(value, low):
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool) and value >= low


def _check_arguments(score_threshold, max_detections, tile_size, tile_overlap,
                     tile_batch_size, tta):
    """InferenceError naming the first argument of predict's that is out of its range."""
    for name, value, fine, need in (
            ('score_threshold', score_threshold, _is_number(score_threshold, 0, 1),
             'a number from 0 to 1'),
            ('max_detections', max_detections,
             max_detections is None or _is_whole(max_detections, 1), 'None or an int >= 1'),
            ('tile_size', tile_size, tile_size is None or _is_whole(tile_size, 0),
             'None, 0 (whole images) or an int of pixels'),
            ('tile_overlap', tile_overlap, tile_overlap is None or _is_whole(tile_overlap, 0),
             'None or an int of pixels'),
            ('tile_batch_size', tile_batch_size, _is_whole(tile_batch_size, 1),
             'an int >= 1'),
            ('tta', tta, tta is None or isinstance(tta, bool), 'None, True or False')):
        if not fine:
            raise InferenceError('predict(%s=%r): %s' % (name, value, need))


class Detector:
    """A trained EfficientDet, loaded from `path` (see the module docstring for the kinds).

    Args:
      path: training run directory, fine-tune --output_dir, SavedModel directory, .tflite or
        .onnx file.
      checkpoint: for a training run or a fine-tune: None (the default: a training run's
        newest checkpoint, as inference.py uses; a fine-tune's best, the one it evaluated and
        exported), 'latest', 'best' (model_dir/best, the best AP evaluation kept), a step
        (1000) or a checkpoint prefix. The weights are its exponential moving averages.
      hparams: for a training run: overrides on its config.yaml ('nms_configs.iou_thresh=0.6').
      label_map: for a training run: a label map JSON instead of its own.
      verbose: keep TensorFlow's Python log (quieted to errors by default, as the commands do).
    Attributes: path, format (one of FORMATS, or FINETUNE), checkpoint (prefix used, or None
      for an export), names ({category_id: name}), tiles ((tile_size, tile_overlap) predict
      uses by default: a fine-tune's plan's, else (None, None): whole images), tta (whether
      predict fuses each image's left-right flip by default: a fine-tune's choice, measured on
      its validation photos, else False).
    """

    def __init__(self, path, checkpoint=None, hparams='', label_map=None, verbose=False):
        tf_env.quiet_python_logging(verbose)
        self.path = os.fspath(path)
        self.format = sniff(self.path)
        model, kind, self.tiles, self.tta = self.path, self.format, (None, None), False
        if kind == FINETUNE:  # Its model/ is a training run directory.
            model, checkpoint, self.tiles, self.tta = finetune_model(self.path, checkpoint)
            kind = 'model_dir'
        self._predictor, self.names, self.checkpoint = open_predictor(
            model, kind, checkpoint, hparams, label_map)
        if self.checkpoint:
            logging.info('Detector: %s, checkpoint %s', self.path, self.checkpoint)

    def __repr__(self):
        weights = ''
        if self.checkpoint:
            inside = os.path.relpath(self.checkpoint, self.path)
            weights = ', checkpoint %s' % (self.checkpoint if inside.startswith('..') else inside)
        tiles = ', tiles of %d px' % self.tiles[0] if self.tiles[0] else ''
        tiles += ', flips fused' if self.tta else ''
        return '<Detector %s (%s%s%s), %d class names>' % (self.path, self.format, weights,
                                                           tiles, len(self.names))

    def predict(self, source, score_threshold=DEFAULT_SCORE_THRESHOLD, max_detections=None,
                tile_size=None, tile_overlap=None, tile_batch_size=4, stream=False, tta=None):
        """Detections per image of `source`: a file path, a glob, a folder, a PIL image, a
        uint8 RGB array [H, W, 3] or a batch [N, H, W, 3], or a list of them.

        score_threshold: keep detections scoring at least this (0: everything the model
          returns, as detections.json holds; its config's NMS threshold is 0.001).
        max_detections: keep at most this many per image (None: the model's cap,
          nms_configs.max_output_size, 100 by default; with tiles no cap).
        tile_size: run overlapping tiles of this many pixels and merge them over the photo
          (for photos much larger than the model's input; any pixel count is then read), as
          `inference.py predict --tile_size`; tile_overlap (default 64) and tile_batch_size as
          its flags. None: `tiles` (a fine-tune's plan's, else whole images); 0: whole images.
        stream: return a generator (one image in memory at a time) instead of a list.
        tta: also run each image (each tile) mirrored left-right and fuse the two views
          (serving/flip_predict.py; `inference.py predict --tta`): twice the network time.
          None: `tta` (a fine-tune's choice, else False).
        Returns a list of Detections (serving/results.py), in input order. A file that
        cannot be decoded is skipped with a warning, as inference.py skips it; when no image
        at all could be read, InferenceError.
        """
        _check_arguments(score_threshold, max_detections, tile_size, tile_overlap,
                         tile_batch_size, tta)
        if tile_size is None:
            tile_size, tile_overlap = self.tiles[0], (
                self.tiles[1] if tile_overlap is None else tile_overlap)
        if tile_overlap is None:
            tile_overlap = DEFAULT_TILE_OVERLAP
        if tile_size and not 0 <= tile_overlap < tile_size:
            raise InferenceError('tile_overlap=%d must be at least 0 and smaller than '
                                 'tile_size=%d' % (tile_overlap, tile_size))
        if self._predictor is None:
            raise InferenceError('this Detector of %s was closed; create a new one' % self.path)
        items = sources.expand(source)
        results = self._results(items, score_threshold, max_detections,
                                (tile_size, tile_overlap, tile_batch_size),
                                self.tta if tta is None else tta)
        return results if stream else list(results)

    __call__ = predict

    def _results(self, items, score_threshold, max_detections, tiles, tta):
        tile_size, tile_overlap, tile_batch_size = tiles
        predictor = self._predictor
        if tta:  # Inside the tiles, as inference.py predict --tta.
            predictor = flip_predict.FlipPredictor(predictor)
        if tile_size:
            predictor = tiled_predict.TiledPredictor(predictor, tile_size, tile_overlap,
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
