"""Confusion matrix between classes and background at one IoU, as a table and a PNG.

Per image, detections scoring at least `score_threshold` are taken by descending score; each
takes the untaken non-crowd truth of highest IoU, whatever its class, when that IoU reaches
`iou` (0.5). A detection covering a crowd box (crowd IoU >= iou) and nothing else is left
out. Rows are the truth's class, then 'background' (a detection that took no truth); columns
the detected class, then 'missed' (a truth no detection took). Boxes COCO [x, y, w, h].
"""
import io

import numpy as np

from efficientdet_hpu.analysis import tide

BACKGROUND, MISSED = 'background', 'missed'


def _image_pairs(truth, dets, iou_threshold, score_threshold):
    """[(truth class or None, detected class or None)] of one image."""
    keep = dets.scores >= score_threshold
    order = np.flatnonzero(keep)[np.argsort(-dets.scores[keep], kind='stable')]
    boxes, classes = dets.boxes[order], dets.classes[order]
    plain = ~truth.crowd
    iou = tide.iou_matrix(boxes, truth.boxes[plain], np.zeros(int(plain.sum())))
    on_crowd = np.any(tide.iou_matrix(boxes, truth.boxes[truth.crowd],
                           np.ones(int(truth.crowd.sum()))) >= iou_threshold, axis=1)
    truth_classes = truth.classes[plain]
    taken = np.zeros(len(truth_classes), bool)
    took = np.full(len(order), -1, np.int64)
    # Only a detection with some IoU >= iou_threshold can take a truth; taking one only
    # removes candidates of later detections.
    candidates = np.any(iou >= iou_threshold, axis=1) if iou.shape[1] else np.zeros(
        len(order), bool)
    for index in np.flatnonzero(candidates).tolist():
        row = np.where(taken, -1.0, iou[index])
        best = int(np.argmax(row))
        if row[best] >= iou_threshold:
            taken[best], took[index] = True, best
    pairs = [(int(truth_classes[t]) if t >= 0 else None, int(c))
             for t, c, crowd in zip(took.tolist(), classes.tolist(), on_crowd.tolist())
             if t >= 0 or not crowd]
    pairs.extend((int(cls), None) for cls in truth_classes[~taken])
    return pairs


def confusion_matrix(truths, detections, classes, iou=0.5, score_threshold=0.3):
    """int64 [K + 1, K + 1] counts.

    Args:
      truths, detections: [tide.ImageTruth], [tide.ImageDetections], aligned per image.
      classes: the K class ids, in row/column order.
      iou: the IoU a detection needs to take a truth.
      score_threshold: detections below it are left out (the deployed operating point).
    Rows: classes then background; columns: classes then missed.
    """
    index = {int(cls): position for position, cls in enumerate(classes)}
    size = len(classes) + 1
    matrix = np.zeros((size, size), np.int64)
    for truth, dets in zip(truths, detections):
        for truth_class, detected in _image_pairs(truth, dets, iou, score_threshold):
            row = size - 1 if truth_class is None else index[truth_class]
            column = size - 1 if detected is None else index[detected]
            matrix[row, column] += 1
    return matrix


def format_table(matrix, names):
    """Text table: one row per truth class (and background), one column per detected class
    (and missed). names: the K class names."""
    rows = list(names) + [BACKGROUND]
    columns = list(names) + [MISSED]
    width = max(len(name) for name in rows + ['truth \\ detected'])
    cell = max(6, max(len(name) for name in columns))
    lines = ['%-*s ' % (width, 'truth \\ detected') + ' '.join('%*s' % (cell, c) for c in columns)]
    for name, counts in zip(rows, matrix.tolist()):
        lines.append('%-*s ' % (width, name) + ' '.join('%*d' % (cell, c) for c in counts))
    return '\n'.join(lines)


def plot_png(matrix, names, title):
    """PNG bytes of the matrix as a heat map with the counts written in each cell."""
    import matplotlib  # pylint: disable=import-outside-toplevel  (only when drawing)
    matplotlib.use('Agg')
    from matplotlib import pyplot  # pylint: disable=import-outside-toplevel
    rows, columns = list(names) + [BACKGROUND], list(names) + [MISSED]
    side = 1.2 + 0.55 * len(columns)
    figure, axes = pyplot.subplots(figsize=(side + 1.5, side))
    shares = matrix / np.maximum(matrix.sum(axis=1, keepdims=True), 1)
    axes.imshow(shares, cmap='Blues', vmin=0.0, vmax=1.0)
    axes.set_xticks(range(len(columns)), columns, rotation=45, ha='right')
    axes.set_yticks(range(len(rows)), rows)
    axes.set_xlabel('detected as')
    axes.set_ylabel('truth')
    axes.set_title(title)
    for (row, column), count in np.ndenumerate(matrix):
        axes.text(column, row, str(count), ha='center', va='center',
                  color='white' if shares[row, column] > 0.5 else 'black')
    figure.tight_layout()
    buffer = io.BytesIO()
    figure.savefig(buffer, format='png', dpi=100)
    pyplot.close(figure)
    return buffer.getvalue()
