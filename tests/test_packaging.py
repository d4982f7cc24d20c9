"""A non-editable install carries the whole library under one top-level name: the wheel built
from pyproject.toml holds every module of efficientdet_hpu and nothing else at the top (names
such as `dataset`, `inference` or `anchors` belong to other projects on the index), its
console scripts name functions that exist, and installed without the checkout around it the
package imports and the launcher finds the training entry point by module."""
import configparser
import glob
import importlib
import os
import shutil
import subprocess
import sys
import zipfile

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = 'efficientdet_hpu'


@pytest.fixture(scope='module')
def wheel(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp('wheel')
    source = tmp_path / 'src'
    everywhere = shutil.ignore_patterns('*.egg-info', '__pycache__')
    at_root = {'.venv', '.git', 'data', 'runs', 'build', '.pytest_cache', 'tests', 'docs'}

    def ignore(directory, names):  # The root's run folders, not efficientdet_hpu/data.
        skipped = at_root & set(names) if os.path.samefile(directory, REPO) else set()
        return skipped | everywhere(directory, names)

    shutil.copytree(REPO, source, ignore=ignore)
    result = subprocess.run(
        [sys.executable, '-m', 'pip', 'wheel', '--no-deps', '--no-build-isolation', '-q',
         '-w', str(tmp_path / 'wheel'), str(source)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    (path,) = glob.glob(str(tmp_path / 'wheel' / '*.whl'))
    return path


def test_wheel_holds_every_module_under_one_top_level_name(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    library = {os.path.relpath(path, REPO) for path in
               glob.glob(os.path.join(REPO, PACKAGE, '**', '*.py'), recursive=True)}
    assert len(library) > 80
    assert sorted(library - names) == [], 'packages missing from the wheel'
    top = {name.split('/')[0] for name in names if not name.split('/')[0].endswith('.dist-info')}
    assert top == {PACKAGE}


def test_console_scripts_name_existing_entry_points(wheel):
    archive = zipfile.ZipFile(wheel)
    (entry_points,) = [n for n in archive.namelist() if n.endswith('entry_points.txt')]
    parser = configparser.ConfigParser()
    parser.read_string(archive.read(entry_points).decode())
    scripts = dict(parser['console_scripts'])
    assert 'efficientdet-train' in scripts and 'efficientdet-launch' in scripts
    for name, target in scripts.items():
        module, function = target.split(':')
        assert callable(getattr(importlib.import_module(module), function)), name


@pytest.mark.slow  # Starts Python processes that import TensorFlow.
def test_installed_without_the_checkout_it_imports_and_launches_by_module(wheel, tmp_path):
    target = tmp_path / 'site'
    result = subprocess.run([sys.executable, '-m', 'pip', 'install', '--no-deps', '-q',
                             '--target', str(target), wheel], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    code = ('import sys; sys.path.insert(0, %r)\n'
            'import efficientdet_hpu\n'
            'assert efficientdet_hpu.__file__.startswith(%r), efficientdet_hpu.__file__\n'
            'from efficientdet_hpu.cli import demo_efficientdet\n'
            'launch = demo_efficientdet.build_launch(["--model_dir=/tmp/m"], {}, cores=2)\n'
            'print(launch.command)\n' % (str(target), str(target)))
    result = subprocess.run([sys.executable, '-c', code], cwd=str(tmp_path), capture_output=True,
                            text=True, timeout=120, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL='3'))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "'-m', 'efficientdet_hpu.cli.main', '--model_dir=/tmp/m'" in result.stdout
