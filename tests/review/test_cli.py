"""`python review.py` and `finetune.py --review_labels` as a user runs them, on the mistakes
that stop them before anything trains: cleanlab missing (hidden by a stand-in package that
fails to import, as a fresh environment without the `review` extra does), no folder named, a
--finetune_dir that holds no fine-tune. Each is one line, exit 2, nothing written; the fix
for cleanlab is followed as far as a test can (the file it names pins cleanlab; with cleanlab
importable the same command goes past the check)."""
import json
import os

import pytest

import review_cases
from cli_runs import assert_one_line_error, run_python
from efficientdet_hpu.core.errors import UserError
from efficientdet_hpu.review import layout, run

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def hidden_cleanlab(tmp_path):
    shadow = tmp_path / 'shadow' / 'cleanlab'
    shadow.mkdir(parents=True)
    (shadow / '__init__.py').write_text(
        'raise ModuleNotFoundError("No module named \'cleanlab\'", name="cleanlab")\n')
    return {'PYTHONPATH': str(shadow.parent)}


def test_cleanlab_missing_is_one_line_naming_the_install_and_writes_nothing(tmp_path):
    data = review_cases.make_coco(str(tmp_path / 'data'))
    env = hidden_cleanlab(tmp_path)
    result = run_python(['review.py', '--data=%s' % data, '--output_dir=%s' % (tmp_path / 'o')],
                        timeout=120, env=env)
    line = assert_one_line_error(result, 'the label review needs cleanlab 2.9.0',
                                 'pip install "efficientdet-hpu[review]"',
                                 'pip install -r requirements/review.txt',
                                 starts_with='review: error: ')
    result = run_python(['finetune.py', '--data=%s' % data, '--review_labels',
                         '--output_dir=%s' % (tmp_path / 'f')], timeout=120, env=env)
    assert_one_line_error(result, line.split('error: ', 1)[1], starts_with='finetune: error: ')
    assert not os.path.exists(tmp_path / 'o') and not os.path.exists(tmp_path / 'f')
    # The fix: the file the line names pins cleanlab; installed, the check passes and the
    # next problem of this command line (a folder that does not exist) is what is said.
    with open(os.path.join(REPO, 'requirements', 'review.txt')) as stream:
        assert 'cleanlab==2.9.0' in stream.read().split()
    result = run_python(['review.py', '--data=%s' % (tmp_path / 'nowhere'),
                         '--output_dir=%s' % (tmp_path / 'o')], timeout=120)
    assert_one_line_error(result, '--data=%s does not exist' % (tmp_path / 'nowhere'),
                          starts_with='review: error: ')


def test_the_folder_to_review_must_be_named_once(tmp_path):
    result = run_python(['review.py', '--output_dir=%s' % tmp_path], timeout=120)
    assert_one_line_error(result, 'give --data=DIR --output_dir=DIR', '--finetune_dir=DIR')
    result = run_python(['review.py', '--data=%s' % tmp_path], timeout=120)
    assert_one_line_error(result, '--data needs --output_dir=DIR')
    result = run_python(['review.py', '--finetune_dir=%s' % tmp_path], timeout=120)
    assert_one_line_error(result, '--finetune_dir=%s holds no fine-tune plan' % tmp_path,
                          'run efficientdet-finetune there first')
    assert os.listdir(tmp_path) == []


def test_a_rerun_with_other_folds_is_refused_in_one_line(tmp_path):
    where = layout.Layout(str(tmp_path))
    os.makedirs(where.directory)
    first = run.Options(data='x', output_dir=str(tmp_path), folds=3)
    with open(where.request_json, 'w') as stream:
        stream.write(json.dumps(run._asked(first)))  # pylint: disable=protected-access
    run.check_request(where, first)  # The same flags resume.
    run.check_request(where, run.Options(data='x', output_dir=str(tmp_path), folds=3,
                                         verbose=True))
    with pytest.raises(UserError, match=r'holds a review of other flags \(--folds: was 3\)'):
        run.check_request(where, run.Options(data='x', output_dir=str(tmp_path), folds=4))
