"""tools/check_pins.py: which lines of a set apply to each Python, that every line is pinned, and
(against the package index) that a set which cannot resolve fails. .ci/run checks the real sets."""
import os
import sys
import tempfile

import pytest

from cli_runs import tmpfs_disk

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, 'tools'))
import check_pins  # noqa: E402  pylint: disable=wrong-import-position


def write_set(tmp_path, monkeypatch, text, versions=('3.10', '3.11')):
    (tmp_path / 'requirements').mkdir(exist_ok=True)
    (tmp_path / 'requirements' / 'base.txt').write_text(text)
    (tmp_path / 'top.txt').write_text('# the whole set\n-r requirements/base.txt\n')
    monkeypatch.setattr(check_pins, 'REPO', str(tmp_path))
    monkeypatch.setitem(check_pins.SETS, 'trial', (versions, ('top.txt',)))


def test_every_set_names_existing_files_and_the_gaudi_set_is_for_310_only():
    for name, (versions, files) in check_pins.SETS.items():
        assert set(versions) <= {'3.10', '3.11'}, name
        for path in files:
            assert os.path.isfile(os.path.join(REPO, path)), path
    assert check_pins.SETS['gaudi'][0] == ('3.10',)


def test_markers_choose_the_pin_of_each_python(tmp_path, monkeypatch):
    write_set(tmp_path, monkeypatch, 'pandas==3.0.6; python_version >= "3.11"\n'
              'pandas==2.2.3; python_version < "3.11"  # 3.0 needs 3.11\nabsl-py==2.1.0\n')
    for version, pandas in (('3.10', '2.2.3'), ('3.11', '3.0.6')):
        requirements = check_pins.pinned_requirements(('top.txt',), version)
        assert [str(r) for r in requirements] == ['pandas==%s' % pandas, 'absl-py==2.1.0']


@pytest.mark.parametrize('line', ['numpy>=1.26', 'numpy', 'numpy==1.*', 'numpy==1.26.4,<2'])
def test_a_loosened_pin_fails(tmp_path, monkeypatch, line):
    write_set(tmp_path, monkeypatch, line + '\n')
    ok, message = check_pins.timed_check('trial', '3.11')
    assert not ok and 'is not pinned' in message and line in message, message


def test_every_real_set_is_pinned():
    for name, (versions, files) in check_pins.SETS.items():
        for version in versions:
            assert check_pins.pinned_requirements(files, version), (name, version)


def test_unknown_set_is_a_usage_error(capsys):
    assert check_pins.main(['nightly']) == 2
    assert 'unknown set nightly' in capsys.readouterr().err


@pytest.mark.slow  # Asks the package index (about 10 s).
def test_a_pin_the_python_cannot_have_fails_against_the_index(tmp_path, monkeypatch):
    write_set(tmp_path, monkeypatch, 'pandas==3.0.6\n', versions=('3.10',))
    assert check_pins.main(['trial']) == 1


@pytest.mark.slow  # Asks the package index (about 15 s).
def test_tensorflow_resolves_with_64_mb_of_scratch_disk(tmp_path, monkeypatch):
    # TensorFlow's wheel is 475 MB: the check reads its metadata, and never downloads it.
    write_set(tmp_path, monkeypatch, 'tensorflow==2.15.1\n', versions=('3.10',))
    with tmpfs_disk(tmp_path / 'disk', '64m') as disk:
        for variable in ('TMPDIR', 'PIP_CACHE_DIR'):
            monkeypatch.setenv(variable, str(disk))
        monkeypatch.setattr(tempfile, 'tempdir', str(disk))
        ok, message = check_pins.timed_check('trial', '3.10')
    assert ok, message


def test_a_pip_run_that_fails_once_is_tried_again_and_one_that_fails_twice_fails(monkeypatch):
    calls = []

    def flaky(requirements, python_version, binary_only):
        calls.append(requirements)
        if len(calls) in (1, 3, 4):
            raise check_pins.PinError('pip could not resolve it:\n    Connection reset')
        return {'install': []}

    monkeypatch.setattr(check_pins, '_pip_report_once', flaky)
    assert check_pins.pip_report(['absl-py==2.1.0'], '3.11', True) == {'install': []}
    with pytest.raises(check_pins.PinError, match='Connection reset'):
        check_pins.pip_report(['absl-py==2.1.0'], '3.11', True)
    assert len(calls) == 4
