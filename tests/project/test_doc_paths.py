"""Every repository path the comments, docstrings and pages name exists.

Read:
  - the comments and docstrings (module, class, function) and the other strings that name a
    `docs/` page (flag help, error messages) of the library (efficientdet_hpu/**/*.py), of the
    root's thin modules (*.py at the root and in dataset/, backbone/, hccl_config/, training/,
    benchmarks/) and of tools/*.py; the comments and docstrings of tests/**/*.py (their other
    strings are test data); the comments of tools/*.sh (the text after a `#` that starts a
    line or follows a blank);
  - README.md, k8s/README.md and docs/**/*.md, whole (prose and code blocks).

A repository path is a word made of letters, digits and `_ . / -` that
  1. starts with a top-level name of the checkout followed by `/` (TOP_LEVEL: `docs/data.md`,
     `tools/demo.sh`, `tests/fixtures/`); it names a file or folder of the checkout; or
  2. is a module path of the library relative to efficientdet_hpu/: a sub-package name
     (efficientdet_hpu.LAYERS), `/`, and more, ending in `.py` (`training/det_model_fn.py`,
     `config/recipe.py`). A name that is also a top-level folder (`training/`, `dataset/`)
     is looked up at the root first, then under efficientdet_hpu/.
and, in markdown, a link target `[text](target)` that is not a URL, resolved against the
page's folder. A module path may end in a name written in the module
(`engine/hooks.SummaryHook`) or leave out `.py` (`backbone/lite_weights`).

Dotted names:
  3. `efficientdet_hpu.a.b` (anywhere) names a module or package, or a name written in the
     longest module or package that prefixes it (`efficientdet_hpu.config.recipe.resolve`);
  4. in Python comments and docstrings, a sub-package name and one lower-case name
     (`core.errors`, `launch.hosts`; not `config.` and `data.`, which are also the names of
     config objects and data files, nor a file extension: `analysis.txt`) names a module or
     package of that sub-package (at the root first: `training.plot_curves`), or a name
     written in its __init__.py.

Not paths: a word preceded by `/`, `.`, `~`, `:`, `$` or a letter (a part of an absolute or
longer path: /tmp/docs/x, runs/demo/eval, a model_dir example, a URL), a word holding a
placeholder or glob (`*`, `?`, `<`, `{`, `$`, `...`, `NNN`, `XXX`, `HOST`), and the `#anchor`,
`:line` or trailing punctuation after a path (the file is checked, not the anchor: tests/
test_docs.py checks markdown anchors). No TensorFlow is imported: this reads text only.

A missing path fails with the file:line that names it. ALLOWED_MISSING lists the ones known
to be stale in files being changed elsewhere, each with its fix.
"""
import ast
import importlib.util
import io
import pathlib
import re
import tokenize

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGE = 'efficientdet_hpu'


def _package_layers():
    """efficientdet_hpu.LAYERS, read from the package's __init__.py (its one statement)."""
    spec = importlib.util.spec_from_file_location(PACKAGE, ROOT / PACKAGE / '__init__.py')
    package = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(package)
    return tuple(package.LAYERS)


LAYERS = _package_layers()
TOP_LEVEL = (PACKAGE, 'docs', 'tools', 'tests', 'configs', 'dataset', 'backbone', 'hccl_config',
             'training', 'benchmarks', 'k8s', 'docker', 'requirements', '.ci')
ROOT_PACKAGES = ('dataset', 'backbone', 'hccl_config', 'training', 'benchmarks')

# (file, path as written): stale references known and left, each with why; keyed without the
# line, so that other edits of those files do not move it. Empty: every path named exists.
ALLOWED_MISSING = set()

_WORD = re.compile(r'(?<![\w/.~:$\-])(\.?[A-Za-z_][\w.\-]*(?:/[\w.\-]*)+)')
_DOTTED = re.compile(r'(?<![\w./\-])(%s(?:\.\w+)+)' % PACKAGE)
_RELATIVE_DOTTED = re.compile(r'(?<![\w./\-])(%s)\.([a-z_][a-z0-9_]*)\b' % '|'.join(
    layer for layer in LAYERS if layer not in ('config', 'data')))
_FILE_EXTENSIONS = {'json', 'jsonl', 'txt', 'yaml', 'yml', 'md', 'png', 'jpg', 'py', 'sh', 'csv',
                    'pth', 'log'}
_PLACEHOLDER = re.compile(r'[*?<>{}$]|\.\.\.|NNN|XXX|HOST')
_LINK = re.compile(r'!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+"[^"]*")?\s*\)')
_URL = re.compile(r'[a-zA-Z][a-zA-Z0-9+.\-]*://\S+')


# ------------------------------------------------------------------------------ the text read
def python_texts(path, strings=True):
    """(line number, text) of each comment and docstring of a Python file, and each line of
    any other string that names a docs/ page (flag help and error messages send users there)
    unless `strings` is false (tests: their strings are test data)."""
    source = path.read_text()
    lines, texts = source.split('\n'), []
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            texts.append((token.start[0], token.string))
    tree = ast.parse(source, str(path))
    for node in ast.walk(tree):
        if (strings and isinstance(node, ast.Constant) and isinstance(node.value, str)
                and 'docs/' in node.value):  # flag help, messages: the source lines of the string
            texts += [(number, lines[number - 1]) for number in
                      range(node.lineno, node.end_lineno + 1) if 'docs/' in lines[number - 1]]
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(
                    getattr(body[0], 'value', None), ast.Constant) and isinstance(
                    body[0].value.value, str):
                first = body[0].lineno
                texts += [(first + offset, line)
                          for offset, line in enumerate(body[0].value.value.split('\n'))]
    return texts


def shell_texts(path):
    """(line number, comment) of each comment of a shell script."""
    texts = []
    for number, line in enumerate(path.read_text().split('\n'), 1):
        match = re.search(r'(?:^|\s)(#.*)$', line)
        if match and not line.startswith('#!'):
            texts.append((number, match.group(1)))
    return texts


def markdown_texts(path):
    return list(enumerate(path.read_text().split('\n'), 1))


def read_files():
    """{path relative to the checkout: [(line, text)]} of every file this test reads."""
    python = [*ROOT.glob('*.py'), *(ROOT / PACKAGE).rglob('*.py'), *ROOT.glob('tools/*.py'),
              *(ROOT / 'tests').rglob('*.py')]
    for package in ROOT_PACKAGES:
        python += (ROOT / package).glob('*.py')
    files = {path: python_texts(path, strings='tests' not in path.relative_to(ROOT).parts)
             for path in python}
    files.update({path: shell_texts(path) for path in ROOT.glob('tools/*.sh')})
    pages = [ROOT / 'README.md', ROOT / 'k8s' / 'README.md', *(ROOT / 'docs').rglob('*.md')]
    files.update({path: markdown_texts(path) for path in pages})
    return {str(path.relative_to(ROOT)): texts for path, texts in sorted(files.items())
            if '__pycache__' not in path.parts}


# ------------------------------------------------------------------------- finding the names
def clean(word):
    """The path part of a word: no #anchor, :line or trailing punctuation."""
    word = word.split('#')[0].split(':')[0]
    return word.rstrip('.,;)\'"`-')


def named_paths(text):
    """Repository paths (rules 1 and 2) named in one line of text."""
    text = _URL.sub(' ', text)
    found = []
    for match in _WORD.finditer(text):
        word = clean(match.group(1))
        end = match.end()
        if _PLACEHOLDER.search(word) or _PLACEHOLDER.match(text[end:end + 1] or ' '):
            continue
        first = word.split('/')[0]
        if first in TOP_LEVEL or (first in LAYERS and word.endswith('.py')):
            found.append(word)
    return found


def path_exists(word):
    """Whether `word` names a file or folder, a module without its `.py`, or a name written in
    a module (`engine/hooks.SummaryHook`): at the root, then for a sub-package name under
    efficientdet_hpu/."""
    bases = [ROOT] + ([ROOT / PACKAGE] if word.split('/')[0] in LAYERS else [])
    module, _, name = word.rpartition('.')
    for base in bases:
        if (base / word).exists() or (base / (word + '.py')).is_file():
            return True
        if module and '/' not in name and module_defines(base / (module + '.py'), name):
            return True
    return False


def link_targets(text):
    """Relative link targets (no URL, no bare #anchor) of one line of markdown."""
    targets = []
    for match in _LINK.finditer(text):
        target = match.group(1)
        if re.match(r'^[a-zA-Z][a-zA-Z0-9+.\-]*:', target) or target.startswith('#'):
            continue
        targets.append(target.split('#')[0].split('?')[0])
    return targets


def module_defines(path, name):
    """Whether the module or package at `path` (a .py file or a folder) writes `name`."""
    if path.is_dir():
        if (path / (name + '.py')).exists() or (path / name).is_dir():
            return True
        path = path / '__init__.py'
    return path.is_file() and re.search(r'\b%s\b' % re.escape(name), path.read_text())


def dotted_exists(dotted):
    """Whether efficientdet_hpu.a.b.c names a module, package or a name in one (rule 3)."""
    parts = dotted.split('.')
    base, index = ROOT / parts[0], 1
    while index < len(parts):
        if (base / parts[index]).is_dir():
            base = base / parts[index]
        elif (base / (parts[index] + '.py')).is_file():
            base = base / (parts[index] + '.py')
        else:
            break
        index += 1
    if index == len(parts):
        return True
    if base == ROOT / PACKAGE:
        return module_defines(base, parts[index])  # efficientdet_hpu.LAYERS
    return bool(module_defines(base, parts[index])) and index >= 2


def relative_module_exists(layer, name):
    """Whether `layer.name` names a module or package at the root's `layer/` or under
    efficientdet_hpu/`layer`/, or a name written in the latter's __init__.py (rule 4)."""
    return ((ROOT / layer / (name + '.py')).is_file() or (ROOT / layer / name).is_dir()
            or bool(module_defines(ROOT / PACKAGE / layer, name)))


def problems_in(name, texts):
    """'file:line: path' for each missing path named in `texts` of file `name`."""
    folder = (ROOT / name).parent
    problems = []
    for line, text in texts:
        for word in named_paths(text):
            if not path_exists(word):
                problems.append((name, line, word))
        for dotted in _DOTTED.findall(text):
            if not dotted_exists(dotted):
                problems.append((name, line, dotted))
        if name.endswith('.py'):
            for layer, module in _RELATIVE_DOTTED.findall(text):
                if module not in _FILE_EXTENSIONS and not relative_module_exists(layer, module):
                    problems.append((name, line, '%s.%s' % (layer, module)))
    if name.endswith('.md'):  # link text may span lines: read the page whole
        page = '\n'.join(text for _, text in texts)
        for match in _LINK.finditer(page):
            for target in link_targets(match.group(0)):
                if target and not (folder / target).exists():
                    problems.append((name, page.count('\n', 0, match.start()) + 1, target))
    return problems


# ----------------------------------------------------------------------------------- tests
def test_named_repository_paths_exist():
    problems = []
    for name, texts in read_files().items():
        problems += problems_in(name, texts)
    unexpected = sorted(p for p in problems if (p[0], p[2]) not in ALLOWED_MISSING)
    fixed = sorted(ALLOWED_MISSING - {(name, word) for name, _, word in problems})
    assert not unexpected, 'named but missing:\n' + '\n'.join(
        '%s:%d: %s' % problem for problem in unexpected)
    assert not fixed, 'ALLOWED_MISSING entries no longer missing (remove them):\n' + '\n'.join(
        '%s: %s' % entry for entry in fixed)


def test_rules_on_planted_text():
    words = named_paths('see docs/data.md#tiles, checkpoints/checkpoints.py:12 and '
                        '`config/recipe.py`; not runs/demo/eval, /tmp/docs/x.md, '
                        'https://github.com/google/automl/tree/master/docs/x.md, '
                        'docs/dev/*.md, tests/test_NNN.py, model_dir/eval/metrics-<step>.json')
    assert words == ['docs/data.md', 'checkpoints/checkpoints.py', 'config/recipe.py']
    assert path_exists('training/det_model_fn.py')  # efficientdet_hpu/training/, not training/
    assert path_exists('training/plot_curves.py')  # the root's training/
    assert not path_exists('training/automl_config.py')
    assert link_targets('[a](../README.md#x) [b](#here) [c](https://x.org/y.md)') == [
        '../README.md']
    assert problems_in('docs/x.md', [(1, 'see [a'), (2, 'page](no-such.md#y)')]) == [
        ('docs/x.md', 1, 'no-such.md')]
    assert dotted_exists('efficientdet_hpu.config.hparams_config.Config')
    assert dotted_exists('efficientdet_hpu.LAYERS')
    assert not dotted_exists('efficientdet_hpu.training.automl_config')
    assert relative_module_exists('core', 'cli')
    assert relative_module_exists('training', 'plot_curves')  # the root's training/
    assert not relative_module_exists('runtime', 'cli')
    assert problems_in('x.py', [(3, 'derive from runtime.cli.UserError, not config.image_size '
                                    'or analysis.txt')]) == [('x.py', 3, 'runtime.cli')]
