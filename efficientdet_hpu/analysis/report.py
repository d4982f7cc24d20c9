"""The error analysis of one COCO-format evaluation: built from the ground truth (a COCO
instances dict) and the detections (a COCO results list), written as model_dir/eval/analysis/
(analysis.json, analysis.txt, confusion.png, worst-NN-<image id>.png), summarised in a few
log lines.

The directory is filled under a temporary name and swapped in by rename, so a reader sees the
previous complete analysis or the new one, never a mix.
"""
import collections
import json
import os
import shutil

import numpy as np

from efficientdet_hpu.analysis import advice
from efficientdet_hpu.analysis import confusion
from efficientdet_hpu.analysis import sizes
from efficientdet_hpu.analysis import tide
from efficientdet_hpu.analysis import worst_images
from efficientdet_hpu.core import atomic_file

ANALYSIS_DIR = 'analysis'
SCORE_THRESHOLD = None  # Confusion matrix and drawings: None = the best-F1 score (f1_threshold).
WORST_COUNT = 8


def per_image(dataset, results, image_ids, categories):
    """([tide.ImageTruth], [tide.ImageDetections]) in `image_ids` order from a COCO instances
    dict and a COCO results list (bbox [x, y, w, h] pixels). Boxes of other categories than
    `categories` are left out, as COCOeval leaves out categories it does not evaluate (automl's
    90-class head predicts ids the data set does not have)."""
    categories = set(categories)
    truth_rows, det_rows = collections.defaultdict(list), collections.defaultdict(list)
    for annotation in dataset['annotations']:
        if annotation['category_id'] not in categories:
            continue
        truth_rows[annotation['image_id']].append(
            list(annotation['bbox']) + [annotation['category_id'], annotation.get('iscrowd', 0)])
    for result in results:
        if result['category_id'] not in categories:
            continue
        det_rows[result['image_id']].append(
            list(result['bbox']) + [result['category_id'], result['score']])
    truths, detections = [], []
    for image_id in image_ids:
        truth = np.array(truth_rows.get(image_id, []), np.float64).reshape(-1, 6)
        dets = np.array(det_rows.get(image_id, []), np.float64).reshape(-1, 6)
        truths.append(tide.ImageTruth(truth[:, :4], truth[:, 4].astype(np.int64),
                                      truth[:, 5] > 0))
        detections.append(tide.ImageDetections(dets[:, :4], dets[:, 4].astype(np.int64),
                                               dets[:, 5]))
    return truths, detections


def f1_threshold(result, detections, truths):
    """The score at which keeping the detections scoring at least it gives the best F1 at
    IoU 0.5 (TIDE's matching, all classes together): the operating point a deployment would
    pick, so the confusion matrix and the drawings show what it would show. 1.0 without
    detections."""
    scores, is_true = [], []
    for outcome, dets in zip(result.images, detections):
        kept = [kind != 'ignored' for kind in outcome.det_kind]
        scores.append(dets.scores[outcome.det_order][kept])
        is_true.append(np.array([kind == 'tp' for kind in outcome.det_kind], bool)[kept])
    scores = np.concatenate(scores + [np.zeros(0)])
    if not len(scores):
        return 1.0
    order = np.argsort(-scores, kind='stable')
    true_positives = np.cumsum(np.concatenate(is_true + [np.zeros(0, bool)])[order])
    num_truth = max(sum(int((~truth.crowd).sum()) for truth in truths), 1)
    f1 = 2 * true_positives / (np.arange(1, len(order) + 1) + num_truth)
    return float(scores[order][int(np.argmax(f1))])


def _image_sizes(dataset, image_ids):
    """int64 [M, 2] (height, width) of the images, or None when the dict lacks them."""
    by_id = {image['id']: image for image in dataset['images']}
    try:
        return np.array([[by_id[i]['height'], by_id[i]['width']] for i in image_ids], np.int64)
    except KeyError:
        return None


def _class_rows(result, names):
    rows = []
    for cls, ap in sorted(result.class_ap.items()):
        delta = result.class_delta.get(cls, {})
        main = max(tide.ERROR_TYPES, key=lambda kind: delta.get(kind, 0.0))
        rows.append({'class': names.get(cls, str(cls)), 'category_id': int(cls), 'ap50': ap,
                     'dap': {kind: delta.get(kind, 0.0) for kind in tide.ERROR_TYPES},
                     'counts': result.class_counts.get(cls, {}), 'dominant_error': main})
    return rows


def analyse(dataset, results, image_ids, names, setup=None, score_threshold=SCORE_THRESHOLD,
            max_dets=tide.MAX_DETS):
    """(report dict, truths, detections, tide.Analysis). names: {category id: name};
    setup: anchor_coverage.AnchorSetup for sizes in network pixels (None: no size table);
    score_threshold: for the confusion matrix and drawings, None for f1_threshold; max_dets:
    detections per image (COCO's 100; None: all of each image's, e.g. a whole photo
    predicted tile by tile)."""
    truths, detections = per_image(dataset, results, image_ids, names)
    if max_dets is None:
        max_dets = max([tide.MAX_DETS] + [len(dets.scores) for dets in detections])
    result = tide.analyse(truths, detections, max_dets=max_dets)
    threshold_rule = 'given'
    if score_threshold is None:
        score_threshold, threshold_rule = f1_threshold(result, detections, truths), 'best F1'
    categories = sorted(names)
    matrix = confusion.confusion_matrix(truths, detections, categories,
                                        score_threshold=score_threshold)
    size_rows = []
    image_sizes = _image_sizes(dataset, image_ids)
    if setup is not None and image_sizes is not None and len(image_ids):
        size_rows = sizes.size_table(result, truths, detections,
                                     sizes.network_scales(image_sizes, setup),
                                     sizes.truth_coverage(truths, image_sizes, setup))
    classes = _class_rows(result, names)
    weakest = min((row for row in classes if row['counts']), key=lambda row: row['ap50'],
                  default=None)
    report = {
        'images': len(image_ids), 'ap50': result.ap if result.class_ap else None,
        'unscored_classes': [names[c] for c in categories if c not in result.class_ap],
        'score_threshold': score_threshold,
        'score_threshold_rule': threshold_rule,
        'errors': {kind: {'dap': result.delta[kind], 'count': result.counts[kind]}
                   for kind in tide.ERROR_TYPES},
        'special': {kind: result.delta[kind] for kind in tide.SPECIAL_TYPES},
        'per_class': classes, 'weakest_class': weakest,
        'confusion': {'classes': [names[c] for c in categories], 'matrix': matrix.tolist()},
        'sizes': size_rows, 'advice': advice.lines(result.delta, size_rows)}
    return report, truths, detections, result


def unscored_line(report):
    """Which classes have no AP and why, or ''."""
    unscored = report.get('unscored_classes') or []
    if not unscored:
        return ''
    return ('not scored: %s, no boxes in the %d validation image%s (COCO gives such a class '
            'AP -1 and leaves it out), so not in the AP50, the weakest class or the advice'
            % (', '.join("'%s'" % name for name in unscored), report['images'],
               '' if report['images'] == 1 else 's'))


def short_lines(report):
    """A few log lines: dAP per error type, the classes not scored, the weakest class's
    dominant error, the advice."""
    errors = report['errors']
    if report['ap50'] is None:
        return ['error analysis (TIDE): nothing to score, no class has boxes in the %d '
                'validation images' % report['images']]
    lines = ['error analysis (TIDE, AP50 %.3f; dAP in AP points): %s' % (
        report['ap50'], ', '.join('%s %.1f' % (tide.SHORT_NAMES[kind], 100 * errors[kind]['dap'])
                                  for kind in tide.ERROR_TYPES))]
    lines.extend(line for line in [unscored_line(report)] if line)
    weakest = report['weakest_class']
    if weakest:
        lines.append("weakest class '%s' (AP50 %.3f): dominant error %s (dAP %.1f)" % (
            weakest['class'], weakest['ap50'], weakest['dominant_error'],
            100 * weakest['dap'][weakest['dominant_error']]))
    lines.extend('advice: ' + line for line in report['advice'])
    return lines


def full_text(report):
    """The whole report as text (analysis.txt)."""
    errors = report['errors']
    lines = short_lines(report) + ['', 'Error type      dAP   count']
    lines += ['%-14s %5.1f %7d' % (kind, 100 * errors[kind]['dap'], errors[kind]['count'])
              for kind in tide.ERROR_TYPES]
    lines += ['%-14s %5.1f' % (kind, 100 * value) for kind, value in report['special'].items()]
    lines += ['', 'Per class (AP50, dAP per type in AP points, dominant error)']
    width = max([len(row['class']) for row in report['per_class']] + [5])
    lines.append('%-*s %6s ' % (width, 'class', 'AP50') +
                 ' '.join('%5s' % tide.SHORT_NAMES[kind] for kind in tide.ERROR_TYPES))
    for row in report['per_class']:
        lines.append('%-*s %6.3f ' % (width, row['class'], row['ap50']) +
                     ' '.join('%5.1f' % (100 * row['dap'][kind]) for kind in tide.ERROR_TYPES) +
                     '  ' + row['dominant_error'])
    lines += ['', 'Confusion matrix at IoU 0.5, detections scoring >= %.3f (%s)' % (
              report['score_threshold'], report['score_threshold_rule']),
              confusion.format_table(np.array(report['confusion']['matrix']),
                                     report['confusion']['classes'])]
    if report['sizes']:
        lines += ['', 'By object size in network-input pixels', sizes.format_table(
            report['sizes'])]
    if report.get('worst_images'):
        lines += ['', 'Worst images (missed + false positives)']
        lines += ['  %s  image %d %s: %d missed, %d false positives' % (
            row['png'], row['image_id'], row['file_name'], row['missed'],
            row['false_positives']) for row in report['worst_images']]
    return '\n'.join(lines) + '\n'


def worst_pictures(report, dataset, image_ids, truths, detections, result, load_image,
                   names, count=WORST_COUNT):
    """[(file name, PIL image)] of the worst images; fills report['worst_images']. load_image:
    image id -> PIL.Image or None (image not available: listed, not drawn)."""
    files = {image['id']: image.get('file_name', '') for image in dataset['images']}
    pictures, rows = [], []
    threshold = report['score_threshold']
    for rank, (position, missed, false) in enumerate(
            worst_images.worst(result, detections, count, threshold), 1):
        image_id = image_ids[position]
        image = load_image(image_id) if load_image else None
        name = 'worst-%02d-%d.png' % (rank, image_id) if image is not None else ''
        if image is not None:
            pictures.append((name, worst_images.draw(image, truths[position],
                                                     detections[position], names, threshold)))
        rows.append({'image_id': int(image_id), 'file_name': files.get(image_id, ''),
                     'missed': missed, 'false_positives': false, 'png': name})
    report['worst_images'] = rows
    return pictures


def write(directory, report, pictures):
    """Writes the report into `directory` (replaced whole by rename); returns its path."""
    staging = directory + '.tmp-%d' % os.getpid()
    shutil.rmtree(staging, ignore_errors=True)
    os.makedirs(staging)
    matrix = np.array(report['confusion']['matrix'])
    files = {'confusion.png': confusion.plot_png(
        matrix, report['confusion']['classes'], 'Confusion at IoU 0.5, score >= %.3f'
        % report['score_threshold'])}
    files.update((name, worst_images.png_bytes(image)) for name, image in pictures)
    for name, data in files.items():
        with open(os.path.join(staging, name), 'wb') as stream:
            stream.write(data)
    atomic_file.write_json_atomically(os.path.join(staging, 'analysis.json'), report)
    atomic_file.write_text_atomically(os.path.join(staging, 'analysis.txt'), full_text(report))
    retired = directory + '.old-%d' % os.getpid()
    if os.path.exists(directory):
        os.rename(directory, retired)
    os.rename(staging, directory)
    shutil.rmtree(retired, ignore_errors=True)
    return directory


def load_json(path):
    with open(path) as stream:
        return json.load(stream)
