r"""google/automl's `model_inspect.py --runmode=...`, run through this project's export,
predict and benchmark code (serving/export.py, serving/detector.py, serving/visualize.py,
benchmarks/infer_bench.py). automl's flags, defaults and outputs:

    --runmode=saved_model        --ckpt_path=DIR [--saved_model_dir=/tmp/saved_model]
        the SavedModel of the checkpoint (serving/export.py; replaces saved_model_dir)
    --runmode=infer              --ckpt_path=DIR --input_image=GLOB --output_image_dir=DIR
        from the checkpoint: output_image_dir/0.jpg, 1.jpg, ... with the boxes drawn
    --runmode=saved_model_infer  --saved_model_dir=DIR --input_image=GLOB --output_image_dir=DIR
        the same from a SavedModel
    --runmode=bm                 [--ckpt_path=DIR] [--batch_size=1] [--bm_runs=10] [--threads=0]
        the network alone on random pixels with random weights, 5 warm-up runs:
        `Per batch inference time: S` and `FPS: N` (and a BENCHMARK line)
    --runmode=saved_model_benchmark --saved_model_dir=DIR --input_image=IMG
        a SavedModel end to end (preprocessing, network, NMS) on one image, 10 runs

--ckpt_path is a directory main.py trained into (its config.yaml gives the model; --model_name
is then not needed) or a checkpoint prefix in one; a directory without config.yaml (automl's
released checkpoints) is built from --model_name and --hparams. --hparams overrides go on top.
As in automl, --min_score_thresh (0.4) and --max_boxes_to_draw (100) set the NMS score
threshold and the number of detections kept (in an export too), and the drawing. Images of a
glob run --batch_size at a time (one by one when their sizes differ). Not carried: `dry`
(automl's default runmode: without --runmode this command counts parameters and FLOPs),
`freeze` and frozen .pb graphs, `ckpt`, `saved_model_video`, --tensorrt, --tflite_path
(`inference.py export --formats=tflite_fp32` writes TFLite files).
"""
import glob
import os

from absl import flags
import numpy as np
from PIL import Image

from efficientdet_hpu.benchmarks import infer_bench
from efficientdet_hpu.benchmarks import report
from efficientdet_hpu.config import recipe
from efficientdet_hpu.core import errors
from efficientdet_hpu.serving import detector
from efficientdet_hpu.serving import export
from efficientdet_hpu.serving import model_spec
from efficientdet_hpu.serving import predict
from efficientdet_hpu.serving import visualize
from efficientdet_hpu.checkpoints import checkpoints

FLAGS = flags.FLAGS

BM_WARMUP_RUNS = 5  # automl's benchmark_model(warmup_runs=5).
SAVED_MODEL_BM_RUNS = 10  # automl's ServingDriver.benchmark: 10 timed runs after one.
NOT_CARRIED = {
    'dry': 'without --runmode, model_inspect.py builds the network and prints its parameters, '
           'FLOPs and output shapes',
    'freeze': 'frozen .pb graphs are not written here; --runmode=saved_model exports a '
              'SavedModel (its weights frozen into the graph)',
    'ckpt': 'python main.py --mode=eval --model_dir=DIR evaluates a checkpoint',
    'saved_model_video': 'video is not read here; run --runmode=saved_model_infer on frames',
}
# Flags that only a run mode reads: given without --runmode they are a mistake.
RUNMODE_FLAGS = ('ckpt_path', 'saved_model_dir', 'input_image', 'output_image_dir',
                 'batch_size', 'min_score_thresh', 'max_boxes_to_draw', 'bm_runs', 'threads',
                 'tensorrt', 'tflite_path')


PLACEHOLDERS = {'ckpt_path': 'DIR', 'saved_model_dir': 'DIR', 'input_image': 'IMAGE',
                'output_image_dir': 'DIR'}


class InspectError(errors.UserError):
    """A run mode's flags do not go together; the message names the fix."""


def define_flags():
    flags.DEFINE_string('runmode', None, 'automl run mode: saved_model, infer, '
                        'saved_model_infer, bm, saved_model_benchmark (default: count '
                        'parameters and FLOPs).')
    flags.DEFINE_string('ckpt_path', None, 'Training run directory or checkpoint prefix.')
    flags.DEFINE_string('saved_model_dir', '/tmp/saved_model', 'SavedModel directory.')
    flags.DEFINE_string('input_image', None, 'Image file or glob pattern.')
    flags.DEFINE_string('output_image_dir', None, 'Where 0.jpg, 1.jpg, ... are written.')
    flags.DEFINE_integer('batch_size', 1, 'Images per network call.', lower_bound=1)
    flags.DEFINE_float('min_score_thresh', 0.4, 'Score threshold of the NMS and the drawing.')
    flags.DEFINE_integer('max_boxes_to_draw', 100, 'Detections kept and drawn per image.',
                         lower_bound=0)
    flags.DEFINE_integer('bm_runs', 10, 'bm: timed runs.', lower_bound=1)
    flags.DEFINE_integer('threads', 0, 'bm: intra-op threads (0: TensorFlow\'s choice).',
                         lower_bound=0)
    flags.DEFINE_string('tensorrt', None, 'Not carried (automl: TensorRT conversion).')
    flags.DEFINE_string('tflite_path', None, 'Not carried: use inference.py export --formats.')
    flags.DEFINE_bool('verbose', False, 'Tracebacks with error messages.')


def check_flags(runmode):
    """Raises InspectError for a flag combination that cannot run (before any work)."""
    if runmode is None:
        given = [name for name in RUNMODE_FLAGS if FLAGS[name].present]
        if given:
            raise InspectError('--%s needs a --runmode (saved_model, infer, saved_model_infer, '
                               'bm, saved_model_benchmark)' % given[0])
        return
    for name in ('image_size', 'num_classes'):
        if FLAGS[name].present:
            raise InspectError('--%s is for the parameter count; with --runmode the model is '
                               "--ckpt_path's, changed with --hparams=%s=..." % (name, name))
    if runmode in NOT_CARRIED:
        raise InspectError('--runmode=%s (automl) is not carried here: %s'
                           % (runmode, NOT_CARRIED[runmode]))
    if runmode not in MODES:
        raise InspectError('--runmode=%s is not a run mode; use one of %s'
                           % (runmode, ', '.join(MODES)))
    for name in ('tensorrt', 'tflite_path'):
        if FLAGS[name].value:
            raise InspectError('--%s is not carried here; write TFLite with python inference.py '
                               'export --model_dir=DIR --export_dir=DIR --formats=saved_model,'
                               'tflite_fp32' % name)
    missing = [name for name in MODES[runmode][1] if not FLAGS[name].value]
    if missing:
        raise InspectError('--runmode=%s needs %s' % (
            runmode, ' and '.join('--%s=%s' % (name, PLACEHOLDERS[name]) for name in missing)))


def hparams_with_nms(hparams, min_score_thresh, max_boxes_to_draw):
    """--hparams, then automl's thresholds as NMS overrides (automl's ModelInspector sets
    nms_configs' score_thresh and max_output_size from them when they are non-zero)."""
    parts = [hparams] if hparams else []
    if min_score_thresh:
        parts.append('nms_configs.score_thresh=%r' % min_score_thresh)
    if max_boxes_to_draw:
        parts.append('nms_configs.max_output_size=%d' % max_boxes_to_draw)
    return ','.join(parts)


def _hparams():
    return hparams_with_nms(FLAGS.hparams, FLAGS.min_score_thresh, FLAGS.max_boxes_to_draw)


def spec_of_ckpt_path(ckpt_path, random_weights=False):
    """The ModelSpec of --ckpt_path (a run directory or a checkpoint prefix in one)."""
    is_dir = os.path.isdir(ckpt_path)
    if not is_dir and not os.path.isfile(ckpt_path + '.index'):
        raise InspectError('--ckpt_path=%s is neither a directory nor a checkpoint prefix (no '
                           '%s.index); pass the directory main.py trained into or a prefix '
                           'such as DIR/model.ckpt-1000' % (ckpt_path, ckpt_path))
    model_dir = ckpt_path if is_dir else os.path.dirname(ckpt_path) or '.'
    if not os.path.isfile(os.path.join(model_dir, 'config.yaml')):
        # automl's released checkpoints have no config.yaml: the model is --model_name's.
        return model_spec.ModelSpec(
            recipe.resolve(FLAGS.model_name, _hparams()), None,
            None if random_weights else checkpoints.resolve_checkpoint(ckpt_path, 'ckpt_path'))
    spec = model_spec.load_model_spec(model_dir, None if is_dir else ckpt_path, _hparams(),
                                      random_weights=random_weights,
                                      checkpoint_argument='--ckpt_path=%s')
    if FLAGS['model_name'].present and FLAGS.model_name != spec.config.name:
        print('the model is %s, as %s/config.yaml says; --model_name=%s is not used'
              % (spec.config.name, model_dir, FLAGS.model_name))
    return spec


def image_files(pattern):
    """automl's --input_image: a file or a glob (sorted); a directory's images also work."""
    if os.path.isdir(pattern):
        return predict.list_images(pattern)
    files = sorted(path for path in glob.glob(pattern) if os.path.isfile(path))
    if not files:
        raise InspectError('--input_image=%s matches no file; pass an image or a quoted glob '
                           'such as "photos/*.jpg"' % pattern)
    return files


def _read(path):
    try:
        return predict.read_rgb(path)
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as error:
        raise InspectError('--input_image: %s cannot be decoded (%s); fix or remove it'
                           % (path, error)) from None


def _batches(files, batch_size):
    """Lists of (index, path, pixels) run together: batch_size at a time, one by one when
    their sizes differ (the SavedModel takes one size per batch)."""
    for start in range(0, len(files), batch_size):
        batch = [(start + i, path, _read(path))
                 for i, path in enumerate(files[start:start + batch_size])]
        if len({item[2].shape for item in batch}) == 1:
            yield batch
        else:
            yield from ([item] for item in batch)


def draw_and_save(pixels, outputs, row, names, path):
    """Draws row `row` of a batch's outputs (the top --max_boxes_to_draw scoring at least
    --min_score_thresh) on `pixels` and writes it to path."""
    count = int(outputs['num_detections'][row])
    if FLAGS.max_boxes_to_draw:
        count = min(count, FLAGS.max_boxes_to_draw)
    image = visualize.draw_detections(
        Image.fromarray(pixels), outputs['detection_boxes'][row][:count],
        outputs['detection_scores'][row][:count], outputs['detection_classes'][row][:count],
        names, min_score=FLAGS.min_score_thresh)
    visualize.save_image(image, path)
    print('writing file to %s' % path)


def infer_files(files, predictor, names):
    """automl's inference: output_image_dir/<i>.jpg for the i-th of `files`."""
    os.makedirs(FLAGS.output_image_dir, exist_ok=True)
    try:
        for batch in _batches(files, FLAGS.batch_size):
            outputs = predictor.predict(np.stack([pixels for _, _, pixels in batch]))
            for row, (index, _, pixels) in enumerate(batch):
                draw_and_save(pixels, outputs, row, names,
                              os.path.join(FLAGS.output_image_dir, '%d.jpg' % index))
    finally:
        predictor.close()
    return 0


def run_saved_model():
    spec = spec_of_ckpt_path(FLAGS.ckpt_path)
    print('exported %s' % export.export_saved_model(spec, FLAGS.saved_model_dir))
    return 0


def run_infer():
    files = image_files(FLAGS.input_image)  # Before building the graph.
    spec = spec_of_ckpt_path(FLAGS.ckpt_path)
    return infer_files(files, detector.GraphPredictor(spec, batch_size=None),
                       predict.category_names(spec.label_map))


def _check_saved_model_dir():
    if FLAGS.saved_model_dir.endswith('.pb'):
        raise InspectError('--saved_model_dir=%s: frozen .pb graphs are not written or read '
                           'here; pass the SavedModel directory of --runmode=saved_model'
                           % FLAGS.saved_model_dir)
    if not os.path.isfile(os.path.join(FLAGS.saved_model_dir, 'saved_model.pb')):
        raise InspectError('--saved_model_dir=%s holds no SavedModel; write one with '
                           '--runmode=saved_model --ckpt_path=DIR --saved_model_dir=%s'
                           % (FLAGS.saved_model_dir, FLAGS.saved_model_dir))


def run_saved_model_infer():
    _check_saved_model_dir()
    files = image_files(FLAGS.input_image)
    return infer_files(files, detector.SavedModelPredictor(FLAGS.saved_model_dir),
                       predict.category_names_of_saved_model(FLAGS.saved_model_dir))


def _print_timing(summary, header):
    seconds = summary['latency_avg_ms'] / 1e3
    print('Per batch inference time: ', seconds)
    print('FPS: ', summary['batch_size'] / seconds)
    report.emit(dict(header, **summary), [summary], BM_COLUMNS)


def run_bm():
    """automl's benchmark_model: the network alone, random weights and pixels."""
    if FLAGS.ckpt_path:
        spec = spec_of_ckpt_path(FLAGS.ckpt_path, random_weights=True)
    else:
        spec = model_spec.ModelSpec(recipe.resolve(FLAGS.model_name, _hparams()), None, None)
    session_config = None
    if FLAGS.threads:
        import tensorflow as tf  # pylint: disable=import-outside-toplevel
        session_config = tf.compat.v1.ConfigProto(intra_op_parallelism_threads=FLAGS.threads,
                                                  inter_op_parallelism_threads=1)
    (row,) = infer_bench.benchmark_batch_size(spec, FLAGS.batch_size, ('random', None),
                                              ('none',), FLAGS.bm_runs, BM_WARMUP_RUNS,
                                              session_config)
    _print_timing(row, {'bench': 'model_inspect_bm', 'model_name': spec.config.name,
                        'image_size': spec.config.image_size})
    return 0


def run_saved_model_benchmark():
    """automl's saved_model_benchmark: the first image of --input_image, batch_size copies."""
    _check_saved_model_dir()
    path = image_files(FLAGS.input_image)[0]
    predictor = detector.SavedModelPredictor(FLAGS.saved_model_dir)
    try:
        batches = infer_bench.make_batches(('image', path), FLAGS.batch_size, None)
        durations = infer_bench.time_runs(predictor.predict, batches, SAVED_MODEL_BM_RUNS, 1)
    finally:
        predictor.close()
    _print_timing(infer_bench.latency_summary(durations, FLAGS.batch_size),
                  {'bench': 'model_inspect_saved_model_benchmark', 'image': path,
                   'saved_model': FLAGS.saved_model_dir})
    return 0


BM_COLUMNS = (('batch', 'batch_size', '%d'), ('images/s', 'images_per_sec', '%.2f'),
              ('avg ms', 'latency_avg_ms', '%.1f'), ('p50 ms', 'latency_p50_ms', '%.1f'),
              ('p90 ms', 'latency_p90_ms', '%.1f'))
# runmode: (function, flags it needs).
MODES = {
    'saved_model': (run_saved_model, ('ckpt_path', 'saved_model_dir')),
    'infer': (run_infer, ('ckpt_path', 'input_image', 'output_image_dir')),
    'saved_model_infer': (run_saved_model_infer,
                          ('saved_model_dir', 'input_image', 'output_image_dir')),
    'bm': (run_bm, ()),
    'saved_model_benchmark': (run_saved_model_benchmark, ('saved_model_dir', 'input_image')),
}


def run(runmode):
    """Runs --runmode; returns the exit status (2 with one line for a user mistake)."""
    try:
        check_flags(runmode)
        return MODES[runmode][0]()
    except (errors.UserError, FileNotFoundError) as error:
        return errors.fail('model_inspect.py', error, FLAGS.verbose)
    except Exception as error:  # pylint: disable=broad-except
        message = errors.disk_full_message(error, FLAGS.output_image_dir or FLAGS.saved_model_dir)
        if message is None:
            raise  # A bug: keep the traceback.
        return errors.fail('model_inspect.py', message, FLAGS.verbose)
