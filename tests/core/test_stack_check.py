"""core/stack_check.py: the TensorFlow found at start, from its distribution's metadata."""
import importlib.metadata

import pytest

from efficientdet_hpu.core import stack_check


def installed(monkeypatch, versions, module_found=True):
    """Pretends the distributions of `versions` ({name: version}) are all that is installed."""
    def version(name):
        if name not in versions:
            raise importlib.metadata.PackageNotFoundError(name)
        return versions[name]
    monkeypatch.setattr(stack_check.importlib.metadata, 'version', version)
    monkeypatch.setattr(stack_check.importlib.util, 'find_spec',
                        lambda name: object() if module_found else None)


@pytest.mark.parametrize('versions', [{'tensorflow': '2.15.1'}, {'tensorflow-cpu': '2.15.0'},
                                      {'tensorflow': '2.15.0+nv24.2'}])
def test_215_of_each_route_says_nothing(monkeypatch, capsys, versions):
    installed(monkeypatch, versions)
    stack_check.check_tensorflow('main.py')
    assert capsys.readouterr().err == ''


def test_another_version_is_one_warning_line_on_rank_0_only(monkeypatch, capsys):
    installed(monkeypatch, {'tensorflow': '2.16.1'})
    monkeypatch.delenv('OMPI_COMM_WORLD_RANK', raising=False)
    stack_check.check_tensorflow('main.py')
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith('main.py: warning: tensorflow 2.16.1 found, but this port needs '
                           'TensorFlow 2.15.x'), line
    assert 'tensorflow==2.15.1' in line and 'docs/install.md' in line
    monkeypatch.setenv('OMPI_COMM_WORLD_RANK', '1')
    stack_check.check_tensorflow('main.py')
    assert capsys.readouterr().err == ''


def test_no_tensorflow_is_one_error_line_and_status_2(monkeypatch, capsys):
    installed(monkeypatch, {}, module_found=False)
    with pytest.raises(SystemExit) as stop:
        stack_check.check_tensorflow('main.py')
    assert stop.value.code == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith('main.py: error: TensorFlow is not installed for '), line


def test_a_build_without_metadata_is_trusted(monkeypatch, capsys):
    installed(monkeypatch, {}, module_found=True)
    stack_check.check_tensorflow('main.py')
    assert capsys.readouterr().err == ''
