r"""Your labels, reviewed: the annotations that are probably wrong, found, ranked and shown.

    python review.py --data=photos/ --output_dir=runs/review [--max_minutes=60] \
        [--weights=efficientnet-lite0-57934424.pth] [--folds=5] [--dry_run]
    python review.py --finetune_dir=runs/mine     (a fine-tune's data, plan and model reused)

--data holds what efficientdet-finetune reads (COCO, Pascal VOC or YOLO; finetune/inputs.py).
K models (folds), each trained with the fine-tune's plan on all labelled photos but one fold's,
predict the photos they never saw; cleanlab's object-detection functions score every label
and photo (pip install "efficientdet-hpu[review]"); output_dir/review/ gets issues.csv (ranked,
most likely wrong first), index.html (the crops, label green, model red), review_coco.json
(for CVAT and Label Studio) and FiftyOne's files. Rerunning the same command resumes.
docs/review.md.
"""

from absl import app, flags

from efficientdet_hpu.core import command_help, errors
from efficientdet_hpu.finetune import runner
from efficientdet_hpu.review import issues
from efficientdet_hpu.review import run

FLAGS = flags.FLAGS
PROGRAM = 'review'


def define_flags():
    flags.DEFINE_string('data', None, 'Folder of photos and annotations (COCO JSON, Pascal VOC '
                        'XML or YOLO), or a COCO .json file, as efficientdet-finetune reads.')
    flags.DEFINE_string('output_dir', None, 'Where the review writes: data/, plan.yaml, '
                        'review/ (issues.csv, index.html, ...).')
    flags.DEFINE_string('finetune_dir', None, 'A fine-tune\'s --output_dir: its data, plan '
                        'and trained model are reused and the review goes to its review/.')
    flags.DEFINE_string('single_class', None, 'Merge every class into this one.')
    flags.DEFINE_string('weights', None, 'Starting weights of each fold\'s model, as '
                        'efficientdet-finetune --weights (default: random).')
    flags.DEFINE_string('model_name', None, 'Variant (default: the fine-tune\'s plan).')
    flags.DEFINE_float('images_per_second', 0, 'Training images/s you measured here, for '
                       'the estimate.', lower_bound=0)
    flags.DEFINE_string('hparams', '', 'a=1,b.c=2 overrides on the fine-tune\'s plan.')
    flags.DEFINE_integer('folds', 0, 'Folds (models trained); 0: planned (5, fewer under a '
                         'short budget).', lower_bound=0)
    flags.DEFINE_integer('steps', 0, 'Training steps of each fold\'s model (default: the '
                         'fine-tune\'s plan, fewer under the budget).', lower_bound=0)
    flags.DEFINE_float('max_minutes', 0, 'Time budget of the review: the folds and steps are '
                       'planned to fit, and training stops at it anyway (0: none).',
                       lower_bound=0)
    flags.DEFINE_float('threshold', issues.DEFAULT_THRESHOLD, 'List the labels and photos '
                       'whose cleanlab score is at most this (0-1; higher lists more).',
                       lower_bound=0, upper_bound=1)
    flags.DEFINE_bool('dry_run', False, 'Print the plans and stop; nothing is written.')
    flags.DEFINE_bool('verbose', False, 'Every command\'s output and tracebacks with errors.')


def options_from_flags():
    if bool(FLAGS.finetune_dir) == bool(FLAGS.data):
        raise errors.UserError('give --data=DIR --output_dir=DIR (a folder of labelled '
                               'photos) or --finetune_dir=DIR (a fine-tune\'s output_dir)')
    if FLAGS.finetune_dir and FLAGS.output_dir:
        raise errors.UserError('--finetune_dir=%s writes its review into its own review/; '
                               'drop --output_dir (another --threshold lists anew there)'
                               % FLAGS.finetune_dir)
    if FLAGS.data and not FLAGS.output_dir:
        raise errors.UserError('--data needs --output_dir=DIR (where the review writes)')
    return run.Options(
        data=FLAGS.data or '', output_dir=FLAGS.output_dir or '',
        finetune_dir=FLAGS.finetune_dir or '', single_class=FLAGS.single_class or '',
        weights=FLAGS.weights or '', model_name=FLAGS.model_name or '',
        images_per_second=FLAGS.images_per_second, hparams=FLAGS.hparams, folds=FLAGS.folds,
        steps=FLAGS.steps, max_minutes=FLAGS.max_minutes, threshold=FLAGS.threshold,
        dry_run=FLAGS.dry_run, verbose=FLAGS.verbose)


def main(argv):
    if len(argv) > 1:
        raise app.UsageError('unexpected arguments: %s (flags are --name=value)' % argv[1:])

    return runner.exit_status(PROGRAM, lambda: run.review(options_from_flags()),
                              FLAGS.output_dir or FLAGS.finetune_dir, FLAGS.verbose)


def entry_point():
    """Parses the command line and runs the command (the module's `main`)."""
    define_flags()
    command_help.install(__name__)
    app.run(main, flags_parser=errors.parse_flags)


if __name__ == '__main__':
    entry_point()
