r"""The data doctor: do a dataset's boxes fit the recipe's anchors? Ask before training.

    python -m dataset.doctor --annotations=instances_train.json --hparams=configs/demo.yaml
    python -m dataset.doctor --file_pattern='/data/train-*.tfrecord' --hparams=recipe.yaml,k=v \
        --write_recipe=advised.yaml --plot=doctor.png --report_json=doctor.json

Reads only the annotations (a COCO JSON, or the converter's TFRecords without decoding an
image) and prints, per class: box counts, sizes and aspect ratios in network-input pixels
after the recipe's resize; anchor coverage, the share of boxes whose best anchor IoU reaches
match_threshold (only those get a positive anchor besides the one forced match), the median
best IoU and the pyramid level the best anchor sits on, overall and for boxes under 8 px;
then advice: the aspect ratios, anchor_scale and image_size that raise coverage most
(doctor_advice.py), with the coverage each gives. The geometry is the training code's
own (efficientdet_hpu/data/anchor_coverage.py), and so is main.py's check at start
(efficientdet_hpu/engine/coverage_check.py).
"""

from efficientdet_hpu.core import errors
from efficientdet_hpu.core import tf_env  # noqa: F401  (before TensorFlow)

import numpy as np  # pylint: disable=wrong-import-position
import yaml  # pylint: disable=wrong-import-position

from efficientdet_hpu.config import hparams_config  # pylint: disable=wrong-import-position
from efficientdet_hpu.config import recipe as recipe_lib  # pylint: disable=wrong-import-position
from efficientdet_hpu.data import anchor_coverage as geometry
from efficientdet_hpu.data import annotated_boxes as doctor_data
from efficientdet_hpu.datatools import doctor_advice as advice_lib
from efficientdet_hpu.datatools import doctor_report  # pylint: disable=wrong-import-position

DoctorInputError = doctor_data.DoctorInputError
load_boxes = doctor_data.load_boxes
coverage_by_class = geometry.coverage_by_class


def _step_label(step):
    if not step.changed:
        return '%s kept' % step.key
    if step.key == 'aspect_ratios':
        return 'aspect_ratios +%s' % ','.join('%g' % r for r in step.after[len(step.before):])
    return '%s %s' % (step.key, step.after)


def _advice_entries(box_set, steps, coverage_now):
    """JSON-ready steps with the per-class coverage (on all boxes) each gives."""
    entries, coverage = [], coverage_now
    for step in steps:
        if step.changed:
            coverage = coverage_by_class(box_set, step.setup)
        entries.append({
            'key': step.key, 'before': step.before, 'after': step.after,
            'changed': step.changed, 'label': _step_label(step), 'cost_note': step.cost_note,
            'coverage': [None if np.isnan(v) else round(float(v), 4) for v in coverage] +
                        [round(advice_lib.mean_coverage(coverage), 4)]})
    return entries


def diagnose(box_set, config, model_name='', hparams='',
             advise=advice_lib.ADVISED_KEYS):
    """Everything the doctor reports.

    Args:
      box_set: annotated_boxes.BoxSet.
      config: hparams_config.Config of the recipe.
      model_name, hparams: as typed, for the report and the command it suggests.
      advise: the keys the advice search may change (doctor_advice.ADVISED_KEYS); empty:
        no search.

    Returns:
      (report: JSON-ready dict, eval_placed: Placed at the eval resize, advised AnchorSetup).
    """
    setup = geometry.AnchorSetup.from_config(config)
    eval_placed = geometry.place_for_training(box_set, setup, [1.0])
    train = geometry.place_for_training(box_set, setup)
    match = geometry.best_anchor_match(train.boxes, setup)
    rows = doctor_report.class_rows(box_set, eval_placed, train, match, setup)
    coverage_now = advice_lib.class_coverage(match[0], train.class_index, box_set.num_classes,
                                             setup.match_threshold)
    steps = advice_lib.advise(box_set, setup, advise) if advise else []
    overrides = advice_lib.advised_overrides(steps)
    report = {
        'dataset': doctor_report.dataset_summary(box_set),
        'recipe': doctor_report.recipe_summary(setup, model_name or config.get('name', '')),
        'classes': rows, 'overall': doctor_report.overall_row(train, match, setup),
        'weak_classes': doctor_report.weak_classes(rows),
        'lagging_classes': doctor_report.lagging_classes(rows),
        'mean_class_coverage': round(advice_lib.mean_coverage(coverage_now), 4),
        'advice': _advice_entries(box_set, steps, coverage_now),
        'advised_overrides': overrides,
        'apply_hparams': ','.join(part for part in (
            hparams, advice_lib.override_string(overrides)) if part),
    }
    return report, eval_placed, steps[-1].setup if steps else setup


def _set_dotted(mapping, dotted_key, value):
    node, parts = mapping, dotted_key.split('.')
    for part in parts[:-1]:
        node = node.setdefault(part, {})
    node[parts[-1]] = value


def recipe_with_advice(hparams, model_name, overrides):
    """The --hparams recipe (YAML and 'k=v' overrides) as one mapping, advice applied."""
    recipe = recipe_lib.read_recipe(hparams)
    content = {'model_name': recipe.run_options.get('model_name', model_name)}
    content.update(recipe.run_options)
    content.update(recipe.hparams)
    for key, value in recipe.overrides.items():
        _set_dotted(content, key, value)
    content.update(overrides)
    return content


def write_recipe(path, hparams, model_name, overrides):
    """Writes the advised recipe as YAML, checked by reading it back as main.py does."""
    content = recipe_with_advice(hparams, model_name, overrides)
    header = ('# Written by python -m dataset.doctor: the recipe %s with the data doctor\'s '
              'advice applied:\n#   %s\n' % (hparams or '(defaults)',
                                              advice_lib.override_string(overrides) or
                                              'no change advised'))
    with open(path, 'w') as handle:
        handle.write(header + yaml.safe_dump(content, sort_keys=False))
    written = recipe_lib.read_recipe(path)
    hparams_config.validate(recipe_lib.build_config(
        written.run_options.get('model_name', model_name), written))
    return path


def _define_flags(flags):
    flags.DEFINE_string('annotations', None, 'COCO instances JSON to examine.')
    flags.DEFINE_string('file_pattern', None, 'Or: TFRecords (glob, comma-separated globs) '
                        'written by dataset.create_coco_tfrecord.')
    flags.DEFINE_integer('max_records', None, 'With --file_pattern: read only the first N.')
    flags.DEFINE_string('hparams', '', 'The training recipe: YAML path and/or "a=1,b=2" '
                        'overrides, as main.py takes it.')
    flags.DEFINE_string('model_name', 'efficientdet-d0', 'Variant whose defaults the recipe '
                        'starts from (a recipe\'s model_name wins).')
    flags.DEFINE_string('write_recipe', None, 'Write the recipe with the advice applied here.')
    flags.DEFINE_string('report_json', None, 'Write the report as JSON here.')
    flags.DEFINE_string('plot', None, 'Write the PNG (box shapes, coverage bars) here.')
    flags.DEFINE_list('advise', list(advice_lib.ADVISED_KEYS), 'Settings the advice may '
                      'change (empty: no advice), e.g. --advise=aspect_ratios,anchor_scale to '
                      'keep the image size (compute) as it is.')


def main(argv):
    import json  # pylint: disable=import-outside-toplevel
    from absl import flags  # pylint: disable=import-outside-toplevel
    del argv
    options = flags.FLAGS
    try:
        unknown = set(options.advise) - set(advice_lib.ADVISED_KEYS)
        if unknown:
            raise DoctorInputError('--advise=%s: cannot advise on %s; choose among %s' % (
                ','.join(options.advise), ', '.join(sorted(unknown)),
                ','.join(advice_lib.ADVISED_KEYS)))
        config = recipe_lib.resolve(options.model_name, options.hparams)
        box_set = load_boxes(options.annotations, options.file_pattern, options.max_records)
        report, eval_placed, advised = diagnose(box_set, config, options.model_name,
                                                options.hparams, options.advise)
        print(doctor_report.format_text(report))
        if options.report_json:
            with open(options.report_json, 'w') as handle:
                json.dump(report, handle, indent=1)
        if options.plot:
            from efficientdet_hpu.datatools import doctor_plot  # pylint: disable=import-outside-toplevel
            doctor_plot.save_plot(options.plot, report, eval_placed, box_set.class_names,
                                  geometry.AnchorSetup.from_config(config), advised)
        if options.write_recipe:
            write_recipe(options.write_recipe, options.hparams, options.model_name,
                         report['advised_overrides'])
            print('Wrote %s' % options.write_recipe)
    except (DoctorInputError, hparams_config.ConfigError, doctor_data.LabelMapError,
            OSError) as error:
        return errors.fail('dataset.doctor', error)
    return 0


def entry_point():
    """Parses the command line and runs the command (the module's `main`)."""
    from absl import app, flags as absl_flags  # pylint: disable=g-import-not-at-top
    from efficientdet_hpu.core import command_help  # pylint: disable=g-import-not-at-top
    _define_flags(absl_flags)
    command_help.install(__name__)
    app.run(main, flags_parser=errors.parse_flags)


if __name__ == '__main__':
    entry_point()
