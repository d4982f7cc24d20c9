"""engine/checkpoint_eval.py in one process with the tiny model (tests/tiny_engine.py):
evaluate_checkpoint's metrics (pycocotools on the tiny model's detections, equal to a direct
coco_metric computation and to the AP worked out by hand) and what it writes (metrics JSON,
summaries, the JSON log line, model_dir/best), keep_best, evaluate_latest and
evaluate_continuously (stops at the final step; no checkpoint); the progress of an evaluation
in both forms and the image counts it is measured against, against the input's own split."""
import contextlib
import io
import json
import os
import re
import shutil
import time

import pytest
import tensorflow as tf

import tiny_engine
from efficientdet_hpu.core.errors import UserError
from efficientdet_hpu.data import dataloader
from efficientdet_hpu.evaluation import coco_metric
from efficientdet_hpu.engine import bad_records
from efficientdet_hpu.engine import checkpoint_eval as evaluation
from efficientdet_hpu.engine import loops
from efficientdet_hpu.engine import train_log as run_log
from tfrecord_fixtures import random_specs, write_shards
from tiny_engine import TinyModel, engine_options, logged_steps

tf1 = tf.compat.v1


@pytest.fixture(scope='module')
def val_pattern(tmp_path_factory):
    return tiny_engine.write_val_shards(tmp_path_factory.mktemp('val'))


@pytest.fixture(scope='module')
def trained(val_pattern, tmp_path_factory):
    """model_dir with checkpoints at steps 2 and 5 of a 5-step training (2 epochs of 2.5),
    not evaluated; the shift shrinks from 0.2, so step 5 scores better. Read only."""
    model_dir = str(tmp_path_factory.mktemp('trained') / 'model')
    options = engine_options(model_dir, val_pattern, mode='train', num_epochs=2)
    with tiny_engine.tiny_run(options, TinyModel(initial_shift=0.2)) as run:
        loops.train_until(run, 2)
        loops.train_until(run, 5)
    return model_dir


def _copy(model_dir, tmp_path):
    copy = str(tmp_path / 'model')
    shutil.copytree(model_dir, copy)
    return copy


def _summaries(directory):
    """{(tag, step): value} of the scalar summaries in directory's event files."""
    values = {}
    for path in tf.io.gfile.glob(os.path.join(directory, 'events.out.tfevents.*')):
        for event in tf1.train.summary_iterator(path):
            for value in event.summary.value:
                values[(value.tag, event.step)] = value.simple_value
    return values


def test_evaluate_checkpoint_scores_with_pycocotools_and_writes_every_record(trained, val_pattern,
                                                                            tmp_path):
    model_dir = _copy(trained, tmp_path)
    checkpoint = os.path.join(model_dir, 'model.ckpt-2')
    printed = io.StringIO()
    options = engine_options(model_dir, val_pattern, mode='eval', num_epochs=2)
    with contextlib.redirect_stdout(printed), tiny_engine.tiny_run(options, TinyModel()) as run:
        metrics = evaluation.evaluate_checkpoint(run, checkpoint)
    direct = tiny_engine.direct_metrics(checkpoint)
    assert list(metrics) == list(direct) == list(coco_metric.METRIC_NAMES) + [
        'AP_/1', 'AP_/2', 'AP_/3']
    for name in direct:
        assert metrics[name] == pytest.approx(direct[name], abs=1e-12), name
    assert metrics['AP'] == tiny_engine.hand_ap(tiny_engine.ema_shift(checkpoint)) == 0.4
    assert metrics['AP50'] == 1.0

    assert 'COCO evaluation of model.ckpt-2 (step 2, 5 images):\n' in printed.getvalue()
    for name in ('metrics-2.json', 'metrics_latest.json'):
        with open(os.path.join(model_dir, 'eval', name)) as f:
            assert json.load(f) == {'step': 2, 'metrics': metrics}
    (record,) = [r for r in run_log.read_json_log(model_dir) if r['event'] == 'eval']
    assert record == dict(metrics, event='eval', step=2)
    summaries = _summaries(os.path.join(model_dir, 'eval'))
    assert summaries[('eval/AP', 2)] == pytest.approx(metrics['AP'])
    assert summaries[('eval/AP__1', 2)] == pytest.approx(metrics['AP_/1'])
    # The first evaluation is the best so far: a loadable copy in model_dir/best.
    best = tiny_engine.best_record(model_dir)
    assert (best['step'], best['checkpoint'], best['AP']) == (2, 'model.ckpt-2', metrics['AP'])
    kept = tf.train.latest_checkpoint(os.path.join(model_dir, 'best'))
    assert kept == os.path.join(model_dir, 'best', 'model.ckpt-2')
    assert tiny_engine.ema_shift(kept) == tiny_engine.ema_shift(checkpoint)


def test_keep_best_replaces_only_a_lower_ap(trained, tmp_path):
    model_dir = _copy(trained, tmp_path)
    first, second = (os.path.join(model_dir, 'model.ckpt-%d' % step) for step in (2, 5))
    assert evaluation.keep_best(model_dir, first, 2, {'AP': 0.3, 'AP50': 0.5})
    assert evaluation.keep_best(model_dir, second, 5, {'AP': 0.4, 'AP50': float('nan')})
    assert not evaluation.keep_best(model_dir, first, 2, {'AP': 0.4})  # A tie keeps the first.
    assert not evaluation.keep_best(model_dir, first, 2, {'AP': 0.1})
    best_dir = os.path.join(model_dir, 'best')
    assert sorted(os.listdir(best_dir)) == [
        'best_eval.json', 'checkpoint', 'model.ckpt-5.data-00000-of-00001', 'model.ckpt-5.index']
    assert tiny_engine.best_record(model_dir) == {
        'step': 5, 'checkpoint': 'model.ckpt-5', 'AP': 0.4,
        'metrics': {'AP': 0.4, 'AP50': None}}
    assert [name for name in os.listdir(model_dir) if name.startswith('best.')] == []


def test_keep_best_leaves_the_kept_one_when_the_checkpoint_went(trained, tmp_path):
    """A training job keeping few checkpoints may remove the one just evaluated: the best
    kept stays whole and as it was, and nothing half-copied is left."""
    model_dir = _copy(trained, tmp_path)
    first, second = (os.path.join(model_dir, 'model.ckpt-%d' % step) for step in (2, 5))
    assert evaluation.keep_best(model_dir, first, 2, {'AP': 0.3})
    os.remove(second + '.data-00000-of-00001')  # The index alone: a checkpoint going.
    with tiny_engine.log_lines() as logged:
        assert not evaluation.keep_best(model_dir, second, 5, {'AP': 0.4})
    assert any('model.ckpt-5 (AP 0.4000) was removed by the training job' in line
               for line in logged)
    assert tiny_engine.best_record(model_dir)['step'] == 2
    assert sorted(os.listdir(os.path.join(model_dir, 'best'))) == [
        'best_eval.json', 'checkpoint', 'model.ckpt-2.data-00000-of-00001', 'model.ckpt-2.index']
    assert [name for name in os.listdir(model_dir) if name.startswith('best.')] == []


def test_evaluate_continuously_stops_after_the_final_step(trained, val_pattern, tmp_path):
    """The JSON log says the training ran to step 5, the newest checkpoint: `--mode=eval`
    evaluates it and stops without waiting for --eval_timeout."""
    model_dir = _copy(trained, tmp_path)
    assert run_log.training_final_step(model_dir) == 5
    options = engine_options(model_dir, val_pattern, mode='eval', num_epochs=2,
                             eval_timeout=120)
    start = time.time()
    with tiny_engine.log_lines() as logged, contextlib.redirect_stdout(io.StringIO()):
        with tiny_engine.tiny_run(options, TinyModel()) as run:
            assert loops.execute(run) == 0
    assert time.time() - start < 60
    assert 'evaluated the final step 5; stopping' in logged
    assert logged_steps(model_dir, 'eval') == [5]
    checkpoint = os.path.join(model_dir, 'model.ckpt-5')
    assert tiny_engine.read_metrics(model_dir, 5)['AP'] == pytest.approx(
        tiny_engine.direct_metrics(checkpoint)['AP'], abs=1e-12)
    assert tiny_engine.best_record(model_dir)['step'] == 5


def test_without_a_checkpoint_the_evaluator_stops_in_one_line(val_pattern, tmp_path):
    model_dir = str(tmp_path / 'model')
    options = engine_options(model_dir, val_pattern, mode='eval', eval_timeout=1)
    with tiny_engine.log_lines() as logged, tiny_engine.tiny_run(options, TinyModel()) as run:
        assert evaluation.evaluate_latest(run) is None
        with pytest.raises(UserError, match=r'no checkpoint came to --model_dir=%s within '
                           r'--eval_timeout=1 s, so nothing was evaluated' % model_dir):
            evaluation.evaluate_continuously(run)
        # A checkpoint a training job rotated out before it was read: moved on from.
        assert evaluation.evaluate_checkpoint(
            run, os.path.join(model_dir, 'model.ckpt-3')) is None
    assert 'no checkpoint in %s to evaluate' % model_dir in logged
    assert 'no new checkpoint within --eval_timeout=1 s; stopping' in logged
    assert ('model.ckpt-3 was removed before evaluation (the training job keeps only '
            '--keep_checkpoint_max checkpoints); moving on') in logged
    assert not os.path.exists(os.path.join(model_dir, 'eval'))
    assert logged_steps(model_dir, 'eval') == []



class _Terminal(io.StringIO):
    def isatty(self):
        return True


@pytest.mark.parametrize('terminal', [False, True])
def test_an_evaluation_shows_its_progress_and_says_what_it_scores(trained, val_pattern, tmp_path,
                                                                   monkeypatch, terminal):
    """Plain: lines in the log, the last with the time taken (five images in three batches
    take less than the five seconds before another line, unless the first batch does); on
    a terminal (stderr): a line drawn in place from the first batch on (again after any log
    record), ended by that last line. Then the scoring is announced."""
    model_dir = _copy(trained, tmp_path)
    stderr = _Terminal() if terminal else io.StringIO()
    monkeypatch.setattr('sys.stderr', stderr)  # Where absl's handler writes the log too.
    options = engine_options(model_dir, val_pattern, mode='eval', num_epochs=2)
    with tiny_engine.log_lines() as logged, contextlib.redirect_stdout(io.StringIO()):
        with tiny_engine.tiny_run(options, TinyModel()) as run:
            evaluation.evaluate_checkpoint(run, os.path.join(model_dir, 'model.ckpt-2'))
    shown = [line for line in logged if line.startswith('evaluating model.ckpt-2:')]
    last = (r'evaluating model\.ckpt-2: 5/5 images \(100%\) in 0:00:\d\d'
            r'( \(start-up 0:00:\d\d\))?, [\d.]+ images/s')
    if terminal:
        draws = [part for part in stderr.getvalue().split('\r')
                 if part.startswith('evaluating model.ckpt-2:')]
        assert not shown and draws[0] == 'evaluating model.ckpt-2: 2/5 images (40%)\x1b[K'
        for draw in draws[1:-1]:  # Batches of 2, 2 and 1.
            assert re.fullmatch(r'evaluating model\.ckpt-2: [45]/5 images \((80|100)%\), '
                                r'[\d.]+ images/s, ETA 0:00:0\d\x1b\[K', draw), draw
        assert re.match(last + r'\x1b\[K\n', draws[-1]), draws[-1]  # The log goes on below.
    else:
        assert '\r' not in stderr.getvalue()
        assert re.fullmatch(last, shown[-1]), shown
        for line in shown[:-1]:  # On a busy machine the first batch may take 5 s or more.
            assert re.fullmatch(r'evaluating model\.ckpt-2: [24]/5 images \((40|80)%\)'
                                r'(, [\d.]+ images/s, ETA 0:00:\d\d)?', line), line
    # 7 boxes in VAL_SPECS: the tiny model detects each once.
    scoring = 'scoring 7 detections of 5 images (%s)' % coco_metric.DEFAULT_EVALUATOR
    scored = [index for index, line in enumerate(logged) if line.startswith('scored in ')]
    assert scoring in logged and scored == [logged.index(scoring) + 1], logged


def _images_read(pattern, eval_samples, skip, ranks, rank):
    """The records the evaluation input of rank `rank` of `ranks` reads: the input's own
    split (InputReader._records, before decoding, which these counts need not wait for)."""
    reader = dataloader.InputReader(pattern, is_training=False, num_shards=ranks,
                                    shard_index=rank, max_examples=eval_samples or None,
                                    skip=skip)
    records = reader._records(ranks, rank, 0, None)  # pylint: disable=protected-access
    return sum(1 for _ in records.as_numpy_iterator())


@pytest.fixture(scope='module')
def three_shards(tmp_path_factory):
    """7 images of 64x64 in shards of 3, 2 and 2."""
    return write_shards(tmp_path_factory.mktemp('three'), random_specs(7, 64, 64, seed=3),
                        num_files=3, prefix='val')


@pytest.mark.parametrize('ranks,eval_samples,skipped', [
    (1, 0, False), (2, 0, False), (3, 0, False),  # Whole files per rank.
    (4, 0, False),  # More ranks than files: every 4th record.
    (2, 5, False),  # --eval_samples: the first 5, every 2nd record.
    (2, 0, True), (2, 6, True)])  # --skip_bad_records: two records left out.
def test_image_counts_are_what_each_rank_reads(three_shards, ranks, eval_samples, skipped):
    files = dataloader.list_record_files(three_shards)
    skip = bad_records.SkipList({files[0]: [1], files[2]: [0]}, {}) if skipped else None
    shares = [evaluation.eval_image_counts(three_shards, eval_samples, skip, ranks, rank)
              for rank in range(ranks)]
    read = [_images_read(three_shards, eval_samples, skip, ranks, rank)
            for rank in range(ranks)]
    assert [mine for mine, _ in shares] == read
    assert {job for _, job in shares} == {sum(read)}


def test_image_counts_are_unknown_for_remote_or_missing_files():
    assert evaluation.eval_image_counts('gs://bucket/val-*.tfrecord', 0, None, 1, 0) == (
        None, None)
    assert evaluation.eval_image_counts('', 0, None, 1, 0) == (None, None)
