"""One line of advice per dominant error type, naming the setting that addresses it."""
from efficientdet_hpu.analysis import tide

ADVICE = {
    'classification': 'right box, wrong class (see confusion.png): more examples of the '
                      'confused classes, longer training (num_epochs), or check their labels',
    'localisation': 'object found, box misplaced: check the anchors against the boxes with '
                    'the data doctor (python -m dataset.doctor; aspect_ratios, anchor_scale) '
                    'and try a larger image_size',
    'both': 'wrong class and misplaced box: too little training (num_epochs) or objects too '
            'small at this image_size',
    'duplicate': 'several detections of one object: lower nms_configs.iou_thresh '
                 '(nms_configs.method=hard) or use soft-NMS (nms_configs.method=gaussian, '
                 'smaller nms_configs.sigma)',
    'background': 'detections where no object is: raise nms_configs.score_thresh for '
                  'deployment and train with more negatives (images without objects)',
    'missed': 'objects never detected: a larger image_size or a lower min_level for small '
              'objects, and the anchor coverage per size (python -m dataset.doctor)',
}
MIN_DAP = 0.005  # Half an AP point: below it an error type is not worth a line.
MAX_LINES = 3


def dominant(delta, share=0.5):
    """Error types (ERROR_TYPES only) whose dAP is at least `share` of the largest and
    >= MIN_DAP, largest first, at most MAX_LINES."""
    ranked = sorted(tide.ERROR_TYPES, key=lambda kind: -delta.get(kind, 0.0))
    top = delta.get(ranked[0], 0.0)
    return [kind for kind in ranked if delta.get(kind, 0.0) >= max(MIN_DAP, share * top)][
        :MAX_LINES]


def missed_detail(size_rows):
    """' (most missed: 16-32 px, 40% of its boxes; anchor coverage there 55%)' or ''."""
    rows = [row for row in size_rows if row.get('missed_share') is not None]
    if not rows:
        return ''
    row = max(rows, key=lambda r: r['missed_share'])
    coverage = row.get('anchor_coverage')
    return ' (most missed: %s, %.0f%% of its boxes%s)' % (
        row['bin'], 100 * row['missed_share'],
        '' if coverage is None else '; anchor coverage there %.0f%%' % (100 * coverage))


def lines(delta, size_rows=()):
    """['<type> (dAP x.x): <advice>'] for the dominant error types."""
    result = []
    for kind in dominant(delta):
        detail = missed_detail(size_rows) if kind == 'missed' else ''
        result.append('%s (dAP %.1f)%s: %s' % (kind, 100 * delta[kind], detail, ADVICE[kind]))
    return result
