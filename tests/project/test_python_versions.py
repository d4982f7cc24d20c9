"""The project runs on CPython 3.10 as well as 3.11 (pyproject's requires-python; .ci/run sets up
.venv310, compiles every module with 3.10 and runs every command's --help and three real runs
there). The whole suite runs on 3.11 only, so this file keeps out of the code what 3.11 added
to the language and the standard library: code that uses one of them passes the suite here and
fails on 3.10 at the first call."""
import ast
import os

from cli_runs import REPO
from test_layout import PACKAGE, ROOT_PACKAGES
# module -> names that module gained in 3.11 (What's New in Python 3.11).
NEW_IN_311 = {
    'asyncio': {'TaskGroup', 'timeout', 'timeout_at', 'Runner', 'Barrier'},
    'contextlib': {'chdir'},
    'datetime': {'UTC'},
    'enum': {'StrEnum', 'ReprEnum', 'verify', 'member', 'nonmember', 'global_enum',
             'EnumCheck', 'FlagBoundary', 'property'},
    'hashlib': {'file_digest'},
    'logging': {'getLevelNamesMapping'},
    'operator': {'call'},
    'typing': {'Self', 'LiteralString', 'Never', 'assert_never', 'assert_type', 'reveal_type',
               'Required', 'NotRequired', 'TypeVarTuple', 'Unpack', 'dataclass_transform',
               'get_overloads', 'clear_overloads'},
}
NEW_MODULES = {'tomllib', 'wsgiref.types'}
NEW_BUILTINS = {'ExceptionGroup', 'BaseExceptionGroup', 'EncodingWarning'}


def _sources():
    """Every Python file that runs outside tests: the package, the entry points (the root's
    files and thin packages), tools/."""
    paths = [os.path.join(REPO, name) for name in os.listdir(REPO) if name.endswith('.py')]
    for root in [os.path.join(REPO, name) for name in (PACKAGE, 'tools', *sorted(ROOT_PACKAGES))]:
        for directory, subdirectories, names in os.walk(root):
            subdirectories[:] = [name for name in subdirectories if name != '__pycache__']
            paths += [os.path.join(directory, name) for name in names if name.endswith('.py')]
    return sorted(paths)


def uses_of_311(source):
    """['line N: what'] for each use in `source` (Python text) of what 3.11 added."""
    found = []
    aliases = {}  # A local name -> the module it names (import hashlib as h).
    for node in ast.walk(ast.parse(source)):
        what = None
        if isinstance(node, ast.Import):
            for alias in node.names:
                aliases[alias.asname or alias.name] = alias.name
                if alias.name in NEW_MODULES:
                    what = 'import %s' % alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.module in NEW_MODULES:
                what = 'from %s import' % node.module
            new = NEW_IN_311.get(node.module, set()) & {alias.name for alias in node.names}
            if new:
                what = 'from %s import %s' % (node.module, ', '.join(sorted(new)))
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            module = aliases.get(node.value.id, node.value.id)
            if node.attr in NEW_IN_311.get(module, ()):
                what = '%s.%s' % (module, node.attr)
        elif isinstance(node, ast.Name) and node.id in NEW_BUILTINS:
            what = node.id
        elif type(node).__name__ == 'TryStar':
            what = 'except*'
        if what:
            found.append('line %d: %s' % (node.lineno, what))
    return found


def test_no_file_uses_what_python_311_added():
    problems = []
    for path in _sources():
        with open(path, encoding='utf-8') as stream:
            problems += ['%s %s' % (os.path.relpath(path, REPO), use)
                         for use in uses_of_311(stream.read())]
    assert not problems, 'new in Python 3.11, missing on 3.10:\n' + '\n'.join(problems)


def test_the_check_finds_each_kind_of_use():
    source = ('import tomllib\n'
              'import hashlib as h\n'
              'from typing import Self, List\n'
              'import datetime\n'
              'def f(s):\n'
              '    h.file_digest(s, "sha256")\n'
              '    return datetime.UTC, datetime.timezone.utc\n'
              'try:\n'
              '    pass\n'
              'except* ValueError:\n'
              '    raise ExceptionGroup("x", [])\n')
    assert sorted(uses_of_311(source)) == sorted([
        'line 1: import tomllib', 'line 3: from typing import Self', 'line 6: hashlib.file_digest',
        'line 7: datetime.UTC', 'line 8: except*', 'line 11: ExceptionGroup'])
    assert uses_of_311('import typing\nx: typing.List[int] = []\n') == []
