"""The fine-tune from start to summary, each stage resumable from what --output_dir holds:

  [1/6] data        (finetune/prepare.py) read, check and split the photos
  [2/6] plan        (finetune/prepare.py) the data doctor, then plan.yaml
  [3/6] records     the converter: data/records/train-*, val-* (tiled when the plan tiles)
  [4/6] training    main.py --hparams=plan.yaml --model_dir=model, stopped at the time budget
                    (SIGTERM: main.py checkpoints and exits); training.json marks it done
  [5/6] evaluation  the whole validation photos predicted with the best checkpoint (tiled
                    when the plan tiles) and scored (inference.py predict --annotations_file),
                    as they are and with their left-right flips fused (--tta; kept where its
                    AP is higher), the error analysis (cli/analyze), detections.png
  [6/6] export      SavedModel, then TFLite fp32 (a failure of TFLite is said, not fatal)
then summary.json and the table. A rerun after summary.json prints the summary again; after
training.json it evaluates and exports again; before it main.py resumes from model/.
"""
import json
import os
import shutil
import tempfile
import time

from efficientdet_hpu.core import atomic_file
from efficientdet_hpu.core import processes
from efficientdet_hpu.core import run_end
from efficientdet_hpu.core.errors import UserError
from efficientdet_hpu.finetune import budget
from efficientdet_hpu.finetune import correction
from efficientdet_hpu.finetune import plan_file
from efficientdet_hpu.finetune import prepare
from efficientdet_hpu.finetune import probe as probe_lib
from efficientdet_hpu.finetune import report
from efficientdet_hpu.finetune import rerun
from efficientdet_hpu.finetune import runner as runner_lib
from efficientdet_hpu.finetune import search
from efficientdet_hpu.finetune import stats
from efficientdet_hpu.serving import formats as export_formats

STAGES = 6
GRACE_SECONDS = 900  # After the budget's stop signal: the checkpoint, or an evaluation's end.


def _stage(runner, number, name, remaining_seconds=None, deadline=None):
    runner.stage = (number, name.split(':')[0])
    eta = ''
    if remaining_seconds is not None:
        eta = '; the run ends in about %s (%s)' % (
            plan_file.minutes(remaining_seconds),
            time.strftime('%H:%M', time.localtime(time.time() + remaining_seconds)))
    if deadline is not None:
        eta += ', the budget at %s' % time.strftime('%H:%M', time.localtime(deadline))
    runner.say('[%d/%d] %s%s' % (number, STAGES, name, eta))


def _remaining(plan, after):
    """Planned seconds of the parts from `after` on (names of plan.seconds)."""
    names = [name for name, _ in plan.seconds]
    return sum(seconds for name, seconds in plan.seconds[names.index(after):])


def records_stage(runner, plan, record):
    """[3/6]: converts both splits unless their label map and summary are there."""
    layout = runner.layout
    tiles = ['--tile_size=%d' % plan.tile_size, '--tile_overlap=%d' % plan.tile_overlap
             ] if plan.tile_size else []
    for split, json_path, image_dir, images in (
            ('train', layout.train_json, record['train_image_dir'], plan.train_images),
            ('val', layout.val_json, record['val_image_dir'], plan.val_images)):
        prefix = os.path.join(layout.records, split)
        if not os.path.exists(prefix + '-summary.json'):
            try:
                runner.command('convert-' + split, 'convert', [
                    '--image_dir=' + image_dir, '--object_annotations_file=' + json_path,
                    '--output_file_prefix=' + prefix,
                    '--num_shards=%d' % (2 if images < 1000 else 8)] + tiles,
                    max(600.0, 5.0 * images))
            except runner_lib.ChildUserError as error:
                raise runner_lib.ChildUserError(in_the_input(
                    str(error), json_path, record.get('sources', {}).get(split))) from None
        with open(prefix + '-summary.json') as stream:
            summary = json.load(stream)
        runner.say('  %s: %s, %s (%s)' % (
            split, stats.count(summary['images_written'], 'tile' if plan.tile_size else 'photo'),
            stats.count(summary['boxes_written'], 'box', 'boxes'), prefix + '-*.tfrecord'))


def in_the_input(message, json_path, source):
    """The converter's fix for a photo names the fine-tune's own copy of the annotations
    (data/train.json); the user's fix is in the input: the photo out of --data, and a rerun
    of the same command reads the changed folder again."""
    if not source or json_path not in message:
        return message
    return '%s Then rerun the same command: the changed folder is read again.' % (
        message.replace(json_path, source).rstrip())


def training_record(model_dir, stopped, minutes, steps=None):
    """training.json: how training ended, its step, its measured images/s, the best. A stop
    that came once the checkpoint of the last of `steps` was written (in main.py's last
    evaluation or its exit) ended nothing: training completed."""
    log = budget.training_log(model_dir)
    rate = budget.measured_rate(model_dir, log)
    early = any(r.get('event') == 'early_stop' for r in log)
    step = rerun.latest_step(model_dir)
    if stopped and steps is not None and step is not None and step >= steps:
        stopped = False
    return {'ended': 'stopped at the time budget' if stopped else
            'early stop' if early else 'completed',
            'step': step, 'minutes': round(minutes, 1),
            'images_per_second': None if rate is None else round(rate, 2)}


def last_step(layout):
    """main.py's last step: its --steps_file's (a move in place), else its schedule.json's
    (engine/setup.py; None when it wrote none)."""
    try:
        with open(os.path.join(layout.model_dir, 'schedule.json')) as stream:
            total_steps = json.load(stream).get('total_steps')
    except (OSError, ValueError):
        total_steps = None
    return run_end.target_steps(layout.steps_file, total_steps)


def training_stage(runner, plan, deadline, last=None, load=1.0):
    """[4/6]: main.py with plan.yaml, its log shown; training.json when it ends. `last`: the
    search's last candidate (search.Last), trained first as this run until its rung decides;
    when it lost there, the winner resumes. `load`: the stages before training's measured
    slowness (budget.stages_load), which the time-budget stop applies to the end's estimate
    until the first steps measure it."""
    layout = runner.layout
    if os.path.exists(layout.training_json):
        with open(layout.training_json) as stream:
            record = json.load(stream)
        runner.say('  ended earlier: step %s, %s' % (record['step'], record['ended']))
        return record
    final = dict(plan.seconds)['whole photos + export']
    planned = _remaining(plan, 'start-up') - final
    start = time.monotonic()
    verbose = ['--verbose'] if runner.verbose else []
    # The probe moves the end through main.py's --steps_file where it can (no restart).
    moved = ['--steps_file=' + layout.steps_file]
    args = ['--hparams=' + layout.plan_yaml, '--model_dir=' + layout.model_dir] + verbose + moved
    if os.path.exists(layout.steps_file):  # An earlier run's: its plan.yaml holds its steps.
        os.remove(layout.steps_file)

    trained = []  # The plan main.py trained before each move in place.

    def move(decision, current):
        if probe.moved is None and last is not None and last.chosen is not None:
            current = last.chosen  # The search's winner, trained in place.
        moved = correction.move_in_place(runner, current, decision)
        trained.extend([current] if moved is not None else [])
        return moved
    probe = (None if deadline is None else
             probe_lib.RateProbe(plan, layout.model_dir, deadline,
                                 rerun.latest_step(layout.model_dir), say=runner.say, move=move))
    floor = run_end.MIN_TRAINING_SECONDS
    stop_after = (None if deadline is None
                  else budget.training_stop(deadline, final, probe, floor, load))
    timeout = (max(floor, deadline - time.time()) if deadline is not None
               else 3 * planned + 3600) + GRACE_SECONDS
    first_args, stop_when = args, probe
    if last is not None:
        first_args, stop_when = last.args() + verbose + moved, last.stop_when(probe)
    _, stopped = runner.command('train', 'train', first_args, timeout, echo=True,
                                stop_after=stop_after, stop_when=stop_when)
    if last is not None:
        if last.lost():  # Stopped at its rung (or before): the winner goes on.
            return training_stage(runner, last.install(), deadline, load=load)
        plan = last.chosen
        shutil.rmtree(layout.path('candidates'), ignore_errors=True)
    if probe is not None and probe.moved is not None:  # Moved while main.py ran.
        plan = probe.moved
    elif probe is not None and probe.decision is not None:
        plan = correction.after_probe(runner, plan, probe.decision)
        if probe.decision['restart']:  # Stopped by the probe: go on with the new steps.
            stop_after = budget.training_stop(deadline, final, probe, 60.0, load)
            _, stopped = runner.command(
                'train', 'train', args, max(60.0, deadline - time.time()) + GRACE_SECONDS,
                echo=True, stop_after=stop_after)
    return training_ended(runner, plan, stopped, (time.monotonic() - start) / 60.0,
                          before=trained[-1] if trained else None)


def training_ended(runner, plan, stopped, minutes, before=None):
    """training.json for a main.py that ended (`stopped` by the time budget or not; `before`:
    the plan it trained before its end last moved in place, None where none moved), and
    plan.json and plan.yaml at the step it ended at where the last move reached it past the
    step asked or after it ended (correction.as_reached). Returns the record."""
    layout = runner.layout
    record = training_record(layout.model_dir, stopped, minutes, last_step(layout))
    if record['step'] is None:
        raise UserError('training wrote no checkpoint before the time budget ended; give a '
                        'larger --max_minutes (the plan needs about %s)' % plan_file.minutes(
                            plan.total_seconds))
    if before is not None and record['ended'] == 'completed':
        reached = correction.as_reached(runner, plan, record['step'], before)
        if reached.steps < plan.steps:
            runner.say('  main.py ended at step %d before the move to %d reached it: plan.yaml '
                       'holds %d' % (reached.steps, plan.steps, reached.steps))
    atomic_file.write_json_atomically(layout.training_json, record)
    runner.say('  training %s at step %s' % (record['ended'], record['step']))
    return record


def explain_stop(runner, stop, dry_run):
    """Fills in the line of a stop signal (processes.Stopped.line): the stage it came in and
    what is kept; in training, the checkpoint main.py wrote at the step it stopped at (no
    training.json is written, so the rerun resumes from it)."""
    number, name = runner.stage or (1, 'data')
    stop.where = '%s (stage %d/%d)' % (name, number, STAGES)
    stop.kept = 'the stages done before it are kept; rerun the same command to continue'
    if dry_run:
        stop.kept = 'a dry run writes nothing'
    elif name == 'training':
        step = rerun.latest_step(runner.layout.model_dir)
        if rerun.search_undecided(runner.layout):
            stop.where, stop.kept = 'the search (stage %d/%d), before its verdict' % (
                number, STAGES), 'rerun the same command to search again'
        elif step is None:
            stop.where, stop.kept = 'training, before its first checkpoint', (
                'rerun the same command to start training')
        else:
            stop.where = 'training at step %d' % step
            stop.kept = ('checkpoint %s kept; rerun the same command to continue' % os.path.join(
                os.path.basename(runner.layout.model_dir), 'model.ckpt-%d' % step))


def best_checkpoint(model_dir):
    """(checkpoint argument for inference.py, its step): model_dir/best when an evaluation
    kept one, else the newest checkpoint."""
    best = os.path.join(model_dir, 'best')
    if os.path.exists(os.path.join(best, 'best_eval.json')):
        with open(os.path.join(best, 'best_eval.json')) as stream:
            return best, json.load(stream)['step']
    return None, rerun.latest_step(model_dir)


def _tile_flags(plan):
    return (['--tile_size=%d' % plan.tile_size, '--tile_overlap=%d' % plan.tile_overlap]
            if plan.tile_size else [])


def _scored(runner, plan, checkpoint, output_dir, tta):
    """inference.py predict of the validation photos into output_dir: its metrics."""
    layout = runner.layout
    chosen = ['--checkpoint=' + checkpoint] if checkpoint else []
    runner.command('predict-tta' if tta else 'predict', 'inference', [
        'predict', '--model_dir=' + layout.model_dir, '--input=' + layout.val_photos,
        '--output_dir=' + output_dir, '--annotations_file=' + layout.val_json]
        + chosen + _tile_flags(plan) + (['--tta'] if tta else []),
        max(900.0, (60.0 if tta else 30.0) * plan.val_images))
    with open(os.path.join(output_dir, 'metrics.json')) as stream:
        return json.load(stream)


def flips_line(plain, flipped):
    """(whether the flips are kept: a higher AP, the measure best/ is kept by; the line said)."""
    kept = flipped['AP'] > plain['AP']
    return kept, ('  with left-right flips fused (test-time augmentation): AP %.3f / AP50 %.3f, '
                  'as they are %.3f / %.3f: %s' % (
                      flipped['AP'], flipped['AP50'], plain['AP'], plain['AP50'],
                      'kept (the Detector of this folder fuses them; inference.py predict '
                      '--tta)' if kept else 'not kept'))


def evaluation_stage(runner, plan, record, checkpoint):
    """[5/6]: whole-photo metrics as the photos are and with their flips fused (the better
    kept: `tta`, and both in `views`), the error analysis and the picture of the kept ones;
    returns the metrics."""
    layout = runner.layout
    plain = _scored(runner, plan, checkpoint, layout.evaluation, tta=False)
    flipped = _scored(runner, plan, checkpoint, layout.flipped, tta=True)
    tta, line = flips_line(plain, flipped)
    runner.say(line)
    metrics = dict(flipped if tta else plain, tta=tta,
                   views={'as they are': plain, 'flips fused': flipped})
    detections_json = os.path.join(layout.flipped if tta else layout.evaluation,
                                   'detections.json')
    runner.command('analyze', 'analyze', [
        '--detections_json=' + detections_json, '--val_json_file=' + layout.val_json,
        '--image_dir=' + record['val_image_dir'], '--max_dets=0', '--worst=1',
        '--output_dir=' + layout.analysis], 1800)
    with open(layout.val_json) as stream, open(detections_json) as found:
        threshold = report.best_f1_threshold(os.path.join(layout.analysis, 'analysis.json'))
        report.draw_picture(json.load(stream), record['val_image_dir'], json.load(found),
                            report.DEFAULT_THRESHOLD if threshold is None else threshold,
                            layout.picture)
    with open(os.path.join(layout.analysis, 'analysis.txt')) as stream:
        short = stream.read().split('\n\n')[0]  # analysis.txt's first block: its log lines.
        runner.say('\n'.join('  ' + line for line in short.splitlines()))
    return metrics


def export_stage(runner, checkpoint):
    """[6/6]: {'saved_model': dir, 'tflite': file or None, 'tflite_error': why or None}."""
    layout = runner.layout
    chosen = ['--checkpoint=' + checkpoint] if checkpoint else []
    common = ['export', '--model_dir=' + layout.model_dir, '--export_dir=' + layout.export]
    runner.command('export', 'inference', common + ['--formats=saved_model'] + chosen, 1800)
    exported = {'saved_model': layout.export, 'tflite': None, 'tflite_error': None}
    try:
        runner.command('export-tflite', 'inference', common + ['--formats=tflite_fp32'] + chosen,
                       1800)
        exported['tflite'] = os.path.join(layout.export,
                                         export_formats.TFLITE_FILES['tflite_fp32'])
    except (runner_lib.StageFailed, UserError) as error:
        exported['tflite_error'] = str(error)
    runner.say('  SavedModel %s; TFLite %s' % (layout.export, exported['tflite'] or
                                              'not written (%s)' % exported['tflite_error']))
    return exported


def _finish(runner, plan, record, training, deadline):
    layout = runner.layout
    checkpoint, step = best_checkpoint(layout.model_dir)
    training = dict(training, best_step=step, checkpoint=checkpoint or layout.model_dir)
    _stage(runner, 5, 'evaluation: the whole validation photos%s, as they are and with their '
           'flips, the error analysis' % (', tiled' if plan.tile_size else ''),
           _remaining(plan, 'whole photos + export'), deadline)
    metrics = evaluation_stage(runner, plan, record, checkpoint)
    _stage(runner, 6, 'export: SavedModel and TFLite', deadline=deadline)
    exported = export_stage(runner, checkpoint)
    summary = report.summary(metrics, training, plan, layout, exported, runner.elapsed() / 60.0)
    report.write_summary(layout.summary_json, summary)
    return summary


def finetune(options, stream=None, after_plan=None):
    """Runs the fine-tune (or with dry_run only its first two stages, in a temporary folder);
    returns the summary dict (None for a dry run). after_plan(runner, plan), if given, runs
    once the plan is printed (the label review says what it adds). Raises UserError,
    StageFailed."""
    root = (tempfile.mkdtemp(prefix='finetune-dry-run-') if options.dry_run
            else os.path.abspath(options.output_dir))
    runner = runner_lib.Runner(runner_lib.Layout(root), options.verbose,
                               **({'stream': stream} if stream else {}))
    try:
        return _run(runner, options, after_plan)
    except processes.Stopped as stop:
        explain_stop(runner, stop, options.dry_run)
        raise
    finally:
        if options.dry_run:
            shutil.rmtree(root, ignore_errors=True)


def _run(runner, options, after_plan=None):
    layout = runner.layout
    state = prepare.check_flags(layout, options)
    if os.path.exists(layout.summary_json):
        with open(layout.summary_json) as stream:
            summary = json.load(stream)
        runner.say('done earlier (%s):' % layout.summary_json)
        runner.say('\n'.join(report.table(summary)))
        return summary
    deadline = time.time() + options.max_minutes * 60.0 if options.max_minutes else None
    _stage(runner, 1, 'data: %s' % options.data)
    record = prepare.data_stage(runner, options, state)
    _stage(runner, 2, 'plan: the data doctor, then the plan')
    plan = prepare.plan_stage(runner, options, state)
    if after_plan:
        after_plan(runner, plan)
    if options.dry_run:
        runner.say('dry run: nothing written; the plan above is what the run would do')
        return None
    runner.say('  wrote %s (rerun the training: %s)' % (layout.plan_yaml,
                                                         prepare.rerun_command(layout)))
    _stage(runner, 3, 'records: the converter', _remaining(plan, 'data'), deadline)
    records_stage(runner, plan, record)
    _stage(runner, 4, 'training: %d steps of %d images' % (plan.steps, plan.global_batch),
           _remaining(plan, 'start-up'), deadline)
    spent = runner.elapsed()  # The stages before training, measured.
    load = budget.stages_load(plan, spent)
    plan, last = search.search_stage(runner, plan, deadline, prepare.plan_from_record, spent)
    if last is None:
        plan = budget.before_training(runner, plan, deadline,
                                      rerun.latest_step(layout.model_dir), spent)
    training = training_stage(runner, plan, deadline, last, load)
    with open(layout.plan_json) as stream:  # Its steps as training last corrected them.
        plan = prepare.plan_from_record(json.load(stream))
    summary = _finish(runner, plan, record, training, deadline)
    runner.say('fine-tune done in %.1f min (%s):' % (summary['minutes'], layout.summary_json))
    runner.say('\n'.join(report.table(summary)))
    if options.max_minutes:
        runner.say(budget.used_line(summary['minutes'], options.max_minutes,
                                    summary['training_ended'], summary.get('images_per_second')))
    return summary
