"""COCO evaluation of checkpoints, distributed over ranks.

Each rank predicts its shard of the validation set with the EMA weights; detections and
ground truth are gathered to rank 0, which runs pycocotools once, so the AP equals that of a
single-process evaluation. Rank 0 prints the table, writes metrics JSON, TensorBoard summaries,
a line in the JSON log, and keeps the best checkpoint by AP in model_dir/best.
Distributed evaluation reads checkpoints from model_dir: with several boxes it must be on
storage every box can read.
"""
import glob
import json
import os
import shutil
import time

import numpy as np
import tensorflow as tf
from absl import logging

from efficientdet_hpu.core import errors
from efficientdet_hpu.core import progress
from efficientdet_hpu.data import dataloader
from efficientdet_hpu.data import tfrecord_framing
from efficientdet_hpu.runtime import distributed
from efficientdet_hpu.checkpoints import checkpoint_integrity
from efficientdet_hpu.checkpoints import checkpoints
from efficientdet_hpu.evaluation import coco_metric
from efficientdet_hpu.engine import bad_records
from efficientdet_hpu.engine import preemption
from efficientdet_hpu.training import det_model_fn
from efficientdet_hpu.evaluation import eval_analysis
from efficientdet_hpu.engine import train_log

tf1 = tf.compat.v1

BEST_DIR = 'best'


def eval_input_fn(run):
    """Batches of settings.batch.eval_per_rank images (per rank, as --train_batch_size)."""
    options = run.options
    reader = dataloader.InputReader(
        options.validation_file_pattern, is_training=False, num_shards=distributed.size(),
        shard_index=distributed.rank(), max_examples=options.eval_samples or None,
        skip=run.eval_skip)

    def input_fn(params):
        def as_features(images, labels):
            features = {key: labels[key] for key in det_model_fn.PREDICT_PASSTHROUGH}
            features['images'] = images
            return features
        return reader(params).map(as_features)
    return input_fn


def predict_shard(run, checkpoint, shown=None):
    """Runs this rank's shard through Estimator.predict (the PREDICT graph built for this
    call); returns (image_ids [N], detections [M,7], groundtruth [N,K,7]). shown: the
    core.progress.Progress that counts the images."""
    return collect_shard(run, run.estimator.predict(
        eval_input_fn(run), checkpoint_path=checkpoint, yield_single_examples=False), shown)


def collect_shard(run, predictions, shown=None):
    """(image_ids int64 [N], detections float64 [M,7], groundtruth float32 [N,K,7]) of an
    iterable of prediction batches (dicts of det_model_fn's PREDICT outputs, arrays with a
    batch dimension), whoever ran them: predict_shard or the evaluator a train_and_eval run
    keeps (engine/training_eval.py). Each batch's images are counted on `shown` (a
    core.progress.Progress, or None)."""
    image_ids, detections, groundtruth = [], [], []
    for batch in predictions:
        if shown is not None:
            shown.update(len(batch['source_ids']))
        image_ids.append(batch['source_ids'])
        groundtruth.append(batch['groundtruth_data'])
        for rows, count, image_id in zip(batch['detections'], batch['num_detections'],
                                         batch['source_ids']):
            # float32 rows hold ids exactly only below 2**24; take the int64 id instead.
            rows = rows[:count].astype(np.float64)
            rows[:, 0] = image_id
            detections.append(rows)
    k = run.config.max_instances_per_image
    return (np.concatenate(image_ids) if image_ids else np.zeros([0], np.int64),
            np.concatenate(detections) if detections else np.zeros([0, 7], np.float64),
            np.concatenate(groundtruth) if groundtruth else np.zeros([0, k, 7], np.float32))


def _gather(array):
    return np.concatenate(distributed.allgather_numpy(array))


def _metric(run):
    label_map = run.label_map
    return coco_metric.EvaluationMetric(
        val_json_file=run.options.val_json_file,
        label_map=label_map.label_to_category_id if label_map else None,
        class_names=label_map.label_to_name if label_map else None,
        testdev_dir=run.options.testdev_dir)


def _checkpoint_present(checkpoint):
    return tf.io.gfile.exists(checkpoint + '.index')


def _predict_unless_removed(run, checkpoint, predict, shown):
    """This rank's predict(run, checkpoint, shown), or None when the checkpoint is gone: a
    training job beside this evaluator rotated it out (keep_checkpoint_max) before or while
    it was read."""
    if not _checkpoint_present(checkpoint):
        return None
    try:
        with bad_records.named_data_errors(run.options.validation_file_pattern,
                                           run.config.num_classes):
            return predict(run, checkpoint, shown)
    except (tf.errors.NotFoundError, ValueError):
        if _checkpoint_present(checkpoint):
            raise
        return None


def _check_intact(checkpoint):
    """Raises CheckpointError on every rank when rank 0 finds `checkpoint` damaged; one that a
    training job rotated out meanwhile (no longer listed) is not: the caller moves on."""
    problem = None
    if distributed.is_main():
        try:
            checkpoint_integrity.check_for_reading(checkpoint)
        except checkpoints.CheckpointError as error:
            listed = checkpoint_integrity.listed_checkpoints(os.path.dirname(checkpoint))
            problem = str(error) if checkpoint in listed else None
    problem = distributed.broadcast_object(problem)
    if problem:
        raise checkpoints.CheckpointError(problem)


def evaluate_checkpoint(run, checkpoint, predict=predict_shard):
    """Evaluates one checkpoint on all ranks; returns the metrics dict on every rank, or None
    when the checkpoint was removed before it could be read (every rank then moves on).
    Raises CheckpointError naming a damaged checkpoint.

    predict(run, checkpoint, shown): this rank's shard as predict_shard returns it, its images
    counted on `shown` (rank 0's progress line); a train_and_eval run passes its kept
    evaluation graph's (engine/training_eval.py)."""
    step = checkpoints.checkpoint_step(checkpoint)
    _check_intact(checkpoint)
    eval_analysis.check_split(run)
    logging.info('evaluating %s (step %d)', os.path.basename(checkpoint), step)
    shown, shard = _progress(run, checkpoint), None
    try:
        shard = _predict_unless_removed(run, checkpoint, predict, shown)
    finally:  # No total line for an evaluation that failed or whose checkpoint went.
        shown.close(finished=shard is not None)
    if distributed.size() > 1 and distributed.is_main():  # It waits for the slowest rank.
        logging.info('gathering the detections of the %d ranks', distributed.size())
    if any(lost for lost in distributed.allgather_numpy(shard is None)):
        logging.warning('%s was removed before evaluation (the training job keeps only '
                        '--keep_checkpoint_max checkpoints); moving on',
                        os.path.basename(checkpoint))
        return None
    image_ids, detections, groundtruth = shard
    image_ids, detections = _gather(image_ids), _gather(detections)
    groundtruth = _gather(groundtruth)
    metrics = None
    if distributed.is_main():
        metric = _metric(run)
        metric.update_state(image_ids, detections, groundtruth)
        metrics = _score(run, metric, len(detections), len(image_ids))
        if metrics:
            _report(run, checkpoint, step, metrics, len(image_ids))
            eval_analysis.analyse_safely(run, metric.scored, step)
        else:
            logging.info('test-dev detections written to %s', run.options.testdev_dir)
    return distributed.broadcast_object(metrics)


def _score(run, metric, num_detections, num_images):
    """metric.evaluate(), said before (COCO's scoring of 5,000 images takes a while)."""
    if not run.options.testdev_dir:
        logging.info('scoring %d detections of %d images (%s)', num_detections, num_images,
                     metric.evaluator)
    start = time.time()
    metrics = metric.evaluate()
    if metrics:
        logging.info('scored in %.1f s', time.time() - start)
    return metrics


def _records_read(path, skip):
    """Records of one shard the input reads: those framed intact, up to a break the skip
    list records, less the records it leaves out."""
    count = len(tfrecord_framing.scan_framing(path).offsets)
    if skip is not None:
        count = min(count, skip.readable.get(path, count))
        count -= sum(1 for index in skip.bad.get(path, ()) if index < count)
    return count


def eval_image_counts(file_pattern, eval_samples, skip, ranks, rank):
    """(images rank `rank` of `ranks` evaluates, images all ranks evaluate), split as
    dataloader.InputReader splits an evaluation: every ranks-th record with --eval_samples or
    fewer files than ranks, else whole files. Counted from the shards' record headers (12
    bytes a record; no image is read); (None, None) for files on remote storage (a read per
    record over the network) or none that can be read (the input then says why)."""
    if not file_pattern or '://' in file_pattern:
        return None, None
    try:
        counts = [_records_read(path, skip)
                  for path in tfrecord_framing.list_shards(file_pattern)]
    except (OSError, tf.errors.OpError):
        return None, None
    if not counts:
        return None, None
    job = sum(counts)
    if eval_samples or len(counts) < ranks:
        job = min(job, eval_samples) if eval_samples else job
        return len(range(rank, job, ranks)), job
    return sum(counts[rank::ranks]), job


def _progress(run, checkpoint):
    """Rank 0's progress line of an evaluation of `checkpoint` (core/progress.py): its
    images, said to be its share under several ranks; plain lines go to the log."""
    if not distributed.is_main():
        return progress.Progress('', enabled=False)
    ranks, options = distributed.size(), run.options
    mine, job = eval_image_counts(options.validation_file_pattern, options.eval_samples,
                                  run.eval_skip, ranks, 0)
    note = None
    if ranks > 1:
        note = "rank 0's share of %d" % job if job is not None else "rank 0's share"
    return progress.Progress('evaluating %s' % os.path.basename(checkpoint), total=mine,
                             note=note, log=lambda line: logging.info('%s', line))


def _report(run, checkpoint, step, metrics, num_images):
    model_dir = run.options.model_dir
    print('COCO evaluation of %s (step %d, %d images):\n%s'
          % (os.path.basename(checkpoint), step, num_images, coco_metric.format_table(metrics)),
          flush=True)
    coco_metric.write_metrics_json(metrics, model_dir, step)
    _write_summaries(os.path.join(model_dir, 'eval'), metrics, step)
    train_log.append_json_log(model_dir, dict(
        {'event': 'eval', 'step': step}, **{k: _finite_or_none(v) for k, v in metrics.items()}))
    keep_best(model_dir, checkpoint, step, metrics)


def _finite_or_none(value):
    value = float(value)
    return value if np.isfinite(value) else None


def _write_summaries(directory, metrics, step):
    values = [tf1.Summary.Value(tag='eval/' + name.replace('/', '_'), simple_value=float(v))
              for name, v in metrics.items() if np.isfinite(float(v))]
    with tf.Graph().as_default():  # The v1 writer refuses eager mode.
        writer = tf1.summary.FileWriter(directory)
        writer.add_summary(tf1.Summary(value=values), step)
        writer.close()


def keep_best(model_dir, checkpoint, step, metrics):
    """Copies `checkpoint` to model_dir/best when its AP beats the kept one (swap by rename)."""
    best_dir = os.path.join(model_dir, BEST_DIR)
    record = os.path.join(best_dir, 'best_eval.json')
    if os.path.exists(record):
        with open(record) as f:
            if json.load(f)['AP'] >= metrics['AP']:
                return False
    staging = best_dir + '.tmp-%d' % os.getpid()
    shutil.rmtree(staging, ignore_errors=True)
    os.makedirs(staging)
    name = os.path.basename(checkpoint)
    if not _copy_whole(checkpoint, staging):
        shutil.rmtree(staging, ignore_errors=True)
        logging.warning('%s (AP %.4f) was removed by the training job (--keep_checkpoint_max) '
                        'before it could be kept in %s; the best kept stays as it was',
                        name, metrics['AP'], best_dir)
        return False
    with open(os.path.join(staging, 'checkpoint'), 'w') as f:
        f.write('model_checkpoint_path: "%s"\nall_model_checkpoint_paths: "%s"\n' % (name, name))
    with open(os.path.join(staging, 'best_eval.json'), 'w') as f:
        json.dump({'step': step, 'checkpoint': name, 'AP': float(metrics['AP']),
                   'metrics': {k: _finite_or_none(v) for k, v in metrics.items()}}, f, indent=1)
    retired = best_dir + '.old-%d' % os.getpid()
    if os.path.exists(best_dir):
        os.rename(best_dir, retired)
    os.rename(staging, best_dir)
    shutil.rmtree(retired, ignore_errors=True)
    logging.info('new best AP %.4f at step %d kept in %s', metrics['AP'], step, best_dir)
    return True


def _copy_whole(checkpoint, directory):
    """Copies the checkpoint's files into `directory`; False when any went meanwhile (the
    copy does not restore whole: checkpoint_integrity.damage)."""
    try:
        for path in glob.glob(checkpoint + '.*'):
            shutil.copy2(path, directory)
    except FileNotFoundError:
        return False
    copy = os.path.join(directory, os.path.basename(checkpoint))
    return checkpoint_integrity.damage(copy) is None


def _latest_checkpoint(run):
    latest = (checkpoints.latest_checkpoint(run.options.model_dir) if distributed.is_main()
              else None)
    return distributed.broadcast_object(latest)


def evaluate_latest(run):
    checkpoint = _latest_checkpoint(run)
    if checkpoint is None:
        logging.warning('no checkpoint in %s to evaluate', run.options.model_dir)
        return None
    return evaluate_checkpoint(run, checkpoint)


def _next_checkpoint(run, iterator):
    checkpoint = next(iterator, None) if distributed.is_main() else None
    return distributed.broadcast_object(checkpoint)


def _final_step(run):
    """The training's last step as its run files record it (train_log.jsonl), else this
    run's own total_steps: `--mode=eval` stops there whatever its own epoch flags say."""
    final = train_log.training_final_step(run.options.model_dir) if distributed.is_main() else None
    final = distributed.broadcast_object(final)
    return final if final else run.settings.schedule.total_steps


def evaluate_continuously(run):
    """Evaluates each new checkpoint until the training's final step (a finished training:
    its last checkpoint, then exit), or eval_timeout without a new one."""
    options = run.options
    newest = (checkpoint_integrity.listed_checkpoints(options.model_dir)[:1]
              if distributed.is_main() else None)
    for checkpoint in distributed.broadcast_object(newest):
        _check_intact(checkpoint)  # TensorFlow would wait forever for one without an index.
    final_step = _final_step(run)
    iterator = None
    if distributed.is_main():
        iterator = tf1.train.checkpoints_iterator(
            options.model_dir, min_interval_secs=options.min_eval_interval,
            timeout=options.eval_timeout)
    evaluated = 0
    if not newest and distributed.is_main():
        logging.info('waiting for a first checkpoint in %s (%s; Ctrl-C stops)', options.model_dir,
                     'up to --eval_timeout=%s s' % options.eval_timeout
                     if options.eval_timeout else 'until one comes: --eval_timeout=N stops '
                     'after N s')
    while True:
        with preemption.waiting_for_a_checkpoint(evaluated):
            checkpoint = _next_checkpoint(run, iterator)
        if checkpoint is None:
            logging.info('no new checkpoint within --eval_timeout=%s s; stopping',
                         options.eval_timeout)
            if not evaluated:  # A one-shot evaluation of a typo'd or empty model_dir.
                raise errors.UserError(
                    'no checkpoint came to --model_dir=%s within --eval_timeout=%s s, so '
                    'nothing was evaluated; give the model_dir a training writes (or wrote), '
                    'or a longer --eval_timeout' % (options.model_dir, options.eval_timeout))
            return
        evaluated += 1
        evaluate_checkpoint(run, checkpoint)
        preemption.stop_evaluation_if_asked(evaluated)
        if checkpoints.checkpoint_step(checkpoint) >= final_step:
            logging.info('evaluated the final step %d; stopping', final_step)
            return
