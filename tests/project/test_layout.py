"""The layout efficientdet_hpu/__init__.py and docs/architecture.md describe.

The library is one package whose sub-packages stand in a line (efficientdet_hpu.LAYERS): a
module imports only from its own sub-package or from one before it. An import that points up
the line, a cycle between modules, an import that does not resolve, a sys.path edit in library
code or a module over ~400 lines fails here. The checkout's root holds only thin modules that
keep the names users of google/automl's and Habana's ports type (core/compat.py).
"""
import ast
import importlib.util
import os
import subprocess
import sys

import pytest

from cli_runs import run_process

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PACKAGE = 'efficientdet_hpu'


def _package_layers():
    """efficientdet_hpu.LAYERS of this checkout, read from its __init__.py: the one place the
    layer order is written."""
    spec = importlib.util.spec_from_file_location(
        PACKAGE, os.path.join(REPO, PACKAGE, '__init__.py'))
    package = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(package)
    return tuple(package.LAYERS)


LAYERS = _package_layers()
ROOT_MODULES = {'main', 'demo_efficientdet', 'inference', 'bench', 'model_inspect',
                'efficientdet_arch', 'dataloader', 'det_model_fn', 'hparams_config', 'anchors',
                'coco_metric', 'finetune', 'review'}
ROOT_PACKAGES = {'dataset', 'backbone', 'hccl_config', 'training', 'benchmarks'}
LINE_LIMIT = 430  # "~400 lines", with slack for docstrings.
THIN_LIMIT = 12  # Lines of a root thin module: a docstring, an import and one call.


def package_modules():
    """{dotted module name: path} of every module of the library package."""
    modules = {}
    for directory, _, names in os.walk(os.path.join(REPO, PACKAGE)):
        for name in names:
            if name.endswith('.py'):
                path = os.path.join(directory, name)
                dotted = os.path.relpath(path, REPO)[:-3].replace(os.sep, '.')
                modules[dotted[:-len('.__init__')] if dotted.endswith('.__init__') else dotted] = path
    return modules


def root_modules():
    """{file path relative to the repo: path} of the root's thin modules and packages."""
    found = {name: os.path.join(REPO, name) for name in os.listdir(REPO) if name.endswith('.py')}
    for package in ROOT_PACKAGES:
        for name in os.listdir(os.path.join(REPO, package)):
            if name.endswith('.py'):
                found[package + '/' + name] = os.path.join(REPO, package, name)
    return found


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


def import_graph(modules):
    graph = {name: set() for name in modules}
    for name, path in modules.items():
        for imported in imported_names(path):
            if imported in modules and imported != name:
                graph[name].add(imported)
    return graph


def layer_of(module):
    """Index in LAYERS of a library module's sub-package; -1 for the package's own __init__."""
    parts = module.split('.')
    return LAYERS.index(parts[1]) if len(parts) > 1 else -1


def upward_imports(graph):
    """['a.b -> c.d', ...]: imports from a sub-package to one later in LAYERS."""
    return sorted('%s -> %s' % (source, target) for source, targets in graph.items()
                  for target in targets if layer_of(target) > layer_of(source))


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


def test_checks_find_a_planted_cycle_and_a_planted_upward_import():
    graph = {'a': {'b'}, 'b': {'c'}, 'c': {'a'}, 'd': {'a'}}
    assert find_cycle(graph) == ['a', 'b', 'c', 'a']
    assert find_cycle({'a': {'b'}, 'b': set(), 'c': {'a', 'b'}}) is None
    planted = {PACKAGE + '.ops.anchors': {PACKAGE + '.config.hparams_config'},
               PACKAGE + '.config.hparams_config': {PACKAGE + '.core.errors'},
               PACKAGE + '.core.errors': set()}
    assert upward_imports(planted) == [
        PACKAGE + '.ops.anchors -> ' + PACKAGE + '.config.hparams_config']


def test_every_subpackage_is_a_stated_layer():
    directory = os.path.join(REPO, PACKAGE)
    subpackages = {name for name in os.listdir(directory)
                   if os.path.isfile(os.path.join(directory, name, '__init__.py'))}
    assert subpackages == set(LAYERS)
    with open(os.path.join(directory, '__init__.py')) as f:
        docstring = ast.get_docstring(ast.parse(f.read()))
    table = [line.split()[0] for line in docstring.splitlines()
             if line.startswith('  ') and not line.startswith('   ')]
    assert tuple(table) == LAYERS  # The package's docstring table states this order.


def test_imports_point_down_the_layers(capsys):
    graph = import_graph(package_modules())
    assert sum(len(targets) for targets in graph.values()) > 200  # The walk found the imports.
    upward = upward_imports(graph)
    with capsys.disabled():
        print('\nupward imports between layers: %d' % len(upward))
    assert not upward, 'imports that point up the layers %s:\n%s' % (LAYERS, '\n'.join(upward))


def test_packages_by_concern():
    """Checkpoints sit below both the training engine and serving, COCO scoring below both its
    drivers (engine/checkpoint_eval runs the Estimator, cli/inference the predictor), and
    serving imports neither the training engine nor the model_fn's package."""
    position = {layer: index for index, layer in enumerate(LAYERS)}
    for lower in ('checkpoints', 'evaluation'):
        assert position[lower] < position['training'] < position['engine'] < position['serving']
    graph = import_graph(package_modules())
    for name, targets in graph.items():
        layer = name.split('.')[1] if name.count('.') else ''
        if layer in ('serving', 'checkpoints', 'evaluation'):
            wrong = sorted(target for target in targets
                           if target.split('.')[1:2] in (['training'], ['engine']))
            assert not wrong, '%s imports %s: move what it needs below (docs/architecture.md)' % (
                name, wrong)


def test_the_launcher_command_only_parses_and_calls():
    """The launcher's logic is launch/'s (plan, start); the command stays short."""
    with open(os.path.join(REPO, PACKAGE, 'cli', 'demo_efficientdet.py')) as f:
        lines = sum(1 for _ in f)
    assert lines < 120, 'cli/demo_efficientdet.py has %d lines: move logic to launch/' % lines


def test_no_import_cycles():
    cycle = find_cycle(import_graph(package_modules()))
    assert cycle is None, 'import cycle: ' + ' -> '.join(cycle)


def test_only_the_runtime_imports_horovod_and_habana():
    for name, path in package_modules().items():
        heavy = {imported for imported in imported_names(path)
                 if imported.split('.')[0] in ('horovod', 'habana_frameworks')}
        assert not heavy or name.startswith(PACKAGE + '.runtime.'), (name, heavy)


def test_every_import_resolves():
    """A module imported by an old name (moved) is not found: caught here without running."""
    modules = package_modules()
    sys.path.insert(0, REPO)
    try:
        unresolved = set()
        for name, path in {**modules, **root_modules()}.items():
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


def test_library_code_never_edits_sys_path():
    for name, path in package_modules().items():
        with open(path) as f:
            tree = ast.parse(f.read(), path)
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and node.attr == 'path'
                    and isinstance(node.value, ast.Name) and node.value.id == 'sys'):
                raise AssertionError('%s touches sys.path (line %d): import through the '
                                     'package instead' % (name, node.lineno))


def test_root_holds_only_thin_modules_over_the_package():
    root = {name[:-3] for name in os.listdir(REPO) if name.endswith('.py')}
    assert root == ROOT_MODULES
    for relative, path in root_modules().items():
        with open(path) as f:
            text = f.read()
        assert len(text.splitlines()) <= THIN_LIMIT, relative
        body = [node for node in ast.parse(text).body
                if not (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant))]
        if relative.endswith('__init__.py') and relative != 'hccl_config/__init__.py':
            assert not body, relative  # A docstring only.
            continue
        assert any(isinstance(node, ast.ImportFrom) and node.module == PACKAGE + '.core.compat'
                   for node in body), relative


@pytest.mark.slow  # Starts Python processes that import TensorFlow.
def test_root_names_are_the_package_modules_themselves():
    code = ('import main, hparams_config, anchors, dataloader, det_model_fn, efficientdet_arch\n'
            'import coco_metric, hccl_config, demo_efficientdet\n'
            'from backbone import efficientnet_builder\n'
            'from efficientdet_hpu.config import hparams_config as real\n'
            'from efficientdet_hpu.cli import main as real_main\n'
            'from efficientdet_hpu import launch\n'
            'from efficientdet_hpu.backbone import efficientnet_builder as real_builder\n'
            'assert hparams_config is real and main is real_main and hccl_config is launch\n'
            'assert efficientnet_builder is real_builder\n'
            'print("ok")\n')
    result = run_process([sys.executable, '-c', code], timeout=300, cwd=REPO,
                         env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL='3'), stderr=subprocess.PIPE)
    assert result.returncode == 0 and result.stdout.strip().endswith('ok'), result.stderr[-3000:]


def test_modules_stay_small():
    long = {}
    for name, path in package_modules().items():
        with open(path) as f:
            lines = sum(1 for _ in f)
        if lines > LINE_LIMIT:
            long[name] = lines
    assert not long, 'split these modules by concept: %s' % long


@pytest.mark.slow  # Starts Python processes that import TensorFlow.
def test_entry_points_import_together_without_flag_clashes():
    """Importing entry points defines no flags (each defines its own when it runs), so one
    process can import them all, e.g. a notebook or a test."""
    code = ('import main, inference, bench, model_inspect, demo_efficientdet, finetune\n'
            'from efficientdet_hpu.cli import plot_curves, analyze\n'
            'from efficientdet_hpu.benchmarks import profile_summary\n'
            'from efficientdet_hpu.datatools import create_coco_tfrecord, doctor\n'
            'from absl import flags\n'
            'main.define_flags()\n'
            'assert flags.FLAGS["model_dir"].default is None\n'
            'print("ok")\n')
    result = run_process([sys.executable, '-c', code], timeout=300, cwd=REPO,
                         env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL='3'), stderr=subprocess.PIPE)
    assert result.returncode == 0 and result.stdout.strip().endswith('ok'), result.stderr[-3000:]


# Folders of tests/ that are not packages of the library: whole commands in processes of their
# own, the repository itself, and what tests read or start.
TEST_FOLDERS_BESIDE_THE_PACKAGE = {'scenarios', 'project', 'fixtures', 'reference_checks'}


def test_tests_mirror_the_package():
    """tests/<package>/test_<module>.py: each folder of tests/ is a layer of the library or one
    of the folders beside it; no test file stands at tests/ itself; the test files' names are
    unique (conftest.py puts tests/ on sys.path, and pytest imports each file by its name)."""
    tests = os.path.join(REPO, 'tests')
    folders = {name for name in os.listdir(tests)
               if os.path.isdir(os.path.join(tests, name)) and not name.startswith(('.', '_'))}
    stray = folders - set(LAYERS) - TEST_FOLDERS_BESIDE_THE_PACKAGE
    assert not stray, 'folders of tests/ that are no layer of %s: %s' % (PACKAGE, sorted(stray))
    at_top = sorted(name for name in os.listdir(tests) if name.startswith('test_'))
    assert not at_top, 'test files belong in tests/<package>/: %s' % at_top
    names = [name for _, _, files in os.walk(tests) for name in files
             if name.startswith('test_') and name.endswith('.py')]
    assert len(names) == len(set(names)), sorted({n for n in names if names.count(n) > 1})
    assert len(names) > 60
