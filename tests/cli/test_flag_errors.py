"""A misspelt flag, typed as a user types it, to each command (found as test_help.py finds
them, one spelling per module): the one error line of every command (core/errors.py), with
absl's suggestion, exit status 2 and no traceback."""
import os
import re
import subprocess
import sys

import pytest

from cli_runs import REPO, run_process
from test_help import COMMANDS, HELP_SECONDS, LAUNCHER, QUICK, SCRIPTS

ONE_SPELLING = {module: typed for typed, module in reversed(COMMANDS)}


def _marked(module, typed):
    marks = [] if module in QUICK else [pytest.mark.slow]
    return pytest.param(typed, module, id=typed.replace(' ', '_'), marks=marks)


@pytest.mark.parametrize('typed,module', [_marked(m, t) for m, t in sorted(ONE_SPELLING.items())])
def test_a_misspelt_flag_is_one_line_naming_it_and_exit_2(typed, module):
    words = ([os.path.join(os.path.dirname(sys.executable), typed)] if typed in SCRIPTS
             else [sys.executable, *typed.split()])
    result = run_process(words + ['--helpshortt'], HELP_SECONDS, stderr=subprocess.PIPE,
                         env=dict(os.environ, PYTHONPATH=REPO))
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 2, (typed, result.returncode, result.stderr[-2000:])
    assert 'Traceback' not in result.stderr, (typed, result.stderr[-2000:])
    # The launcher checks the flags it hands on with main.py's parser: its line names main.py.
    program = 'main.py' if module == LAUNCHER else r'\S+'
    assert lines and re.fullmatch(
        r"%s: error: Unknown command line flag 'helpshortt'\. Did you mean: helpshort \? "
        r'\(see --helpshort\)' % program, lines[-1]), (typed, result.stderr[-2000:])
