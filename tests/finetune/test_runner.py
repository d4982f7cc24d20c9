"""finetune/runner.py: a stage's command under its deadline, its output in logs/, a child's
one-line user error raised as the fine-tune's own, any other failure naming the log. The
commands here are the VOC converter's (no TensorFlow) and py_compile, failing on purpose."""
import io
import os

import pytest

from efficientdet_hpu.finetune import runner as runner_lib


@pytest.fixture
def runner(tmp_path, monkeypatch):
    monkeypatch.setitem(runner_lib.MODULES, 'voc', 'efficientdet_hpu.datatools.voc_to_coco')
    return runner_lib.Runner(runner_lib.Layout(str(tmp_path)), stream=io.StringIO())


def test_a_childs_user_error_is_its_one_line(runner, tmp_path):
    with pytest.raises(runner_lib.ChildUserError) as raised:
        runner.command('voc', 'voc', ['--xml_dir=%s' % (tmp_path / 'absent'),
                                      '--output_file=%s' % (tmp_path / 'x.json')], 120)
    assert str(raised.value) == 'voc_to_coco: error: --xml_dir=%s is not a directory' % (
        tmp_path / 'absent')
    with open(os.path.join(runner.layout.logs, 'voc.log')) as stream:
        log = stream.read()
    assert log.startswith('$ ') and 'is not a directory' in log
    assert runner.stream.getvalue() == ''  # Shown only with echo or --verbose.


def test_another_failure_names_the_command_its_status_and_its_log(runner, monkeypatch):
    # A child that fails other than with a user error: py_compile of a missing file exits 1.
    monkeypatch.setitem(runner_lib.MODULES, 'compile', 'py_compile')
    with pytest.raises(runner_lib.StageFailed, match=r'compile-bad failed \(exit status 1\).*'
                                                     r'logs/compile-bad.log'):
        runner.command('compile-bad', 'compile', ['/nonexistent/absent.py'], 120)


def test_echo_shows_the_lines_as_they_come(runner, tmp_path):
    with pytest.raises(runner_lib.ChildUserError):
        runner.command('voc', 'voc', ['--xml_dir=/nonexistent', '--output_file=/tmp/x.json'],
                       120, echo=True)
    assert '    voc_to_coco: error: --xml_dir=/nonexistent' in runner.stream.getvalue()


def test_children_import_this_checkout_first():
    env = runner_lib.child_env()
    assert env['PYTHONPATH'].split(os.pathsep)[0] == os.path.dirname(
        os.path.dirname(os.path.dirname(os.path.abspath(runner_lib.__file__))))
    assert env['TF_CPP_MIN_LOG_LEVEL'] in ('3', os.environ.get('TF_CPP_MIN_LOG_LEVEL'))


def test_how_finetune_and_review_end(tmp_path, capsys):
    """runner.exit_status: a stop signal's line and 128+N, a user error or a full disk 2, a
    failed stage 1, anything else raised (a real bug keeps its traceback)."""
    import errno
    import signal

    from efficientdet_hpu.core import processes

    def raising(error):
        def work():
            raise error
        return work

    stop = processes.Stopped(signal.SIGTERM)
    stop.where, stop.kept = 'training', 'checkpoint kept'
    assert runner_lib.exit_status('prog', raising(stop), str(tmp_path), False) == 143
    assert capsys.readouterr().err == 'prog: stopped by SIGTERM during training; checkpoint kept\n'
    assert runner_lib.exit_status('prog', raising(runner_lib.ChildUserError('bad photo')),
                                  str(tmp_path), False) == 2
    assert capsys.readouterr().err.startswith('prog: error: bad photo')
    assert runner_lib.exit_status('prog', raising(runner_lib.StageFailed('main.py died')),
                                  str(tmp_path), False) == 1
    assert capsys.readouterr().err == 'prog: main.py died\n'
    full = OSError(errno.ENOSPC, 'No space left on device', str(tmp_path / 'x'))
    assert runner_lib.exit_status('prog', raising(full), str(tmp_path), False) == 2
    assert 'no space left on the device writing %s' % (tmp_path / 'x') in capsys.readouterr().err
    with pytest.raises(PermissionError):
        runner_lib.exit_status('prog', raising(PermissionError('denied')), str(tmp_path), False)
    assert runner_lib.exit_status('prog', lambda: None, str(tmp_path), False) == 0
