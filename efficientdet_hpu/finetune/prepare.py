"""The fine-tune's first two stages (finetune/stages.py runs the rest):

  [1/6] data   read --data (and --val_data), split by photo: data/train.json, val.json,
               val_photos/ (links), inputs.json (written last: the stage is done)
  [2/6] plan   the data doctor on the images training will see (tiles when the plan tiles),
               then the plan: plan.yaml (main.py's recipe) and plan.json (reused on a rerun)

Nothing is written before the inputs have passed every check, so bad input leaves
--output_dir as it was.
"""
import dataclasses
import json
import os
import shutil
import tempfile

from efficientdet_hpu.config import hparams_config
from efficientdet_hpu.config import recipe as recipe_lib
from efficientdet_hpu.core import atomic_file
from efficientdet_hpu.core.errors import UserError
from efficientdet_hpu.finetune import costs
from efficientdet_hpu.finetune import hardware
from efficientdet_hpu.finetune import inputs
from efficientdet_hpu.finetune import plan as plan_lib
from efficientdet_hpu.finetune import plan_file
from efficientdet_hpu.finetune import search
from efficientdet_hpu.finetune import stats
from efficientdet_hpu.finetune import weights as weights_lib

DOCTOR_SECONDS = 900


@dataclasses.dataclass(frozen=True)
class Options:
    """The command line of efficientdet-finetune (cli/finetune.py)."""
    data: str
    output_dir: str
    val_data: str = ''
    val_photos: tuple = ()
    single_class: str = ''
    weights: str = ''
    model_name: str = ''
    max_minutes: float = 0.0
    images_per_second: float = 0.0
    steps: int = 0
    hparams: str = ''
    dry_run: bool = False
    verbose: bool = False

    def request(self) -> dict:
        """What decides the run's data and plan: a rerun must ask the same to resume."""
        record = dataclasses.asdict(self)
        for key in ('output_dir', 'dry_run', 'verbose'):
            record.pop(key)
        for key in ('data', 'val_data', 'weights'):
            record[key] = os.path.abspath(record[key]) if record[key] else ''
        record['val_photos'] = list(record['val_photos'])
        return record


def check_flags(layout, options):
    """Raises UserError, before anything is read or written, for --hparams that main.py would
    refuse (an unknown key, a value of the wrong type) and for an output_dir that holds a
    fine-tune of other flags."""
    _request(options, plan_lib.Weights())
    check_request(layout, options)


def check_request(layout, options):
    """Raises UserError when output_dir holds a fine-tune of another request."""
    if not os.path.exists(layout.request_json):
        return
    with open(layout.request_json) as stream:
        saved = json.load(stream)
    wanted = options.request()
    changed = sorted(key for key in set(saved) | set(wanted) if saved.get(key) != wanted.get(key))
    if changed:
        raise UserError('--output_dir=%s holds a fine-tune of other flags (%s: was %s); rerun '
                        'with the same flags to resume it, or give another --output_dir' % (
                            layout.root, ', '.join(changed),
                            ', '.join('%r' % saved.get(key) for key in changed)))


def _validation(options, dataset):
    """(val COCO dict, its image dir, how it was chosen), and the training COCO dict."""
    if options.val_data and options.val_photos:
        raise UserError('give --val_data=DIR or --val_photos=NAMES, not both')
    if options.val_data:
        held = inputs.read('val_data', options.val_data, options.single_class)
        val = inputs.align_categories(dataset.coco, held.coco, '--val_data=%s' % options.val_data)
        return dataset.coco, val, held.image_dir, '--val_data: ' + held.line()
    if dataset.val_dir and not options.val_photos:
        names = [c['name'] for c in dataset.coco['categories']]
        val = inputs.yolo_to_coco.coco_dataset(dataset.val_dir, names)
        if options.single_class:
            val = inputs.merge_classes(val, options.single_class)
        return dataset.coco, val, dataset.val_dir, 'the val: images of the data.yaml'
    train, val, how = inputs.split(dataset.coco, options.val_photos)
    return train, val, dataset.image_dir, how


def _link_val_photos(val, image_dir, directory):
    """directory/: a link to each validation photo by its file name (inference.py predict
    reads a folder; photo_eval matches photos by file name); made aside, then renamed."""
    staging = tempfile.mkdtemp(prefix='.val_photos.tmp-', dir=os.path.dirname(directory))
    for image in val['images']:
        os.symlink(os.path.abspath(os.path.join(image_dir, image['file_name'])),
                   os.path.join(staging, inputs.photo_name(image)))
    shutil.rmtree(directory, ignore_errors=True)
    os.rename(staging, directory)


def data_stage(runner, options):
    """[1/6]: the inputs record {'line', 'split', 'train_image_dir', 'val_image_dir'}."""
    layout = runner.layout
    if os.path.exists(layout.inputs_json):
        with open(layout.inputs_json) as stream:
            record = json.load(stream)
        runner.say('  %s\n  %s (from %s)' % (record['line'], record['split'], layout.data))
        return record
    dataset = inputs.read('data', options.data, options.single_class)
    runner.say('  ' + dataset.line())
    train, val, val_image_dir, how = _validation(options, dataset)
    names = [inputs.photo_name(image) for image in val['images']]
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise UserError('two validation photos are called %s; the whole photos are matched by '
                        'file name: rename one' % twice[0])
    record = {'line': dataset.line(), 'split': inputs.split_line(train, val, how),
              'train_image_dir': os.path.abspath(dataset.image_dir),
              'val_image_dir': os.path.abspath(val_image_dir)}
    runner.say('  ' + record['split'])
    os.makedirs(layout.data, exist_ok=True)
    atomic_file.write_json_atomically(layout.request_json, options.request())
    atomic_file.write_json_atomically(layout.train_json, train)
    atomic_file.write_json_atomically(layout.val_json, val)
    _link_val_photos(val, val_image_dir, layout.val_photos)
    atomic_file.write_json_atomically(layout.inputs_json, record)
    return record


def _read_json(path):
    with open(path) as stream:
        return json.load(stream)


def _request(options, weights):
    if options.hparams and hparams_config.is_yaml_path(options.hparams.split(',')[0]):
        raise UserError('--hparams=%s: give a=1,b.c=2 overrides here; to start from a recipe '
                        'file, edit the written plan.yaml and run main.py with it'
                        % options.hparams)
    overrides = hparams_config.parse_override_string(options.hparams or '')
    run_options = {key: overrides[key] for key in overrides
                   if key in plan_file.RUN_OPTION_OVERRIDES}
    for key, value in run_options.items():
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise UserError('--hparams: %s=%s is not a count; give a whole number >= 0 (a key '
                            'of main.py\'s that plan.yaml sets)' % (
                                key, hparams_config.override_texts(options.hparams)[key].strip()))
    hparams_config.Config(hparams_config.get_efficientdet_config(
        options.model_name or plan_lib.DEFAULT_MODEL).as_dict()).override(
            {key: value for key, value in overrides.items() if key not in run_options})
    return plan_lib.Request(options.model_name, weights, options.max_minutes,
                            options.images_per_second, options.steps, tuple(overrides.items()))


def config_overrides(request) -> str:
    """request's --hparams overrides of config keys (not main.py's run options) as 'a=1,b.c=2'
    (values as JSON, which YAML reads back)."""
    return ','.join('%s=%s' % (key, json.dumps(value)) for key, value in request.hparams
                    if key not in plan_file.RUN_OPTION_OVERRIDES)


def doctor_advice(runner, first, train, request):
    """The data doctor's advice (((key, value), ...)) for the first plan's model and size, on
    the training images it will train on (tiles when it tiles)."""
    layout = runner.layout
    coco = stats.tiles_coco(train, first.tile_size, first.tile_overlap) if first.tile_size else train
    atomic_file.write_json_atomically(layout.doctor_input, coco, indent=None)
    keys = [key for key in ('aspect_ratios', 'anchor_scale', 'image_size')
            if request.hparam(key) is None
            and not (key == 'aspect_ratios' and request.weights.kind == 'detector')
            and not (key == 'image_size' and first.tile_size)]
    hparams = ','.join(part for part in ('image_size=%d,jitter_min=%g,jitter_max=%g' % (
        first.image_size, plan_lib.SCHEDULE_KEYS['jitter_min'],
        plan_lib.SCHEDULE_KEYS['jitter_max']), config_overrides(request)) if part)
    report = layout.doctor_json + '.tmp'
    try:
        runner.command('doctor', 'doctor', [
            '--annotations=' + layout.doctor_input, '--model_name=' + first.model_name,
            '--hparams=' + hparams, '--advise=' + ','.join(keys), '--report_json=' + report],
            DOCTOR_SECONDS)
        os.replace(report, layout.doctor_json)
    finally:
        atomic_file.discard(report)  # The doctor writes its report in place: none half-written.
    doctor = _read_json(layout.doctor_json)
    changed = [step for step in doctor['advice'] if step['changed']]
    runner.say('  data doctor: %.0f%% of the boxes reach an anchor (mean over classes) with '
               '%s\'s anchors%s' % (
                   100 * doctor['mean_class_coverage'], first.model_name,
                   '; %s: %.0f%%' % (', '.join(step['label'] for step in changed),
                                     100 * changed[-1]['coverage'][-1]) if changed else
                   ', no change advised'))
    return tuple(doctor['advised_overrides'].items()), doctor['mean_class_coverage']


def training_paths(layout, plan):
    return (os.path.join(layout.records, 'train-*.tfrecord'),
            os.path.join(layout.records, 'val-*.tfrecord'),
            os.path.join(layout.records, 'val-tiles.json') if plan.tile_size else layout.val_json)


def rerun_command(layout):
    return 'python main.py --hparams=%s --model_dir=%s' % (layout.plan_yaml, layout.model_dir)


def plan_stage(runner, options):
    """[2/6]: the Plan (reused from plan.json on a rerun)."""
    layout = runner.layout
    if os.path.exists(layout.plan_json):
        plan = plan_from_record(_read_json(layout.plan_json))
        runner.say('  the plan of the first run (%s):' % layout.plan_yaml)
        runner.say('\n'.join(plan_file.lines(plan)))
        return plan
    machine = hardware.detect()
    runner.say('  ' + hardware.line(machine))
    request = _request(options, weights_lib.resolve(options.weights, options.model_name))
    train, val = _read_json(layout.train_json), _read_json(layout.val_json)
    data = stats.from_coco(train, val)
    table = costs.load(machine.cpu)
    first = plan_lib.make_plan(data, machine, request, table=table)
    advice, coverage = doctor_advice(runner, first, train, request)
    plan = plan_lib.make_plan(data, machine, request, advice, coverage, table)
    runner.say('\n'.join(plan_file.lines(plan)))

    def recipe_of(chosen):
        content = plan_file.recipe(chosen, *training_paths(layout, chosen), request.hparams)
        return plan_file.yaml_text(content, rerun_command(layout))
    with atomic_file.replacing(layout.plan_yaml, suffix='.yaml') as temporary:
        with open(temporary, 'w', encoding='utf-8') as stream:
            stream.write(recipe_of(plan))
        check_recipe(temporary)  # A bad --hparams override: said now, nothing written.
    if plan.candidates:
        search.write_candidates(layout, [plan] + [plan_lib.candidate_plan(
            plan, data, machine, request, size, advice, coverage, table)
            for size in plan.candidates[1:]], recipe_of)
    atomic_file.write_json_atomically(layout.plan_json, dataclasses.asdict(plan))
    return plan


def check_recipe(path):
    """Reads plan.yaml back as main.py does: a bad --hparams override is said now."""
    written = recipe_lib.read_recipe(path)
    hparams_config.validate(recipe_lib.build_config(written.run_options['model_name'], written))


def plan_from_record(record) -> plan_lib.Plan:
    """A Plan from dataclasses.asdict(plan) (plan.json)."""
    values = dict(record, weights=plan_lib.Weights(**record['weights']))
    for key in ('anchors', 'seconds', 'reasons', 'schedule_keys'):
        if key in record:
            values[key] = tuple(tuple(item) for item in record[key])
    if 'candidates' in record:
        values['candidates'] = tuple(record['candidates'])
    return plan_lib.Plan(**values)
