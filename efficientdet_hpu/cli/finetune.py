r"""Fine-tune EfficientDet on a folder of your photos in one command:

    python finetune.py --data=photos/ --output_dir=runs/mine [--val_data=DIR]
        [--weights=efficientnet-lite0-57934424.pth] [--max_minutes=30] [--dry_run]
        [--review_labels]

--data holds COCO JSON + images, Pascal VOC XML + images, or YOLO images/ + labels/ with
classes.txt / obj.names / data.yaml (finetune/inputs.py). The command prints a plan sized to
the data, the machine and the time budget (finetune/plan.py), writes it as main.py's recipe
(output_dir/plan.yaml), then converts, trains, evaluates the whole validation photos, analyses
the errors and exports, each as the project's own command under a deadline
(finetune/stages.py), and ends with a summary table (output_dir/summary.json); with
--review_labels the label review follows (review/run.py, docs/review.md). Rerunning the same
command resumes. docs/finetune.md.
"""

from absl import app, flags

from efficientdet_hpu.core import command_help
from efficientdet_hpu.core import errors
from efficientdet_hpu.finetune import plan_file
from efficientdet_hpu.finetune import prepare
from efficientdet_hpu.finetune import runner
from efficientdet_hpu.finetune import stages
from efficientdet_hpu.review import run as review_run

FLAGS = flags.FLAGS
PROGRAM = 'finetune'


def define_flags():
    flags.DEFINE_string('data', None, 'Folder of photos and annotations: COCO JSON, Pascal VOC '
                        'XML or YOLO (images/ + labels/ + classes.txt or data.yaml), or a COCO '
                        '.json file.')
    flags.DEFINE_string('output_dir', None, 'Everything the run writes: data/, plan.yaml, '
                        'model/, evaluation/, export/, summary.json.')
    flags.DEFINE_string('val_data', None, 'Validation photos in a folder of their own (default: '
                        'a split of --data by photo).')
    flags.DEFINE_list('val_photos', [], 'Photos of --data to hold out for validation, by file '
                      'name with or without extension (default: 20%, chosen by file name).')
    flags.DEFINE_string('single_class', None, 'Merge every class into this one.')
    flags.DEFINE_bool('drop_orphan_labels', False, 'YOLO: leave out label files whose image is '
                      'missing (default: an error naming them, as their boxes would be lost).')
    flags.DEFINE_string('weights', None, 'Starting weights: an EfficientNet-Lite ImageNet .pth, '
                        'an EfficientNet checkpoint, or a detector model_dir or checkpoint '
                        '(google/automl\'s or this project\'s). Default: random weights.')
    flags.DEFINE_string('model_name', None, 'Variant (default: planned; efficientdet-lite0 on a '
                        'CPU).')
    flags.DEFINE_float('max_minutes', 0, 'Time budget of the whole command: the steps are '
                       'planned to fit, and training stops at it anyway (0: none).',
                       lower_bound=0)
    flags.DEFINE_float('images_per_second', 0, 'Training images/s you measured on this machine '
                       'for the plan\'s estimate (default: the project\'s measured figures).',
                       lower_bound=0)
    flags.DEFINE_integer('steps', 0, 'Training steps (default: planned from the data and the '
                         'budget).', lower_bound=0)
    flags.DEFINE_string('hparams', '', 'a=1,b.c=2 overrides on top of the plan: main.py\'s '
                        'hparams keys, and the run options %s.' % ', '.join(
                            plan_file.RUN_OPTION_OVERRIDES))
    flags.DEFINE_bool('review_labels', False, 'Then review the labels (efficientdet-review): '
                      'models trained without each fold predict it, cleanlab ranks the '
                      'labels that are probably wrong; output_dir/review/. The plan says '
                      'what it adds to the time.')
    flags.DEFINE_bool('dry_run', False, 'Print the plan and stop; nothing is written.')
    flags.DEFINE_bool('verbose', False, 'Every command\'s output, TensorFlow\'s log lines, and '
                      'tracebacks with errors.')
    flags.mark_flags_as_required(['data', 'output_dir'])


def options_from_flags():
    return prepare.Options(
        data=FLAGS.data, output_dir=FLAGS.output_dir, val_data=FLAGS.val_data or '',
        val_photos=tuple(FLAGS.val_photos), single_class=FLAGS.single_class or '',
        drop_orphan_labels=FLAGS.drop_orphan_labels,
        weights=FLAGS.weights or '', model_name=FLAGS.model_name or '',
        max_minutes=FLAGS.max_minutes, images_per_second=FLAGS.images_per_second,
        steps=FLAGS.steps, hparams=FLAGS.hparams, dry_run=FLAGS.dry_run, verbose=FLAGS.verbose)


def main(argv):
    if len(argv) > 1:
        raise app.UsageError('unexpected arguments: %s (flags are --name=value)' % argv[1:])
    def work():
        if FLAGS.review_labels:
            review_run.check_installed()  # A missing cleanlab is said before anything runs.
        summary = stages.finetune(options_from_flags(), after_plan=(
            review_run.finetune_estimate if FLAGS.review_labels else None))
        if FLAGS.review_labels and summary is not None:
            review_run.review_finetune(FLAGS.output_dir, FLAGS.verbose)
    return runner.exit_status(PROGRAM, work, FLAGS.output_dir, FLAGS.verbose)


def entry_point():
    """Parses the command line and runs the command (the module's `main`)."""
    define_flags()
    command_help.install(__name__)
    app.run(main, flags_parser=errors.parse_flags)


if __name__ == '__main__':
    entry_point()
