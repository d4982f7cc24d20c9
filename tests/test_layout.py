"""The layout the README's Architecture section describes: no import cycles, every import
resolvable (so no module is imported by a name it no longer has), a short root, small modules,
entry points that define their flags only when they run."""
import ast
import importlib.util
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ('backbone', 'benchmarks', 'dataset', 'hccl_config', 'modeling', 'runtime',
            'serving', 'training')
ROOT_LIMIT = 12
LINE_LIMIT = 430  # "~400 lines", with slack for docstrings.


def project_modules():
    """{dotted module name: path} of the root modules and the packages' modules."""
    modules = {}
    for name in os.listdir(REPO):
        if name.endswith('.py'):
            modules[name[:-3]] = os.path.join(REPO, name)
    for package in PACKAGES:
        directory = os.path.join(REPO, package)
        for name in os.listdir(directory):
            if name.endswith('.py'):
                dotted = package if name == '__init__.py' else package + '.' + name[:-3]
                modules[dotted] = os.path.join(directory, name)
    return modules


def imported_names(path):
    """Every module name an import statement of `path` names, at any depth (deferred imports
    inside functions count: they close cycles all the same). `from p import m` yields p.m when
    m is a module, else p."""
    with open(path) as f:
        tree = ast.parse(f.read(), path)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            for alias in node.names:
                yield node.module + '.' + alias.name
            yield node.module


def import_graph():
    modules = project_modules()
    graph = {name: set() for name in modules}
    for name, path in modules.items():
        for imported in imported_names(path):
            if imported in modules and imported != name:
                graph[name].add(imported)
    return graph


def find_cycle(graph):
    """One cycle as a list of modules [a, b, ..., a], or None."""
    state, stack = {}, []

    def visit(node):
        state[node] = 'open'
        stack.append(node)
        for target in sorted(graph[node]):
            if state.get(target) == 'open':
                return stack[stack.index(target):] + [target]
            if target not in state:
                found = visit(target)
                if found:
                    return found
        stack.pop()
        state[node] = 'done'
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def test_cycle_finder_finds_a_planted_cycle():
    graph = {'a': {'b'}, 'b': {'c'}, 'c': {'a'}, 'd': {'a'}}
    assert find_cycle(graph) == ['a', 'b', 'c', 'a']
    assert find_cycle({'a': {'b'}, 'b': set(), 'c': {'a', 'b'}}) is None


def test_no_import_cycles():
    graph = import_graph()
    assert sum(len(targets) for targets in graph.values()) > 50  # The walk found the imports.
    cycle = find_cycle(graph)
    assert cycle is None, 'import cycle: ' + ' -> '.join(cycle)


def test_every_import_resolves():
    """A module imported by an old name (moved into a package) is not found: caught here
    without running the code."""
    modules = project_modules()
    sys.path.insert(0, REPO)
    try:
        unresolved = set()
        for name, path in modules.items():
            with open(path) as f:
                tree = ast.parse(f.read(), path)
            for node in ast.walk(tree):
                names = ([alias.name for alias in node.names] if isinstance(node, ast.Import)
                         else [node.module] if isinstance(node, ast.ImportFrom)
                         and node.level == 0 else [])
                for imported in names:
                    if imported in modules or imported.startswith('habana_frameworks'):
                        continue  # Habana's stack exists only on Gaudi hosts.
                    if importlib.util.find_spec(imported.split('.')[0]) is None:
                        unresolved.add('%s imports %s' % (name, imported))
    finally:
        sys.path.remove(REPO)
    assert not unresolved, sorted(unresolved)


def test_root_holds_only_the_entry_points_and_known_names():
    root = sorted(name for name in os.listdir(REPO) if name.endswith('.py'))
    assert len(root) <= ROOT_LIMIT, root
    for name in ('main.py', 'demo_efficientdet.py', 'efficientdet_arch.py', 'dataloader.py'):
        assert name in root


def test_modules_stay_small():
    long = {}
    for name, path in project_modules().items():
        with open(path) as f:
            lines = sum(1 for _ in f)
        if lines > LINE_LIMIT:
            long[name] = lines
    assert not long, 'split these modules by concept: %s' % long


def test_entry_points_import_together_without_flag_clashes():
    """Importing entry points defines no flags (each defines its own when it runs), so one
    process can import them all, e.g. a notebook or a test."""
    code = ('import main, inference, bench, model_inspect, demo_efficientdet\n'
            'from training import plot_curves\n'
            'from benchmarks import profile_summary\n'
            'from dataset import create_coco_tfrecord\n'
            'from absl import flags\n'
            'main.define_flags()\n'
            'assert flags.FLAGS["model_dir"].default is None\n'
            'print("ok")\n')
    result = subprocess.run([sys.executable, '-c', code], cwd=REPO, capture_output=True,
                            text=True, timeout=300,
                            env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL='3'))
    assert result.returncode == 0 and result.stdout.strip().endswith('ok'), result.stderr[-3000:]
