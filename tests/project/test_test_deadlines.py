"""No test starts a process that can outlive its deadline (issue 29): every process a test
starts goes through tests/cli_runs.py (run_process, started, run_python, run_main), which waits
with a time-out and then kills the command's whole process group. subprocess.run's own timeout
kills only the direct child: an mpirun's ranks, a converter's workers or a TensorFlow child
still holding the output pipe would keep the test waiting forever.

The test files are read with ast, not grep: comments, strings (a YAML payload naming os.system)
and references that are not calls (os.system as a malicious pickle's global) do not count.
Plain Python, no TensorFlow: part of the fast set.
"""
import ast
import pathlib
import textwrap

TESTS = pathlib.Path(__file__).resolve().parents[1]
HELPER = 'cli_runs.py'  # The one place that calls subprocess, with a deadline and a group kill.
PROCESS_STARTERS = {
    'subprocess': {'run', 'Popen', 'call', 'check_call', 'check_output', 'getoutput',
                   'getstatusoutput'},
    'os': {'system', 'popen'},
}
# Files still allowed to start processes directly while their owners convert them: none.
NOT_YET_CONVERTED = ()


def process_starts(source):
    """[(line, 'module.function')] of the calls in `source` (Python text) that start a process
    directly, however the module or the function was imported (`import subprocess as sp`,
    `from os import system`)."""
    tree = ast.parse(source)
    modules, functions = {}, {}  # Name bound in the file -> module / 'module.function'.
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                module = alias.name if alias.asname else alias.name.split('.')[0]
                if module in PROCESS_STARTERS:
                    modules[alias.asname or module] = module
        elif isinstance(node, ast.ImportFrom) and node.module in PROCESS_STARTERS:
            for alias in node.names:
                if alias.name in PROCESS_STARTERS[node.module]:
                    functions[alias.asname or alias.name] = '%s.%s' % (node.module, alias.name)
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        called = node.func
        if (isinstance(called, ast.Attribute) and isinstance(called.value, ast.Name)
                and called.attr in PROCESS_STARTERS.get(modules.get(called.value.id), ())):
            found.append((node.lineno, '%s.%s' % (modules[called.value.id], called.attr)))
        elif isinstance(called, ast.Name) and called.id in functions:
            found.append((node.lineno, functions[called.id]))
    return sorted(found)


def _sources():
    """{path relative to tests/: source} of every Python file under tests/."""
    return {path.relative_to(TESTS).as_posix(): path.read_text(encoding='utf-8')
            for path in sorted(TESTS.rglob('*.py'))}


def test_no_test_starts_a_process_without_cli_runs():
    offenders = ['tests/%s:%d: %s()' % (name, line, call)
                 for name, source in _sources().items()
                 if name != HELPER and name not in NOT_YET_CONVERTED
                 for line, call in process_starts(source)]
    assert not offenders, (
        'start these through tests/cli_runs.py (run_process, started, run_python): a deadline '
        'and the whole process group killed, not only the direct child:\n  '
        + '\n  '.join(offenders))


def test_the_not_yet_converted_list_names_only_files_that_still_start_processes():
    files = _sources()
    stale = [name for name in NOT_YET_CONVERTED
             if name not in files or not process_starts(files[name])]
    assert not stale, ('remove from NOT_YET_CONVERTED (gone, or no longer starts a process '
                       'directly): %s' % stale)


def test_process_starts_sees_calls_however_imported_and_nothing_else():
    source = textwrap.dedent('''\
        import os
        import os.path
        import subprocess as sp
        from subprocess import Popen as Started, PIPE
        from os import system
        sp.run(['true'])  # subprocess.run(['in a comment'])
        with Started(['true'], stdout=PIPE):
            pass
        system('true')
        text = "os.system('in a string')"
        payload = (os.system, ('touch x',))  # A reference, not a call.
        os.path.join(os.system.__module__, 'x')
        sp.TimeoutExpired(['true'], 1)
        os.popen('true')
        ''')
    assert process_starts(source) == [(6, 'subprocess.run'), (7, 'subprocess.Popen'),
                                       (9, 'os.system'), (14, 'os.popen')]
