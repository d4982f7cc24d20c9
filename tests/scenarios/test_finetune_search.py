"""`python finetune.py --max_minutes=N --weights=...` searching for real: an ImageNet backbone
against random weights (finetune/search.py), whose winner goes on to the end. The run reads a
cost table of its own, planted with EFFICIENTDET_FINETUNE_COSTS, whose figures make the plan
search; the run then measures its own."""
import json
import os
import re

import pytest
import yaml

from efficientdet_hpu.finetune import search as search_lib
from cli_runs import run_python
from test_finetune import make_coco
from test_finetune_budget import TINY_MODEL, _summary
from test_finetune_reruns import _lite0_pth


def _search_table(path):
    """Lite0 at 128 px 40 images/s, at 192 px 24; 5 s start-ups; small fixed stages: 640
    photos of 160 px (512 to train) in 5 min get 10 passes at 128 px and 6 at 192, so the plan
    trains 128 px; from an ImageNet backbone, with 500 whole photos or more, it tries random
    weights beside it at 128 px (trying 192 px too would cost over a quarter of the training).
    The data stage's estimate (66 s, with a 45 s doctor) is over three times its 18 s on a
    quiet 2-core box: the stages' ratio scales the search's cost, which at about 1.3 would
    pass a quarter of the training left and only past plan.SEARCH_RUN_MAX_SHARE is skipped
    (test_search checks that line), so the search stays when another test shares the machine."""
    with open(path, 'w') as stream:
        json.dump({'machine': 'planted for the test', 'cores': 2, 'date': 'today',
                   'training': [{'model': 'efficientdet-lite0', 'image_size': size,
                                 'images_per_second': rate, 'startup_seconds': 5.0}
                                for size, rate in ((128, 40.0), (192, 24.0), (320, 10.0))],
                   'stages': {'evaluation_fixed_seconds': 1.0, 'inference_speedup': 2.0,
                              'convert_seconds': 3.0, 'convert_images_per_second': 50.0,
                              'doctor_seconds': 45.0, 'predict_seconds': 15.0,
                              'analysis_seconds': 8.0, 'export_seconds': 40.0}}, stream)
    return path


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_a_search_tries_imagenet_and_random_weights_and_the_winner_goes_on(tmp_path):
    """The ImageNet .pth is Lite0's names and shapes with small random values
    (test_finetune_reruns): which start wins is the measurement's; the winner's weights,
    rate and network go on with it."""
    data = make_coco(str(tmp_path / 'data'), count=640)
    out = str(tmp_path / 'out')
    table = _search_table(str(tmp_path / 'costs.json'))
    weights = _lite0_pth(str(tmp_path / 'efficientnet-lite0-57934424.pth'))
    result = run_python(['finetune.py', '--data=%s' % data, '--output_dir=%s' % out,
                         '--max_minutes=5', '--weights=%s' % weights,
                         '--hparams=%s' % TINY_MODEL], timeout=1700,
                        env={'EFFICIENTDET_FINETUNE_COSTS': table})
    assert result.returncode == 0, result.stdout[-5000:]
    assert ('128px from the ImageNet backbone against 128px-random from random weights'
            in result.stdout), result.stdout[-5000:]
    with open(os.path.join(out, 'search.json')) as stream:
        search = json.load(stream)
    tried = {entry['name']: entry for entry in search['tried']}
    assert set(tried) == {'128px', '128px-random'}
    assert (tried['128px']['weights'], tried['128px-random']['weights']) == (
        'backbone', 'random')
    for entry in tried.values():  # Each scored at its first evaluation.
        assert 0.0 <= entry['AP50'] <= 1.0 and entry['step'] < entry['of_steps']
        assert entry['loss'] > 0  # The detection loss main.py logged on the way to it.
    winner = tried[search['winner']]
    # The better AP50 to the three decimals printed; equal ones, or all under SCORE_FLOOR, are
    # a tie, which goes to the random start where its training loss is LOSS_MARGIN or more
    # under the plan's own's.
    def level(ap50):
        return 0.0 if ap50 < search_lib.SCORE_FLOOR else round(ap50, 3)
    assert all(level(winner['AP50']) >= level(entry['AP50']) for entry in tried.values())
    own, random_start = tried['128px'], tried['128px-random']
    if level(own['AP50']) == level(random_start['AP50']):
        assert search['winner'] == (
            '128px-random' if random_start['loss'] < (1 - search_lib.LOSS_MARGIN) * own['loss']
            else '128px')
    assert search['line'] in result.stdout
    with open(os.path.join(out, 'plan.yaml')) as stream:
        text = stream.read()
    assert '# search: ' + search['line'] in text
    recipe = yaml.safe_load(text)
    random = search['winner'] == '128px-random'
    assert ('backbone_ckpt' in recipe, recipe['model_name'], recipe['learning_rate']) == (
        (False, 'efficientdet-d0', 1.28) if random else (True, 'efficientdet-lite0', 0.08))
    # The network --hparams names stays the user's, over the random start's own.
    assert (recipe['fpn_num_filters'], recipe['fpn_cell_repeats']) == (16, 1)
    with open(os.path.join(out, 'plan.json')) as stream:
        assert json.load(stream)['weights']['kind'] == ('' if random else 'backbone')
    summary = _summary(out)
    assert summary['image_size'] == winner['image_size'] == 128
    # The winner went on from its checkpoint: training passed its search step.
    assert summary['steps_trained'] > winner['step']
    assert not os.path.exists(os.path.join(out, 'candidates'))
    # The last candidate, the random start, was trained as the training itself, in model/:
    # never a search run of its own; when it won, that first run went on past its rung.
    with open(os.path.join(out, 'logs', 'train.log')) as stream:
        runs = stream.read().split('\n$ ')
    assert ('candidates/128px-random/plan.yaml' in runs[0].splitlines()[0]
            and '--model_dir=%s ' % os.path.join(out, 'model') in runs[0].splitlines()[0] + ' ')
    assert not os.path.exists(os.path.join(out, 'logs', 'search-128px-random.log'))
    first_steps = [int(found) for found in re.findall(r' step (\d+)/\d+ loss', runs[0])]
    if random:
        assert max(first_steps) > winner['step']
    else:
        assert max(first_steps) <= tried['128px-random']['step'] + 5  # A log record on
