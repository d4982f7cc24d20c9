"""tools/check_pins.py: which lines of a set apply to each Python, that every line is pinned, and
(against the package index) that a set which cannot resolve fails. .ci/run checks the real sets."""
import os
import sys

import pytest

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
