"""engine/training_eval.py in one process with the tiny model (tests/tiny_engine.py):
train_and_eval evaluates inside one train() call with graphs built once (1 training + 1
evaluation graph for 3 evaluations, against 3 + 3 epoch by epoch, as before) and the same metrics; the
epoch-by-epoch path when a run cannot evaluate inside the session (said in one line); a stop
signal during an evaluation, and one during the step that ends an epoch; each evaluation's
progress line on both paths; an end --steps_file moves, later or sooner, on both paths."""
import contextlib
import io
import os
import re
import signal

import pytest
import tensorflow as tf

import tiny_engine
from efficientdet_hpu.core import run_end
from efficientdet_hpu.engine import loops
from efficientdet_hpu.engine import preemption
from efficientdet_hpu.engine import training_eval
from tiny_engine import TinyModel, checkpoint_steps, engine_options, logged_steps

tf1 = tf.compat.v1
EPOCH_ENDS = (2, 5, 7)  # engine_options: 2.5 steps an epoch, 7 steps.


def _execute(options, model):
    """loops.execute of a tiny run: (exit status or the Stopped raised, printed, logged)."""
    printed = io.StringIO()
    with tiny_engine.log_lines() as logged, contextlib.redirect_stdout(printed):
        with tiny_engine.tiny_run(options, model) as run:
            try:
                status = loops.execute(run)
            except preemption.Stopped as stopped:
                status = stopped
    return status, printed.getvalue(), logged


@pytest.fixture(scope='module')
def val_pattern(tmp_path_factory):
    return tiny_engine.write_val_shards(tmp_path_factory.mktemp('val'))


@pytest.fixture(scope='module')
def both_paths(val_pattern, tmp_path_factory):
    """The same train_and_eval (3 epochs) in the session and epoch by epoch (a model whose
    PREDICT spec has a prediction hook, which an evaluation in a kept session would not
    run). Read only."""
    runs = {}
    for name, model in (('in_session', TinyModel()),
                        ('by_epoch', TinyModel(prediction_hook=True))):
        model_dir = str(tmp_path_factory.mktemp(name) / 'model')
        status, printed, logged = _execute(engine_options(model_dir, val_pattern), model)
        runs[name] = dict(model_dir=model_dir, status=status, printed=printed, logged=logged,
                          builds=dict(model.builds))
    return runs


def test_three_evaluations_build_one_training_and_one_evaluation_graph(both_paths):
    in_session, by_epoch = both_paths['in_session'], both_paths['by_epoch']
    assert in_session['status'] == by_epoch['status'] == 0
    assert in_session['builds'] == {'train': 1, 'infer': 1}
    # 3 + 3, and the evaluation graph that showed the prediction hook.
    assert by_epoch['builds'] == {'train': 3, 'infer': 3 + 1}
    assert [line for line in by_epoch['logged'] if line.startswith('train_and_eval')] == [
        'train_and_eval evaluates epoch by epoch (a train() call per epoch, Estimator.predict '
        'per evaluation): the model_fn\'s PREDICT spec has prediction_hooks, which an '
        'evaluation in a kept session would not run']
    assert not [line for line in in_session['logged'] if 'epoch by epoch' in line]


def test_both_paths_evaluate_the_same_checkpoints_to_the_same_metrics(both_paths):
    """Same steps, same checkpoints (the tiny training is deterministic), same metrics
    files, the same best checkpoint; each AP the EMA's hand-worked one."""
    in_session, by_epoch = both_paths['in_session'], both_paths['by_epoch']
    for run in (in_session, by_epoch):
        assert checkpoint_steps(run['model_dir']) == [0, 2, 5, 7]
        assert logged_steps(run['model_dir'], 'eval') == list(EPOCH_ENDS)
    for step in EPOCH_ENDS:
        checkpoints = [os.path.join(run['model_dir'], 'model.ckpt-%d' % step)
                       for run in (in_session, by_epoch)]
        assert tiny_engine.ema_shift(checkpoints[0]) == tiny_engine.ema_shift(checkpoints[1])
        metrics = tiny_engine.read_metrics(in_session['model_dir'], step)
        assert metrics == tiny_engine.read_metrics(by_epoch['model_dir'], step)
        assert metrics['AP'] == tiny_engine.hand_ap(tiny_engine.ema_shift(checkpoints[0]))
    assert (tiny_engine.best_record(in_session['model_dir'])
            == tiny_engine.best_record(by_epoch['model_dir']))


def test_each_evaluation_shows_its_progress_on_both_paths(both_paths):
    """The kept evaluation graph and Estimator.predict count the same images: each
    evaluation's last progress line (the log is not a terminal here), then its scoring."""
    for run in both_paths.values():
        shown = [line for line in run['logged']  # The last line of each evaluation.
                 if re.match(r'evaluating model\.ckpt-\d+: 5/5 images \(100%\) in ', line)]
        assert [line.split(':')[0] for line in shown] == [
            'evaluating model.ckpt-%d' % step for step in EPOCH_ENDS]
        for line in shown:
            assert re.fullmatch(r'evaluating model\.ckpt-\d: 5/5 images \(100%\) in 0:00:\d\d'
                                r'( \(start-up 0:00:\d\d\))?, [\d.]+ images/s', line), line
        assert len([line for line in run['logged']
                    if line.startswith('scoring 7 detections of 5 images')]) == 3


def test_a_signal_during_an_evaluation_stops_at_its_step_and_the_rerun_goes_on(val_pattern,
                                                                                tmp_path):
    """SIGUSR2 (SIGTERM's stand-in) while step 2 is evaluated: the evaluation ends, its
    records are written, and the run stops at step 2 with that checkpoint (no step 3);
    the rerun does not evaluate step 2 again and evaluates 5 and 7."""
    model_dir = str(tmp_path / 'model')
    options = engine_options(model_dir, val_pattern)
    model = TinyModel(signal_in_evaluation_of=2)
    stopped, _, _ = _execute(options, model)
    assert model.signals_sent == [2]
    assert isinstance(stopped, preemption.Stopped)
    assert (stopped.signum, stopped.step, stopped.exit_status) == (signal.SIGTERM, 2, 143)
    assert stopped.checkpoint == os.path.join(model_dir, 'model.ckpt-2')
    assert checkpoint_steps(model_dir) == [0, 2]
    assert logged_steps(model_dir, 'eval') == [2]
    assert logged_steps(model_dir, 'train') == [2]
    assert tiny_engine.best_record(model_dir)['step'] == 2

    status, _, _ = _execute(options, TinyModel())
    assert status == 0
    assert checkpoint_steps(model_dir) == [0, 2, 5, 7]
    assert logged_steps(model_dir, 'eval') == [2, 5, 7]


def test_a_signal_during_an_epochs_last_step_stops_without_evaluating_it(val_pattern,
                                                                          tmp_path):
    """A signal after step 4: the ranks stop after step 5, an epoch's end; its checkpoint is
    written and not evaluated (the run stops there)."""
    model_dir = str(tmp_path / 'model')
    options = engine_options(model_dir, val_pattern)
    stopped, printed, _ = _execute(options, TinyModel(signal_at_step=4))
    assert isinstance(stopped, preemption.Stopped)
    assert (stopped.step, stopped.checkpoint) == (5, os.path.join(model_dir, 'model.ckpt-5'))
    assert checkpoint_steps(model_dir) == [0, 2, 5]
    assert logged_steps(model_dir, 'eval') == [2]
    assert 'model.ckpt-5' not in printed


def test_a_run_without_periodic_checkpoints_evaluates_epoch_by_epoch(val_pattern, tmp_path):
    options = engine_options(str(tmp_path / 'model'), val_pattern, cp_every_n_steps=0)
    with tiny_engine.tiny_run(options, TinyModel()) as run:
        with training_eval.Evaluator(run) as evaluator:
            assert training_eval.blocker(run, evaluator) == (
                '--cp_every_n_steps=0: no checkpoint saver to write the evaluation steps\' '
                'checkpoints')
            assert evaluator.graph.finalized


@pytest.mark.parametrize('path, asked, evaluated', [
    ('in_session', 12, [2, 5, 7, 10, 12]), ('by_epoch', 12, [2, 5, 7, 10, 12]),
    ('in_session', 11, [2, 5, 7, 10, 11]), ('by_epoch', 4, [2, 4])])
def test_a_steps_file_moves_the_end_and_the_evaluations_follow(val_pattern, tmp_path, path,
                                                               asked, evaluated):
    """--steps_file asking for 12 (11, 4) of the planned 7 steps (2.5 an epoch): the run ends
    there on both paths, evaluating at the epochs' ends before it (10 before 11: the
    fine-tune's fitted end counts on it), the last at it."""
    steps = str(tmp_path / 'steps.json')
    run_end.write(steps, asked)
    model_dir = str(tmp_path / 'model')
    status, _, _ = _execute(engine_options(model_dir, val_pattern, steps_file=steps),
                            TinyModel(prediction_hook=path == 'by_epoch'))
    assert status == 0
    assert logged_steps(model_dir, 'eval') == evaluated
    assert checkpoint_steps(model_dir)[-1] == asked
    assert logged_steps(model_dir, 'train')[-1] == asked


def test_a_rerun_goes_on_to_the_end_the_steps_file_moved(val_pattern, tmp_path):
    """A run trained to its planned 7 steps, then the file asks 12: the same command rerun
    trains on to 12 in the session, evaluating at 10 and 12, and says nothing of an end
    reached."""
    model_dir, steps = str(tmp_path / 'model'), str(tmp_path / 'steps.json')
    options = engine_options(model_dir, val_pattern, steps_file=steps)
    assert _execute(options, TinyModel())[0] == 0
    run_end.write(steps, 12)
    status, printed, logged = _execute(options, TinyModel())
    assert status == 0
    assert logged_steps(model_dir, 'eval') == [2, 5, 7, 10, 12]
    assert checkpoint_steps(model_dir)[-1] == 12
    assert 'nothing to train' not in printed
    assert any('evaluations at steps 10 and 12, in the training session' in line
               for line in logged)


def test_a_fraction_of_an_epoch_ends_inside_it(val_pattern, tmp_path):
    """num_epochs 3.4 of 2.5 steps (a plan whose end was moved inside an interval): 8 steps,
    int(3.4 x 2.5) as automl counts, evaluated at the epochs' ends and at 8."""
    model_dir = str(tmp_path / 'model')
    status, _, _ = _execute(engine_options(model_dir, val_pattern, num_epochs=3.4), TinyModel())
    assert status == 0
    assert logged_steps(model_dir, 'eval') == [2, 5, 7, 8]
    assert checkpoint_steps(model_dir)[-1] == 8


def test_describe_lists_the_steps():
    assert training_eval.describe([7]) == 'evaluations at step 7, in the training session'
    assert training_eval.describe([2, 5, 7]) == (
        'evaluations at steps 2, 5 and 7, in the training session')
