"""finetune/prepare.py's data stage in-process (plain Python and PIL: no TensorFlow): the
validation from --val_data, a data.yaml's val: or the split, the files it writes only once
the input passed its checks, the refusal of other flags on a run's folder, and plan.json read
back into the same Plan."""
import dataclasses
import io
import json
import os
import re
import shutil

import pytest

from efficientdet_hpu.config import hparams_config
from efficientdet_hpu.core.errors import UserError
from efficientdet_hpu.finetune import plan as plan_lib
from efficientdet_hpu.finetune import prepare
from efficientdet_hpu.finetune import runner as runner_lib
from efficientdet_hpu.finetune import stages
from efficientdet_hpu.finetune import stats
from finetune_cases import make_coco, make_yolo, photo, ORTHO, ROOMY


def _stage(root, **options):
    runner = runner_lib.Runner(runner_lib.Layout(str(root)), stream=io.StringIO())
    record = prepare.data_stage(runner, prepare.Options(output_dir=str(root), **options))
    return record, runner.stream.getvalue()


def _json(path):
    with open(path) as stream:
        return json.load(stream)


def test_val_data_gets_the_training_class_ids_by_name(tmp_path):
    train = make_coco(str(tmp_path / 'train'))
    val = make_coco(str(tmp_path / 'val'), count=2)
    coco = _json(os.path.join(val, 'instances.json'))
    coco['categories'][0]['id'] = 99
    for annotation in coco['annotations']:
        annotation['category_id'] = 99
    with open(os.path.join(val, 'instances.json'), 'w') as stream:
        json.dump(coco, stream)
    record, said = _stage(tmp_path / 'out', data=train, val_data=val)
    layout = runner_lib.Layout(str(tmp_path / 'out'))
    assert {a['category_id'] for a in _json(layout.val_json)['annotations']} == {7}
    assert len(_json(layout.train_json)['images']) == 3
    assert record['val_image_dir'] == val
    assert sorted(os.listdir(layout.val_photos)) == ['p0.jpg', 'p1.jpg']
    assert 'split by photo: 3 photos, 3 boxes to train; 2 photos, 2 boxes to validate' in said


def test_a_data_yaml_val_directory_is_the_validation(tmp_path):
    root = tmp_path / 'ultra'
    make_yolo(str(root / 'train'), count=2)
    make_yolo(str(root / 'valid'), count=1)
    (root / 'data.yaml').write_text('names: [ant, bee]\ntrain: train/images\nval: valid/images\n')
    record, said = _stage(tmp_path / 'out', data=str(root), single_class='insect')
    val = _json(runner_lib.Layout(str(tmp_path / 'out')).val_json)
    assert val['categories'] == [{'id': 1, 'name': 'insect'}]
    assert record['val_image_dir'] == str(root / 'valid' / 'images')
    assert 'the val: images of the data.yaml' in said


def test_nothing_is_written_until_the_input_passed(tmp_path):
    data = make_coco(str(tmp_path / 'coco'))
    for options in (dict(val_photos=('nope',)), dict(val_data=data, val_photos=('p0',))):
        with pytest.raises(UserError):
            _stage(tmp_path / 'out', data=data, **options)
        assert not os.path.exists(tmp_path / 'out')


def _trained(layout, step=40):
    """model/ as main.py leaves it after a checkpoint (its index file is what is read)."""
    os.makedirs(layout.model_dir, exist_ok=True)
    with open(os.path.join(layout.model_dir, 'checkpoint'), 'w') as stream:
        stream.write('model_checkpoint_path: "model.ckpt-%d"\n' % step)


def _fake_plan(layout):
    """plan.json, plan.yaml and records as the plan stage and the converter leave them."""
    for path in (layout.plan_json, layout.plan_yaml):
        with open(path, 'w') as stream:
            stream.write('{}')
    os.makedirs(layout.records, exist_ok=True)


def test_a_budget_too_short_writes_nothing_and_the_minutes_it_names_go_on(tmp_path):
    data = make_coco(str(tmp_path / 'coco'))
    with pytest.raises(plan_lib.PlanError) as raised:
        _stage(tmp_path / 'out', data=data, max_minutes=1)
    assert not os.path.exists(tmp_path / 'out')
    given = int(re.search(r'give at least (\d+)$', str(raised.value)).group(1))
    record, said = _stage(tmp_path / 'out', data=data, max_minutes=given)
    assert 'COCO: instances.json, 3 photos' in said and record['sources'] == {
        'train': '--data=' + data, 'val': '--data=' + data}
    layout = runner_lib.Layout(str(tmp_path / 'out'))
    assert _json(layout.request_json)['max_minutes'] == given


def test_the_budget_and_log_spacing_change_no_result(tmp_path):
    """A trained run: another --max_minutes bounds this run (the plan stands), another
    log_every_n_steps rewrites plan.yaml; neither is refused. Before training, either plans
    again."""
    data = make_coco(str(tmp_path / 'coco'))
    _stage(tmp_path / 'out', data=data, max_minutes=30, hparams='image_size=256')
    layout = runner_lib.Layout(str(tmp_path / 'out'))
    later = prepare.Options(data=data, output_dir='x', max_minutes=90, images_per_second=4,
                            hparams='image_size=256,log_every_n_steps=5', verbose=True)
    state = prepare.check_request(layout, later)
    assert state.replan == (('hparams', 'image_size=256', 'image_size=256,log_every_n_steps=5'),
                            ('max_minutes', 30, 90), ('images_per_second', 0.0, 4))
    assert state.read is None  # The input is as it was: not read again.
    _trained(layout)
    state = prepare.check_request(layout, later)
    assert (state.trained, state.replan, state.relog) == (40, (), True)
    assert state.budget == (('max_minutes', 30, 90), ('images_per_second', 0.0, 4))


def test_after_training_a_new_budget_bounds_the_run_and_log_spacing_rewrites_plan_yaml(
        tmp_path):
    data = make_coco(str(tmp_path / 'coco'))
    out = str(tmp_path / 'out')
    _stage(out, data=data, max_minutes=30)
    layout = runner_lib.Layout(out)
    plan = plan_lib.make_plan(stats.from_coco(_json(layout.train_json), _json(layout.val_json)),
                              ROOMY, plan_lib.Request(max_minutes=30))
    with open(layout.plan_json, 'w') as stream:
        json.dump(dataclasses.asdict(plan), stream)
    _trained(layout, step=120)
    options = prepare.Options(data=data, output_dir=out, max_minutes=90,
                              hparams='log_every_n_steps=7')
    state = prepare.check_request(layout, options)
    runner = runner_lib.Runner(layout, stream=io.StringIO())
    assert prepare.plan_stage(runner, options, state) == plan
    said = runner.stream.getvalue()
    assert ('  --max_minutes=90: this run\'s budget only; the plan\'s %d steps stand (planned with '
            '--max_minutes=30) as model/ has trained to step 120; to plan for the new budget, '
            'start afresh in another --output_dir' % plan.steps) in said
    with open(layout.plan_yaml) as stream:
        assert 'log_every_n_steps: 7' in stream.read()
    saved = _json(layout.request_json)
    assert (saved['hparams'], saved['max_minutes']) == ('log_every_n_steps=7', 30)


def test_a_trained_run_of_other_flags_is_refused_naming_the_command_that_resumes(tmp_path):
    data = make_coco(str(tmp_path / 'coco'))
    out = str(tmp_path / 'out')
    _stage(out, data=data, val_photos=('p1',), steps=8)
    layout = runner_lib.Layout(out)
    other = prepare.Options(data=data, output_dir=out, val_photos=('p1',), steps=8,
                            model_name='efficientdet-d0')
    assert prepare.check_request(layout, other).replan == (
        ('model_name', '', 'efficientdet-d0'),)  # Nothing trained: planned again.
    _trained(layout)
    with pytest.raises(UserError) as raised:
        prepare.check_request(layout, other)
    assert str(raised.value) == (
        "--output_dir=%s holds a fine-tune trained to step 40 with other flags (model_name: was "
        "'', now 'efficientdet-d0'); resume it with its own: python finetune.py --data=%s "
        "--output_dir=%s --val_photos=p1 --steps=8; or start afresh with these in another "
        "--output_dir" % (out, data, out))


def _add_photo(folder, name='p9.jpg', category=7):
    path = os.path.join(folder, 'instances.json')
    coco = _json(path)
    photo(os.path.join(folder, name))
    coco['images'].append({'id': 99, 'file_name': name, 'width': 64, 'height': 48})
    coco['annotations'].append({'id': 99, 'image_id': 99, 'category_id': category,
                                'bbox': [4, 4, 20, 10], 'area': 200, 'iscrowd': 0})
    if category not in [c['id'] for c in coco['categories']]:
        coco['categories'].append({'id': category, 'name': 'dog'})
    with open(path, 'w') as stream:
        json.dump(coco, stream)


def _planned(tmp_path):
    """A COCO folder and an output_dir whose data stage ran and which holds a plan: (data,
    layout, options)."""
    data = make_coco(str(tmp_path / 'coco'))
    out = str(tmp_path / 'out')
    _stage(out, data=data)
    layout = runner_lib.Layout(out)
    _fake_plan(layout)
    return data, layout, prepare.Options(data=data, output_dir=out)


def test_a_changed_folder_is_read_again_and_what_is_redone_is_said(tmp_path):
    data, layout, options = _planned(tmp_path)
    os.remove(os.path.join(data, 'p1.jpg'))
    coco = _json(os.path.join(data, 'instances.json'))
    with open(os.path.join(data, 'instances.json'), 'w') as stream:
        json.dump(dict(coco, images=[i for i in coco['images'] if i['file_name'] != 'p1.jpg'],
                       annotations=[a for a in coco['annotations'] if a['image_id'] != 11]),
                  stream)
    state = prepare.check_request(layout, options)
    assert state.note == ('the input changed since the last run (1 file removed (p1.jpg); 1 '
                          'changed (instances.json)): read again; the split, the data doctor, '
                          'the plan and the records are redone')
    runner = runner_lib.Runner(layout, stream=io.StringIO())
    prepare.data_stage(runner, options, state)
    assert state.note in runner.stream.getvalue()
    assert len(_json(layout.train_json)['images']) + len(_json(layout.val_json)['images']) == 2
    assert not any(os.path.exists(p) for p in (layout.plan_json, layout.plan_yaml, layout.records))
    # Read as it is now: the next rerun reuses it.
    assert prepare.check_request(layout, options).read is None


def test_same_photos_and_boxes_keep_the_plan_and_a_trained_model(tmp_path):
    data, layout, options = _planned(tmp_path)
    photo(os.path.join(data, 'p0.jpg'))  # Written again: another mtime, the same annotations.
    os.utime(os.path.join(data, 'p0.jpg'), ns=(1, 1))
    state = prepare.check_request(layout, options)
    assert state.same_data and state.note == (
        'the input\'s files changed since the last run (1 file changed (p0.jpg)), its photos and '
        'boxes did not: the split and the plan stand; the records are converted again')
    prepare.data_stage(runner_lib.Runner(layout, stream=io.StringIO()), options, state)
    assert os.path.exists(layout.plan_json) and not os.path.exists(layout.records)
    # Trained: model/ resumes, the records stay; the data moved elsewhere is the same data;
    # a budget too short to plan in bounds this run only (the plan stands).
    _fake_plan(layout)
    _trained(layout)
    moved = shutil.copytree(data, str(tmp_path / 'moved'))
    options = prepare.Options(data=moved, output_dir=layout.root, max_minutes=1)
    state = prepare.check_request(layout, options)
    assert state.same_data and state.note.endswith('model/ resumes with the records written '
                                                   'before')
    prepare.data_stage(runner_lib.Runner(layout, stream=io.StringIO()), options, state)
    assert os.path.exists(layout.records) and _json(layout.request_json)['data'] == moved
    assert os.readlink(os.path.join(layout.val_photos, os.listdir(layout.val_photos)[0])
                       ).startswith(moved)


def test_other_data_under_a_trained_model_is_refused_naming_the_command_that_starts_afresh(
        tmp_path):
    """A class added to the data after training: the model learnt the old classes."""
    data = make_coco(str(tmp_path / 'coco'))
    out = str(tmp_path / 'out')
    _stage(out, data=data, max_minutes=30)
    layout = runner_lib.Layout(out)
    _fake_plan(layout)
    _trained(layout)
    _add_photo(data, category=8)
    with pytest.raises(UserError) as raised:
        prepare.check_request(layout, prepare.Options(data=data, output_dir=out, max_minutes=30))
    assert str(raised.value) == (
        'the data changed since %s was trained on it (1 file added (p9.jpg); 1 changed '
        '(instances.json); now COCO: instances.json, 4 photos, 2 classes, 4 boxes): its '
        'checkpoints learnt the old data; start afresh on the new data in another folder: '
        'python finetune.py --data=%s --output_dir=%s-2 --max_minutes=30'
        % (layout.model_dir, data, out))
    assert sorted(os.listdir(layout.data)) == ['input_files.json', 'inputs.json', 'records',
                                               'train.json', 'val.json', 'val_photos']


def test_a_folder_without_a_fingerprint_is_read_once_and_kept_when_the_same(tmp_path):
    """An --output_dir of an earlier version (no input_files.json)."""
    data = make_coco(str(tmp_path / 'coco'))
    out = str(tmp_path / 'out')
    _stage(out, data=data)
    layout = runner_lib.Layout(out)
    os.remove(os.path.join(layout.data, 'input_files.json'))
    request = _json(layout.request_json)
    request.pop('drop_orphan_labels')  # Nor this flag.
    with open(layout.request_json, 'w') as stream:
        json.dump(request, stream)
    options = prepare.Options(data=data, output_dir=out)
    state = prepare.check_request(layout, options)
    assert state.same_data and state.note == '' and state.replan == ()
    prepare.data_stage(runner_lib.Runner(layout, stream=io.StringIO()), options, state)
    assert prepare.check_request(layout, options).read is None


def test_the_converters_fix_for_a_photo_names_the_input_not_the_runs_copy():
    message = ('create_coco_tfrecord: error: cannot decode image /p/bad.jpg (OSError: broken data '
               'stream); the file is unreadable or truncated. Re-export or remove it from '
               '/out/data/train.json.')
    assert stages.in_the_input(message, '/out/data/train.json', '--data=/p') == (
        'create_coco_tfrecord: error: cannot decode image /p/bad.jpg (OSError: broken data '
        'stream); the file is unreadable or truncated. Re-export or remove it from --data=/p. '
        'Then rerun the same command: the changed folder is read again.')
    message = ('create_coco_tfrecord: error: image /p/a.jpg is 108x120 (width x height) but '
               '/out/data/val.json says 120x108. The file has EXIF orientation 6')
    assert stages.in_the_input(message, '/out/data/val.json', '--val_data=/v').startswith(
        'create_coco_tfrecord: error: image /p/a.jpg is 108x120 (width x height) but '
        '--val_data=/v says 120x108. The file has EXIF orientation 6 Then rerun')


def test_plan_json_reads_back_into_the_same_plan():
    weights = plan_lib.Weights('backbone', '/w/efficientnet-lite0.pth', 'efficientdet-lite0')
    plan = plan_lib.make_plan(ORTHO, ROOMY, plan_lib.Request(weights=weights),
                              (('anchor_scale', 2.0), ('aspect_ratios', [1.0, 2.0, 0.5, 4.0])))
    record = json.loads(json.dumps(dataclasses.asdict(plan)))
    again = prepare.plan_from_record(record)
    assert dataclasses.asdict(again) == dataclasses.asdict(plan)
    assert again.steps == plan.steps and again.weights == weights


def test_hparams_are_overrides_not_a_recipe_file():
    with pytest.raises(UserError, match='give a=1,b.c=2 overrides here'):
        prepare._request(prepare.Options(data='d', output_dir='o', hparams='mine.yaml'),
                         plan_lib.Weights())
    request = prepare._request(prepare.Options(data='d', output_dir='o',
                                               hparams='image_size=256,nms_configs.sigma=0.3'),
                               plan_lib.Weights())
    assert request.hparam('image_size') == 256 and request.hparam('nms_configs.sigma') == 0.3
    with pytest.raises(UserError, match='image_sise'):
        prepare.check_flags(runner_lib.Layout('/nonexistent'), prepare.Options(
            data='d', output_dir='o', hparams='image_sise=256'))


def test_hparams_may_override_the_plans_run_options_with_counts():
    """num_examples_per_epoch and the other counts plan.yaml sets are main.py flags, not
    hparams: accepted as overrides when they are whole numbers, refused otherwise; the plan
    names them in its `overrides` line and plan.yaml carries them."""
    request = prepare._request(prepare.Options(
        data='d', output_dir='o', hparams='num_examples_per_epoch=200,early_stop_patience=0'),
        plan_lib.Weights())
    assert request.hparam('num_examples_per_epoch') == 200
    assert request.hparam('early_stop_patience') == 0
    for bad in ('early_stop_patience=off', 'num_examples_per_epoch=-4', 'num_epochs=2.5'):
        # The message shows the value as typed ('off', not YAML's False).
        with pytest.raises(UserError, match=re.escape('%s is not a count; give a whole number'
                                                      % bad)):
            prepare._request(prepare.Options(data='d', output_dir='o', hparams=bad),
                             plan_lib.Weights())
    # A run option the plan does not set stays refused, naming the key.
    with pytest.raises(UserError, match='training_file_pattern'):
        prepare._request(prepare.Options(data='d', output_dir='o',
                                         hparams='training_file_pattern=x'), plan_lib.Weights())
    # The data doctor, which reads config keys only, gets the others, as main.py would read them.
    request = prepare._request(prepare.Options(
        data='d', output_dir='o', hparams='num_epochs=3,aspect_ratios=[[1.0,2.0],[2.0,1.0]],'
        'nms_configs.method=hard,early_stop_patience=0'), plan_lib.Weights())
    text = prepare.config_overrides(request)
    assert 'early_stop_patience' not in text and 'num_epochs' not in text
    assert hparams_config.parse_override_string(text) == {
        'aspect_ratios': [[1.0, 2.0], [2.0, 1.0]], 'nms_configs.method': 'hard'}
