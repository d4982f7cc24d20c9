"""tools/setup_env.sh chooses the interpreter and the route, checks the OS pieces first and
never leaves a half-made venv: run with pyenv's real CPython 3.10, 3.12 and 3.13 as python3
(skipped where pyenv lacks them), a stand-in whose venv module is missing and a stand-in
Habana container (a `habana_frameworks` package and the container's distributions on a
temporary site). PATH holds only a fixed set of tools, so no other Python on the machine is
found. `--check-only` stops after the checks: nothing is installed."""
import glob
import os
import shutil

import pytest

from cli_runs import run_process

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PYENV_ROOT = os.environ.get('PYENV_ROOT', os.path.expanduser('~/.pyenv'))
TOOLS = ('bash', 'sh', 'env', 'dirname', 'cat', 'cut', 'sha256sum', 'rm', 'id', 'tr', 'grep',
         'mkdir', 'uname', 'c++', 'g++', 'gcc', 'cc', 'cmake', 'mpirun', 'mpicc', 'chromium')
CONTAINER = {'tensorflow-cpu': '2.15.0', 'habana-tensorflow': '1.14.0.493',
             'habana-horovod': '1.14.0.493'}


def pyenv_python(version_prefix):
    """pyenv's CPython whose version starts with `version_prefix`, or skip."""
    found = sorted(glob.glob(os.path.join(PYENV_ROOT, 'versions', version_prefix + '*', 'bin',
                                          'python3')))
    if not found:
        pytest.skip('pyenv has no CPython %s here' % version_prefix)
    return found[-1]


def tool_dir(tmp_path, python3):
    """A PATH directory with TOOLS and `python3` -> the given interpreter, nothing else."""
    bin_dir = tmp_path / 'bin'
    shutil.rmtree(bin_dir, ignore_errors=True)
    bin_dir.mkdir()
    for name in TOOLS:
        path = shutil.which(name)
        if path:
            os.symlink(path, bin_dir / name)
    os.symlink(python3, bin_dir / 'python3')
    return str(bin_dir)


def setup_env(tmp_path, python3, *args, timeout=60, **env):
    """Runs tools/setup_env.sh with only tool_dir on PATH and VENV in tmp_path; returns
    (exit status, output lines)."""
    full_env = {'PATH': tool_dir(tmp_path, python3), 'HOME': str(tmp_path),
                'VENV': str(tmp_path / 'venv')}
    full_env.update(env)
    result = run_process(['/bin/bash', os.path.join(REPO, 'tools', 'setup_env.sh')] + list(args),
                         timeout, env=full_env)
    return result.returncode, [line for line in result.stdout.splitlines() if line.strip()]


@pytest.mark.parametrize('version', ['3.12', '3.13'])
def test_python3_without_tensorflow_wheels_stops_in_one_line(tmp_path, version):
    status, lines = setup_env(tmp_path, pyenv_python(version))
    assert status == 2, lines
    (line,) = lines
    assert line.startswith('setup_env.sh: error: python3 is ')
    for part in ('Python %s' % version, 'CPython 3.10 or 3.11', 'PYTHON=', 'uv python install 3.11'):
        assert part in line, line
    assert not (tmp_path / 'venv').exists()


def test_python_without_venv_module_is_named_in_one_line(tmp_path):
    shadow = tmp_path / 'shadow'
    for module in ('venv', 'ensurepip'):
        (shadow / module).mkdir(parents=True)
        (shadow / module / '__init__.py').write_text(
            'raise ModuleNotFoundError("No module named %r")\n' % module)
    status, lines = setup_env(tmp_path, pyenv_python('3.11'), PYTHONPATH=str(shadow))
    assert status == 2, lines
    assert lines[0].startswith('[setup] CPU route: CPython 3.11')
    (error,) = lines[1:]
    assert error.startswith('setup_env.sh: error: ') and 'python3.11-venv' in error, error
    assert not (tmp_path / 'venv').exists()


def test_python_variable_is_honoured_over_python3(tmp_path):
    chosen = pyenv_python('3.10')
    status, lines = setup_env(tmp_path, pyenv_python('3.12'), '--check-only', PYTHON=chosen)
    assert status == 0, lines
    assert lines[0].startswith('[setup] CPU route: CPython 3.10'), lines
    assert os.path.realpath(chosen) in [os.path.realpath(word.strip('(),'))
                                        for word in lines[0].split()]
    assert not (tmp_path / 'venv').exists()


def test_python_variable_naming_python_312_is_refused(tmp_path):
    status, lines = setup_env(tmp_path, pyenv_python('3.10'), PYTHON=pyenv_python('3.12'))
    assert status == 2, lines
    (line,) = lines
    assert 'PYTHON=' in line and 'is Python 3.12' in line, line


def habana_site(tmp_path, with_every_pin=False):
    """A stand-in for the site of Habana's container: habana_frameworks and horovod packages,
    the distributions of CONTAINER and, `with_every_pin`, one of every pin the Gaudi route
    would otherwise install."""
    site = tmp_path / 'site'
    for package in ('habana_frameworks', 'habana_frameworks/tensorflow', 'horovod'):
        (site / package).mkdir(parents=True)
        (site / package / '__init__.py').write_text('')
    distributions = dict(CONTAINER)
    if with_every_pin:
        for name in ('runtime', 'export', 'test'):
            with open(os.path.join(REPO, 'requirements', name + '.txt')) as handle:
                for line in handle:
                    if '==' in line and not line.startswith('#'):
                        distributions[line.split('==')[0]] = line.split('==')[1].split(';')[0].strip()
    for name, version in distributions.items():
        info = site / ('%s-%s.dist-info' % (name.replace('-', '_'), version))
        info.mkdir(exist_ok=True)
        (info / 'METADATA').write_text('Metadata-Version: 2.1\nName: %s\nVersion: %s\n'
                                       % (name, version))
    return str(site)


def test_habana_container_takes_the_gaudi_route_without_tensorflow_or_horovod(tmp_path):
    status, lines = setup_env(tmp_path, pyenv_python('3.11'), '--check-only',
                              PYTHONPATH=habana_site(tmp_path))
    assert status == 0, lines
    assert lines[0].startswith('[setup] Gaudi route: CPython 3.11'), lines
    for name, version in CONTAINER.items():
        assert '%s %s' % (name, version) in lines[0], lines[0]
    (plan,) = [line for line in lines if 'would install' in line]
    assert 'absl-py==2.1.0' in plan and 'tidecv==1.0.1' in plan, plan
    assert 'tensorflow' not in plan and 'horovod' not in plan, plan
    assert not (tmp_path / 'venv').exists()


@pytest.mark.slow  # Makes a real venv and installs the project into it (about 30 s).
def test_gaudi_route_venv_sees_the_container_and_builds_nothing(tmp_path):
    site = habana_site(tmp_path, with_every_pin=True)
    status, lines = setup_env(tmp_path, pyenv_python('3.11'), timeout=300, PYTHONPATH=site)
    assert status == 0, lines
    assert lines[0].startswith('[setup] Gaudi route'), lines
    assert not any('building' in line for line in lines), lines
    assert 'include-system-site-packages = true' in (tmp_path / 'venv' / 'pyvenv.cfg').read_text()
    (site_packages,) = glob.glob(str(tmp_path / 'venv' / 'lib' / 'python*' / 'site-packages'))
    installed = os.listdir(site_packages)
    assert not [name for name in installed if name.startswith(('tensorflow', 'horovod'))], installed
    # A rerun trusts the finished venv and installs nothing.
    status, lines = setup_env(tmp_path, pyenv_python('3.11'), timeout=120, PYTHONPATH=site)
    assert status == 0 and len(lines) == 1, lines


def test_failed_venv_creation_leaves_nothing(tmp_path):
    """`python -m venv` stops half-way (a stand-in venv module writes part of a venv and
    fails, as a missing ensurepip does): the script removes what it left and says so."""
    shadow = tmp_path / 'shadow' / 'venv'
    shadow.mkdir(parents=True)
    (shadow / '__init__.py').write_text('')
    (shadow / '__main__.py').write_text(
        'import os, sys\n'
        'os.makedirs(os.path.join(sys.argv[-1], "bin"))\n'
        'os.symlink(sys.executable, os.path.join(sys.argv[-1], "bin", "python"))\n'
        'raise SystemExit("ensurepip failed")\n')
    status, lines = setup_env(tmp_path, pyenv_python('3.11'), PYTHONPATH=str(shadow.parent))
    assert status == 2, lines
    assert lines[-1].startswith('setup_env.sh: error: ') and 'nothing was left' in lines[-1]
    assert not (tmp_path / 'venv').exists()


def test_incomplete_venv_is_not_trusted(tmp_path):
    """A venv without pip, what a `python -m venv` stopped at ensurepip leaves, is made again."""
    made = run_process([pyenv_python('3.11'), '-m', 'venv', '--without-pip',
                        str(tmp_path / 'venv')], 60)
    assert made.returncode == 0, made.stdout
    status, lines = setup_env(tmp_path, pyenv_python('3.11'), '--check-only')
    assert status == 0, lines
    assert any('incomplete' in line and 'would be made again' in line for line in lines), lines
