"""`python finetune.py --review_labels` as a user runs it (the tiny network, 2 steps, three
COCO photos: one held out, so three folds, fold 0 predicted by the fine-tune's own model):
the plan says what the review adds to the time, the run ends with the fine-tune's table and
the review's (suspected labels by kind, the share of the validation AP they could explain,
the page), the fine-tune's model is not trained again, and a rerun is done at once."""
import json
import os

import pytest

import review_cases
from cli_runs import run_python, TINY_HPARAMS


def finetune(data, out, timeout):
    return run_python(['finetune.py', '--data=%s' % data, '--output_dir=%s' % out, '--steps=2',
                       '--hparams=%s' % TINY_HPARAMS, '--review_labels'], timeout=timeout)


@pytest.fixture(scope='module')
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp('finetune_review')
    data = review_cases.make_coco(str(root / 'data'), photos=3)
    out = str(root / 'out')
    return finetune(data, out, 1700), out, data


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_the_plan_the_tables_and_the_reused_model(run):
    result, out, _ = run
    assert result.returncode == 0, result.stdout[-5000:]
    said = result.stdout
    assert '--review_labels: the label review after the fine-tune' in said
    time_line = next(line for line in said.splitlines() if 'without --review_labels' in line)
    assert 'min with it' in time_line
    assert said.index('fine-tune done in') < said.index('review done in')
    review_table = said[said.index('review done in'):]
    for row in ('suspected', 'validation AP', 'could explain', 'page', 'issues'):
        assert row in review_table, row
    with open(os.path.join(out, 'review', 'summary.json')) as stream:
        summary = json.load(stream)
    assert summary['folds'] == 3 and summary['photos'] == 3
    validation = summary['validation']
    assert 0 <= validation['AP'] <= 1 and 0 <= validation['AP_fixed'] <= 1
    assert summary['planned_minutes'] > 0 and summary['minutes'] > 0
    assert not os.path.exists(os.path.join(out, 'review', 'folds', 'fold-0', 'model'))
    assert not os.path.exists(os.path.join(out, 'logs', 'train-fold-0.log'))
    assert os.path.exists(os.path.join(out, 'logs', 'predict-fold-0.log'))
    with open(os.path.join(out, 'logs', 'predict-fold-0.log')) as stream:
        assert '--model_dir=%s' % os.path.join(out, 'model') in stream.readline()


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_a_rerun_is_done_at_once(run):
    _, out, data = run
    again = finetune(data, out, 180)
    assert again.returncode == 0, again.stdout[-3000:]
    assert 'done earlier' in again.stdout and 'review done earlier' in again.stdout
