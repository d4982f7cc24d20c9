"""The fine-tune's first two stages (finetune/stages.py runs the rest):

  [1/6] data   read --data (and --val_data), split by photo: data/train.json, val.json,
               val_photos/ (links), input_files.json (the input's fingerprint), inputs.json
               (written last: the stage is done)
  [2/6] plan   the data doctor on the images training will see (tiles when the plan tiles),
               then the plan: plan.yaml (main.py's recipe) and plan.json (reused on a rerun)

Nothing is written before the inputs, --weights, --hparams and the budget have passed every
check (the plan is made once before the doctor for that), so a refused run leaves
--output_dir as it was. A rerun reuses, redoes or refuses by what changed (finetune/rerun.py).
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
from efficientdet_hpu.finetune import model_choice
from efficientdet_hpu.finetune import plan as plan_lib
from efficientdet_hpu.finetune import plan_file
from efficientdet_hpu.finetune import rerun
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
    drop_orphan_labels: bool = False
    weights: str = ''
    model_name: str = ''
    max_minutes: float = 0.0
    images_per_second: float = 0.0
    steps: int = 0
    hparams: str = ''
    dry_run: bool = False
    verbose: bool = False

    def request(self) -> dict:
        """The flags as request.json keeps them (rerun.py says which a rerun compares)."""
        record = dataclasses.asdict(self)
        for key in ('output_dir', 'dry_run', 'verbose'):
            record.pop(key)
        for key in ('data', 'val_data', 'weights'):
            record[key] = os.path.abspath(record[key]) if record[key] else ''
        record['val_photos'] = list(record['val_photos'])
        return record


@dataclasses.dataclass
class Rerun:
    """What check_flags found in --output_dir (rerun.py): `trained` the step of model/'s
    checkpoint (None: nothing trained), `replan` the request's changes that make the plan stale,
    `relog` whether only the log spacing changed (a trained run: plan.yaml is rewritten),
    `budget` this run's budget against the plan's (a trained run), `read` the input read again
    (changed files or data flags: read_inputs), `same_data` whether it gave the last run's
    photos and boxes, `note` the line saying what changed and `changes` the changes alone."""
    trained: object = None
    replan: tuple = ()
    relog: bool = False
    budget: tuple = ()
    read: object = None
    same_data: bool = False
    note: str = ''
    changes: str = ''


def check_flags(layout, options) -> Rerun:
    """Raises UserError, before anything is written, for --hparams that main.py would refuse
    (an unknown key, a value of the wrong type), --weights of another kind or model, and a
    rerun that must be refused (rerun.py); returns what a rerun reuses and redoes."""
    _request(options, plan_lib.Weights())
    weights_lib.resolve(options.weights, options.model_name)
    return check_request(layout, options)


def _saved(path):
    return _read_json(path) if os.path.exists(path) else None


def check_request(layout, options) -> Rerun:
    """The Rerun of --output_dir; raises UserError when it holds a trained fine-tune of another
    request or of other data."""
    saved = _saved(layout.request_json)
    if saved is None:
        return Rerun()
    wanted, trained = options.request(), rerun.trained_step(layout)
    # The data flags are judged by what they read (_check_data): a folder moved elsewhere
    # holds the same photos.
    result_keys = tuple(key for key in rerun.RESULT_KEYS if key not in rerun.DATA_KEYS)
    changed = rerun.changes(saved, wanted, result_keys)
    if changed and trained is not None:
        raise UserError('--output_dir=%s holds a fine-tune trained to step %d with other flags '
                        '(%s); resume it with its own: %s; or start afresh with these in another '
                        '--output_dir' % (layout.root, trained, rerun.describe(changed),
                                          rerun.command_line(saved, layout.root)))
    state = Rerun(trained=trained)
    if trained is None:
        state.replan = tuple(rerun.changes(saved, wanted, result_keys + rerun.BUDGET_KEYS,
                                           with_logs=True))
    else:
        state.relog = bool(rerun.changes(saved, wanted, ('hparams',), with_logs=True))
        state.budget = tuple(rerun.changes(saved, wanted, rerun.BUDGET_KEYS))
    _check_data(layout, options, saved, state)
    return state


def _check_data(layout, options, saved, state):
    """Reads the input again when its files or the data flags changed (or the folder has no
    fingerprint yet); refuses other photos or boxes under a trained model."""
    inputs_record, files = _saved(layout.inputs_json), _saved(rerun.input_files_json(layout))
    flags = rerun.changes(saved, options.request(), rerun.DATA_KEYS)
    now = _input_files(options, layout, files)
    change = rerun.files_change(files, now) if files is not None else ''
    if inputs_record is None or not (flags or change or files is None):
        return
    state.read = read_inputs(options)
    state.same_data = (_read_json(layout.train_json) == _as_json(state.read['train'])
                       and _read_json(layout.val_json) == _as_json(state.read['val']))
    what = state.changes = '; '.join(part for part in (rerun.describe(flags), change) if part)
    if not state.same_data and state.trained is not None:
        raise UserError('the data changed since %s was trained on it (%s; now %s): its checkpoints '
                        'learnt the old data; start afresh on the new data in another folder: '
                        '%s' % (layout.model_dir, what or 'read again', state.read['line'],
                                rerun.command_line(options.request(), rerun.fresh_dir(
                                    layout.root))))
    if state.same_data:
        state.note = ('the input\'s files changed since the last run (%s), its photos and boxes '
                      'did not: the split and the plan stand; %s' % (
                          what, 'the records are converted again' if state.trained is None else
                          'model/ resumes with the records written before') if what else '')
    else:
        state.note = ('the input changed since the last run (%s): read again; the split, the '
                      'data doctor, the plan and the records are redone' % what)


def _as_json(value):
    return json.loads(json.dumps(value))


def _input_files(options, layout, saved_files):
    """The fingerprint of the input now: --data and --val_data walked (--output_dir left out),
    and the other files the last run read (photos a COCO JSON names outside its folder)."""
    roots = [path for path in (options.data, options.val_data) if path]
    return rerun.input_files(roots, extra=sorted(saved_files or ()), skip=[layout.root])


def _validation(options, dataset):
    """(val COCO dict, its image dir, how it was chosen), and the training COCO dict."""
    if options.val_data and options.val_photos:
        raise UserError('give --val_data=DIR or --val_photos=NAMES, not both')
    if options.val_data:
        held = inputs.read('val_data', options.val_data, options.single_class,
                           options.drop_orphan_labels)
        val = inputs.align_categories(dataset.coco, held.coco, '--val_data=%s' % options.val_data)
        return dataset.coco, val, held.image_dir, '--val_data: ' + held.line()
    if dataset.val_dir and not options.val_photos:
        names = [c['name'] for c in dataset.coco['categories']]
        val = inputs.yolo_to_coco.coco_dataset(dataset.val_dir, names, None,
                                               options.drop_orphan_labels)
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


def read_inputs(options) -> dict:
    """--data (and --val_data) read and checked, nothing written: {'dataset', 'train', 'val'
    (COCO dicts), 'line', 'record' (inputs.json: 'line', 'split', the image dirs, 'sources':
    the flag each split comes from), 'photos' (every photo file read)}."""
    dataset = inputs.read('data', options.data, options.single_class, options.drop_orphan_labels)
    train, val, val_image_dir, how = _validation(options, dataset)
    names = [inputs.photo_name(image) for image in val['images']]
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise UserError('two validation photos are called %s; the whole photos are matched by '
                        'file name: rename one' % twice[0])
    given = '--data=%s' % options.data
    record = {'line': dataset.line(), 'split': inputs.split_line(train, val, how),
              'train_image_dir': os.path.abspath(dataset.image_dir),
              'val_image_dir': os.path.abspath(val_image_dir),
              'sources': {'train': given, 'val': '--val_data=%s' % options.val_data
                          if options.val_data else given}}
    photos = [os.path.join(record[key], image['file_name']) for key, coco in (
        ('train_image_dir', train), ('val_image_dir', val)) for image in coco['images']]
    return {'dataset': dataset, 'train': train, 'val': val, 'line': dataset.line(),
            'record': record, 'photos': photos}


def check_plan_fits(options, train, val):
    """The plan before the data doctor, made now so that a budget or a machine it cannot fit
    (PlanError: '--max_minutes=1 is too short ... give at least 6') is said before anything
    is written; the plan stage makes it again, then asks the doctor."""
    request = _request(options, weights_lib.resolve(options.weights, options.model_name))
    machine = hardware.detect()
    plan_lib.make_plan(stats.from_coco(train, val), machine, request, table=costs.load(machine.cpu))


def data_stage(runner, options, state=None):
    """[1/6]: the inputs record {'line', 'split', 'train_image_dir', 'val_image_dir',
    'sources'}; reused as it is unless `state` (check_flags' Rerun) says the input changed."""
    layout, state = runner.layout, state or Rerun()
    if os.path.exists(layout.inputs_json) and state.read is None:
        record = _read_json(layout.inputs_json)
        runner.say('  %s\n  %s (from %s)' % (record['line'], record['split'], layout.data))
        return record
    read = state.read or read_inputs(options)
    if state.trained is None:  # A trained run keeps its plan: the budget bounds this run only.
        check_plan_fits(options, read['train'], read['val'])
    if state.note:
        runner.say('  ' + state.note)
    runner.say('  %s\n  %s' % (read['line'], read['record']['split']))
    files = rerun.input_files([p for p in (options.data, options.val_data) if p],
                              extra=read['photos'], skip=[layout.root])
    if state.same_data:  # The photos may be elsewhere now (a folder moved): read from there.
        record = dict(_read_json(layout.inputs_json), **{key: read['record'][key] for key in (
            'sources', 'train_image_dir', 'val_image_dir')})
        _link_val_photos(read['val'], record['val_image_dir'], layout.val_photos)
        if state.trained is None:
            shutil.rmtree(layout.records, ignore_errors=True)  # The pixels may have changed.
        atomic_file.write_json_atomically(rerun.input_files_json(layout), files, indent=None)
        atomic_file.write_json_atomically(layout.inputs_json, record)
        _write_request(layout, options, state)
        return record
    if os.path.exists(layout.data):
        rerun.clear(layout, data=True)
    os.makedirs(layout.data, exist_ok=True)
    atomic_file.write_json_atomically(layout.request_json, options.request())
    atomic_file.write_json_atomically(layout.train_json, read['train'])
    atomic_file.write_json_atomically(layout.val_json, read['val'])
    _link_val_photos(read['val'], read['record']['val_image_dir'], layout.val_photos)
    atomic_file.write_json_atomically(rerun.input_files_json(layout), files, indent=None)
    atomic_file.write_json_atomically(layout.inputs_json, read['record'])
    return read['record']


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
        options.model_name or model_choice.DEFAULT_MODEL).as_dict()).override(
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
    tile = first.tile_size
    coco = stats.tiles_coco(train, tile, first.tile_overlap) if tile else train
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


def _write_request(layout, options, state):
    """request.json: the flags the data and the plan were made with. A trained run keeps its
    budget there (its plan's), so a later rerun can say which budget planned it."""
    request = options.request()
    if state.trained is not None and os.path.exists(layout.request_json):
        saved = _read_json(layout.request_json)
        request.update({key: saved.get(key, request[key]) for key in rerun.BUDGET_KEYS})
    atomic_file.write_json_atomically(layout.request_json, request)


def _recipe_text(layout, plan, request):
    """plan.yaml's text for `plan` (the plan or a search candidate)."""
    content = plan_file.recipe(plan, *training_paths(layout, plan), request.hparams)
    return plan_file.yaml_text(content, rerun_command(layout))


def _write_plan_yaml(layout, plan, request):
    with atomic_file.replacing(layout.plan_yaml, suffix='.yaml') as temporary:
        with open(temporary, 'w', encoding='utf-8') as stream:
            stream.write(_recipe_text(layout, plan, request))
        check_recipe(temporary)  # A bad --hparams override: said now, nothing written.


def _reuse_plan(runner, options, state):
    """The plan of plan.json, its log spacing rewritten when only that changed; says when the
    budget differs from the plan's: it bounds this run, the plan stands."""
    layout = runner.layout
    plan = plan_from_record(_read_json(layout.plan_json))
    runner.say('  the plan of the first run (%s):' % layout.plan_yaml)
    runner.say('\n'.join(plan_file.lines(plan)))
    if state.budget:
        runner.say('  %s: this run\'s budget only; the plan\'s %d steps stand (planned with %s) '
                   'as model/ has trained to step %d; to plan for the new budget, start afresh '
                   'in another --output_dir' % (
                       ', '.join('--%s=%g' % (key, now or 0) for key, _, now in state.budget),
                       plan.steps, ', '.join('--%s=%g' % (key, was or 0)
                                             for key, was, _ in state.budget), state.trained))
    if state.relog:
        _write_plan_yaml(layout, plan, _request(options, plan.weights))
        _write_request(layout, options, state)
        runner.say('  %s rewritten with --hparams=%s (the log spacing: the plan stands)'
                   % (layout.plan_yaml, options.hparams))
    return plan


def plan_stage(runner, options, state=None):
    """[2/6]: the Plan (reused from plan.json on a rerun, made again when `state` says the
    request changed before anything was trained)."""
    layout, state = runner.layout, state or Rerun()
    if os.path.exists(layout.plan_json) and not state.replan:
        return _reuse_plan(runner, options, state)
    machine = hardware.detect()
    runner.say('  ' + hardware.line(machine))
    request = _request(options, weights_lib.resolve(options.weights, options.model_name))
    train, val = _read_json(layout.train_json), _read_json(layout.val_json)
    data = stats.from_coco(train, val)
    table = costs.load(machine.cpu)
    first = plan_lib.make_plan(data, machine, request, table=table)
    if state.replan:
        runner.say('  the flags changed since the last run (%s) and nothing was trained: '
                   'planning again' % rerun.describe(state.replan))
    if os.path.exists(layout.plan_json):  # Only now: a plan that cannot be made wrote nothing.
        rerun.clear(layout)
    _write_request(layout, options, state)
    advice, coverage = doctor_advice(runner, first, train, request)
    plan = plan_lib.make_plan(data, machine, request, advice, coverage, table)
    runner.say('\n'.join(plan_file.lines(plan)))
    _write_plan_yaml(layout, plan, request)
    search.write_candidates(layout, [(name, plan_lib.candidate_plan(
        plan, data, machine, request, name, advice, coverage, table) if index else plan)
        for index, name in enumerate(plan.candidates)], lambda chosen: _recipe_text(
            layout, chosen, request))
    atomic_file.write_json_atomically(layout.plan_json, dataclasses.asdict(plan))
    return plan


def check_recipe(path):
    """Reads plan.yaml back as main.py does: a bad --hparams override is said now."""
    written = recipe_lib.read_recipe(path)
    hparams_config.validate(recipe_lib.build_config(written.run_options['model_name'], written))


def plan_from_record(record) -> plan_lib.Plan:
    """A Plan from dataclasses.asdict(plan) (plan.json)."""
    values = dict(record, weights=plan_lib.Weights(**record['weights']))
    for key in set(record) & {'anchors', 'seconds', 'reasons', 'schedule_keys', 'model_keys'}:
        values[key] = tuple(tuple(item) for item in record[key])
    values['candidates'] = tuple(plan_lib.candidate_name(item) if isinstance(item, int) else
                                 item for item in record.get('candidates', ()))  # Sizes: older.
    return plan_lib.Plan(**values)
