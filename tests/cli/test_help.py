"""Each command's --help, run as a user types it, lists that command's own flags with their
help, in its groups, and ends as absl ends it (core/command_help.py).

The commands are found, not listed: the checkout's command files (main.py, dataset/doctor.py,
... : the root thin modules that run a package module), the console scripts of
pyproject.toml, and `python -m` of each package module with an entry point. A new command is
checked as soon as it exists. Each one's --help runs once, in a process of its own with a
deadline; the flags it must show are the ones README.md and docs/*.md use on its command lines
(any spelling of the same command), so a flag the docs use but --help hides fails.
"""
import ast
import functools
import os
import re
import shlex
import subprocess
import sys

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # pytest's own dependency before 3.11, pinned in requirements/test.txt
    import tomli as tomllib

from cli_runs import REPO, run_process

HELP_SECONDS = 120  # One --help; a TensorFlow import takes ~5 s of it on 2 busy cores.
ABSL_LAST_LINE = 'Try --helpfull to get a list of all flags.'
ABSL_HELP_FLAGS = {'help', 'helpfull', 'helpshort', 'helpxml', 'flagfile', 'undefok'}
COMMAND_FOLDERS = ('.', 'dataset', 'training', 'benchmarks')
MODULE_PACKAGES = ('efficientdet_hpu/cli', 'efficientdet_hpu/datatools',
                   'efficientdet_hpu/benchmarks')
LAUNCHER = 'efficientdet_hpu.cli.demo_efficientdet'  # its own usage text, not absl's
TRAINER = 'efficientdet_hpu.cli.main'  # the launcher hands it the flags it does not read
# Modules whose --help imports no TensorFlow (checked below): their tests are not `slow`.
QUICK = {TRAINER, LAUNCHER, 'efficientdet_hpu.cli.finetune', 'efficientdet_hpu.cli.bench',
         'efficientdet_hpu.cli.inference',
         'efficientdet_hpu.datatools.synthetic_coco', 'efficientdet_hpu.datatools.voc_to_coco',
         'efficientdet_hpu.datatools.yolo_to_coco', 'efficientdet_hpu.benchmarks.profile_summary'}
PRINCIPAL_TRAINING_FLAGS = ('mode', 'model_dir', 'model_name', 'train_batch_size', 'hparams',
                            'training_file_pattern', 'validation_file_pattern',
                            'val_json_file', 'num_epochs', 'use_horovod')
_RUNS = re.compile(r"run_or_alias\(__name__, '([\w.]+)'\)")
_FLAG_LINE = re.compile(r'^  (?:-\S,)?--(\[no\])?([A-Za-z0-9_]+)(?=[: ]|$)', re.M)


# ------------------------------------------------------------------------- the commands
def _checkout_commands():
    """{('main.py',) or ('-m', 'dataset.doctor'): package module} of the root command files."""
    found = {}
    for folder in COMMAND_FOLDERS:
        for name in sorted(os.listdir(os.path.join(REPO, folder))):
            path = os.path.join(REPO, folder, name)
            if not name.endswith('.py') or not os.path.isfile(path):
                continue
            with open(path) as handle:
                target = _RUNS.search(handle.read())
            if target:
                words = (name,) if folder == '.' else ('-m', '%s.%s' % (folder, name[:-3]))
                found[words] = target.group(1)
    return found


def _console_scripts():
    with open(os.path.join(REPO, 'pyproject.toml'), 'rb') as handle:
        scripts = tomllib.load(handle)['project']['scripts']
    return {name: target.split(':')[0] for name, target in scripts.items()}


def _package_commands():
    """{('-m', module): module} of the package modules that run when started with -m."""
    found = {}
    for package in MODULE_PACKAGES:
        for name in sorted(os.listdir(os.path.join(REPO, package))):
            if not name.endswith('.py'):
                continue
            with open(os.path.join(REPO, package, name)) as handle:
                text = handle.read()
            if 'def entry_point' in text and "if __name__ == '__main__'" in text:
                module = '%s.%s' % (package.replace('/', '.'), name[:-3])
                found[('-m', module)] = module
    return found


CHECKOUT = _checkout_commands()
SCRIPTS = _console_scripts()
PACKAGE = _package_commands()
# (how a user types it, the package module whose entry point it runs)
COMMANDS = ([(' '.join(words), module) for words, module in CHECKOUT.items()]
            + sorted(SCRIPTS.items())
            + [(' '.join(words), module) for words, module in PACKAGE.items()])


def _module_of(typed):
    return dict(COMMANDS)[typed]


def _argv(typed):
    if typed in SCRIPTS:
        return [os.path.join(os.path.dirname(sys.executable), typed), '--help']
    return [sys.executable, *typed.split(), '--help']


@functools.lru_cache(maxsize=None)
def run_help(typed):
    """(exit status, stdout, names of the modules imported) of `<typed> --help`, run once."""
    env = dict(os.environ, PYTHONPATH=REPO)  # a console script runs this checkout's code
    if _module_of(typed) in QUICK:  # the modules it imports, on stderr
        env['PYTHONPROFILEIMPORTTIME'] = '1'
    result = run_process(_argv(typed), HELP_SECONDS, env=env, stderr=subprocess.PIPE)
    imported = set(re.findall(r'^import time:\s+\d+ \|\s+\d+ \|\s+(\S+)$', result.stderr, re.M))
    other = '\n'.join(line for line in result.stderr.splitlines()
                      if not line.startswith('import time:'))
    assert 'Traceback' not in other, '%s --help:\n%s' % (typed, other[-3000:])
    return result.returncode, result.stdout, frozenset(n.strip() for n in imported)


def listed_flags(text):
    """{name: is boolean ([no] form)} of the flag lines of a --help output."""
    return {match.group(2): bool(match.group(1)) for match in _FLAG_LINE.finditer(text)}


def docstring_first_line(module):
    path = os.path.join(REPO, *module.split('.')) + '.py'
    with open(path) as handle:
        return ast.get_docstring(ast.parse(handle.read())).strip().split('\n')[0]


# --------------------------------------------------------------------- what the docs use
def _doc_texts():
    names = ['README.md'] + ['docs/' + n for n in sorted(os.listdir(os.path.join(REPO, 'docs')))
                             if n.endswith('.md')]
    for name in names:
        with open(os.path.join(REPO, name)) as handle:
            yield name, handle.read()


def _command_texts(markdown):
    """The text of each fenced block line (continuations joined) and of each inline code span."""
    texts, inside = [], False
    for line in re.sub(r'\\\n\s*', ' ', markdown).split('\n'):
        if line.lstrip().startswith(('```', '~~~')):
            inside = not inside
        elif inside:
            texts.append(line)
        else:
            texts += re.findall(r'`([^`]+)`', line)
    return texts


def _spellings():
    """{first word(s) of a command as docs write it: package module}."""
    spellings = {words[-1] if words[0] == '-m' else words[0]: module
                 for words, module in CHECKOUT.items()}
    spellings.update(SCRIPTS)
    spellings.update({words[1]: module for words, module in PACKAGE.items()})
    return spellings


def _words(text):
    try:
        return shlex.split(text, comments=True)
    except ValueError:  # an unbalanced quote in prose
        return text.split()


@functools.lru_cache(maxsize=None)
def documented_flags():
    """{module: {flag: (where, after a bare `--`)}} of the flags on the docs' command lines of
    each command, in any of its spellings."""
    spellings, found = _spellings(), {}
    for name, markdown in _doc_texts():
        for text in _command_texts(markdown):
            module, after_separator = None, False
            for word in _words(text):
                word = word.strip('[]()')
                bare = os.path.normpath(word) if word.endswith('.py') else word
                if bare in spellings:
                    module, after_separator = spellings[bare], False
                elif word in ('|', '||', '&&', ';', '&') or word.startswith(('>', '2>')):
                    module = None
                elif module and word == '--':
                    after_separator = True
                elif module and re.match(r'--[A-Za-z]', word):
                    flag = re.match(r'--([A-Za-z0-9_]+)', word).group(1)
                    found.setdefault(module, {}).setdefault(flag, (name, after_separator))
    return found


def accepts(listed, flag):
    return flag in listed or (flag.startswith('no') and listed.get(flag[2:]) is True)


# ------------------------------------------------------------------------------- tests
def _marked(typed, module):
    marks = [] if module in QUICK else [pytest.mark.slow]
    return pytest.param(typed, module, id=typed.replace(' ', '_'), marks=marks)


@pytest.mark.parametrize('typed,module', [_marked(t, m) for t, m in COMMANDS])
def test_help_lists_the_commands_own_flags_and_the_ones_its_docs_use(typed, module):
    status, text, imported = run_help(typed)
    listed = listed_flags(text)
    if module == LAUNCHER:  # Its own usage text; the flags it forwards are main.py's.
        assert status == 0 and text.startswith('usage:'), (typed, status, text[-2000:])
        forwarded = listed_flags(run_help('main.py')[1])
    else:
        assert status == 0 and text.rstrip().endswith(ABSL_LAST_LINE), (typed, status, text[-800:])
        assert text.startswith(docstring_first_line(module)), (typed, text[:500])
        assert '\nflags:\n' in text and listed, (typed, text[-2000:])
        assert 'logtostderr' not in listed, ('%s --help lists every module\'s flags; it should '
                                             'list its own' % typed, text[-2000:])
        forwarded = {}
    hidden = ['--%s (%s)' % (flag, where)
              for flag, (where, after_separator) in documented_flags().get(module, {}).items()
              if flag not in ABSL_HELP_FLAGS
              and not (accepts(forwarded, flag) if after_separator
                       else accepts(listed, flag) or accepts(forwarded, flag))]
    assert not hidden, '%s --help does not list flags the docs use: %s\n%s' % (
        typed, ', '.join(hidden), text[-3000:])
    if module in QUICK:  # (the import list was read: absl is in it)
        assert 'absl' in imported and 'tensorflow' not in imported, (
            '%s --help imports TensorFlow: import it where the command runs, or take the '
            'module out of QUICK' % typed)


def test_the_docs_use_flags_of_the_principal_commands():
    """The check above has something to check: the docs' command lines were read."""
    used = documented_flags()
    for module in (TRAINER, 'efficientdet_hpu.cli.inference', 'efficientdet_hpu.cli.bench',
                   'efficientdet_hpu.datatools.create_coco_tfrecord', LAUNCHER):
        assert len(used.get(module, ())) >= 3, (module, used.get(module))
    assert {'model_dir', 'training_file_pattern'} <= set(used[TRAINER])


@pytest.mark.parametrize('typed', ['main.py', 'efficientdet-train',
                                   '-m efficientdet_hpu.cli.main'])
def test_training_help_shows_its_principal_flags_with_their_help_in_groups(typed):
    _, text, _ = run_help(typed)
    listed = listed_flags(text)
    missing = [flag for flag in PRINCIPAL_TRAINING_FLAGS if flag not in listed]
    assert not missing, (missing, text)
    # The help of a flag, not only its name: its text, default and type, as absl shows them.
    assert ("--train_batch_size: Training images per rank (per card); the global batch is this "
            "times the number of ranks. (default: '64') (an integer)") in ' '.join(text.split())
    # main.py's own flags first, headed by the command as absl heads a main module's flags,
    # then the Habana/automl ones of config/legacy_flags.py.
    headers = re.findall(r'^(\S.*):$', text.split('\nflags:\n', 1)[1], re.M)
    assert len(headers) == 2 and headers[0].endswith(('main.py', 'efficientdet-train')), headers
    assert headers[1] == 'efficientdet_hpu.config.legacy_flags', headers
    legacy = text.index('\nefficientdet_hpu.config.legacy_flags:\n')
    assert text.index('\n  --mode:') < legacy < text.index('\n  --[no]use_horovod:')
    assert legacy < text.index('\n  --[no]use_tpu:') < text.index(ABSL_LAST_LINE)


def test_inference_help_groups_the_flags_by_subcommand():
    _, text, _ = run_help('inference.py')
    common = text.index('\ninference.py:\n')
    export = text.index('\ninference.py export:\n')
    predict = text.index('\ninference.py predict:\n')
    assert common < text.index('\n  --model_dir:') < export < predict
    for flag in ('export_dir', 'formats', 'calibration_count'):
        assert export < text.index('\n  --%s:' % flag) < predict, flag
    for flag in ('input', 'output_dir', 'saved_model', 'tile_size'):
        assert predict < text.index('\n  --%s:' % flag), flag
    assert text.count('\n  --model_dir:') == 1  # a flag of both is listed once


def test_bench_help_lists_a_flag_under_each_subcommand_it_serves():
    _, text, _ = run_help('bench.py')
    groups = dict(re.findall(r'\n(bench\.py[\w ]*):\n((?:  .*\n|    .*\n)+)', text))
    assert list(groups) == ['bench.py', 'bench.py train', 'bench.py infer', 'bench.py input',
                            'bench.py suite', 'bench.py coco_eval', 'bench.py train_and_eval',
                            'bench.py finetune_costs', 'bench.py finetune_suite',
                            'bench.py review_planted']
    serving = {title.split()[-1] for title, body in groups.items() if '--image_size:' in body}
    assert serving == {'infer', 'input', 'train_and_eval'}
    assert '--model_name:' in groups['bench.py'] and '--output:' in groups['bench.py suite']


@pytest.mark.parametrize('typed, said', [
    ('bench.py finetune_suit', "bench.py: error: no command 'finetune_suit' (did you mean "
                               "finetune_suite?); the commands are train, infer, input, suite, "
                               "coco_eval, train_and_eval, finetune_costs, finetune_suite, "
                               "review_planted"),
    ('inference.py predic', "inference.py: error: no command 'predic' (did you mean predict?); "
                            "the commands are export, predict"),
    ('inference.py serve', "inference.py: error: no command 'serve'; the commands are export, "
                           "predict")], ids=['bench-typo', 'inference-typo', 'inference-other'])
def test_an_unknown_command_is_one_line_with_the_closest_and_exit_2(typed, said):
    result = run_process([sys.executable] + typed.split(), 120)
    assert (result.returncode, result.stdout.strip()) == (2, said), result.stdout[-2000:]


@pytest.mark.slow  # model_inspect imports TensorFlow
def test_model_inspect_help_shows_automl_run_mode_flags_as_their_group():
    _, text, _ = run_help('model_inspect.py')
    group = text.index('\nefficientdet_hpu.cli.inspect_modes:\n')
    assert text.index('\n  --model_name:') < group < text.index('\n  --runmode:')
