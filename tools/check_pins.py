"""Checks against the package index that each pinned set resolves for the Pythons it serves.

    python tools/check_pins.py [SET ...]      # sets: runtime, test, gpu, gaudi, review,
                                              # fiftyone (default: all)

Each set is a list of requirement files (SETS below), resolved for CPython 3.10 and 3.11 (the
Gaudi set for 3.10 only: Habana builds its bridge for 3.10) on manylinux x86_64 up to glibc 2.35
(Ubuntu 22.04, the oldest base of the three routes), by pip itself:
`pip install --dry-run --ignore-installed --report ... --python-version V --platform ...
--only-binary=:all: --use-feature=fast-deps`, so nothing is installed or built, and each
wheel's metadata is read by HTTP range requests rather than by downloading the wheel. A pip
run that fails is tried once more before the set counts as failed.

Source-only pins (SOURCE_ONLY: horovod, habana-horovod, mpi4py publish no wheels; they are
compiled on install) cannot take part in a binary-only resolution. Each is asked for alone
(`--no-deps`, which pip allows with a foreign --python-version): the index must serve that
version and its Requires-Python must admit V; pip builds only its metadata. The dependencies
that metadata declares then join the binary resolution of the rest of the set.

A requirement that is not pinned with `==` fails the check, and so does a set that no longer
resolves: exit status 1 with pip's reason, 0 when every set resolves.
"""
import concurrent.futures
import json
import os
import subprocess
import sys
import tempfile
import time

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SETS = {
    'runtime': (('3.10', '3.11'), ('requirements/runtime.txt', 'requirements/cpu.txt',
                                   'requirements/horovod.txt')),
    'test': (('3.10', '3.11'), ('requirements.txt', 'requirements/horovod.txt')),
    'gpu': (('3.10', '3.11'), ('requirements/runtime.txt', 'requirements/gpu.txt',
                               'requirements/export.txt', 'requirements/horovod.txt')),
    'gaudi': (('3.10',), ('requirements-hpu.txt', 'requirements/runtime.txt',
                          'requirements/export.txt', 'requirements/test.txt')),
    # `pip install .[review]` on the CPU route: the label review's cleanlab beside TensorFlow.
    'review': (('3.10', '3.11'), ('requirements/runtime.txt', 'requirements/cpu.txt',
                                  'requirements/review.txt')),
    'fiftyone': (('3.10', '3.11'), ('requirements/runtime.txt', 'requirements/cpu.txt',
                                    'requirements/review.txt', 'requirements/fiftyone.txt')),
}
SOURCE_ONLY = frozenset({'horovod', 'habana-horovod', 'mpi4py'})
PLATFORMS = ['manylinux2014_x86_64'] + ['manylinux_2_%d_x86_64' % minor
                                        for minor in range(17, 36)]
PIP_TIMEOUT = 900


class PinError(Exception):
    """A set that does not resolve, or a requirement that is not pinned."""


def read_requirements(path):
    """The requirement lines of `path`, following `-r other.txt` (relative to the file)."""
    lines = []
    with open(os.path.join(REPO, path)) as handle:
        for raw in handle:
            line = raw.split(' #')[0].strip()
            if not line or line.startswith('#'):
                continue
            if line.startswith('-r '):
                nested = os.path.join(os.path.dirname(path), line[3:].strip())
                lines += read_requirements(os.path.normpath(nested))
            else:
                lines.append(line)
    return lines


def target_environment(python_version):
    """Marker variables of CPython `python_version` on Linux x86_64."""
    environment = default_environment()
    environment.update(python_version=python_version, python_full_version=python_version + '.0',
                       sys_platform='linux', platform_system='Linux', os_name='posix',
                       platform_machine='x86_64', implementation_name='cpython',
                       platform_python_implementation='CPython')
    return environment


def pinned_requirements(files, python_version):
    """The Requirements of `files` whose markers hold on `python_version`; PinError if one of
    them is not pinned to a single version with `==`."""
    environment, requirements = target_environment(python_version), []
    for path in files:
        for line in read_requirements(path):
            requirement = Requirement(line)
            if requirement.marker and not requirement.marker.evaluate(environment):
                continue
            # pip evaluates markers for the interpreter it runs on, not --python-version.
            requirement.marker = None
            specifiers = list(requirement.specifier)
            if len(specifiers) != 1 or specifiers[0].operator != '==' or '*' in specifiers[0].version:
                raise PinError('%s: %r is not pinned: write name==version' % (path, line))
            requirements.append(requirement)
    return requirements


def pip_report(requirements, python_version, binary_only):
    """Runs pip's dry run for `requirements` (strings) on the target; returns its report.

    A run that fails is run once more before it counts: a set that does not resolve fails
    both, while a dropped connection or a full scratch disk seldom strikes twice."""
    try:
        return _pip_report_once(requirements, python_version, binary_only)
    except PinError:
        return _pip_report_once(requirements, python_version, binary_only)


def _pip_report_once(requirements, python_version, binary_only):
    with tempfile.TemporaryDirectory() as scratch:
        listing, report = os.path.join(scratch, 'req.txt'), os.path.join(scratch, 'report.json')
        with open(listing, 'w') as handle:
            handle.write('\n'.join(requirements) + '\n')
        command = [sys.executable, '-m', 'pip', 'install', '--dry-run', '--ignore-installed',
                   '--quiet', '--report', report, '--python-version', python_version,
                   '--implementation', 'cp', '--target', os.path.join(scratch, 'target'),
                   '-r', listing]
        command += [word for platform in PLATFORMS for word in ('--platform', platform)]
        # Each wheel's metadata by HTTP range requests, not the whole wheel (TensorFlow's is
        # 475 MB for each Python); pip downloads the wheel where a server refuses ranges.
        command += ['--use-feature=fast-deps']
        command += ['--only-binary=:all:'] if binary_only else ['--no-deps']
        result = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, timeout=PIP_TIMEOUT, env=dict(os.environ, PIP_NO_INPUT='1'))
        if result.returncode != 0:
            reason = [line for line in result.stdout.splitlines() if 'Location' not in line]
            raise PinError('pip could not resolve it:\n    ' + '\n    '.join(reason[-12:]))
        with open(report) as handle:
            return json.load(handle)


def declared_dependencies(report, python_version):
    """The dependencies (strings) that the reported distributions declare for the target."""
    environment = dict(target_environment(python_version), extra='')
    dependencies = []
    for item in report['install']:
        for line in item['metadata'].get('requires_dist', []):
            requirement = Requirement(line)
            if not requirement.marker or requirement.marker.evaluate(environment):
                requirement.marker = None
                dependencies.append(str(requirement))
    return dependencies


def check_set(name, python_version):
    """Resolves set `name` for `python_version`; returns {package: version} it installs."""
    files = SETS[name][1]
    requirements = pinned_requirements(files, python_version)
    source = [str(r) for r in requirements if canonicalize_name(r.name) in SOURCE_ONLY]
    binary = [str(r) for r in requirements if canonicalize_name(r.name) not in SOURCE_ONLY]
    if source:
        binary += declared_dependencies(pip_report(source, python_version, False), python_version)
    report = pip_report(binary, python_version, True)
    resolved = {canonicalize_name(item['metadata']['name']): item['metadata']['version']
                for item in report['install']}
    for requirement in requirements:
        name_key = canonicalize_name(requirement.name)
        version = resolved.get(name_key)
        if name_key not in SOURCE_ONLY and (version is None or version not in requirement.specifier):
            raise PinError('%s resolved to %s' % (requirement, version or 'nothing'))
    return resolved


def timed_check(name, python_version):
    """One line saying whether set `name` resolves for `python_version`; (ok, line)."""
    start = time.time()
    try:
        resolved = check_set(name, python_version)
    except PinError as error:
        return False, 'check_pins: %s set, CPython %s: %s' % (name, python_version, error)
    return True, ('check_pins: %s set resolves for CPython %s (%d packages, %.0f s)'
                  % (name, python_version, len(resolved), time.time() - start))


def main(argv):
    names = argv or list(SETS)
    unknown = [name for name in names if name not in SETS]
    if unknown:
        print('check_pins: error: unknown set %s; the sets are %s'
              % (', '.join(unknown), ', '.join(SETS)), file=sys.stderr)
        return 2
    jobs = [(name, version) for name in names for version in SETS[name][0]]
    # pip waits on the index most of the time: three resolutions at once.
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        outcomes = list(pool.map(lambda job: timed_check(*job), jobs))
    for _, line in outcomes:
        print(line)
    return 0 if all(ok for ok, _ in outcomes) else 1


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
