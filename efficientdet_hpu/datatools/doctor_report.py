"""The data doctor's report: per-class statistics as a JSON-ready dict, and its text tables.

Sizes are sqrt(width * height) in network-input pixels, aspects width / height. "size" is at
the eval resize (scale multiplier 1); "train" spans the jitter range; coverage, median best
IoU, levels and the small-box figures are over the training scales (data/anchor_coverage.py).
"""
import numpy as np

from efficientdet_hpu.data import anchor_coverage as geometry
from efficientdet_hpu.datatools import doctor_advice as advice_lib

LAGGING_POINTS = 0.10  # This far under the median class a class is lagging.


def _quantiles(values, percents=(5, 50, 95)):
    if not len(values):
        return None
    return [round(float(v), 3) for v in np.percentile(values, percents)]


def _level_shares(levels, setup):
    return {'P%d' % level: round(float(np.mean(levels == level)), 4) if len(levels) else 0.0
            for level in range(setup.min_level, setup.max_level + 1)}


def _class_row(index, box_set, eval_placed, train, match, setup):
    """The figures of class `index`."""
    in_class = box_set.class_index == index
    eval_rows = eval_placed.class_index == index
    train_rows = train.class_index == index
    best_iou, levels = match[0][train_rows], match[1][train_rows]
    sizes = train.sizes[train_rows]
    small = sizes < geometry.SMALL_BOX_PX
    threshold = setup.match_threshold
    return {
        'name': box_set.class_names[index], 'boxes': int(in_class.sum()),
        'images': int(len(np.unique(box_set.image_index[in_class]))),
        'crowd': int(box_set.is_crowd[in_class].sum()),
        'size_px': _quantiles(eval_placed.sizes[eval_rows]),
        'train_size_px': _quantiles(sizes, (5, 95)),
        'aspect': _quantiles(eval_placed.aspects[eval_rows]),
        'coverage': round(float(np.mean(best_iou >= threshold)), 4) if len(best_iou) else None,
        'median_best_iou': round(float(np.median(best_iou)), 4) if len(best_iou) else None,
        'levels': _level_shares(levels, setup),
        'small_share': round(float(np.mean(small)), 4) if len(sizes) else None,
        'small_coverage': (round(float(np.mean(best_iou[small] >= threshold)), 4)
                           if small.any() else None),
    }


def class_rows(box_set, eval_placed, train, match, setup):
    """Per-class dicts (see format_text for the columns).

    Args:
      box_set: annotated_boxes.BoxSet.
      eval_placed, train: geometry.Placed at the eval resize and the training scales.
      match: best_anchor_match(train.boxes, setup).
      setup: geometry.AnchorSetup of the recipe.
    """
    return [_class_row(index, box_set, eval_placed, train, match, setup)
            for index in range(box_set.num_classes)]


def overall_row(train, match, setup):
    """Coverage of all boxes together and of the boxes under SMALL_BOX_PX."""
    best_iou = match[0]
    small = train.sizes < geometry.SMALL_BOX_PX
    hit = best_iou >= setup.match_threshold
    return {'coverage': round(float(hit.mean()), 4) if len(hit) else None,
            'median_best_iou': round(float(np.median(best_iou)), 4) if len(hit) else None,
            'levels': _level_shares(match[1], setup),
            'small_share': round(float(small.mean()), 4) if len(hit) else None,
            'small_coverage': round(float(hit[small].mean()), 4) if small.any() else None}


def dataset_summary(box_set):
    images_with_boxes = len(np.unique(box_set.image_index))
    return {'source': box_set.source, 'images': int(len(box_set.image_sizes)),
            'negatives': int(len(box_set.image_sizes) - images_with_boxes),
            'boxes': int(len(box_set.boxes)), 'crowd': int(box_set.is_crowd.sum()),
            'skipped': dict(box_set.skipped)}


def recipe_summary(setup, model_name):
    return dict(model_name=model_name, levels=[setup.min_level, setup.max_level],
                num_scales=setup.num_scales, match_threshold=setup.match_threshold,
                jitter=[setup.jitter_min, setup.jitter_max],
                scale_multipliers=[round(float(m), 4) for m in geometry.scale_multipliers(setup)],
                anchors_per_location=setup.anchors_per_location, **setup.overrides())


def weak_classes(rows):
    """Names of the classes under WEAK_COVERAGE (data/anchor_coverage.py)."""
    return [row['name'] for row in rows
            if row['coverage'] is not None and row['coverage'] < geometry.WEAK_COVERAGE]


def lagging_classes(rows):
    """Names of the classes, not weak, LAGGING_POINTS or more under the median class."""
    coverages = [row['coverage'] for row in rows if row['coverage'] is not None]
    if not coverages:
        return []
    median = float(np.median(coverages))
    return [row['name'] for row in rows if row['coverage'] is not None
            and geometry.WEAK_COVERAGE <= row['coverage'] <= median - LAGGING_POINTS]


# ----------------------------------------------------------------------------- text

def _pct(value):
    return '   -' if value is None else '%3.0f%%' % (100 * value)


def _triple(values, spec='%.0f'):
    return '-' if values is None else '/'.join(spec % v for v in values)


def _data_table(report):
    width = max([len('class')] + [len(row['name']) for row in report['classes']])
    lines = ['Boxes in network pixels (size = sqrt(w*h) at the eval resize; train = the '
             'jitter range):',
             '  %-*s  %6s  %6s  %5s  %-16s  %-12s  %s' % (
                 width, 'class', 'boxes', 'images', 'crowd', 'size p5/p50/p95',
                 'train p5-p95', 'w/h p5/p50/p95')]
    for row in report['classes']:
        train = row['train_size_px']
        lines.append('  %-*s  %6d  %6d  %5d  %-16s  %-12s  %s' % (
            width, row['name'], row['boxes'], row['images'], row['crowd'],
            _triple(row['size_px']), '-' if train is None else '%.0f-%.0f' % tuple(train),
            _triple(row['aspect'], '%.2f')))
    return lines


def _coverage_table(report):
    setup = report['recipe']
    width = max([len('all boxes')] + [len(row['name']) for row in report['classes']])
    levels = '/'.join(report['overall']['levels'])
    lines = ['Anchor coverage (share of boxes whose best anchor reaches IoU %g at the '
             'training scales %s):' % (setup['match_threshold'], setup['scale_multipliers']),
             '  %-*s  %8s  %10s  %-18s  %s' % (width, 'class', 'coverage', 'median IoU',
                                              'best level ' + levels, '< %g px: share, coverage'
                                              % geometry.SMALL_BOX_PX)]
    for row in report['classes'] + [dict(report['overall'], name='all boxes')]:
        flagged = row['name'] in report['weak_classes'] + report['lagging_classes']
        weak = ' !' if flagged else '  '
        shares = '/'.join('%.0f' % (100 * v) for v in row['levels'].values()) + ' %'
        iou = '-' if row['median_best_iou'] is None else '%.2f' % row['median_best_iou']
        lines.append('  %-*s  %6s%s  %10s  %-18s  %s, %s' % (
            width, row['name'], _pct(row['coverage']), weak, iou, shares,
            _pct(row['small_share']), _pct(row['small_coverage'])))
    return lines


def _advice_lines(report):
    steps = report['advice']
    header = '  %-*s  %5s' % (report['_width'], 'class', 'now')
    for step in steps:
        header += '  %-*s' % (len(step['label']), step['label'])
    lines = ['Advice (searched on up to %d boxes per class; each column adds its change to the '
             'previous ones; coverage on all boxes):' % advice_lib.SEARCH_BOXES_PER_CLASS, header]
    names = [row['name'] for row in report['classes']] + ['mean of classes']
    now = [row['coverage'] for row in report['classes']] + [report['mean_class_coverage']]
    for index, name in enumerate(names):
        line = '  %-*s  %5s' % (report['_width'], name, _pct(now[index]))
        for step in steps:
            line += '  %-*s' % (len(step['label']), _pct(step['coverage'][index]))
        lines.append(line)
    lines.extend('  %s: %s' % (step['key'], step['cost_note']) for step in steps
                 if step['cost_note'])
    return lines


def format_text(report):
    """The report as the doctor prints it."""
    data, recipe = report['dataset'], report['recipe']
    lines = ['Data doctor: %s: %d images (%d without boxes), %d boxes (%d crowd)%s' % (
        data['source'], data['images'], data['negatives'], data['boxes'], data['crowd'],
        ''.join(', %d %s skipped' % (n, why) for why, n in data['skipped'].items() if n)),
        'Recipe: %s, image_size %s, levels P%d-P%d, num_scales %d, aspect_ratios %s, '
        'anchor_scale %g, match_threshold %g, jitter %g-%g' % (
            recipe['model_name'], recipe['image_size'], recipe['levels'][0], recipe['levels'][1],
            recipe['num_scales'], recipe['aspect_ratios'], recipe['anchor_scale'],
            recipe['match_threshold'], recipe['jitter'][0], recipe['jitter'][1]), '']
    lines += _data_table(report) + [''] + _coverage_table(report) + ['']
    coverage = {row['name']: row['coverage'] for row in report['classes']}
    if report['weak_classes']:
        lines.append('Weak (coverage under %.0f%%): %s. Most of their boxes get no positive '
                     'anchor besides the one forced match.' % (100 * geometry.WEAK_COVERAGE, ', '.join(
                         '%s %s' % (name, _pct(coverage[name]).strip())
                         for name in report['weak_classes'])))
    else:
        lines.append('No class is under %.0f%% coverage.' % (100 * geometry.WEAK_COVERAGE))
    if report['lagging_classes']:
        lines.append('Lagging (%.0f points or more under the median class): %s.' % (
            100 * LAGGING_POINTS, ', '.join('%s %s' % (name, _pct(coverage[name]).strip())
                                            for name in report['lagging_classes'])))
    if not report['advice']:
        return '\n'.join(lines)
    lines += [''] + _advice_lines(dict(report, _width=max(
        len('mean of classes'), *[len(row['name']) for row in report['classes']])))
    if report['advised_overrides']:
        lines += ['', 'Apply: --hparams=%s' % report['apply_hparams'],
                  '   or: --write_recipe=out.yaml (the recipe with the advice applied)']
    else:
        lines += ['', 'The recipe\'s anchors already fit this data: no change advised.']
    return '\n'.join(lines)
