"""finetune/prepare.py's data stage in-process (plain Python and PIL: no TensorFlow): the
validation from --val_data, a data.yaml's val: or the split, the files it writes only once
the input passed its checks, the refusal of other flags on a run's folder, and plan.json read
back into the same Plan."""
import dataclasses
import io
import json
import os
import re

import pytest

from efficientdet_hpu.config import hparams_config
from efficientdet_hpu.core.errors import UserError
from efficientdet_hpu.finetune import plan as plan_lib
from efficientdet_hpu.finetune import prepare
from efficientdet_hpu.finetune import runner as runner_lib
from finetune_cases import make_coco, make_yolo, ORTHO, ROOMY


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


def test_a_rerun_must_ask_the_same(tmp_path):
    data = make_coco(str(tmp_path / 'coco'))
    _stage(tmp_path / 'out', data=data, val_photos=('p1',))
    layout = runner_lib.Layout(str(tmp_path / 'out'))
    prepare.check_request(layout, prepare.Options(data=data, output_dir='x', val_photos=('p1',),
                                                  verbose=True))  # Display flags may differ.
    with pytest.raises(UserError, match=r"other flags \(max_minutes, val_photos: was 0.0, "
                                        r"\['p1'\]\)"):
        prepare.check_request(layout, prepare.Options(data=data, output_dir='x',
                                                      max_minutes=30))


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
