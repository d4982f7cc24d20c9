"""The review from start to summary, each stage resumable from what output_dir holds:

  [1/5] data      the fine-tune's data stage (finetune/prepare.py: read, check, split), or a
                  fine-tune's data/ as it is (--finetune_dir)
  [2/5] plan      the fine-tune's plan (the data doctor, plan.yaml) or a fine-tune's own, then
                  the review's (review/plan.py): folds, steps, time
  [3/5] records   each fold's photos converted once
  [4/5] folds     each fold's model trained on the other folds, its photos predicted
  [5/5] scores    cleanlab's scores, issues.csv, the page, the labelling tools' files; with a
                  fine-tune's evaluation, the share of its validation AP the issues explain
then review/summary.json and the table. `review_finetune` is what the fine-tune calls with
--review_labels: the same review of its output_dir, its trained model reused for fold 0.
"""
import dataclasses
import json
import os
import shutil
import tempfile
import time

from efficientdet_hpu.core import atomic_file
from efficientdet_hpu.core import processes
from efficientdet_hpu.core.errors import UserError
from efficientdet_hpu.finetune import costs
from efficientdet_hpu.finetune import hardware
from efficientdet_hpu.finetune import plan_file
from efficientdet_hpu.finetune import prepare
from efficientdet_hpu.finetune import rerun
from efficientdet_hpu.finetune import runner as runner_lib
from efficientdet_hpu.finetune import stages
from efficientdet_hpu.finetune import stats
from efficientdet_hpu.review import issues as issues_lib
from efficientdet_hpu.review import layout as layout_lib
from efficientdet_hpu.review import plan as plan_lib
from efficientdet_hpu.review import predictions
from efficientdet_hpu.review import report
from efficientdet_hpu.review import scores as scores_lib

STAGES = 5
RATE_TOLERANCE = 0.1  # A fold's measured rate this far off the plan's re-estimates the rest.


@dataclasses.dataclass(frozen=True)
class Options:
    """The command line of efficientdet-review (cli/review.py). finetune_dir: a fine-tune's
    output_dir whose data, plan and model the review reuses (and writes into)."""
    data: str = ''
    output_dir: str = ''
    finetune_dir: str = ''
    single_class: str = ''
    weights: str = ''
    model_name: str = ''
    images_per_second: float = 0.0
    hparams: str = ''
    folds: int = 0
    steps: int = 0
    max_minutes: float = 0.0
    threshold: float = issues_lib.DEFAULT_THRESHOLD
    dry_run: bool = False
    verbose: bool = False

    @property
    def root(self) -> str:
        return os.path.abspath(self.finetune_dir or self.output_dir)

    def finetune_options(self) -> prepare.Options:
        """The fine-tune's data and plan stages as this review asks them (no budget: the
        review sizes its folds to its own)."""
        return prepare.Options(data=self.data, output_dir=self.root,
                               single_class=self.single_class, weights=self.weights,
                               model_name=self.model_name,
                               images_per_second=self.images_per_second, hparams=self.hparams,
                               dry_run=self.dry_run, verbose=self.verbose)


def _stage(runner, number, name):
    runner.say('[%d/%d] %s' % (number, STAGES, name))


def _read(path):
    with open(path) as stream:
        return json.load(stream)


def rerun_state(runner, layout, options):
    """--data: prepare.check_flags' Rerun of output_dir, where a review begun on another input
    or flags starts again or is refused (_begun_anew); None with --finetune_dir."""
    if options.finetune_dir:
        return None
    state = prepare.check_flags(runner.layout, options.finetune_options())
    # --images_per_second moves the estimates only: the review's plan.json holds its steps.
    state.replan = tuple(item for item in state.replan if item[0] not in rerun.BUDGET_KEYS)
    _begun_anew(runner, layout, state, options)
    return state


def data_and_plan(runner, options, state=None):
    """(the fine-tune's inputs record, its Plan, whether its model trained); state: the
    rerun_state of a --data review."""
    layout = runner.layout
    if options.finetune_dir:
        if not os.path.exists(layout.plan_json) or not os.path.exists(layout.inputs_json):
            raise UserError('--finetune_dir=%s holds no fine-tune plan (plan.json, '
                            'data/inputs.json); run efficientdet-finetune there first, or give '
                            '--data=DIR --output_dir=DIR' % options.finetune_dir)
        _stage(runner, 1, 'data: the fine-tune\'s (%s)' % layout.data)
        record = _read(layout.inputs_json)
        runner.say('  %s\n  %s' % (record['line'], record['split']))
        _stage(runner, 2, 'plan: the fine-tune\'s, then the review\'s')
        plan = prepare.plan_from_record(_read(layout.plan_json))
        runner.say('\n'.join(plan_file.lines(plan)))
        return record, plan, os.path.exists(layout.training_json)
    finetune = options.finetune_options()
    _stage(runner, 1, 'data: %s' % options.data)
    record = prepare.data_stage(runner, finetune, state)
    _stage(runner, 2, 'plan: the data doctor, the fine-tune\'s plan, then the review\'s')
    return record, prepare.plan_stage(runner, finetune, state), False


def _begun_anew(runner, layout, state, options):
    """A review begun in output_dir on another input or other flags (prepare.check_flags'
    Rerun) is started again, its folds of the old photos removed; where a fold's model has
    trained, refused (UserError). Input files only touched (copied, checked out: the same
    photos and boxes) leave trained folds to go on, as the fine-tune's model does."""
    changed = state.replan or (state.read is not None and (state.note or not state.same_data))
    if not changed or not os.path.isdir(layout.directory):
        return
    folds = layout.path('folds')
    trained = sorted(name for name in (os.listdir(folds) if os.path.isdir(folds) else ())
                     if rerun.latest_step(os.path.join(folds, name, 'model')) is not None)
    if trained and not state.replan and state.same_data:
        runner.say('the input\'s files changed since the last run (%s), its photos and boxes did '
                   'not: the review\'s trained folds (%s) go on' % (state.changes,
                                                                    ', '.join(trained)))
        return
    if trained:
        raise UserError('--output_dir=%s holds a review whose %s model trained on the last '
                        'run\'s input and flags (%s); rerun those to resume it, or review '
                        'this input in another --output_dir' % (
                            options.output_dir, trained[0], '; '.join(part for part in (
                                state.changes, rerun.describe(state.replan)) if part)))
    runner.say('the review begun in %s starts again: its folds were of the last run\'s input '
               'and flags' % layout.directory)
    shutil.rmtree(layout.directory)


def _asked(options) -> dict:
    """What decides the review's folds: a rerun must ask the same to resume (--threshold
    only cuts the list: another lists anew from the same folds, finished_review)."""
    return {'folds': options.folds, 'steps': options.steps}


def check_request(layout, options):
    """Raises UserError when output_dir holds a review of other --folds or --steps (its folds
    would mix two plans)."""
    if not os.path.exists(layout.request_json):
        return
    saved, wanted = _read(layout.request_json), _asked(options)
    changed = sorted(key for key in wanted if saved.get(key) != wanted[key])
    if changed:
        raise UserError('%s holds a review of other flags (%s: was %s); rerun with the same '
                        'flags to resume it, or give another output directory' % (
                            layout.directory, ', '.join('--' + key for key in changed),
                            ', '.join(repr(saved.get(key)) for key in changed)))


def _cost_table():
    """The cost table of this machine, as the fine-tune's plan reads it."""
    return costs.load(hardware.detect().cpu)


def review_plan(runner, layout, plan, options, reuse_first):
    if os.path.exists(layout.plan_json):
        review = plan_lib.from_record(_read(layout.plan_json))
        runner.say('  the review\'s plan of the first run (%s):' % layout.plan_json)
    else:
        train, val = _read(runner.layout.train_json), _read(runner.layout.val_json)
        review = plan_lib.make(plan, train, val, plan_lib.Request(
            options.folds, options.steps, options.max_minutes, reuse_first, _cost_table()))
    runner.say('\n'.join(plan_file.lines(review)))
    return review


def records_stage(runner, layout, review, plan, record):
    train, val = _read(runner.layout.train_json), _read(runner.layout.val_json)
    image_dirs = {'train': record['train_image_dir'], 'val': record['val_image_dir']}
    for fold in review.folds:
        predictions.write_inputs(layout, fold, predictions.fold_coco(fold, train, val),
                                 image_dirs)
        prefix = predictions.records_prefix(layout, runner.layout, fold)
        if fold.is_validation:  # The fine-tune's records (converted by its data stage).
            json_path, image_dir = runner.layout.val_json, record['val_image_dir']
        else:
            json_path, image_dir = layout.fold(fold.index, 'records.json'), layout.fold(
                fold.index, 'photos')
        summary = predictions.convert(runner, fold, prefix, json_path, image_dir, plan,
                                      record.get('sources') or {})
        runner.say('  fold %d: %s, %s, %s' % (
            fold.index, stats.count(len(fold.photos), 'photo'),
            stats.count(summary['images_written'], 'tile' if plan.tile_size else 'image'),
            stats.count(summary['boxes_written'], 'box', 'boxes')))


def _fold_stop(deadline, layout, review, plan, index):
    """When fold `index`'s training must stop so that the later folds (the steps each has
    left), the predictions and the scores still fit the budget (the plan sized the steps to
    it; this is the guard)."""
    if deadline is None:
        return None
    reached = _steps_reached(layout, review, index)
    later = sum(plan_lib.training_seconds(plan, steps - reached.get(fold.index, 0),
                                          _cost_table())
                for fold, steps in zip(review.folds, review.steps) if fold.index > index)
    rest = sum(seconds for part, seconds in review.seconds
               if part in ('predictions', 'scores and page'))
    return deadline - later - rest


def _training_line(runner, index, steps, images, plan, reached=None) -> str:
    """What a fold's training is about to do, its time and where main.py's output goes (it is
    not echoed: a fold trains for as long as the fine-tune); `reached`, the step of a stopped
    run's checkpoint, counts only the steps left."""
    # At the plan's rate, or at the rate a fold before measured (_refitted).
    left = max(steps - (reached or 0), 0)  # A budget's refit may have cut under the step.
    seconds = plan_lib.training_seconds(plan, left, _cost_table())
    doing = ('resuming at step %d of %d on %d images, %d steps left' % (reached, steps, images,
                                                                        left)
             if reached else 'training %d steps on %d images' % (steps, images))
    return ('  fold %d: %s, about %.0f min (until %s); main.py\'s output in %s' % (
        index, doing, seconds / 60.0,
        time.strftime('%H:%M', time.localtime(time.time() + seconds)),
        os.path.join(runner.layout.logs, 'train-fold-%d.log' % index)))


def _steps_reached(layout, review, index):
    """{fold index: the step its model reached} for the folds after `index` that a stopped
    run began (a trained fold: its steps), never past the fold's steps (a budget's refit may
    have cut them under its checkpoint)."""
    reached = {}
    for fold, steps in zip(review.folds, review.steps):
        if fold.index > index and steps:
            trained = os.path.exists(layout.fold(fold.index, 'training.json'))
            reached[fold.index] = steps if trained else min(
                steps, rerun.latest_step(layout.fold(fold.index, 'model')) or 0)
    return reached


def _refitted(runner, layout, review, plan, index, record, deadline, rate_from="the plan's"):
    """After fold `index` trained: where its measured rate is RATE_TOLERANCE or more off the
    plan's (`rate_from` says whose rate that is), the rest of the review estimated at it and,
    under a budget, the later folds' steps fitted to it (plan_lib.refit; review/plan.json
    rewritten), in one line. (review, plan)."""
    rate = record.get('images_per_second')
    if not rate or abs(rate / plan.images_per_second - 1.0) < RATE_TOLERANCE:
        return review, plan
    left = None if deadline is None else deadline - time.time()
    refitted, at_rate, rest = plan_lib.refit(review, plan, index, rate, left, _cost_table(),
                                             _steps_reached(layout, review, index))
    cut = [(fold.index, new, old) for fold, old, new in zip(review.folds, review.steps,
                                                           refitted.steps) if new != old]
    runner.say('  fold %d trained at %.1f images/s, %s %.1f: the rest of the review '
               'takes about %.0f min at that rate (until %s)%s' % (
                   index, rate, rate_from, plan.images_per_second, rest / 60.0,
                   time.strftime('%H:%M', time.localtime(time.time() + rest)),
                   '; to fit --max_minutes, %s' % ', '.join(
                       'fold %d %d steps instead of %d' % item for item in cut) if cut else ''))
    if cut:
        atomic_file.write_json_atomically(layout.plan_json, plan_lib.to_record(refitted))
    return refitted, at_rate


def folds_stage(runner, layout, review, plan, trained_finetune, deadline):
    rate_from = 'the plan\'s'  # Whose rate the estimate takes: a fold's, once one is off it.
    for position, fold in enumerate(review.folds):
        steps, images = review.steps[position], review.train_images[position]
        if not steps and trained_finetune:  # The plan reuses the fine-tune's model here.
            checkpoint, step = stages.best_checkpoint(runner.layout.model_dir)
            runner.say('  fold 0: the fine-tune\'s model (step %s)' % step)
            model_dir = runner.layout.model_dir
        else:
            patterns = [predictions.records_prefix(layout, runner.layout, other) + '-*.tfrecord'
                        for other in review.folds if other.index != fold.index]
            recipe_path = layout.fold(fold.index, 'train.yaml')
            model_dir = layout.fold(fold.index, 'model')
            predictions.write_recipe(recipe_path, predictions.fold_recipe(
                runner.layout.plan_yaml, plan, steps, images, patterns, review.max_instances),
                'python main.py --hparams=%s --model_dir=%s' % (recipe_path, model_dir))
            if not os.path.exists(layout.fold(fold.index, 'training.json')):  # Not trained yet.
                runner.say(_training_line(runner, fold.index, steps, images, plan,
                                          rerun.latest_step(model_dir)))
            started = time.monotonic()
            training = predictions.train(runner, layout, fold, recipe_path, steps, plan,
                                         _fold_stop(deadline, layout, review, plan,
                                                    fold.index))
            runner.say('  fold %d: trained, %s at step %s (%.1f min)' % (
                fold.index, training['ended'], training['step'],
                (time.monotonic() - started) / 60.0))
            before = plan.images_per_second
            review, plan = _refitted(runner, layout, review, plan, fold.index, training,
                                     deadline, rate_from)
            if plan.images_per_second != before:
                rate_from = 'fold %d\'s' % fold.index
            checkpoint = None
        found = predictions.predict(runner, layout, fold, model_dir, checkpoint, plan,
                                    review.max_detections)
        runner.say('  fold %d: %s predicted, %s' % (
            fold.index, stats.count(len(fold.photos), 'photo'),
            stats.count(len(found), 'detection')))


KEPT = 'what the review finished is kept; rerun the same command to continue'


def review(options, stream=None) -> dict:
    """Runs the review; returns its summary (None for a dry run). Raises UserError,
    runner.StageFailed, and processes.Stopped with its line's `where` and `kept` (the rerun
    continues: the folds trained and the steps of the one training are kept)."""
    temporary = None
    if options.dry_run and not options.finetune_dir:  # As the fine-tune's: nothing written.
        temporary = tempfile.mkdtemp(prefix='review-dry-run-')
        options = dataclasses.replace(options, output_dir=temporary)
    try:
        return _review(options, stream)
    except processes.Stopped as stop:
        stop.where, stop.kept = stop.where or 'the label review', stop.kept or KEPT
        raise
    finally:
        if temporary:
            shutil.rmtree(temporary, ignore_errors=True)


def finished_review(runner, layout, threshold):
    """The summary of a review finished at this threshold, said again; None where none is,
    or where it was listed at another one (its summary.json removed: the rerun then lists
    anew from the folds' predictions, which it keeps)."""
    if not os.path.exists(layout.summary_json):
        return None
    summary = _read(layout.summary_json)
    if summary.get('threshold') != threshold:
        runner.say('--threshold=%g (the review listed at %g): listed anew from the folds\' '
                   'predictions' % (threshold, summary.get('threshold')))
        os.remove(layout.summary_json)
        return None
    runner.say('review done earlier (%s):' % layout.summary_json)
    runner.say('\n'.join(report.table(summary)))
    return summary


def _review(options, stream):
    check_installed()  # A missing cleanlab is said before anything runs.
    runner = runner_lib.Runner(runner_lib.Layout(options.root), options.verbose,
                               **({'stream': stream} if stream else {}))
    layout = layout_lib.Layout(options.root)
    state = rerun_state(runner, layout, options)
    check_request(layout, options)
    summary = finished_review(runner, layout, options.threshold)
    if summary is not None:
        return summary
    deadline = time.time() + options.max_minutes * 60.0 if options.max_minutes else None
    record, plan, trained = data_and_plan(runner, options, state)
    review_ = review_plan(runner, layout, plan, options, trained)
    if options.dry_run:
        runner.say('dry run: the review\'s plan above is what it would do')
        return None
    atomic_file.write_json_atomically(layout.request_json, _asked(options))
    atomic_file.write_json_atomically(layout.plan_json, plan_lib.to_record(review_))
    _stage(runner, 3, 'records: each fold\'s photos')
    records_stage(runner, layout, review_, plan, record)
    _stage(runner, 4, 'folds: %d models, each predicting the photos it never saw'
           % len(review_.folds))
    went_on = any(_steps_reached(layout, review_, -1).values())  # Folds a stopped run began.
    folds_stage(runner, layout, review_, plan, trained, deadline)
    _stage(runner, 5, 'scores: cleanlab, issues.csv, the page, the labelling tools\' files')
    summary = report.finish(runner, layout, review_, record, options.threshold, trained,
                            went_on)
    runner.say('review done in %.1f min (%s):' % (summary['minutes'], layout.summary_json))
    runner.say('\n'.join(report.table(summary)))
    return summary


def check_installed():
    """MissingCleanlab (one line naming the install command) when cleanlab is missing."""
    scores_lib.cleanlab_rank()


def finetune_estimate(runner, plan):
    """What --review_labels adds to a fine-tune's plan: the review's plan lines and the time
    with and without it (the fine-tune's model predicts fold 0)."""
    layout = runner.layout
    review_ = plan_lib.make(plan, _read(layout.train_json), _read(layout.val_json),
                            plan_lib.Request(reuse_first=True))
    runner.say('  --review_labels: the label review after the fine-tune (docs/review.md)')
    runner.say('\n'.join(plan_file.lines(review_)))
    runner.say('  time: about %.0f min without --review_labels, about %.0f min with it' % (
        plan.total_seconds / 60.0, (plan.total_seconds + review_.total_seconds) / 60.0))


def review_finetune(output_dir, verbose=False, threshold=None, stream=None) -> dict:
    """The review of a fine-tune's output_dir after it finished (--review_labels)."""
    return review(Options(finetune_dir=output_dir, verbose=verbose,
                          threshold=threshold or issues_lib.DEFAULT_THRESHOLD),
                  stream)
