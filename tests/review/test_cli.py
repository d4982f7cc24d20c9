"""`python review.py` and `finetune.py --review_labels` as a user runs them, on the mistakes
that stop them before anything trains: cleanlab missing (hidden by a stand-in package that
fails to import, as a fresh environment without the `review` extra does), no folder named, a
--finetune_dir that holds no fine-tune. Each is one line, exit 2, nothing written; the fix
for cleanlab is followed as far as a test can (the file it names pins cleanlab; with cleanlab
importable the same command goes past the check)."""
import io
import json
import os
import signal

import pytest

import review_cases
from cli_runs import assert_one_line_error, run_python, TINY_HPARAMS
from efficientdet_hpu.core import processes
from efficientdet_hpu.core.errors import UserError
from efficientdet_hpu.finetune import runner
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
    # --threshold only cuts the list: another resumes, and is listed anew (finished_review).
    run.check_request(where, run.Options(data='x', output_dir=str(tmp_path), folds=3,
                                         threshold=0.9))


def test_a_finished_review_at_another_threshold_is_listed_anew(tmp_path):
    _, where, _, _ = review_cases.fake_review(review_cases.make_coco(str(tmp_path / 'data')),
                                              str(tmp_path / 'out'))
    said = io.StringIO()
    speaker = runner.Runner(runner.Layout(str(tmp_path / 'out')), stream=said)
    assert run.finished_review(speaker, where, 0.5)['threshold'] == 0.5  # fake_review's.
    assert 'review done earlier' in said.getvalue() and os.path.exists(where.summary_json)
    assert run.finished_review(speaker, where, 0.9) is None
    assert '--threshold=0.9 (the review listed at 0.5): listed anew' in said.getvalue()
    assert not os.path.exists(where.summary_json)


def test_a_stop_during_the_review_says_the_rerun_continues(tmp_path, monkeypatch):
    """finetune.py --review_labels and review.py alike: the line says what is kept."""
    def stopped(*_):
        raise processes.Stopped(signal.SIGTERM)
    monkeypatch.setattr(run, '_review', stopped)
    with pytest.raises(processes.Stopped) as raised:
        run.review_finetune(str(tmp_path))
    assert raised.value.line('finetune') == (
        'finetune: stopped by SIGTERM during the label review; what the review finished is '
        'kept; rerun the same command to continue')


def test_a_finetune_dir_review_takes_no_output_dir(tmp_path):
    result = run_python(['review.py', '--finetune_dir=%s' % tmp_path,
                         '--output_dir=%s' % (tmp_path / 'other')], timeout=120)
    assert_one_line_error(result, '--finetune_dir=%s writes its review into its own review/'
                          % tmp_path, 'drop --output_dir')
    assert os.listdir(tmp_path) == []


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_photo_the_converter_refuses_is_named_in_the_input_and_the_fix_reruns(tmp_path):
    """The review converts its folds from links to the photos: its error names the photo in
    --data, and the same command, rerun once the photo is out, reads the changed folder."""
    data = review_cases.make_voc(str(tmp_path / 'data'))
    with open(os.path.join(data, 'v1.png'), 'rb') as stream:
        head = stream.read()
    with open(os.path.join(data, 'v1.png'), 'wb') as stream:
        stream.write(head[:len(head) // 2])
    command = ['review.py', '--data=%s' % data, '--output_dir=%s' % (tmp_path / 'out'),
               '--folds=2', '--steps=2', '--hparams=%s' % TINY_HPARAMS]
    assert_one_line_error(run_python(command, timeout=400),
                          'cannot decode image %s' % os.path.join(data, 'v1.png'),
                          'remove it from --data=%s. Then rerun the same command' % data,
                          starts_with='review: error: ')
    os.remove(os.path.join(data, 'v1.png'))
    os.remove(os.path.join(data, 'v1.xml'))
    again = run_python(command, timeout=600)
    assert again.returncode == 0, again.stdout[-3000:]
    assert 'starts again: its folds were of the last run\'s input and flags' in again.stdout
    assert '2 files removed (v1.png, v1.xml)' in again.stdout
    assert 'Pascal VOC: 5 XML files, 5 photos' in again.stdout
    assert 'review done in' in again.stdout


def test_a_dry_run_writes_nothing(tmp_path):
    data = review_cases.make_coco(str(tmp_path / 'data'))
    result = run_python(['review.py', '--data=%s' % data, '--output_dir=%s' % (tmp_path / 'o'),
                         '--folds=2', '--dry_run'], timeout=300)
    assert result.returncode == 0 and 'dry run' in result.stdout, result.stdout[-3000:]
    assert not os.path.exists(tmp_path / 'o')
