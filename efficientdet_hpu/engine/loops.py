"""The modes of a run: train, eval (continuous, beside a training job) and train_and_eval
(an evaluation after each epoch, inside the training session: engine/training_eval.py), over
a prepared Run (engine/setup.py); at the end of train and train_and_eval, where the wall time
went (engine/wall_time.py).

Errors that are the user's to fix derive from core.errors.UserError (main.py prints their one
line and exits 2); a data error while reading shards becomes one (engine/bad_records.py),
and so does a full disk (`disk_full_message`).
"""
import glob
import os
import shutil

from absl import logging

from efficientdet_hpu.core import errors
from efficientdet_hpu.runtime import distributed
from efficientdet_hpu.engine import throughput
from efficientdet_hpu.checkpoints import checkpoints
from efficientdet_hpu.engine import coverage_check
from efficientdet_hpu.engine import bad_records
from efficientdet_hpu.engine import early_stop
from efficientdet_hpu.engine import checkpoint_eval
from efficientdet_hpu.engine import hooks
from efficientdet_hpu.engine import preemption
from efficientdet_hpu.engine import resume_check
from efficientdet_hpu.core import run_end
from efficientdet_hpu.engine import train_log
from efficientdet_hpu.engine import training_eval
from efficientdet_hpu.engine import wall_time
from efficientdet_hpu.engine.setup import train_input_fn
from efficientdet_hpu.training import steps_file


def current_step(run):
    """Rank 0's checkpointed step, shared so every rank makes the same decisions."""
    step = 0
    if distributed.is_main():
        latest = checkpoints.latest_checkpoint(run.options.model_dir)
        step = checkpoints.checkpoint_step(latest) if latest else 0
    return distributed.broadcast_object(step)


def last_step(run):
    """The run's last step: the plan's, or the one --steps_file moved it to (a rerun goes on
    to it too: training/steps_file.py)."""
    return run_end.target_steps(run.settings.runtime.steps_file, run.settings.schedule.total_steps)


def train_until(run, max_steps, clock=None, evaluation=None, epoch=False):
    """Trains to max_steps; raises preemption.Stopped when a signal stopped it (the
    checkpoint of the stop step is then written).

    clock: the run's wall_time.WallTime; evaluation: (training_eval.Evaluator, a function of
    the run's last step giving the steps to evaluate at) for evaluations inside this train()
    call. With --steps_file its hook stops the call: at the end the file moves, sooner or later,
    or for an epoch (`epoch`, train_by_epochs) at max_steps or sooner."""
    start_step = current_step(run)
    if start_step < max_steps:
        pattern = None if run.options.use_fake_data else run.options.training_file_pattern
        saver = hooks.checkpoint_hook(run, clock)
        evaluator, steps_for = evaluation or (None, None)
        eval_hook = None if evaluator is None else training_eval.EvaluationHook(
            run, evaluator, steps_for, saver, clock)
        train_hooks = hooks.make_training_hooks(run, max_steps, clock, eval_hook, epoch)
        train_hooks += [saver] if saver is not None else []
        if eval_hook is not None:  # After the saver and the stop and log hooks.
            train_hooks.append(eval_hook)
            train_hooks += [hook.settle_hook() for hook in train_hooks
                            if isinstance(hook, steps_file.StepsFileHook)]
        # Only rank 0 has a CheckpointSaverHook, whose saves the listener checks.
        listeners = ([hooks.FiniteWeightsListener(run.options.model_dir)]
                     if distributed.is_main() else None)
        limit = (steps_file.NO_LIMIT if run.settings.runtime.steps_file and not epoch
                 else max_steps)
        with bad_records.named_data_errors(pattern, run.config.num_classes):
            run.estimator.train(train_input_fn(run, start_step), max_steps=limit,
                                hooks=train_hooks, saving_listeners=listeners)
    preemption.stop_if_asked(run.options.model_dir)


def evaluation_steps(schedule, total_steps=None):
    """The steps train_and_eval evaluates at: epoch ends at int(epoch * steps per epoch) (a
    float, as automl counts) before the last step, then the last step (`total_steps` when
    given: an end --steps_file moved; inside an epoch where num_epochs is a fraction or the
    file says so); ascending."""
    total_steps = schedule.total_steps if total_steps is None else total_steps
    ends = []
    epoch = 1
    while int(epoch * schedule.steps_per_epoch) < total_steps:
        end = int(epoch * schedule.steps_per_epoch)
        if end > (ends[-1] if ends else 0):  # Epochs under a step end at the same step.
            ends.append(end)
        epoch += 1
    return ends + [total_steps]


def train_and_eval(run, clock=None):
    """One train() call to the final step, evaluating inside it at each epoch's end still to
    come (engine/training_eval.py), the graphs built once; epoch by epoch (train_by_epochs)
    when there is nothing to train or the run cannot evaluate inside the session."""
    total_steps = last_step(run)
    start_step = current_step(run)
    if start_step >= total_steps:  # Nothing to train: the last checkpoint is evaluated.
        train_by_epochs(run, clock)
        return
    if early_stop.reached(run):  # A rerun after an early stop.
        return
    with training_eval.Evaluator(run) as evaluator:
        reason = training_eval.blocker(run, evaluator)
        if reason is None:
            def steps_for(last):
                return [step for step in evaluation_steps(run.settings.schedule, last)
                        if step > start_step]
            logging.info('train_and_eval: %s', training_eval.describe(steps_for(total_steps)))
            train_until(run, total_steps, clock, evaluation=(evaluator, steps_for))
            return
    training_eval.log_fallback(reason)
    train_by_epochs(run, clock)


def train_by_epochs(run, clock=None):
    """train_and_eval as a train() call per epoch, each followed by an evaluation through
    Estimator.predict (a graph and session built for each); with nothing left to train, the
    last checkpoint is evaluated."""
    while True:
        last = last_step(run)  # --steps_file may have moved the end.
        start = current_step(run)
        step = next((s for s in evaluation_steps(run.settings.schedule, last) if s > start),
                    last)
        if early_stop.reached(run):  # After the last evaluation, or a rerun after a stop.
            break
        train_until(run, step, clock, epoch=True)
        with wall_time.phase(clock, wall_time.EVALUATIONS):
            checkpoint_eval.evaluate_latest(run)
        preemption.stop_if_asked(run.options.model_dir)  # A signal during the evaluation.
        if current_step(run) >= last_step(run) or start >= step:
            break


def execute(run):
    """Runs the mode; returns the process exit status."""
    options = run.options
    if options.benchmark:
        return throughput.run_benchmark(run)
    early_stop.warn_if_unused(options)
    if options.mode == 'eval':
        preemption.install(evaluation=True)
        checkpoint_eval.evaluate_continuously(run)
        report_skipped(run)
        return 0
    clock = wall_time.WallTime()  # From the process's start.
    preemption.install()
    check_anchor_coverage(run)
    announce_resume(run)
    try:
        if options.mode == 'train':
            train_until(run, last_step(run), clock)
            if options.eval_after_training:
                with wall_time.phase(clock, wall_time.EVALUATIONS):
                    checkpoint_eval.evaluate_latest(run)
                preemption.stop_if_asked(options.model_dir)
        else:
            train_and_eval(run, clock)
    except preemption.Stopped as stop:  # Every rank raises it: the ranks agreed on the step.
        report_wall_time(run, clock, stop.step)
        raise
    report_skipped(run)
    report_wall_time(run, clock)
    return 0


def report_wall_time(run, clock, step=None):
    """Rank 0: where the run's wall time went, one line and a JSON log record (step: the
    stop's, agreed by the ranks; None asks rank 0's checkpoint, a collective)."""
    step = current_step(run) if step is None else step
    if not distributed.is_main():
        return
    record = clock.record(run.options.mode, step)
    print(wall_time.summary_line(record), flush=True)
    train_log.append_json_log(run.options.model_dir, record)


def announce_resume(run):
    """One line naming the checkpoint a training run continues from (TF's own is hidden)."""
    if not distributed.is_main():
        return
    latest = checkpoints.latest_checkpoint(run.options.model_dir)
    if not latest:
        return
    step, total_steps = checkpoints.checkpoint_step(latest), last_step(run)
    if step >= total_steps:
        print(resume_check.nothing_to_train_line(latest, step, total_steps), flush=True)
    else:
        logging.info('resuming from %s (step %d)', latest, step)


def check_anchor_coverage(run):
    """The data doctor's coverage check at start (engine/coverage_check.py, NumPy on
    annotations only): one line per class whose boxes mostly miss the anchors, pointing to
    the doctor.
    Annotations: --val_json_file when given, else the training TFRecords. Never stops a run."""
    options = run.options
    if not distributed.is_main() or options.use_fake_data:
        return
    json_file = options.val_json_file or None
    try:
        lines = coverage_check.low_coverage_warnings(
            run.config, json_file, file_pattern=None if json_file else
            options.training_file_pattern, hparams=options.hparams)
    except (errors.UserError, OSError, ValueError) as error:
        logging.info('anchor coverage check skipped: %s', error)
        return
    for line in lines:
        logging.warning(line)


def report_skipped(run):
    """With --skip_bad_records: what was left out, on the screen and in the JSON log."""
    for name, skips in (('training', run.train_skip), ('validation', run.eval_skip)):
        if skips is None or not (skips.count or skips.readable):
            continue
        print('--skip_bad_records: the %s data had %s%s' % (
            name, skips.describe(), '; shards cut short: %s' % ', '.join(
                sorted(os.path.basename(p) for p in skips.readable)) if skips.readable else ''),
              flush=True)
        if distributed.is_main():
            train_log.append_json_log(run.options.model_dir, dict(
                skips.as_json(), event='skipped_records', data=name,
                cut_short=sorted(skips.readable)))


def _checkpoint_bytes(model_dir):
    """Size of the newest checkpoint's files: about what the next one needs."""
    latest = checkpoints.latest_checkpoint(model_dir)
    return sum(os.path.getsize(path) for path in glob.glob(latest + '.*')) if latest else None


def disk_full_message(error, model_dir):
    """One line for an out-of-space error while training or evaluating into model_dir (the
    newest complete checkpoint stays loadable: TensorFlow names it in `checkpoint` only once
    its files are whole), or None for any other error."""
    if not errors.is_disk_full(error):
        return None
    for partial in glob.glob(os.path.join(model_dir or '.', 'model.ckpt-*_temp*')):
        shutil.rmtree(partial, ignore_errors=True)  # A checkpoint the disk could not hold.
    latest = checkpoints.latest_checkpoint(model_dir) if model_dir else None
    return errors.disk_full_message(
        error, model_dir or '.', needed_bytes=_checkpoint_bytes(model_dir) if latest else None,
        fix='free space there (or use another --model_dir) and rerun the same command: it '
            'resumes from %s' % (os.path.basename(latest) if latest else 'the start'))
