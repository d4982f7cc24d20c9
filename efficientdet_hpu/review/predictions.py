"""Out-of-sample predictions for every labelled photo, with the project's own commands run as
the fine-tune runs them (finetune/runner.py: children under deadlines, logs in logs/):

  records   each fold's photos converted once (tiles when the plan tiles), from links to
            them (fold-K/photos/): review/records/fold-K-*; the fold of the fine-tune's
            validation photos is its data/records/val-*
  training  fold K's model: main.py with the fine-tune's plan.yaml, its steps and its
            training records replaced by the review's (every fold's records but K's)
  predict   fold K's photos, whole, by fold K's model (inference.py predict, tiled where the
            plan tiles, one soft-NMS over all classes), every detection down to the model's
            score threshold (0.001)

Fold 0 of a fine-tune that trained is predicted by the fine-tune's best checkpoint (its model
never saw the validation photos). Each step is skipped on a rerun when what it writes is there.
"""
import json
import os
import shutil
import tempfile
import time

import yaml

from efficientdet_hpu.core import atomic_file
from efficientdet_hpu.core import run_end
from efficientdet_hpu.core.errors import UserError
from efficientdet_hpu.finetune import inputs
from efficientdet_hpu.finetune import plan_file
from efficientdet_hpu.finetune import prepare
from efficientdet_hpu.finetune import runner as runner_lib
from efficientdet_hpu.finetune import schedule
from efficientdet_hpu.finetune import stages

FOLD_KEEP_CHECKPOINTS = 1
# One soft-NMS over all classes, as automl's serving path: each object keeps the model's best
# class and the others there are decayed, as a softmax detector's probabilities at a box sum to
# one. Per class, EfficientDet's sigmoid scores let a second class keep a high score on the
# same object, which cleanlab reads as a confident prediction of another class: a swap on
# every such label (measured on planted errors: docs/review.md).
PREDICT_HPARAMS = 'nms_configs.max_output_size=%d,nms_configs.class_agnostic=true'
# Children's deadlines, as the fine-tune's stages set them.
TRAIN_GRACE_SECONDS = stages.GRACE_SECONDS


def fold_coco(fold, train, val) -> dict:
    """The COCO dict of a fold's photos (from train.json and val.json), each image with its
    'review_key' [source, id]; where the two sources number photos of the fold alike, the
    fold's images are numbered 1.. (the converter wants unique ids)."""
    parts = [(source, inputs.subset(coco, fold.ids(source)))
             for source, coco in (('train', train), ('val', val)) if fold.ids(source)]
    images = [dict(image, review_key=[source, image['id']])
              for source, part in parts for image in part['images']]
    annotations = [(source, annotation) for source, part in parts
                   for annotation in part['annotations']]
    renumber = len({image['id'] for image in images}) < len(images)
    new_id = {tuple(image['review_key']): index + 1 if renumber else image['id']
              for index, image in enumerate(images)}
    return dict(parts[0][1], images=[dict(image, id=new_id[tuple(image['review_key'])])
                                     for image in images],
                annotations=[dict(annotation, image_id=new_id[(source, annotation['image_id'])])
                             for source, annotation in annotations])


def photo_key(fold, image) -> tuple:
    """The (source, image id) of a photo of fold-K/photos.json (a review written before
    folds could mix sources holds one source a fold and the ids of it)."""
    return tuple(image['review_key']) if 'review_key' in image else (fold.photos[0][0],
                                                                     image['id'])


def link_names(coco) -> dict:
    """{image id: the name of its link}: the file name, or 'id-name' where two photos of the
    fold share one (YOLO trees of folders): inference.py matches photos by file name."""
    names = [inputs.photo_name(image) for image in coco['images']]
    return {image['id']: name if names.count(name) == 1 else '%d-%s' % (image['id'], name)
            for image, name in zip(coco['images'], names)}


def write_inputs(layout, fold, coco, image_dirs):
    """fold-K/photos/ (links to the photos, made aside and renamed), records.json (the
    converter's COCO: the photos by their links) and photos.json (the fold's COCO, each image
    with its link name), written last; image_dirs: {source: the photos' folder}."""
    if all(os.path.exists(layout.fold(fold.index, name))
           for name in ('photos.json', 'records.json')):
        return
    names = link_names(coco)
    os.makedirs(layout.fold(fold.index), exist_ok=True)
    staging = tempfile.mkdtemp(prefix='.photos.tmp-', dir=layout.fold(fold.index))
    for image in coco['images']:
        os.symlink(os.path.abspath(os.path.join(image_dirs[image['review_key'][0]],
                                                image['file_name'])),
                   os.path.join(staging, names[image['id']]))
    shutil.rmtree(layout.fold(fold.index, 'photos'), ignore_errors=True)
    os.rename(staging, layout.fold(fold.index, 'photos'))
    atomic_file.write_json_atomically(layout.fold(fold.index, 'records.json'), dict(
        coco, images=[dict(image, file_name=names[image['id']]) for image in coco['images']]),
        indent=None)
    coco = dict(coco, images=[dict(image, review_name=names[image['id']])
                              for image in coco['images']])
    atomic_file.write_json_atomically(layout.fold(fold.index, 'photos.json'), coco, indent=None)


def records_prefix(layout, finetune_layout, fold) -> str:
    """The fine-tune's validation records for the fold of its validation photos, else the
    review's of the fold."""
    return (os.path.join(finetune_layout.records, 'val') if fold.is_validation
            else layout.fold_records(fold.index))


def convert(runner, fold, prefix, json_path, image_dir, plan, sources):
    """The converter on a fold's photos, unless its summary is there; returns its summary.
    sources: {source: the flag that gave its photos}, which the converter's fix then names."""
    if not os.path.exists(prefix + '-summary.json'):
        photos = len(_read(json_path)['images'])
        tiles = (['--tile_size=%d' % plan.tile_size, '--tile_overlap=%d' % plan.tile_overlap]
                 if plan.tile_size else [])
        try:
            runner.command('convert-fold-%d' % fold.index, 'convert', [
                '--image_dir=' + image_dir, '--object_annotations_file=' + json_path,
                '--output_file_prefix=' + prefix,
                '--num_shards=%d' % (2 if photos < 1000 else 8)] + tiles, max(600.0, 5.0 * photos))
        except runner_lib.ChildUserError as error:
            given = ' or '.join(sorted({sources.get(source, '--data')
                                        for source, _ in fold.photos}))
            raise runner_lib.ChildUserError(stages.in_the_input(
                _linked_photos(str(error), image_dir), json_path, given)) from None
    return _read(prefix + '-summary.json')


def _linked_photos(message, directory):
    """The message with each photo link of `directory` it names as the photo it links to."""
    if not os.path.isdir(directory):
        return message
    for name in os.listdir(directory):
        link = os.path.join(directory, name)
        if link in message:
            message = message.replace(link, os.path.realpath(link))
    return message


def _read(path):
    with open(path) as stream:
        return json.load(stream)


def fold_recipe(finetune_yaml, plan, steps, train_images, patterns, max_instances) -> dict:
    """The fine-tune's recipe (plan.yaml: model, anchors, schedule, the user's --hparams) made
    a fold's: `steps` steps on `patterns` (comma-joined), no evaluation, and the schedule's
    step counts (warm-up, freeze) redone for those steps, as finetune/plan.py does."""
    with open(finetune_yaml, encoding='utf-8') as stream:
        content = yaml.safe_load(stream)
    _, warmup_share, _ = schedule.learning_rate(plan.weights.kind)
    steps, interval, warmup, _ = schedule.schedule_numbers(
        steps, train_images, plan.global_batch, warmup_share)
    for key in ('validation_file_pattern', 'val_json_file', 'eval_after_training'):
        content.pop(key, None)
    content.update(mode='train', training_file_pattern=','.join(patterns),
                   num_examples_per_epoch=interval * plan.global_batch,
                   num_epochs=steps // interval, cp_every_n_steps=interval,
                   log_every_n_steps=max(1, min(50, interval // 2)),
                   keep_checkpoint_max=FOLD_KEEP_CHECKPOINTS, early_stop_patience=0,
                   lr_warmup_epoch=plan_file.warmup_epochs(warmup, interval),
                   max_instances_per_image=max_instances)
    if 'var_freeze_steps' in content:
        content['var_freeze_steps'] = warmup
    return content


def write_recipe(path, content, rerun):
    """fold-K/train.yaml, read back as main.py reads it before it is kept."""
    with atomic_file.replacing(path, suffix='.yaml') as temporary:
        with open(temporary, 'w', encoding='utf-8') as stream:
            stream.write(plan_file.yaml_text(content, rerun).replace(
                'efficientdet-finetune: its plan', 'efficientdet-review: a fold\'s plan'))
        prepare.check_recipe(temporary)


def train(runner, layout, fold, recipe_path, planned_steps, plan, stop_at=None):
    """main.py on a fold's recipe, stopped at `stop_at` (time.time()) if given; returns the
    training record (finetune/stages.py's, written to fold-K/training.json)."""
    record_path = layout.fold(fold.index, 'training.json')
    if os.path.exists(record_path):
        return _read(record_path)
    model_dir = layout.fold(fold.index, 'model')
    planned = planned_steps * plan.global_batch / plan.images_per_second
    stop_after = None if stop_at is None else max(run_end.MIN_TRAINING_SECONDS,
                                                  stop_at - time.time())
    timeout = (stop_after if stop_after is not None else 3 * planned + 3600) + TRAIN_GRACE_SECONDS
    start = time.monotonic()
    _, stopped = runner.command(
        'train-fold-%d' % fold.index, 'train',
        ['--hparams=' + recipe_path, '--model_dir=' + model_dir]
        + (['--verbose'] if runner.verbose else []), timeout, stop_after=stop_after)
    record = stages.training_record(model_dir, stopped, (time.monotonic() - start) / 60.0)
    if record['step'] is None:
        raise UserError('fold %d trained to no checkpoint before the review\'s budget '
                               'ended; give a larger --max_minutes' % fold.index)
    atomic_file.write_json_atomically(record_path, record)
    return record


def predict(runner, layout, fold, model_dir, checkpoint, plan, max_detections):
    """inference.py predict on fold-K/photos with fold K's model; returns the detections
    (COCO results rows with the photos' link names)."""
    output = layout.fold(fold.index, 'predictions')
    results = os.path.join(output, 'detections.json')
    if not os.path.exists(results):
        tiles = (['--tile_size=%d' % plan.tile_size, '--tile_overlap=%d' % plan.tile_overlap]
                 if plan.tile_size else [])
        photos = len(os.listdir(layout.fold(fold.index, 'photos')))
        runner.command('predict-fold-%d' % fold.index, 'inference', [
            'predict', '--model_dir=' + model_dir, '--input=' + layout.fold(fold.index, 'photos'),
            '--output_dir=' + output,
            '--hparams=' + PREDICT_HPARAMS % max_detections]
            + (['--checkpoint=' + checkpoint] if checkpoint else []) + tiles,
            max(900.0, 30.0 * photos))
    return _read(results)


def by_photo(layout, review_folds) -> dict:
    """{(source, image id): [detection rows]} of every fold's predictions (photos without a
    detection get an empty list)."""
    found = {}
    for fold in review_folds:
        coco = _read(layout.fold(fold.index, 'photos.json'))
        ids = {image['review_name']: photo_key(fold, image) for image in coco['images']}
        for key in ids.values():
            found[key] = []
        for row in _read(layout.fold(fold.index, 'predictions', 'detections.json')):
            found[ids[row['file_name']]].append(row)
    return found
