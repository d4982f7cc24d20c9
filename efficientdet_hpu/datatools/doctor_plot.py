"""The data doctor's picture: box shapes over the anchor shapes, and coverage per class.

Left: width against height (log-log, network pixels at the eval resize) of up to
POINTS_PER_CLASS boxes per class, over the recipe's anchor shapes (every level, octave and
aspect ratio) and the shapes the advice adds. Right: coverage per class now and with all the
advice applied, with the 50% line under which main.py warns.
"""
import matplotlib

matplotlib.use('Agg')
import matplotlib.pyplot as plt  # pylint: disable=wrong-import-position
import numpy as np  # pylint: disable=wrong-import-position

from efficientdet_hpu.data import anchor_coverage as geometry

POINTS_PER_CLASS = 1500


def anchor_shapes(setup):
    """float32 [L * A, 2]: (width, height) of every anchor shape of the setup, pixels."""
    shapes = []
    for _, y_extent, x_extent in geometry.level_extents(setup):
        heights = y_extent[0, :, 1] - y_extent[0, :, 0]
        widths = x_extent[0, :, 1] - x_extent[0, :, 0]
        shapes.append(np.stack([widths, heights], axis=1))
    return np.concatenate(shapes)


def _scatter(axis, eval_placed, class_names, before, after):
    rng = np.random.default_rng(0)
    for index, name in enumerate(class_names):
        rows = np.flatnonzero(eval_placed.class_index == index)
        if len(rows) > POINTS_PER_CLASS:
            rows = rng.choice(rows, POINTS_PER_CLASS, replace=False)
        boxes = eval_placed.boxes[rows]
        axis.scatter(boxes[:, 3] - boxes[:, 1], boxes[:, 2] - boxes[:, 0], s=6, alpha=0.45,
                     label=name)
    old = anchor_shapes(before)
    axis.scatter(old[:, 0], old[:, 1], marker='s', s=40, facecolors='none', edgecolors='black',
                 linewidths=1.2, label='anchors now')
    new = anchor_shapes(after)
    added = ~np.any(np.all(np.isclose(new[:, None], old[None], rtol=1e-4), axis=-1), axis=1)
    if added.any():
        axis.scatter(new[added, 0], new[added, 1], marker='x', s=45, color='black',
                     linewidths=1.6, label='anchors advised')
    axis.set_xscale('log')
    axis.set_yscale('log')
    axis.set_xlabel('box width (network px)')
    axis.set_ylabel('box height (network px)')
    axis.set_title('Box shapes over anchor shapes (image_size %s)' % before.image_size)
    axis.legend(fontsize=7, loc='upper left', markerscale=1.5)
    axis.grid(True, which='both', alpha=0.2)


def _bars(axis, report):
    names = [row['name'] for row in report['classes']]
    now = [row['coverage'] or 0.0 for row in report['classes']]
    after = report['advice'][-1]['coverage'][:len(names)] if report['advice'] else now
    positions = np.arange(len(names))
    axis.barh(positions - 0.2, now, height=0.4, color='#999999', label='recipe now')
    axis.barh(positions + 0.2, [v or 0.0 for v in after], height=0.4, color='#1f77b4',
              label='with the advice')
    axis.axvline(geometry.WEAK_COVERAGE, color='black', linestyle='--', linewidth=1)
    axis.set_yticks(positions)
    axis.set_yticklabels(names)
    axis.invert_yaxis()
    axis.set_xlim(0, 1)
    axis.set_xlabel('coverage: share of boxes with an anchor at IoU >= %g'
                    % report['recipe']['match_threshold'])
    axis.set_title('Anchor coverage per class')
    axis.legend(fontsize=8, loc='lower right')


def save_plot(path, report, eval_placed, class_names, before, after):
    """Writes the two panels to the PNG `path`.

    Args:
      report: doctor.diagnose's report dict.
      eval_placed: anchor_coverage.Placed at the eval resize.
      class_names: names by class index.
      before, after: AnchorSetup of the recipe and with all advice applied.
    """
    figure, (left, right) = plt.subplots(1, 2, figsize=(13, 5.5),
                                         gridspec_kw={'width_ratios': [1.15, 1]})
    _scatter(left, eval_placed, class_names, before, after)
    _bars(right, report)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
