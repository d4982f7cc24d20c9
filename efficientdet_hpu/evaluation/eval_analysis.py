"""What evaluation adds around the COCO score: the split check before it scores, and after it
the detections as a COCO results file and the error analysis (analysis/report.py).

Before scoring (every rank, rank 0 reads): each validation record's image id, file name and
size against --val_json_file (data/record_index.check_against_json).
After scoring (rank 0): model_dir/eval/detections.json (COCO results: image_id, category_id,
bbox [x, y, w, h], score), evaluated_images.json (the image ids scored, the ground-truth file)
and, when the ground truth came from the records, groundtruth.json, so `python -m
efficientdet_hpu.cli.analyze --model_dir=...` reruns the analysis offline; then
model_dir/eval/analysis/, a few log lines and the worst images in TensorBoard.
"""
import io
import os
import time

import tensorflow as tf
from absl import logging
from PIL import Image

from efficientdet_hpu.analysis import report as analysis_report
from efficientdet_hpu.analysis import worst_images
from efficientdet_hpu.core import atomic_file
from efficientdet_hpu.data import anchor_coverage
from efficientdet_hpu.data import coco_annotations
from efficientdet_hpu.data import record_index
from efficientdet_hpu.runtime import distributed

tf1 = tf.compat.v1

DETECTIONS_FILE = 'detections.json'
GROUNDTRUTH_FILE = 'groundtruth.json'
EVALUATED_FILE = 'evaluated_images.json'
_identities = {}  # file pattern -> [record_index.Identity], read once per process.
_checked = set()  # (records, JSON) pairs already checked by this process.


def _record_identities(options):
    key = (options.validation_file_pattern, options.eval_samples)
    if key not in _identities:
        _identities[key] = record_index.read_identities(options.validation_file_pattern,
                                                        options.eval_samples or None)
    return _identities[key]


def check_split(run):
    """Raises record_index.SplitMismatchError on every rank when a validation record's id is
    in --val_json_file under another file name or size."""
    options = run.options
    key = (options.validation_file_pattern, options.val_json_file)
    if key in _checked or not (options.val_json_file and options.validation_file_pattern and
                               not options.testdev_dir):
        return
    message = None
    if distributed.is_main():
        try:
            images = coco_annotations.load_coco_json(options.val_json_file)['images']
            record_index.check_against_json(_record_identities(options), images,
                                            options.validation_file_pattern,
                                            options.val_json_file)
        except record_index.SplitMismatchError as error:
            message = str(error)
    message = distributed.broadcast_object(message)
    if message:
        raise record_index.SplitMismatchError(message)
    _checked.add(key)


def _with_sizes(dataset, options):
    """The ground truth with image sizes: from the records when it was built from arrays."""
    if all('height' in image for image in dataset['images']) or not (
            options.validation_file_pattern):
        return dataset
    sizes = {record.image_id: record for record in _record_identities(options)}
    images = [dict(image, height=sizes[image['id']].height, width=sizes[image['id']].width,
                   file_name=sizes[image['id']].file_name)
              if image['id'] in sizes else image for image in dataset['images']]
    return dict(dataset, images=images)


def _write_inputs(eval_dir, scored, options, dataset):
    keys = ('image_id', 'category_id', 'bbox', 'score')  # loadRes adds more to these dicts.
    atomic_file.write_json_atomically(os.path.join(eval_dir, DETECTIONS_FILE),
                                      [{key: result[key] for key in keys}
                                       for result in scored['results']], indent=None)
    truth = options.val_json_file
    if not truth:
        truth = GROUNDTRUTH_FILE
        atomic_file.write_json_atomically(os.path.join(eval_dir, GROUNDTRUTH_FILE),
                                          dataset, indent=None)
    atomic_file.write_json_atomically(os.path.join(eval_dir, EVALUATED_FILE), {
        'image_ids': [int(i) for i in scored['image_ids']], 'groundtruth': truth})


def _image_loader(options, image_ids):
    if not options.validation_file_pattern:
        return None
    encoded = record_index.read_images(options.validation_file_pattern, image_ids)

    def load(image_id):
        data = encoded.get(int(image_id))
        return Image.open(io.BytesIO(data)) if data else None
    return load


def _image_summaries(eval_dir, pictures, step):
    values = []
    for name, picture in pictures:
        png = io.BytesIO()
        picture.save(png, format='PNG')
        values.append(tf1.Summary.Value(tag='eval_worst/' + name[:-4], image=tf1.Summary.Image(
            height=picture.height, width=picture.width, colorspace=3,
            encoded_image_string=png.getvalue())))
    if values:
        with tf.Graph().as_default():
            writer = tf1.summary.FileWriter(eval_dir)
            writer.add_summary(tf1.Summary(value=values), step)
            writer.close()


def analyse(run, scored, step):
    """Rank 0, after scoring: writes the inputs and the analysis, logs the short form.
    scored: coco_metric.EvaluationMetric.scored. Returns the seconds it took."""
    start = time.time()
    logging.info('error analysis of %d detections of %d images', len(scored['results']),
                 len(scored['image_ids']))
    options = run.options
    eval_dir = os.path.join(options.model_dir, 'eval')
    dataset = _with_sizes(scored['dataset'], options)
    _write_inputs(eval_dir, scored, options, dataset)
    image_ids = list(scored['image_ids'])
    report, truths, detections, result = analysis_report.analyse(
        dataset, scored['results'], image_ids, scored['names'],
        anchor_coverage.AnchorSetup.from_config(run.config))
    report['step'] = int(step)
    worst = [image_ids[p] for p, _, _ in worst_images.worst(
        result, detections, analysis_report.WORST_COUNT, report['score_threshold'])]
    pictures = analysis_report.worst_pictures(
        report, dataset, image_ids, truths, detections, result,
        _image_loader(options, worst), scored['names'])
    directory = analysis_report.write(os.path.join(eval_dir, analysis_report.ANALYSIS_DIR),
                                      report, pictures)
    _image_summaries(eval_dir, pictures, step)
    seconds = time.time() - start
    print('\n'.join(analysis_report.short_lines(report) +
                    ['full error analysis in %s (%.1f s)' % (directory, seconds)]), flush=True)
    return seconds


def analyse_safely(run, scored, step):
    """analyse, but a failure of the analysis never fails the evaluation it follows."""
    try:
        return analyse(run, scored, step)
    except Exception as error:  # pylint: disable=broad-except
        logging.warning('error analysis of step %d failed (%s: %s); the COCO metrics above '
                        'stand', step, type(error).__name__, error, exc_info=True)
        return None
