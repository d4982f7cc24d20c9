"""A non-editable install carries every module: the wheel built from pyproject.toml holds each
top-level .py file and each package of the repository (an editable install hides a module
missing from `py-modules`, because it puts the repository root on sys.path)."""
import glob
import os
import shutil
import subprocess
import sys
import zipfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _repo_sources():
    """Top-level modules and package files, as paths inside a wheel."""
    modules = {os.path.basename(p) for p in glob.glob(os.path.join(REPO, '*.py'))}
    packages = {os.path.relpath(p, REPO)
                for init in glob.glob(os.path.join(REPO, '*', '__init__.py'))
                for p in glob.glob(os.path.join(os.path.dirname(init), '*.py'))}
    return modules, packages


def test_wheel_holds_every_module_and_package(tmp_path):
    source = tmp_path / 'src'
    shutil.copytree(REPO, source, ignore=shutil.ignore_patterns(
        '.venv', '.git', 'data', 'runs', 'build', '*.egg-info', '__pycache__', '.pytest_cache',
        'tests', 'docs'))
    result = subprocess.run(
        [sys.executable, '-m', 'pip', 'wheel', '--no-deps', '--no-build-isolation', '-q',
         '-w', str(tmp_path / 'wheel'), str(source)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    (wheel,) = glob.glob(str(tmp_path / 'wheel' / '*.whl'))
    names = set(zipfile.ZipFile(wheel).namelist())
    modules, packages = _repo_sources()
    assert modules and packages
    assert sorted(modules - names) == [], 'add these to py-modules in pyproject.toml'
    assert sorted(packages - names) == [], 'add these packages to pyproject.toml'
