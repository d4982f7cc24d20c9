"""The documentation's commands and links still match the code.

Read: README.md, docs/**/*.md and k8s/README.md: the fenced code blocks labelled bash, sh, shell
or console, or unlabelled (```text, ```yaml, ```json, ```python blocks are not read), and the
links of the prose.

Which lines are commands:
  1. a line ending in a backslash is joined with the next one;
  2. in a block where some line starts with a `$ ` prompt, only those lines are commands (the
     prompt is dropped): the other lines are their output;
  3. blank lines and lines starting with `#` are skipped; a ` # comment` after a command is
     dropped (shell rules, shlex);
  4. after leading `NAME=value` environment assignments, the first word decides: a Python
     interpreter (`python`, `python3`, `.venv/bin/python`, any path ending in `/python...`,
     `$PYTHON`), `mpirun` (its own flags are skipped up to the first interpreter word) or
     `make`. A line starting with any other word is not checked: other programs (`kubectl`,
     `pip`) and program output (`main.py: error: ...`, log lines, tables), which never starts
     with a command word;
  5. usage-synopsis brackets are optional arguments (`[--flag=x]` is `--flag=x`); `<...>`, `|`
     and `...` are placeholders.

What is checked:
  - `python X.py`: X.py exists in the repository; `python -m a.b`: a/b.py or a/b/__main__.py
    exists, unless `a` is an installed tool that is not in the repository (`python -m pytest`);
  - for the entry points users type (main.py, demo_efficientdet.py, inference.py, bench.py,
    model_inspect.py, finetune.py, review.py and the `dataset.*`, `training.*`, `benchmarks.*` tools): every
    `--flag`, `--flag=value` or `--noflag` (a boolean) after the script is a flag the entry
    point defines, and a first bare word (`inference.py export`, `bench.py infer`) is one of
    its subcommands. The flags are what the entry point prints for `--helpfull` (absl; `--help`
    for argparse), run from the repository root with this interpreter, so the check does not
    depend on where the code lives. demo_efficientdet.py reads its own flags (its `--help`) and
    forwards every other one to main.py: a flag on a launcher line may be either's, and after a
    bare `--` it is main.py's;
  - `make X`: X is a target of the Makefile;
  - a relative link `[text](path)` outside code points to an existing file, and a `#anchor`
    into a markdown file names one of its headings (GitHub's heading ids);
  - README.md starts with the two set-up commands, links every docs/ page and is at most
    12 KB (README_LIMIT bytes): detail goes to the pages;
  - the Kubernetes command of README.md and k8s/README.md, run as written up to `kubectl`, gives
    the manifest with the image it names and nothing else changed (envsubst).

User pages say what is (README.md, k8s/README.md and docs/*.md outside docs/dev/, which holds
history and lab notes with their dates); in their prose (fenced blocks are program output and
are not read):
  - no issue or pull-request number (`issue 32`, `issue #32`, `PR 7`): the commit log has those;
  - a date (YYYY-MM-DD) only in a measurement stamp, the fixed form, on one line, that ends
    the sentence of a measured number: `(` + the command in backticks (a few words after it
    may say how it ran) + `, ` + a machine named in the table of docs/benchmarks.md#machines
    + `, ` + the date + `)`, e.g. "(`make demo`, 2-core EPYC AVX-512, 2026-11-27)". A dated
    sentence that is not a measurement ("on 2026-11-26 the code changed ...") has no such
    stamp and fails. The pages
    `make bench` writes (docs/benchmarks-<host>.md) keep the header line it writes
    (`Measured <date> <time> by `make bench``);
  - none of the lab-notebook phrases of LAB_NOTES ("this session", "the aim of", "(was ...)",
    "the code before", ...), each with why.
"""

import contextlib
import dataclasses
import hashlib
import importlib.util
import os
import pathlib
import re
import shlex
import shutil
import subprocess
import sys

import pytest
import yaml

from cli_runs import kill_group, run_process, started

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOC_FILES = sorted([ROOT / 'README.md', *(ROOT / 'docs').rglob('*.md'), ROOT / 'k8s' / 'README.md'])
COMMAND_LANGUAGES = {'', 'bash', 'sh', 'shell', 'console'}
# Entry points whose flags are checked; each prints its flags for --helpfull and exits.
FLAG_CHECKED_SCRIPTS = {'main.py', 'demo_efficientdet.py', 'inference.py', 'bench.py',
                        'model_inspect.py', 'finetune.py', 'review.py'}
FLAG_CHECKED_PACKAGES = {'dataset', 'training', 'benchmarks'}
# The launcher reads its own flags and hands every other argument to main.py.
FORWARDS_TO = {'demo_efficientdet.py': 'main.py'}
# (file, command words joined by spaces) of command lines that are deliberately wrong, each
# with the reason. Empty: the error examples of docs/troubleshooting.md are program output
# (`main.py: error: ...`), which rule 4 already skips.
ALLOWED_WRONG = {}

_INTERPRETER = re.compile(r'(?:^|/)python[0-9.]*$|^\$\{?PYTHON\}?$')
_ENV_ASSIGNMENT = re.compile(r'^[A-Za-z_][A-Za-z0-9_]*=')
_ABSL_FLAG_LINE = re.compile(r'^  (?:-\S+,)?--(\[no\])?([A-Za-z0-9_.\-]+):')
_ARGPARSE_FLAG = re.compile(r'(?:^|[\s,\[])--([A-Za-z0-9][A-Za-z0-9_\-]*)')
_LAUNCHER_FLAG_LINE = re.compile(r'^\s+--([A-Za-z0-9_]+)( [A-Z]+)?\s{2,}')
_SUBCOMMANDS = re.compile(r'usage: \S+ \{([A-Za-z0-9_,\-]+)\}')
_BARE_WORD = re.compile(r'^[a-z][a-z0-9_]*$')
_NO_SUCH_COMMAND = '__docs_check_no_such_command__'


# ---------------------------------------------------------------------------- reading docs
@dataclasses.dataclass
class Command:
    where: str    # 'docs/data.md:12'
    words: list   # shell words without the environment assignments; [] if not valid shell
    text: str     # the joined line as written
    error: str = ''


def code_blocks(text):
    """(language, number of the first line, lines) of each fenced block."""
    blocks, lines, index = [], text.split('\n'), 0
    while index < len(lines):
        opening = re.match(r'^\s*(```+|~~~+)\s*([\w+-]*)', lines[index])
        index += 1
        if not opening:
            continue
        start, body = index + 1, []
        while index < len(lines) and not lines[index].strip().startswith(opening.group(1)):
            body.append(lines[index])
            index += 1
        blocks.append((opening.group(2).lower(), start, body))
        index += 1
    return blocks


def joined_lines(start, body):
    """(line number, line) with backslash continuations joined."""
    joined, number = [], 0
    while number < len(body):
        first, line = number, body[number]
        while line.endswith('\\') and number + 1 < len(body):
            number += 1
            line = line[:-1] + ' ' + body[number].strip()
        joined.append((start + first, line))
        number += 1
    return joined


def is_command_word(word):
    return bool(_INTERPRETER.search(word)) or word in ('mpirun', 'make')


def commands_in_markdown(text, name):
    """The command lines of `text` (a markdown file called `name`) by the module's rule."""
    commands = []
    for language, start, body in code_blocks(text):
        if language not in COMMAND_LANGUAGES:
            continue
        prompted = any(line.startswith('$ ') for line in body)
        for number, line in joined_lines(start, body):
            if prompted and not line.startswith('$ '):
                continue
            line = line[2:].strip() if prompted else line.strip()
            first = [word for word in line.split() if not _ENV_ASSIGNMENT.match(word)][:1]
            if line.startswith('#') or not first or not is_command_word(first[0]):
                continue
            where = '%s:%d' % (name, number)
            try:
                words = shlex.split(line, comments=True)
            except ValueError as error:
                commands.append(Command(where, [], line, 'not a valid shell line: %s' % error))
                continue
            while words and _ENV_ASSIGNMENT.match(words[0]):
                words = words[1:]
            commands.append(Command(where, words, line))
    return commands


def all_commands():
    commands = []
    for path in DOC_FILES:
        commands += commands_in_markdown(path.read_text(), str(path.relative_to(ROOT)))
    return commands


# ------------------------------------------------------------------------ reading commands
@dataclasses.dataclass
class PythonCall:
    kind: str     # 'script' or 'module'
    target: str   # 'main.py', 'dataset.doctor'
    args: list

    @property
    def entry_point(self):
        """The key of an entry point whose flags are checked ('main.py', 'dataset.doctor')."""
        if self.kind == 'script':
            path = os.path.normpath(self.target)
            return path if path in FLAG_CHECKED_SCRIPTS else None
        return self.target if self.target.split('.')[0] in FLAG_CHECKED_PACKAGES else None


def python_call(words):
    """The script or module a command's words run, or None (make, or no Python)."""
    if words[:1] == ['mpirun']:
        words = words[next((i for i, w in enumerate(words) if _INTERPRETER.search(w)), 0):]
    if not words or not _INTERPRETER.search(words[0]):
        return None
    index = 1
    while index < len(words) and words[index].startswith('-') and words[index] != '-m':
        index += 1  # interpreter options (-u, -B, ...)
    if index >= len(words) or (words[index] == '-m' and index + 1 >= len(words)):
        return None
    if words[index] == '-m':
        return PythonCall('module', words[index + 1], words[index + 2:])
    return PythonCall('script', words[index], words[index + 1:])


def clean_word(word):
    """A synopsis word without its optional-argument brackets: '[--x=1]' -> '--x=1'."""
    return word.lstrip('[').rstrip(']')


def flag_words(args):
    """(flag name, whether after a bare '--') of each --flag, --flag=value, --noflag."""
    flags, after_separator = [], False
    for word in map(clean_word, args):
        if word == '--':
            after_separator = True
        elif word.startswith('--') and len(word) > 2:
            flags.append((word[2:].split('=', 1)[0], after_separator))
    return flags


def subcommand_word(args):
    first = clean_word(args[0]) if args else ''
    return first if _BARE_WORD.match(first) else None


def missing_file(call):
    """Why the script or module of `call` is not in the repository, or None."""
    if call.kind == 'script':
        found = (ROOT / call.target).is_file()
        return None if found else 'python %s: no such file in the repository' % call.target
    parts = call.target.split('.')
    base = ROOT.joinpath(*parts)
    if base.with_suffix('.py').is_file() or (base / '__main__.py').is_file():
        return None
    in_repository = (ROOT / parts[0]).exists() or (ROOT / (parts[0] + '.py')).exists()
    if not in_repository and importlib.util.find_spec(parts[0]) is not None:
        return None  # an installed tool, not this project's: python -m pytest
    return 'python -m %s: no %s.py or %s/__main__.py in the repository' % (
        call.target, '/'.join(parts), '/'.join(parts))


# ------------------------------------------------------------------ what entry points take
@dataclasses.dataclass
class EntryPoint:
    flags: set
    booleans: set
    subcommands: set = None  # None: takes none, or did not say

    def accepts(self, name):
        return name in self.flags or (name.startswith('no') and name[2:] in self.booleans)


def parse_help(text, line_pattern, boolean_group_is_marker):
    flags, booleans = set(), set()
    for line in text.split('\n'):
        match = line_pattern.match(line)
        if match:
            name, marker = (match.group(2), match.group(1)) if boolean_group_is_marker else (
                match.group(1), not match.group(2))
            flags.add(name)
            if marker:
                booleans.add(name)
    return flags, booleans


def run_all(argvs):
    """Runs the command lines at once from the repository root; their output by argv."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL='3', PYTHONDONTWRITEBYTECODE='1')
    outputs = {}
    with contextlib.ExitStack() as stack:
        processes = {argv: stack.enter_context(started(argv, cwd=ROOT, env=env,
                                                       stdout=subprocess.PIPE,
                                                       stderr=subprocess.STDOUT))
                     for argv in argvs}
        for argv, process in processes.items():
            try:
                outputs[argv] = process.communicate(timeout=300)[0]
            except subprocess.TimeoutExpired:
                kill_group(process)
                outputs[argv] = process.communicate(timeout=30)[0]
    return outputs


def command_line(key, *args):
    return (sys.executable, key, *args) if key.endswith('.py') else (
        sys.executable, '-m', key, *args)


def learn_entry_points(keys, with_subcommands):
    """Flags (--helpfull; the launcher's --help) and, for `with_subcommands`, subcommands
    (the usage error for an unknown one lists them) of every entry point of `keys`."""
    keys = set(keys) | {FORWARDS_TO[key] for key in set(keys) & set(FORWARDS_TO)}
    help_lines = {key: command_line(key, '--help' if key in FORWARDS_TO else '--helpfull')
                  for key in keys}
    usage_lines = {key: command_line(key, _NO_SUCH_COMMAND) for key in with_subcommands}
    outputs = run_all([*help_lines.values(), *usage_lines.values()])
    found = {}
    for key in sorted(keys):
        text = outputs[help_lines[key]]
        flags, booleans = parse_help(text, _ABSL_FLAG_LINE, True)
        if key in FORWARDS_TO:  # the launcher's own usage text, absl's if it becomes absl
            launcher_flags, launcher_booleans = parse_help(text, _LAUNCHER_FLAG_LINE, False)
            flags, booleans = flags | launcher_flags, booleans | launcher_booleans
        if not flags:  # not absl: argparse's --help
            text = run_all([command_line(key, '--help')])[command_line(key, '--help')]
            flags, booleans = set(_ARGPARSE_FLAG.findall(text)), set()
        assert flags, '%s printed no flags:\n%s' % (' '.join(help_lines[key]), text[-3000:])
        match = _SUBCOMMANDS.search(outputs.get(usage_lines.get(key), ''))
        found[key] = EntryPoint(flags, booleans, set(match.group(1).split(',')) if match else None)
    return found


# ---------------------------------------------------------------------------------- checks
def makefile_targets():
    targets = set()
    for line in (ROOT / 'Makefile').read_text().split('\n'):
        match = re.match(r'^([A-Za-z0-9_.\-/ ]+?)\s*::?(?!=)', line)
        if match and not line.startswith(('\t', '.')):
            targets.update(match.group(1).split())
    return targets


def check_flags(call, entry_points):
    key = call.entry_point
    entry, forwarded = entry_points[key], entry_points.get(FORWARDS_TO.get(key))
    problems = []
    subcommand = subcommand_word(call.args)
    if subcommand and entry.subcommands is not None and subcommand not in entry.subcommands:
        problems.append('%s has no subcommand %r (it takes: %s)' % (
            key, subcommand, ', '.join(sorted(entry.subcommands))))
    for name, after_separator in flag_words(call.args):
        readers = [forwarded] if after_separator else [entry, forwarded]
        if not any(reader is not None and reader.accepts(name) for reader in readers):
            owner = key if forwarded is None else '%s or %s' % (key, FORWARDS_TO[key])
            problems.append('--%s is not a flag of %s' % (name, owner))
    return problems


def check_make(words, targets):
    return ['make %s: no such target in the Makefile (targets: %s)' % (
                word, ', '.join(sorted(targets)))
            for word in words[1:] if not word.startswith('-') and not _ENV_ASSIGNMENT.match(word)
            and word not in targets]


def check_commands(commands, entry_points, kinds=('shell', 'file', 'flag', 'make')):
    """'where: problem' for every problem of `commands` of the given kinds."""
    problems, targets = [], makefile_targets()
    for command in commands:
        found = {'shell': [command.error] if command.error else []}
        if command.words[:1] == ['make']:
            found['make'] = check_make(command.words, targets)
        call = python_call(command.words) if command.words else None
        if call:
            found['file'] = [missing_file(call)] if missing_file(call) else []
            if not found['file'] and call.entry_point and entry_points is not None:
                found['flag'] = check_flags(call, entry_points)
        if (command.where.rsplit(':', 1)[0], ' '.join(command.words)) in ALLOWED_WRONG:
            continue
        problems += ['%s: %s\n    %s' % (command.where, problem, command.text)
                     for kind in kinds for problem in found.get(kind, [])]
    return problems


def needed_entry_points(commands):
    """The entry points the commands use, and those shown with a subcommand."""
    keys, with_subcommands = set(), set()
    for command in commands:
        call = python_call(command.words) if command.words else None
        if call and call.entry_point and not missing_file(call):
            keys.add(call.entry_point)
            if subcommand_word(call.args):
                with_subcommands.add(call.entry_point)
    return keys, with_subcommands


def without_code(text, inline=True):
    """`text` without fenced blocks (kept as empty lines), and without inline code spans
    unless `inline` is false: a link there is code."""
    kept, fence = [], None
    for line in text.split('\n'):
        opening = re.match(r'^\s*(```+|~~~+)', line)
        if fence is None and opening:
            fence = opening.group(1)
        elif fence is not None and line.strip().startswith(fence):
            fence = None
        kept.append('' if fence is not None or opening else line)
    prose = '\n'.join(kept)
    return re.sub(r'(`+)(?:(?!\1).)+?\1', '', prose, flags=re.S) if inline else prose


def relative_links(text):
    """(line number, target) of each [text](target) that is not a URL."""
    prose, links = without_code(text), []
    for match in re.finditer(r'!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+"[^"]*")?\s*\)', prose):
        if not re.match(r'^[a-zA-Z][a-zA-Z0-9+.\-]*:', match.group(1)):
            links.append((prose.count('\n', 0, match.start()) + 1, match.group(1)))
    return links


def heading_ids(text):
    """GitHub's ids of the headings of a markdown text."""
    ids, seen = set(), {}
    for line in without_code(text, inline=False).split('\n'):
        match = re.match(r'^#{1,6}\s+(.*?)\s*#*\s*$', line)
        if match:
            title = re.sub(r'\[([^\]]*)\]\([^)]*\)', r'\1', match.group(1)).lower()
            slug = re.sub(r'[^\w\- ]', '', title).replace(' ', '-')
            ids.add(slug if slug not in seen else '%s-%d' % (slug, seen[slug]))
            seen[slug] = seen.get(slug, 0) + 1
    return ids


def check_links(path, text):
    problems = []
    for line, target in relative_links(text):
        file_part, _, anchor = target.partition('#')
        resolved = (path.parent / file_part.split('?')[0]).resolve() if file_part else path
        where = '%s:%d' % (path.relative_to(ROOT) if path.is_relative_to(ROOT) else path, line)
        if not resolved.exists():
            problems.append('%s: link to %s: no such file' % (where, target))
        elif (anchor and resolved.suffix == '.md'
              and anchor not in heading_ids(resolved.read_text())):
            problems.append('%s: link to %s: %s has no heading with that id' % (
                where, target, resolved.name))
    return problems


# ----------------------------------------------------------------------------------- tests
def code_fingerprint():
    """A hash of the interpreter and every Python file of the project outside tests/ (and
    outside .git and the virtual environments, .venv, .venv310, which are not walked)."""
    digest = hashlib.sha256(sys.executable.encode())
    paths = []
    for directory, subdirectories, names in os.walk(ROOT):
        if pathlib.Path(directory) == ROOT:
            subdirectories[:] = [name for name in subdirectories
                                 if not name.startswith('.venv') and name not in ('.git', 'tests')]
        subdirectories[:] = [name for name in subdirectories if name != '__pycache__']
        paths += [pathlib.Path(directory, name) for name in names if name.endswith('.py')]
    for path in sorted(paths):
        digest.update(str(path.relative_to(ROOT)).encode() + b'\0' + path.read_bytes() + b'\0')
    return digest.hexdigest()


@pytest.fixture(scope='module')
def commands():
    found = all_commands()
    assert len(found) > 20, 'the command rule found almost no commands: %s' % found
    return found


@pytest.fixture(scope='module')
def entry_points(commands, request):
    """Flags and subcommands of the entry points the docs use (and main.py), learnt once.

    That starts ~10 processes importing TensorFlow (20-40 s on 2 cores), so the result is
    kept in pytest's cache (.pytest_cache) under a hash of the project's Python files: any
    code change learns them again.
    """
    keys, with_subcommands = needed_entry_points(commands)
    keys.add('main.py')
    cache = getattr(request.config, 'cache', None)
    fingerprint = '%s %s %s' % (code_fingerprint(), sorted(keys), sorted(with_subcommands))
    cached = cache.get('test_docs/entry_points', {}) if cache else {}
    if cached.get('fingerprint') == fingerprint:
        return {key: EntryPoint(set(flags), set(booleans), subs and set(subs))
                for key, (flags, booleans, subs) in cached['entry_points'].items()}
    found = learn_entry_points(keys, with_subcommands)
    if cache:
        cache.set('test_docs/entry_points', {'fingerprint': fingerprint, 'entry_points': {
            key: [sorted(e.flags), sorted(e.booleans), e.subcommands and sorted(e.subcommands)]
            for key, e in found.items()}})
    return found


def test_commands_run_existing_scripts_and_modules(commands):
    problems = check_commands(commands, None, kinds=('shell', 'file'))
    assert not problems, '\n'.join(problems)


@pytest.mark.slow  # Starts Python processes that import TensorFlow.
def test_flags_and_subcommands_are_defined(commands, entry_points):
    problems = check_commands(commands, entry_points, kinds=('flag',))
    assert not problems, '\n'.join(problems)


def test_make_targets_exist(commands):
    assert {'demo', 'test'} <= makefile_targets()
    problems = check_commands(commands, None, kinds=('make',))
    assert not problems, '\n'.join(problems)


def test_relative_links_and_anchors_resolve():
    problems = []
    for path in DOC_FILES:
        problems += check_links(path, path.read_text())
    assert not problems, '\n'.join(problems)


def test_readme_starts_with_the_two_setup_commands_and_links_every_page():
    text = (ROOT / 'README.md').read_text()
    language, _, body = code_blocks(text)[0]
    assert language == 'bash'
    assert [line.split()[:2] for line in body] == [['make', 'demo'], ['make', 'test']]
    preamble = text.split('```')[0].strip().split('\n')
    assert len(preamble) == 1 and preamble[0].startswith('# '), preamble
    linked = {target.split('#')[0] for _, target in relative_links(text)}
    pages = {'docs/%s' % path.name for path in (ROOT / 'docs').glob('*.md')}
    assert not pages - linked, 'README.md does not link %s' % sorted(pages - linked)


PLANTED = '''
Some prose with [a good link](README.md) and [a bad one](docs/no-such-page.md).

```bash
python main.py --mode=train --no_such_flag=3 \\
    --model_dir=/tmp/x   # a comment with --flag_in_a_comment
python no_such_script.py --x=1
python -m dataset.no_such_tool
MULTI_HLS_IPS=1.2.3.4 python demo_efficientdet.py --use_horovod 8 --dry_run --nouse_amp \\
    -- --hls_type=HLS1
mpirun -np 2 --allow-run-as-root -x PATH $PYTHON main.py --use_horovod --nodeterministic
make no_such_target
python -m pytest -q tests/project/test_docs.py
```

```
main.py: error: this is output, --not_a_flag is fine here
```
'''


@pytest.mark.slow  # Starts Python processes that import TensorFlow.
def test_checker_catches_planted_mistakes(entry_points, tmp_path):
    commands = commands_in_markdown(PLANTED, 'planted.md')
    assert [command.words[0] for command in commands] == [
        'python', 'python', 'python', 'python', 'mpirun', 'make', 'python']
    problems = check_commands(commands, entry_points)
    text = '\n'.join(problems)
    assert 'planted.md:5: --no_such_flag is not a flag of main.py' in text
    assert 'planted.md:7: python no_such_script.py: no such file' in text
    assert 'planted.md:8: python -m dataset.no_such_tool: no dataset/no_such_tool.py' in text
    # --hls_type is the launcher's: after `--` it goes to main.py, which does not define it.
    assert 'planted.md:9: --hls_type is not a flag of demo_efficientdet.py or main.py' in text
    assert 'planted.md:12: make no_such_target: no such target' in text
    # Not problems: the comment's flag, mpirun's flags, --nouse_amp, --use_horovod, pytest.
    assert len(problems) == 5, text

    page = tmp_path / 'page.md'
    page.write_text('# A page\n')
    assert check_links(page, PLANTED.replace('README.md', 'page.md')) == [
        '%s:2: link to docs/no-such-page.md: no such file' % page]
    assert check_links(page, '[x](page.md#a-page) [y](#no-such-heading)') == [
        '%s:1: link to #no-such-heading: page.md has no heading with that id' % page]


def test_rule_details():
    assert heading_ids('# Preparing data: COCO or your own export → TFRecords\n'
                       '## What `make demo` does\n## A\n## A') == {
        'preparing-data-coco-or-your-own-export--tfrecords', 'what-make-demo-does', 'a', 'a-1'}
    console = '```console\n$ python bench.py train --x\nstep 1 python main.py --y\n```\n'
    assert [c.words for c in commands_in_markdown(console, 'c.md')] == [
        ['python', 'bench.py', 'train', '--x']]
    call = python_call(['.venv/bin/python', '-u', 'inference.py', 'export', '[--formats=a]'])
    assert (call.kind, call.entry_point, subcommand_word(call.args)) == (
        'script', 'inference.py', 'export')
    assert flag_words(call.args) == [('formats', False)]


# ------------------------------------------------------------------------ pages say what is
README_LIMIT = 12 * 1024  # bytes: the README routes; the pages hold the detail.
MACHINES_PAGE = ROOT / 'docs' / 'benchmarks.md'
_ISSUE_REFERENCE = re.compile(r'\b(?:issues?|PR|pull requests?)\s*#?\s*\d+\b', re.I)
_DATE = re.compile(r'(?<![\d-])\d{4}-\d{2}-\d{2}(?![\d-])')
_STAMP = re.compile(r'\(`[^`\n]+`[^(),`\n]*, ([^()`,\n]+), (\d{4}-\d{2}-\d{2})\)')
_GENERATED_PAGE = re.compile(r'^benchmarks-[\w.-]+\.md$')  # what `make bench` writes
_GENERATED_HEADER = re.compile(r'^Measured \d{4}-\d{2}-\d{2} \d{2}:\d{2} by `make bench`')
# (pattern, why it is a lab note and not a fact about the code), matched case-insensitively.
LAB_NOTES = (
    (r'\bthis session\b', "a session is the writer's, not the reader's"),
    (r'\bthe aim of\b', 'an aim is a plan: the page says what the code does'),
    (r'\((?:was|were) [^)]*\)', 'a former value is history'),
    (r'\bthe code before\b|\bbefore (?:this|the) (?:change|fix|commit)\b',
     'a comparison with former code is history'),
    (r'\bfrom here\b', "the writer's machine is not the reader's"),
)


def user_pages():
    """README.md, k8s/README.md and docs/*.md outside docs/dev/."""
    return [path for path in DOC_FILES if ROOT / 'docs' / 'dev' not in path.parents]


def machines(text):
    """The machine names of the `## Machines` table of a page: its rows' first cells."""
    section = re.search(r'^## Machines\n(.*?)(?=^## |\Z)', text, re.S | re.M)
    rows = re.findall(r'^\| *([^|]+?) *\|', section.group(1), re.M) if section else []
    return {row for row in rows if not set(row) <= set(':- ') and row != 'machine'}


def what_is_problems(name, text, known_machines):
    """'name:line: problem' for each issue number, unstamped date and lab note in the prose."""
    problems, generated = [], bool(_GENERATED_PAGE.match(pathlib.Path(name).name))
    for number, line in enumerate(without_code(text, inline=False).split('\n'), 1):
        where = '%s:%d' % (name, number)
        problems += ['%s: %r: an issue number; the commit log has it' % (where, match.group(0))
                     for match in _ISSUE_REFERENCE.finditer(line)]
        stamped = set()
        for match in _STAMP.finditer(line):
            stamped.add(match.start(2))
            if match.group(1) not in known_machines:
                problems.append('%s: machine %r of a measurement stamp is not in the table of '
                                'docs/benchmarks.md#machines (%s)' % (
                                    where, match.group(1), ', '.join(sorted(known_machines))))
        if generated and _GENERATED_HEADER.match(line):
            continue
        problems += ['%s: date %s outside a measurement stamp (`command`, machine, date); a '
                     'dated note belongs in docs/dev/ or the commit log' % (where, match.group(0))
                     for match in _DATE.finditer(line) if match.start() not in stamped]
        problems += ['%s: %r: %s' % (where, match.group(0), why) for pattern, why in LAB_NOTES
                     for match in re.finditer(pattern, line, re.I)]
    return problems


def test_user_pages_say_what_is():
    known = machines(MACHINES_PAGE.read_text())
    assert known, 'docs/benchmarks.md has no ## Machines table naming the machines'
    problems = []
    for path in user_pages():
        problems += what_is_problems(str(path.relative_to(ROOT)), path.read_text(), known)
    assert not problems, '\n'.join(problems)


def test_what_is_rule_on_planted_text():
    page = '\n'.join([
        'Fixed in issue 32, see issue #40 and PR 7.',                      # 1: three numbers
        'It takes 6 min 31 s (`make demo` on a quiet machine, 2-core EPYC AVX-512, 2026-11-26).',
        'On 2026-11-26 the evaluations moved into the session.',           # 3: a dated note
        'AP 0.391 (`make demo`, a laptop, 2026-11-26).',                   # 4: unknown machine
        '6 min 31 s (was 6:27), against the aim of 1.25x; the code before it took 44.',  # 5
        '```text', 'started 2026-11-24 12:03:41 UTC', '```',              # 6-8: output
        'Measured 2026-11-23 16:26 by `make bench`.'])                      # 9: not generated
    problems = what_is_problems('docs/x.md', page, {'2-core EPYC AVX-512'})
    lines = [problem.split(':')[1] for problem in problems]
    assert lines == ['1', '1', '1', '3', '4', '5', '5', '5', '9'], '\n'.join(problems)
    assert what_is_problems('docs/benchmarks-vm.md', page.split('\n')[-1], set()) == []
    table = '## Machines\n\n| machine | CPU |\n|---|---|\n| 2-core EPYC AVX2 | AMD EPYC |\n## Next'
    assert machines(table) == {'2-core EPYC AVX2'}


def test_readme_fits_in_12_kb():
    size = len((ROOT / 'README.md').read_bytes())
    assert size <= README_LIMIT, (
        'README.md is %d bytes, over %d: move detail to the docs/ page that holds it and link '
        'it' % (size, README_LIMIT))


# --------------------------------------------------------------- the Kubernetes command
def kubernetes_commands(text):
    """The lines of a page's command blocks that pipe a manifest through envsubst to kubectl."""
    return [line for language, start, body in code_blocks(text) if language in COMMAND_LANGUAGES
            for _, line in joined_lines(start, body) if 'envsubst' in line and 'kubectl' in line]


def test_kubernetes_command_applies_the_manifest_with_its_image():
    """README's Kubernetes line and k8s/README.md's, run as written up to `| kubectl` (with the
    image README's line names; k8s/README.md's lines follow an `export EFFICIENTDET_IMAGE=...`,
    so the test exports one): the YAML kubectl would get is the manifest with that image in
    every `image:`, no `${` left, and nothing else changed (the pods' shell scripts keep their
    own `$sshd`, `$pid`: envsubst is limited to the one variable)."""
    assert shutil.which('envsubst'), 'envsubst is missing: apt-get install gettext-base'
    lines = kubernetes_commands((ROOT / 'README.md').read_text())
    assert len(lines) == 1, 'README.md should show one Kubernetes command line: %s' % lines
    lines += kubernetes_commands((ROOT / 'k8s' / 'README.md').read_text())
    manifests = set()
    for line in lines:
        producer = line.split('| kubectl')[0]
        # The image the line names itself, or (k8s/README.md: `export EFFICIENTDET_IMAGE=...`
        # on a line before) one the test exports.
        assignment = re.search(r'\bEFFICIENTDET_IMAGE=(\S+)', producer)
        image = assignment.group(1) if assignment else 'registry.example.com/team/edet:gaudi-1'
        env = {key: value for key, value in os.environ.items() if key != 'EFFICIENTDET_IMAGE'}
        if not assignment:
            env['EFFICIENTDET_IMAGE'] = image
        result = run_process(['bash', '-c', producer], timeout=30, env=env,
                             stderr=subprocess.PIPE)
        assert result.returncode == 0, '%s\n%s' % (line, result.stderr)
        manifest = re.search(r'<\s*(k8s/\S+\.yaml)', producer).group(1)
        manifests.add(manifest)
        original = (ROOT / manifest).read_text()
        assert '${EFFICIENTDET_IMAGE}' in original
        assert result.stdout == original.replace('${EFFICIENTDET_IMAGE}', image), line
        assert '${' not in result.stdout, line
        (job,) = yaml.safe_load_all(result.stdout)
        for replica in job['spec']['mpiReplicaSpecs'].values():
            for container in replica['template']['spec']['containers']:
                assert container['image'] == image, (line, container['name'])
    assert manifests == {'k8s/mpijob-efficientdet-8card.yaml',
                         'k8s/mpijob-efficientdet-habana-style.yaml'}, manifests


def test_gaudi_dockerfile_names_habanas_image_in_full():
    """docker/Dockerfile.gaudi builds without a --build-arg: its BASE_IMAGE default is a full
    image reference (registry host, path, tag) of SynapseAI 1.14's TensorFlow 2.15.0 image, the
    one docs/hpu.md names."""
    match = re.search(r'^ARG BASE_IMAGE=(\S+)$', (ROOT / 'docker' / 'Dockerfile.gaudi').read_text(),
                      re.M)
    assert match, 'docker/Dockerfile.gaudi: no ARG BASE_IMAGE=<default>'
    image = match.group(1)
    assert re.match(r'^[a-z0-9-]+(\.[a-z0-9-]+)+/[\w./-]+:[\w.-]+$', image), image
    assert '/1.14.0/' in image and 'tf-cpu-2.15.0' in image, image
    assert image in (ROOT / 'docs' / 'hpu.md').read_text(), 'docs/hpu.md should name ' + image
