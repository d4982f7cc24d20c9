r"""Export and prediction from the command line (the library is the serving/ package).

    python inference.py export --model_dir=runs/demo --export_dir=runs/demo/saved_model \
        [--formats=saved_model,tflite_fp32,tflite_fp16,tflite_int8,onnx_fp32] \
        [--calibration_file_pattern='data/train-*.tfrecord' | DIR] [--calibration_count=200]
    python inference.py predict --saved_model=runs/demo/saved_model --input=photos/ \
        --output_dir=runs/demo/predictions [--repeat=10] [--min_score=0.3]
    python inference.py predict --model_dir=runs/demo --input=photo.jpg --output_dir=out
    python inference.py predict --tflite=runs/demo/saved_model/model_int8.tflite ...
    python inference.py predict --onnx=runs/demo/saved_model/model_fp32.onnx ...

The model comes from model_dir/config.yaml (written by main.py), the label map from the
`training_file_pattern` in model_dir/flags.json (or --label_map). See serving/detector.py for
what the graph computes, serving/export.py for the SavedModel's signatures and
serving/tflite_export.py for the TFLite files and serving/onnx_export.py for the ONNX file
(written into export_dir beside the SavedModel; an export that includes saved_model replaces
export_dir, older .tflite and .onnx files included).
"""
import json
import os

from efficientdet_hpu.core import tf_env  # (before anything imports tensorflow)
from absl import app, flags

from efficientdet_hpu.core import atomic_file
from efficientdet_hpu.core import command_help
from efficientdet_hpu.core import errors
from efficientdet_hpu.serving import formats as export_formats

# The commands' modules import TensorFlow, seconds that --help does without: each command
# imports them as it starts (pylint: import-outside-toplevel below).

FLAGS = flags.FLAGS




def define_flags():
    flags.DEFINE_string('model_dir', None, 'Training run directory (config.yaml, checkpoints).')
    flags.DEFINE_string('checkpoint', None, 'Checkpoint prefix (default: latest in model_dir).')
    flags.DEFINE_string('hparams', '', 'Overrides on top of model_dir/config.yaml, e.g. '
                        'nms_configs.score_thresh=0.05.')
    flags.DEFINE_string('label_map', None, 'Label map JSON (default: beside the training '
                        'TFRecords named in model_dir/flags.json).')
    flags.DEFINE_string('export_dir', None, 'export: SavedModel directory to write.')
    flags.DEFINE_string('formats', 'saved_model', 'export: comma list of %s.'
                        % ', '.join(export_formats.FORMATS))
    flags.DEFINE_string('calibration_file_pattern', None, 'export tflite_int8: TFRecords '
                        "(a glob) or a directory of images to calibrate on (default: the "
                        "training TFRecords named in model_dir/flags.json).")
    flags.DEFINE_integer('calibration_count', export_formats.DEFAULT_CALIBRATION_COUNT,
                         'export tflite_int8: calibrate on at most this many images.',
                         lower_bound=1)
    flags.DEFINE_string('saved_model', None, 'predict: use this SavedModel (else model_dir).')
    flags.DEFINE_string('tflite', None, 'predict: use this .tflite file of an export (its '
                        'tflite.json beside it).')
    flags.DEFINE_string('onnx', None, 'predict: use this .onnx file of an export (its '
                        'tflite.json and post-processing file beside it).')
    flags.DEFINE_string('input', None, 'predict: an image file or a directory of images.')
    flags.DEFINE_string('output_dir', None, 'predict: annotated images + detections.json.')
    flags.DEFINE_integer('repeat', 1, 'predict: run each image N times, report latency.',
                         lower_bound=1)
    flags.DEFINE_float('min_score', 0.3, 'predict: draw detections scoring at least this '
                       '(the JSON keeps every detection).')
    flags.DEFINE_integer('tile_size', 0, 'predict: run overlapping tiles of this many pixels '
                         'and merge them over the whole photo (0: the whole image at once).',
                         lower_bound=0)
    flags.DEFINE_integer('tile_overlap', 64, 'predict: pixels adjacent tiles share.',
                         lower_bound=0)
    flags.DEFINE_integer('tile_batch_size', 4, 'predict: tiles per network call.', lower_bound=1)
    flags.DEFINE_bool('tta', False, 'predict: test-time augmentation: each image (each tile) '
                      'also run mirrored left-right and the two views fused by weighted box '
                      'fusion; twice the network time.')
    flags.DEFINE_string('annotations_file', None, 'predict: a COCO JSON of the input photos '
                        '(matched by file name): AP, AP50 and recall at IoU 0.4 into '
                        'output_dir/metrics.json.')
    flags.DEFINE_bool('verbose', False, "TensorFlow's own log lines, and tracebacks with "
                      'error messages.')


def _require(*names):
    from efficientdet_hpu.serving import model_spec  # pylint: disable=import-outside-toplevel
    missing = [name for name in names if not FLAGS[name].value]
    if missing:
        raise model_spec.InferenceError('missing %s' % ', '.join('--' + name for name in missing))


def _spec_from_flags():
    from efficientdet_hpu.serving import model_spec  # pylint: disable=import-outside-toplevel
    _require('model_dir')
    return model_spec.load_model_spec(FLAGS.model_dir, FLAGS.checkpoint, FLAGS.hparams,
                                      FLAGS.label_map)


def run_export():
    # pylint: disable=import-outside-toplevel
    from efficientdet_hpu.serving import export, model_spec, onnx_export, tflite_export
    _require('model_dir', 'export_dir')
    export.check_export_dir(FLAGS.export_dir)  # Before the model is built.
    formats = tflite_export.parse_formats(FLAGS.formats)
    spec = _spec_from_flags()
    calibration = (FLAGS.calibration_file_pattern
                   or tflite_export.default_calibration_source(FLAGS.model_dir))
    if 'tflite_int8' in formats and not calibration:  # Said before any file is written.
        raise model_spec.InferenceError(
            'tflite_int8 needs calibration images and %s/flags.json names no training '
            'TFRecords: pass --calibration_file_pattern=TFRECORD_GLOB or an image directory'
            % FLAGS.model_dir)
    if set(formats) & set(onnx_export.ONNX_FILES):
        onnx_export.import_tf2onnx()  # A missing package is said before any file is written.
    if tflite_export.SAVED_MODEL in formats:
        print('exported %s' % export.export_saved_model(spec, FLAGS.export_dir))
    for path in tflite_export.export_network_files(spec, FLAGS.export_dir, formats,
                                                   calibration, FLAGS.calibration_count):
        print('exported %s' % path)
    return 0


def _predictor_and_names():
    """The predictor the flags name (--tflite, --onnx, --saved_model or --model_dir) and its
    {category_id: name}."""
    # pylint: disable=import-outside-toplevel
    from efficientdet_hpu.serving import (detector, model_spec, onnx_runner, predict,
                                          tflite_runner)
    if FLAGS.tflite and FLAGS.onnx:
        raise model_spec.InferenceError('give --tflite=FILE or --onnx=FILE, not both')
    if FLAGS.onnx:
        predictor = onnx_runner.ONNXPredictor(FLAGS.onnx)
        return predictor, predictor.names
    if FLAGS.tflite:
        predictor = tflite_runner.TFLitePredictor(FLAGS.tflite)
        return predictor, predictor.names
    if FLAGS.saved_model:
        return (detector.SavedModelPredictor(FLAGS.saved_model),
                predict.category_names_of_saved_model(FLAGS.saved_model))
    if not FLAGS.model_dir:
        raise model_spec.InferenceError('predict needs --saved_model=DIR (an export), '
                                        '--tflite=FILE.tflite, --onnx=FILE.onnx or '
                                        '--model_dir=DIR (a training run)')
    spec = _spec_from_flags()
    # Tiles come in batches of --tile_batch_size (the last one smaller): any batch size.
    return (detector.GraphPredictor(spec, batch_size=None if FLAGS.tile_size else 1),
            predict.category_names(spec.label_map))


def run_predict():
    # pylint: disable=import-outside-toplevel
    from efficientdet_hpu.engine import train_log
    from efficientdet_hpu.evaluation import photo_eval
    from efficientdet_hpu.serving import flip_predict, model_spec, predict, tiled_predict
    _require('input', 'output_dir')
    if FLAGS.tile_size and not FLAGS.tile_overlap < FLAGS.tile_size:
        raise model_spec.InferenceError('--tile_overlap=%d must be smaller than --tile_size=%d'
                                        % (FLAGS.tile_overlap, FLAGS.tile_size))
    if FLAGS.annotations_file and not os.path.isfile(FLAGS.annotations_file):
        raise model_spec.InferenceError('--annotations_file=%s does not exist; give the COCO '
                                        'JSON of the photos' % FLAGS.annotations_file)
    predict.check_output_dir(FLAGS.input, FLAGS.output_dir)  # Before the model loads.
    predictor, names = _predictor_and_names()
    if FLAGS.tta:  # Inside the tiles: each tile flipped on its own, the seams merged after.
        predictor = flip_predict.FlipPredictor(predictor)
    if FLAGS.tile_size:
        predictor = tiled_predict.TiledPredictor(predictor, FLAGS.tile_size, FLAGS.tile_overlap,
                                                 FLAGS.tile_batch_size)
    predicted = []
    try:
        status = predict.predict_files(predictor, names, FLAGS.input, FLAGS.output_dir,
                                       repeat=FLAGS.repeat, min_score=FLAGS.min_score,
                                       any_size=bool(FLAGS.tile_size), processed_names=predicted)
    finally:
        predictor.close()
    if FLAGS.tile_size:  # What a photo of this size needs: the photo, one batch, the boxes.
        print('peak host memory of this process: %.2f GiB'
              % (train_log.host_memory_mb()[1] / 1024.0))
    if FLAGS.annotations_file and status == 0:
        metrics = photo_eval.evaluate_file(
            os.path.join(FLAGS.output_dir, predict.RESULTS_FILE), FLAGS.annotations_file,
            photos=predicted)
        atomic_file.write_json_atomically(os.path.join(FLAGS.output_dir, 'metrics.json'),
                                          metrics, indent=1)
        print('against %s: %s' % (FLAGS.annotations_file, json.dumps(metrics)))
    return status


COMMANDS = {'export': run_export, 'predict': run_predict}


def main(argv):
    errors.check_command(argv, COMMANDS)
    if len(argv) != 2 or argv[1] not in COMMANDS:
        return errors.fail('inference.py', 'give one command: inference.py {%s} --flags...'
                           % ','.join(COMMANDS))
    tf_env.quiet_python_logging(FLAGS.verbose)
    try:
        return COMMANDS[argv[1]]()
    except (errors.UserError, FileNotFoundError) as error:
        return errors.fail('inference.py', error, FLAGS.verbose)
    except Exception as error:  # pylint: disable=broad-except
        message = errors.disk_full_message(error, FLAGS.export_dir or FLAGS.output_dir or '.')
        if message is None:
            raise  # A bug: keep the traceback.
        return errors.fail('inference.py', message, FLAGS.verbose)


def entry_point():
    """Parses the command line and runs the command (the module's `main`)."""
    define_flags()
    command_help.install(__name__, subcommands=COMMANDS)
    app.run(main, flags_parser=errors.parse_flags)


if __name__ == '__main__':
    entry_point()
