"""engine/preemption.py in one process with the tiny model (tests/tiny_engine.py): a stop
signal recorded by preemption's own handler (installed by loops.execute; the signal is sent to
this process only while that handler is in place, and the test process's handlers are put back
after) ends training after the next step, with the checkpoint of that step, and
stop_if_asked raises Stopped with 128 + the signal's number; the rerun continues from it."""
import os
import signal

import pytest
import tensorflow as tf

import tiny_engine
from efficientdet_hpu.engine import loops
from efficientdet_hpu.engine import preemption
from tiny_engine import TinyModel, checkpoint_steps, engine_options, logged_steps


@pytest.fixture(scope='module')
def val_pattern(tmp_path_factory):
    return tiny_engine.write_val_shards(tmp_path_factory.mktemp('val'))


def test_a_signal_stops_after_the_next_step_with_its_checkpoint_and_the_rerun_goes_on(
        val_pattern, tmp_path):
    """SIGUSR2 (the launcher's stand-in for SIGTERM) after step 3: every rank stops after
    step 4, whose checkpoint the Estimator writes; exit status 143 as for SIGTERM."""
    model_dir = str(tmp_path / 'model')
    options = engine_options(model_dir, val_pattern, mode='train')
    signalled = TinyModel(signal_at_step=3, signum=signal.SIGUSR2)
    with tiny_engine.tiny_run(options, signalled) as run:
        with pytest.raises(preemption.Stopped) as raised:
            loops.execute(run)
        assert preemption.received() == signal.SIGTERM
        # The handler put the default ones back: a second signal ends the process at once.
        assert all(signal.getsignal(number) == signal.SIG_DFL
                   for number in preemption.handled_signals())
    stopped = raised.value
    assert (stopped.signum, stopped.step, stopped.exit_status) == (signal.SIGTERM, 4, 143)
    assert stopped.checkpoint == os.path.join(model_dir, 'model.ckpt-4')
    assert str(stopped) == ('stopped by SIGTERM at step 4; checkpoint model.ckpt-4 written; '
                            'rerun the same command to continue')
    assert checkpoint_steps(model_dir) == [0, 4]
    assert tf.train.load_variable(stopped.checkpoint, 'global_step') == 4
    assert logged_steps(model_dir, 'train') == [2, 3, 4]  # 4: where the call stopped.

    with tiny_engine.log_lines() as logged, tiny_engine.tiny_run(options, TinyModel()) as run:
        assert preemption.received() == 0  # tiny_run started clean.
        assert loops.execute(run) == 0
    assert 'resuming from %s (step 4)' % stopped.checkpoint in logged
    assert checkpoint_steps(model_dir) == [0, 4, 7]
    assert logged_steps(model_dir, 'train') == [2, 3, 4, 6, 7]


def test_a_signal_outside_training_stops_at_the_newest_checkpoint(tmp_path):
    """A signal between train() calls (during an evaluation): stop_if_asked names rank 0's
    newest checkpoint; SIGUSR1 stands for SIGINT, 130."""
    model_dir = str(tmp_path)
    with tiny_engine.preemption_restored():
        preemption.install()
        assert preemption.stop_if_asked(model_dir) is None  # Nothing received.
        os.kill(os.getpid(), signal.SIGUSR1)
        assert preemption.received() == signal.SIGINT
        with pytest.raises(preemption.Stopped) as without:
            preemption.stop_if_asked(model_dir)
        latest = _write_checkpoint(model_dir, 6)
        with pytest.raises(preemption.Stopped) as with_checkpoint:
            preemption.stop_if_asked(model_dir)
    assert (without.value.exit_status, without.value.step, without.value.checkpoint) == (
        130, 0, None)
    assert str(without.value) == ('stopped by SIGINT at step 0; no checkpoint was written; '
                                  'rerun the same command to start again')
    assert (with_checkpoint.value.step, with_checkpoint.value.checkpoint) == (6, latest)
    assert str(with_checkpoint.value).startswith('stopped by SIGINT at step 6; checkpoint '
                                                 'model.ckpt-6 written')
    assert preemption.received() == 0  # preemption_restored cleared the record.


def _write_checkpoint(model_dir, step):
    with tf.Graph().as_default():
        tf.compat.v1.train.get_or_create_global_step()
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            return tf.compat.v1.train.Saver().save(
                session, os.path.join(model_dir, 'model.ckpt'), global_step=step)



def test_sighup_stops_with_129_and_sigalrm_stands_for_it_under_mpirun(tmp_path):
    """A closed terminal's SIGHUP is a stop like SIGTERM (129); the launcher passes it through
    mpirun as SIGALRM, taken only under Open MPI (no other alarm is taken for a stop); a
    SIGHUP ignored from the start (nohup) stays ignored."""
    assert signal.SIGALRM not in preemption.handled_signals({})
    assert signal.SIGALRM in preemption.handled_signals({'OMPI_COMM_WORLD_SIZE': '2'})
    assert preemption.STOP_SIGNALS[signal.SIGALRM] == signal.SIGHUP
    previous = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        assert signal.SIGHUP not in preemption.handled_signals({})
    finally:
        signal.signal(signal.SIGHUP, previous)
    with tiny_engine.preemption_restored():
        preemption.install()
        os.kill(os.getpid(), signal.SIGHUP)
        assert preemption.received() == signal.SIGHUP
        with pytest.raises(preemption.Stopped) as stopped:
            preemption.stop_if_asked(str(tmp_path))
    assert stopped.value.exit_status == 129
    assert str(stopped.value).startswith('stopped by SIGHUP at step 0')
