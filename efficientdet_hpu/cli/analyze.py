"""Why the AP is what it is, for any COCO-format evaluation: TIDE error types per class, the
confusion matrix, AP and recall by size next to the anchor coverage, the worst images, advice.

    python -m efficientdet_hpu.cli.analyze --model_dir=runs/demo
    python -m efficientdet_hpu.cli.analyze --detections_json=results.json \\
        --val_json_file=instances_val2017.json --image_dir=val2017 --output_dir=analysis

With --model_dir it reads what evaluation wrote to model_dir/eval/ (detections.json,
evaluated_images.json, groundtruth.json unless --val_json_file was used) and config.yaml for
the network's input size and anchors; the report goes to model_dir/eval/analysis/. Evaluation
runs the same analysis by itself after each evaluation (docs/evaluation.md).
"""
import os

from efficientdet_hpu.core import tf_env  # noqa: F401  (before anything imports tensorflow)
from absl import app, flags  # pylint: disable=wrong-import-position
from PIL import Image  # pylint: disable=wrong-import-position

from efficientdet_hpu.analysis import report as analysis_report  # noqa: E402
from efficientdet_hpu.core import command_help  # noqa: E402
from efficientdet_hpu.core import errors  # noqa: E402
from efficientdet_hpu.core.errors import UserError  # noqa: E402
from efficientdet_hpu.data import anchor_coverage  # noqa: E402
from efficientdet_hpu.data import coco_annotations  # noqa: E402
from efficientdet_hpu.config import recipe  # noqa: E402
from efficientdet_hpu.evaluation import eval_analysis  # noqa: E402

FLAGS = flags.FLAGS


class AnalyzeError(UserError):
    """Missing or unreadable input; the message names the file and the fix."""


def _read(path, what):
    if not path or not os.path.exists(path):
        raise AnalyzeError(f'{what} {path!r} does not exist; evaluate first (main.py '
                           f'--mode=eval) or pass --detections_json and --val_json_file')
    return analysis_report.load_json(path)


def _inputs():
    """(ground-truth dict, results list, image ids, output dir, AnchorSetup or None)."""
    eval_dir = os.path.join(FLAGS.model_dir, 'eval') if FLAGS.model_dir else None
    detections = FLAGS.detections_json or (
        os.path.join(eval_dir, eval_analysis.DETECTIONS_FILE) if eval_dir else None)
    results = _read(detections, '--detections_json')
    evaluated = {}
    if eval_dir and os.path.exists(os.path.join(eval_dir, eval_analysis.EVALUATED_FILE)):
        evaluated = analysis_report.load_json(os.path.join(eval_dir, eval_analysis.EVALUATED_FILE))
    truth = FLAGS.val_json_file or evaluated.get('groundtruth')
    if truth and eval_dir and not os.path.isabs(truth) and not os.path.exists(truth):
        truth = os.path.join(eval_dir, truth)
    if not truth:
        raise AnalyzeError('no ground truth: pass --val_json_file=instances.json')
    dataset = coco_annotations.load_coco_json(truth)
    results = _by_file_name(results, dataset)
    known = {image['id'] for image in dataset['images']}
    if results and not any(row.get('image_id') in known for row in results):
        raise AnalyzeError('no detection of %s is of a photo of %s (by image_id or file_name); '
                           'pass the ground truth of the photos predicted' % (detections, truth))
    image_ids = evaluated.get('image_ids') or [image['id'] for image in dataset['images']]
    setup = None
    config_path = os.path.join(FLAGS.model_dir, 'config.yaml') if FLAGS.model_dir else None
    if config_path and os.path.exists(config_path):
        setup = anchor_coverage.AnchorSetup.from_config(recipe.read_saved_config(config_path))
    output = FLAGS.output_dir or (os.path.join(eval_dir, analysis_report.ANALYSIS_DIR)
                                  if eval_dir else None)
    if not output:
        raise AnalyzeError('pass --output_dir=DIR (or --model_dir) for the report')
    return dataset, results, image_ids, output, setup


def _by_file_name(results, dataset):
    """inference.py predict's rows carry the photo's file_name and an image_id that is only
    its position in the input: when every row's file_name is a JSON image's (basename), the
    row takes that image's id, as predict --annotations_file matches them."""
    by_name = {os.path.basename(image['file_name']): image['id'] for image in dataset['images']}
    if not results or not all(os.path.basename(str(row.get('file_name'))) in by_name
                              for row in results):
        return results
    return [dict(row, image_id=by_name[os.path.basename(row['file_name'])]) for row in results]


def _loader(dataset):
    if not FLAGS.image_dir:
        return None
    files = {image['id']: image['file_name'] for image in dataset['images']}

    def load(image_id):
        path = os.path.join(FLAGS.image_dir, files.get(image_id, ''))
        return Image.open(path) if os.path.isfile(path) else None
    return load


def run():
    dataset, results, image_ids, output, setup = _inputs()
    names = {category['id']: category['name'] for category in dataset['categories']}
    report, truths, detections, result = analysis_report.analyse(
        dataset, results, image_ids, names, setup, FLAGS.score_threshold,
        FLAGS.max_dets or None)
    pictures = analysis_report.worst_pictures(report, dataset, image_ids, truths, detections,
                                              result, _loader(dataset), names, FLAGS.worst)
    analysis_report.write(output, report, pictures)
    print(analysis_report.full_text(report), end='')
    print('wrote %s' % output)


def main(argv):
    if len(argv) > 1:
        raise app.UsageError('unexpected arguments: %s' % argv[1:])
    try:
        run()
    except UserError as error:
        return errors.fail('analyze', error, FLAGS.verbose)
    return 0


def entry_point():
    """Parses the command line and runs the command (the module's `main`)."""
    flags.DEFINE_string('model_dir', None, 'Run directory whose eval/ holds detections.json.')
    flags.DEFINE_string('detections_json', None, 'COCO results file (default: '
                        'model_dir/eval/detections.json).')
    flags.DEFINE_string('val_json_file', None, 'COCO instances JSON of the evaluated images.')
    flags.DEFINE_string('image_dir', None, 'Images (JSON file_name) to draw the worst ones.')
    flags.DEFINE_integer('max_dets', 100, 'Detections per image, highest scores first (COCO\'s '
                         '100, as the evaluation counts them); 0: all of them, for a whole '
                         'photo predicted tile by tile (inference.py predict --tile_size).',
                         lower_bound=0)
    flags.DEFINE_string('output_dir', None, 'Report directory (default: '
                        'model_dir/eval/analysis).')
    flags.DEFINE_float('score_threshold', None,
                       'Detections drawn and counted in the confusion matrix score at least '
                       'this (default: the score of the best F1 at IoU 0.5).')
    flags.DEFINE_integer('worst', analysis_report.WORST_COUNT, 'Worst images to draw.')
    flags.DEFINE_bool('verbose', False, 'Tracebacks with errors.')
    command_help.install(__name__)
    app.run(main, flags_parser=errors.parse_flags)


if __name__ == '__main__':
    entry_point()
