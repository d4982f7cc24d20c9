"""Training curves of a run: loss terms, learning rate and COCO AP against the step.

    python -m training.plot_curves --model_dir=runs/demo --output=curves.png

Reads model_dir/train_log.jsonl (engine/train_log.py writes `{"event": "train", "step", "loss",
"cls_loss", "box_loss", "learning_rate", ...}` at each log step and engine/checkpoint_eval.py appends
`{"event": "eval", "step", "AP", "AP50", ...}`) and renders a PNG with matplotlib's Agg
backend (no display needed). Runs that resumed log a step twice: the later record wins.
"""
import os

import matplotlib

matplotlib.use('Agg')
import matplotlib.pyplot as plt  # pylint: disable=wrong-import-position
from absl import app, flags  # pylint: disable=wrong-import-position

from efficientdet_hpu.core import command_help
from efficientdet_hpu.core import errors
from efficientdet_hpu.core import atomic_file  # pylint: disable=wrong-import-position
from efficientdet_hpu.engine import train_log  # pylint: disable=wrong-import-position
from efficientdet_hpu.core.errors import UserError  # pylint: disable=wrong-import-position

LOSS_KEYS = ('loss', 'cls_loss', 'box_loss', 'iou_loss', 'l2_loss')
AP_KEYS = ('AP', 'AP50', 'AP75')


class CurvesError(UserError, ValueError):
    """Nothing to plot; the message says where the log was looked for."""


def series(records, event, key):
    """(steps, values) of one key over the records of one event, sorted, last record wins."""
    by_step = {}
    for record in records:
        value = record.get(key)
        if record.get('event') == event and isinstance(value, (int, float)):
            by_step[int(record['step'])] = float(value)
    steps = sorted(by_step)
    return steps, [by_step[step] for step in steps]


def _plot_group(axis, records, event, keys, title, log_scale=False):
    drawn = []
    for key in keys:
        steps, values = series(records, event, key)
        if not steps or (key != 'loss' and not any(values)):  # Unused terms stay at zero.
            continue
        axis.plot(steps, values, marker='o' if len(steps) < 20 else None, markersize=3,
                  label=key)
        drawn.extend(values)
    axis.set_title(title)
    axis.set_xlabel('step')
    axis.grid(True, alpha=0.3)
    if drawn:
        axis.legend(fontsize='small')
        if log_scale and min(drawn) > 0:  # Terms differ by orders of magnitude.
            axis.set_yscale('log')
    else:
        axis.text(0.5, 0.5, 'no %s records yet' % event, ha='center', va='center',
                  transform=axis.transAxes, color='gray')
    return len(drawn)


def plot_curves(model_dir, output):
    """Writes the figure to `output`; returns the number of train and eval records used."""
    records = train_log.read_json_log(model_dir)
    num_train = sum(1 for r in records if r.get('event') == 'train')
    num_eval = sum(1 for r in records if r.get('event') == 'eval')
    if not num_train and not num_eval:
        raise CurvesError('no train or eval records in %s; train with main.py --model_dir=%s '
                          'first' % (os.path.join(model_dir, train_log.JSON_LOG), model_dir))
    figure, (loss_axis, rate_axis, ap_axis) = plt.subplots(1, 3, figsize=(15, 4.2))
    _plot_group(loss_axis, records, 'train', LOSS_KEYS, 'losses', log_scale=True)
    _plot_group(rate_axis, records, 'train', ('learning_rate',), 'learning rate')
    _plot_group(ap_axis, records, 'eval', AP_KEYS, 'COCO AP (EMA weights)')
    figure.suptitle(os.path.basename(os.path.normpath(model_dir)))
    figure.tight_layout()
    try:
        with atomic_file.replacing(output, suffix='.png') as temporary:
            figure.savefig(temporary, dpi=100)
    finally:
        plt.close(figure)
    return num_train, num_eval


def main(argv):
    if len(argv) > 1:
        raise app.UsageError('unexpected arguments: %s' % argv[1:])
    try:
        num_train, num_eval = plot_curves(flags.FLAGS.model_dir, flags.FLAGS.output)
    except CurvesError as error:
        return errors.fail('plot_curves', error)
    print('wrote %s (%d train, %d eval records)' % (flags.FLAGS.output, num_train, num_eval))
    return 0


def entry_point():
    """Parses the command line and runs the command (the module's `main`)."""
    flags.DEFINE_string('model_dir', None, 'Run directory holding train_log.jsonl.')
    flags.DEFINE_string('output', 'curves.png', 'PNG to write.')
    flags.mark_flag_as_required('model_dir')
    command_help.install(__name__)
    app.run(main, flags_parser=errors.parse_flags)


if __name__ == '__main__':
    entry_point()
