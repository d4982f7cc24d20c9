"""Prints the requirement lines of FILES whose distribution this interpreter does not have.

    python tools/missing_requirements.py requirements/runtime.txt ...
    python tools/missing_requirements.py --found NAME ...   # 'NAME VERSION, ...' of those present

The Gaudi route of tools/setup_env.sh installs only these: inside Habana's container a
distribution that is there in any version (its numpy, its protobuf, its Horovod fork) is kept,
never replaced by our pin. Lines whose environment marker does not hold here are skipped.
Runs with the base interpreter, which may have no `packaging`: pip's copy serves then.
"""
import importlib.metadata
import sys

try:
    from packaging.requirements import Requirement
except ImportError:  # pragma: no cover - a base interpreter with pip only
    from pip._vendor.packaging.requirements import Requirement


def requirement_lines(path):
    with open(path) as handle:
        for raw in handle:
            line = raw.split(' #')[0].strip()
            if line and not line.startswith(('#', '-')):
                yield line


def installed(name):
    try:
        importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def missing(paths):
    lines = []
    for path in paths:
        for line in requirement_lines(path):
            requirement = Requirement(line)
            if requirement.marker and not requirement.marker.evaluate():
                continue
            if not installed(requirement.name):
                requirement.marker = None
                lines.append(str(requirement))
    return lines


def found(names):
    """'name version, ...' of the distributions of `names` this interpreter has."""
    present = ['%s %s' % (name, importlib.metadata.version(name)) for name in names
               if installed(name)]
    return ', '.join(present) or 'none of %s' % ', '.join(names)


if __name__ == '__main__':
    if sys.argv[1:2] == ['--found']:
        print(found(sys.argv[2:]))
    else:
        for line in missing(sys.argv[1:]):
            print(line)
