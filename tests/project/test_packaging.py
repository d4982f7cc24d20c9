"""A non-editable install carries the whole library under one top-level name: the wheel built
from pyproject.toml holds every module of efficientdet_hpu and nothing else at the top (names
such as `dataset`, `inference` or `anchors` belong to other projects on the index), its
console scripts name functions that exist, and installed without the checkout around it the
package imports and the launcher finds the training entry point by module."""
import configparser
import glob
import importlib
import os
import re
import shutil
import subprocess
import sys
import zipfile

import pytest

from cli_runs import run_process

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PACKAGE = 'efficientdet_hpu'


@pytest.fixture(scope='module')
def wheel(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp('wheel')
    source = tmp_path / 'src'
    everywhere = shutil.ignore_patterns('*.egg-info', '__pycache__')
    at_root = {'.git', 'data', 'runs', 'build', '.pytest_cache', 'tests', 'docs'}

    def ignore(directory, names):  # The root's run folders, not efficientdet_hpu/data.
        skipped = set()
        if os.path.samefile(directory, REPO):  # And .venv, .venv310 (.ci/run), ...
            skipped = {name for name in names if name in at_root or name.startswith('.venv')}
        return skipped | everywhere(directory, names)

    shutil.copytree(REPO, source, ignore=ignore)
    result = run_process(
        [sys.executable, '-m', 'pip', 'wheel', '--no-deps', '--no-build-isolation', '-q',
         '-w', str(tmp_path / 'wheel'), str(source)], 600, stderr=subprocess.PIPE)
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
    result = run_process([sys.executable, '-m', 'pip', 'install', '--no-deps', '-q',
                          '--target', str(target), wheel], 600, stderr=subprocess.PIPE)
    assert result.returncode == 0, result.stderr
    code = ('import sys; sys.path.insert(0, %r)\n'
            'import efficientdet_hpu\n'
            'assert efficientdet_hpu.__file__.startswith(%r), efficientdet_hpu.__file__\n'
            'from efficientdet_hpu.cli import demo_efficientdet\n'
            'launch = demo_efficientdet.build_launch(["--model_dir=/tmp/m"], {}, cores=2)\n'
            'print(launch.command)\n' % (str(target), str(target)))
    result = run_process([sys.executable, '-c', code], 120, cwd=str(tmp_path),
                         stderr=subprocess.PIPE, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL='3'))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "'-m', 'efficientdet_hpu.cli.main', '--model_dir=/tmp/m'" in result.stdout


def test_wheel_holds_the_library_only_and_declares_the_routes(wheel):
    """Python modules of the package and its metadata: no tests, docs, data, configs or
    requirement files; TensorFlow only in the route extras, Horovod in none."""
    archive = zipfile.ZipFile(wheel)
    names = archive.namelist()
    assert [n for n in names if not n.endswith('.py') and '.dist-info/' not in n] == []
    assert not [n for n in names if n.startswith(('tests/', 'docs/', 'configs/', 'requirements'))]
    (metadata,) = [n for n in names if n.endswith('.dist-info/METADATA')]
    requires = [line.split(':', 1)[1].strip() for line in archive.read(metadata).decode().splitlines()
                if line.startswith('Requires-Dist:')]
    unconditional = [r for r in requires if 'extra ==' not in r]
    assert unconditional and not [r for r in unconditional if r.lower().startswith(('tensorflow', 'horovod'))]
    assert 'tensorflow==2.15.1; extra == "cpu"' in requires
    assert 'tensorflow[and-cuda]==2.15.1; extra == "gpu"' in requires
    assert not [r for r in requires if 'horovod' in r.lower()]


def console_scripts(wheel):
    archive = zipfile.ZipFile(wheel)
    (entry_points,) = [n for n in archive.namelist() if n.endswith('entry_points.txt')]
    parser = configparser.ConfigParser()
    parser.read_string(archive.read(entry_points).decode())
    return sorted(parser['console_scripts'])


@pytest.mark.slow  # A fresh venv, pip install and every command's --help (about a minute).
def test_pip_install_in_a_fresh_venv_then_every_command_helps(wheel, tmp_path):
    """`pip install .[cpu]` into a new venv that already sees a TensorFlow (this one's
    site-packages through a .pth, as a container's would be) installs the package and no second
    TensorFlow; each console command's --help then lists its own flags, under its name, and
    ends as absl's does (status 1); the launcher prints its own usage (status 0)."""
    venv = tmp_path / 'venv'
    made = run_process([sys.executable, '-m', 'venv', '--without-pip', str(venv)], 120)
    assert made.returncode == 0, made.stdout
    (site,) = glob.glob(str(venv / 'lib' / 'python*' / 'site-packages'))
    ours = [p for p in sys.path if p.endswith('site-packages') and os.path.isdir(p)]
    with open(os.path.join(site, 'environment.pth'), 'w') as handle:
        handle.write('\n'.join(ours) + '\n')
    python = str(venv / 'bin' / 'python')
    result = run_process([python, '-m', 'pip', 'install', '-q', wheel + '[cpu]'], 600,
                         cwd=str(tmp_path), stderr=subprocess.PIPE)
    assert result.returncode == 0, result.stderr[-3000:]
    assert not [n for n in os.listdir(site) if n.startswith(('tensorflow', 'numpy'))], os.listdir(site)
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL='3')
    env.pop('PYTHONPATH', None)
    for name in console_scripts(wheel):
        script = str(venv / 'bin' / name)
        result = run_process([script, '--help'], 180, cwd=str(tmp_path), env=env,
                             stderr=subprocess.PIPE)
        output = result.stdout + result.stderr
        assert 'Traceback (most recent call last)' not in output, (name, output[-2000:])
        if name == 'efficientdet-launch':  # The launcher's own usage text.
            assert result.returncode == 0 and '\n  --use_horovod N ' in result.stdout, output
            continue
        assert result.returncode == 0, (name, result.returncode, output[-2000:])
        assert result.stdout.rstrip().endswith('Try --helpfull to get a list of all flags.')
        own = re.search(r'\nflags:\n\n%s:\n((?:  .*\n)+)' % re.escape(script), result.stdout)
        assert own and re.search(r'^  --\S+: \S', own.group(1), re.M), (name, result.stdout)
        assert '--logtostderr' not in result.stdout, (name, 'lists every module\'s flags')
        if name == 'efficientdet-train':
            for flag in ('mode', 'model_dir', 'train_batch_size', 'hparams', 'use_horovod'):
                assert re.search(r'^  --(\[no\])?%s: ' % flag, result.stdout, re.M), flag
