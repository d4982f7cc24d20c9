"""The review's last stage and what it hands back: every fold's predictions joined to the
labels, cleanlab's scores, the issues (issues.csv), the page, the labelling tools' files, the
share of a fine-tune's validation AP the issues explain, summary.json and the table."""
import json
import os
import time

from efficientdet_hpu.core import atomic_file
from efficientdet_hpu.review import exports
from efficientdet_hpu.review import impact
from efficientdet_hpu.review import issues as issues_lib
from efficientdet_hpu.review import page
from efficientdet_hpu.review import predictions
from efficientdet_hpu.review import scores as scores_lib

# Under this share of the labels found, the table says the scores are weak. Measured
# (docs/review.md): fold models finding 91% of an easy set's labels put 82-88% of its planted
# drops and swaps in the top 2N; finding 59-62% of the synthetic set's, 2-29%; on deepforest's
# photos, 64%, and the page's first 20 rows were the models' own errors.
WEAK_MODELS = 0.8
KIND_WORDS = (('overlooked', 'overlooked objects'), ('swap', 'swapped classes'),
              ('badloc', 'bad locations'), ('image', 'photos'))


def _read(path):
    with open(path) as stream:
        return json.load(stream)


def shown_name(record, source, file_name) -> str:
    """The photo as issues.csv, the page and review_coco.json name it: its path from the
    training photos' folder, so a --val_data photo called like a training photo stays apart
    ('../val/photo0.jpg' beside 'photo0.jpg')."""
    if record['val_image_dir'] == record['train_image_dir']:
        return file_name
    return os.path.relpath(os.path.join(record[source + '_image_dir'], file_name),
                           record['train_image_dir'])


def photos_of(layout, review, record) -> tuple:
    """(every reviewed photo, fold by fold: {'key' (source, id), 'file_name', 'name' (what
    the files show, shown_name), 'width', 'height', 'image_dir', 'annotations' (cleanlab's
    labels), 'fold'}; the categories)."""
    photos = []
    for fold in review.folds:
        coco = _read(layout.fold(fold.index, 'photos.json'))
        by_image = {image['id']: [] for image in coco['images']}
        for annotation in scores_lib.label_boxes(coco['annotations']):
            by_image[annotation['image_id']].append(annotation)
        for image in coco['images']:
            key = predictions.photo_key(fold, image)
            photos.append({'key': key, 'file_name': image['file_name'],
                           'name': shown_name(record, key[0], image['file_name']),
                           'width': image['width'], 'height': image['height'],
                           'image_dir': record[key[0] + '_image_dir'],
                           'annotations': by_image[image['id']],
                           'fold': fold.index})
    return photos, coco['categories']


def cleanlab_inputs(photos, detections, categories):
    """(labels, predictions, class_of {category id: class index}, the calibration's two
    scores, how many labels a detection matched); photos get their 'classes'."""
    class_of = {category_id: index
                for index, category_id in enumerate(scores_lib.classes({'categories':
                                                                        categories}))}
    labels = []
    for photo in photos:
        labels.append(scores_lib.to_labels(photo['annotations'], class_of, photo['file_name']))
        photo['classes'] = labels[-1]['labels'].tolist()
    matched = scores_lib.matched_scores([(label, detections[photo['key']], class_of)
                                         for label, photo in zip(labels, photos)])
    probability, points = scores_lib.calibrated_scores(matched)
    found = [scores_lib.to_predictions(detections[photo['key']], class_of, probability)
             for photo in photos]
    return labels, found, class_of, points, len(matched)


def _confident(prediction):
    """A photo's predictions cleanlab calls plausible (> 0.5 on its scale), for its card."""
    return [row[:4].tolist() for boxes in prediction for row in boxes if row[4] > 0.5]


def _detection_rows(photos, detections):
    """Every detection with the review's image ids (1..N), for FiftyOne."""
    return [dict(row, image_id=index + 1) for index, photo in enumerate(photos)
            for row in detections[photo['key']]]


def finish(runner, layout, review, record, threshold, trained, went_on=False) -> dict:
    """Scores, files, summary.json; returns the summary. `went_on`: this run went on from
    folds a stopped one began (its minutes are its own, the plan's the whole review's)."""
    started = time.monotonic()
    photos, categories = photos_of(layout, review, record)
    detections = predictions.by_photo(layout, review.folds)
    labels, found, class_of, points, matched = cleanlab_inputs(photos, detections, categories)
    results = scores_lib.score(labels, found)
    names = {index: next(c['name'] for c in categories if c['id'] == category_id)
             for category_id, index in class_of.items()}
    category_of = {name: category_id for category_id, name in
                   ((c['id'], c['name']) for c in categories)}
    atomic_file.write_json_atomically(layout.scores_json, {
        'calibration': {'score_at_0.5': points[0], 'score_at_0.95': points[1]},
        'overlooked_cover_iou': scores_lib.COVER_IOU,
        'photos': [{'file_name': p['name'], 'fold': p['fold'], **r}
                   for p, r in zip(photos, results)]}, indent=None)
    rank = scores_lib.cleanlab_rank()
    issues = issues_lib.ranked(issues_lib.candidates(photos, results, names), threshold, rank)
    issues_lib.write_csv(layout.issues_csv, issues, photos)
    cards = page.write_page(layout.page, layout.crops, issues, photos,
                            [_confident(p) for p in found],
                            'Label review: %s' % record['line'])
    coco = exports.review_coco(photos, results, issues, categories, category_of)
    atomic_file.write_json_atomically(layout.coco_json, coco, indent=None)
    fiftyone, app_line = exports.fiftyone_export(
        layout.fiftyone, coco, photos, _detection_rows(photos, detections),
        {c['id']: c['name'] for c in categories})
    validation = None
    evaluated = os.path.join(runner.layout.evaluation, 'detections.json')
    if trained and os.path.exists(evaluated):
        validation = impact.validation_ap(
            evaluated, runner.layout.val_json, impact.fixes_of(issues, photos, category_of),
            layout.path('val_corrected.json'))
    summary = {
        'photos': len(photos), 'labels': sum(len(p['annotations']) for p in photos),
        'folds': len(review.folds), 'threshold': threshold,
        'suspected': issues_lib.counts(issues), 'cards': cards,
        'calibration': {'score_at_0.5': points[0], 'score_at_0.95': points[1]},
        'validation': validation, 'minutes': round(runner.elapsed() / 60.0, 1),
        'planned_minutes': round(review.total_seconds / 60.0, 1), 'went_on': went_on,
        'matched_labels': matched,
        'scoring_seconds': round(time.monotonic() - started, 1),
        'issues_csv': layout.issues_csv, 'page': layout.page, 'coco_json': layout.coco_json,
        'fiftyone': fiftyone, 'fiftyone_line': app_line}
    atomic_file.write_json_atomically(layout.summary_json, summary)
    return summary


def suspected_line(summary) -> str:
    return ', '.join('%d %s' % (summary['suspected'][kind], words)
                     for kind, words in KIND_WORDS)


def table(summary) -> list:
    found = summary['matched_labels'] / float(max(1, summary['labels']))
    rows = [('reviewed', '%d photos, %d labels, by %d fold models' % (
                summary['photos'], summary['labels'], summary['folds'])),
            ('fold models', 'find %.0f%% of the labels (same class, IoU >= 0.5)%s' % (
                100 * found, '' if found >= WEAK_MODELS else ': too few for the scores to '
                'mean much; train longer (--steps) or from better --weights')),
            ('suspected', '%s (cleanlab score <= %g)' % (suspected_line(summary),
                                                          summary['threshold']))]
    validation = summary.get('validation')
    if validation:
        rows.append(('validation AP', '%.3f as labelled, %.3f with the suggestions taken: '
                     'the suspected labels could explain %.0f%% of the AP lost' % (
                         validation['AP'], validation['AP_fixed'], 100 * validation['share'])))
    rows.append(('time', ('%.1f min this run, which went on from a stopped one (planned %.1f '
                          'for the whole review)' if summary.get('went_on') else
                          '%.1f min (planned %.1f)') % (summary['minutes'],
                                                        summary['planned_minutes'])))
    rows += [('page', summary['page']), ('issues', summary['issues_csv']),
             ('labelling tools', summary['coco_json']),
             ('FiftyOne', summary['fiftyone_line'])]
    width = max(len(name) for name, _ in rows)
    return ['  %-*s  %s' % (width, name, value) for name, value in rows]
