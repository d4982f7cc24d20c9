"""Entry points turn oneDNN on before TensorFlow loads, unless the environment says otherwise."""
import os
import subprocess
import sys

import pytest

from cli_runs import run_process

pytestmark = pytest.mark.slow  # Each test starts a Python process that imports TensorFlow.

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_PROBE = ('import {module}\n'
          'from tensorflow.python.util import _pywrap_util_port\n'
          'print("onednn", _pywrap_util_port.IsMklEnabled())\n')


def _onednn_after_import(module, setting):
    env = {k: v for k, v in os.environ.items() if k != 'TF_ENABLE_ONEDNN_OPTS'}
    if setting is not None:
        env['TF_ENABLE_ONEDNN_OPTS'] = setting
    result = run_process([sys.executable, '-c', _PROBE.format(module=module)], timeout=300,
                         cwd=REPO, env=env, stderr=subprocess.PIPE)
    assert result.returncode == 0, result.stderr
    return result.stdout.split()[-1]


@pytest.mark.parametrize('module', ['main', 'inference'])
def test_entry_points_enable_onednn_by_default(module):
    assert _onednn_after_import(module, None) == 'True'


def test_user_setting_wins():
    assert _onednn_after_import('main', '0') == 'False'

