"""The issues in files the labelling tools read:

  review_coco.json   the labels as COCO, each annotation with a `review` field (its swap and
                     badloc scores, the kinds it is suspected of, the model's class and box)
                     and CVAT's `attributes` (CVAT shows them on the box; Label Studio keeps
                     them as meta), plus one annotation per suspected overlooked object
                     (its review's kind 'overlooked', the model's class and box); each
                     photo's file_name its path from the training photos' folder
  fiftyone/          with FiftyOne installed (`pip install .[fiftyone]`): a FiftyOne dataset
                     (ground truth, predictions, the scores); without it: data/ (links to the
                     photos), labels.json and predictions.json, the files FiftyOne's COCO
                     importer reads; either way the one line that opens the App
"""
import importlib
import json
import os
import shutil
import tempfile

from efficientdet_hpu.core import atomic_file
from efficientdet_hpu.review import issues as issues_lib

FIFTYONE_FILES_LINE = (
    'python -c "import json, fiftyone as fo, fiftyone.utils.coco as fouc; '
    'd = fo.Dataset.from_dir(dataset_dir=\'{dir}\', dataset_type=fo.types.COCODetectionDataset,'
    ' label_field=\'ground_truth\', include_id=True, name=\'{name}\', overwrite=True); '
    'fouc.add_coco_labels(d, \'predictions\', \'{dir}/predictions.json\', '
    'json.load(open(\'{dir}/labels.json\'))[\'categories\'], '
    'coco_id_field=\'ground_truth_coco_id\'); '
    'fo.launch_app(d).wait()"')
FIFTYONE_DATASET_LINE = ('python -c "import fiftyone as fo; '
                         'fo.launch_app(fo.load_dataset(\'{name}\')).wait()"')


def coco_box(box):
    """[x1, y1, x2, y2] -> COCO [x, y, w, h], 0.01 px."""
    return [round(box[0], 2), round(box[1], 2), round(box[2] - box[0], 2),
            round(box[3] - box[1], 2)]


def _suspected(issues):
    """{(photo, label): [issues]} and {photo: [overlooked issues]}, {photo: image issue}."""
    by_label, overlooked, images = {}, {}, {}
    for issue in issues:
        if issue.kind == 'overlooked':
            overlooked.setdefault(issue.photo, []).append(issue)
        elif issue.kind == 'image':
            images[issue.photo] = issue
        else:
            by_label.setdefault((issue.photo, issue.label), []).append(issue)
    return by_label, overlooked, images


def _label_review(row, found):
    review = {'swap': round(row['swap'], 4), 'badloc': round(row['badloc'], 4),
              'suspected': [issue.kind for issue in found]}
    for issue in found:
        if issue.kind == 'swap' and issue.suggested_class:
            review['suggested_class'] = issue.suggested_class
        if issue.suggested_box:
            review['suggested_bbox'] = coco_box(issue.suggested_box)
    return review


def _attributes(review):
    text = ', '.join('%s %.2f' % (kind, review[kind]) for kind in review['suspected'])
    return {'review': text or 'ok', 'review_suspected': bool(review['suspected'])}


def review_coco(photos, results, issues, categories, category_of) -> dict:
    """The COCO dict of review_coco.json (image ids 1..N in the review's photo order)."""
    by_label, overlooked, images = _suspected(issues)
    coco = {'images': [], 'annotations': [], 'categories': categories}
    used_ids = set()
    for index, (photo, result) in enumerate(zip(photos, results)):
        image_id = index + 1
        image_issue = images.get(index)
        coco['images'].append({'id': image_id, 'file_name': photo['name'],
                               'width': photo['width'], 'height': photo['height'],
                               'review': {'image': round(result['image'], 4),
                                          'suspected': image_issue is not None}})
        for label, (annotation, row) in enumerate(zip(photo['annotations'], result['labels'])):
            review = _label_review(row, by_label.get((index, label), []))
            entry = dict(annotation, image_id=image_id, review=dict(
                review, label_id=issues_lib.label_id(annotation)),
                attributes=dict(annotation.get('attributes') or {}, **_attributes(review)))
            coco['annotations'].append(entry)
            used_ids.add(entry['id'])
        for issue in overlooked.get(index, []):
            coco['annotations'].append({
                'image_id': image_id, 'category_id': category_of[issue.class_name],
                'bbox': coco_box(issue.box), 'iscrowd': 0,
                'area': round((issue.box[2] - issue.box[0]) * (issue.box[3] - issue.box[1]), 2),
                'review': {'kind': 'overlooked', 'overlooked': round(issue.score, 4),
                           'suspected': ['overlooked']},
                'attributes': {'review': 'overlooked %.2f' % issue.score,
                               'review_suspected': True}})
    _number_annotations(coco['annotations'], used_ids)
    return coco


def _number_annotations(annotations, used_ids):
    """Ids for the added overlooked boxes, and for labels whose ids two sources share."""
    seen, next_id = set(), max(used_ids | {0}) + 1
    for annotation in annotations:
        if 'id' not in annotation or annotation['id'] in seen:
            annotation['id'] = next_id
            next_id += 1
        seen.add(annotation['id'])


def _link_photos(photos, directory):
    """directory/: a link to each photo under a unique name; returns the names."""
    names = [os.path.basename(photo['file_name']) for photo in photos]
    unique = [name if names.count(name) == 1 else '%d-%s' % (index + 1, name)
              for index, name in enumerate(names)]
    staging = tempfile.mkdtemp(prefix='.data.tmp-', dir=os.path.dirname(directory))
    for photo, name in zip(photos, unique):
        os.symlink(os.path.abspath(os.path.join(photo['image_dir'], photo['file_name'])),
                   os.path.join(staging, name))
    shutil.rmtree(directory, ignore_errors=True)
    os.rename(staging, directory)
    return unique


def fiftyone_files(directory, coco, photos, detections):
    """directory/data, labels.json (review_coco with the links' names) and predictions.json
    ({'annotations': every detection, with image ids}); returns the line opening the App."""
    os.makedirs(directory, exist_ok=True)
    names = _link_photos(photos, os.path.join(directory, 'data'))
    labels = dict(coco, images=[dict(image, file_name=name)
                                for image, name in zip(coco['images'], names)])
    atomic_file.write_json_atomically(os.path.join(directory, 'labels.json'), labels, indent=None)
    rows = [dict(row, id=number + 1) for number, row in enumerate(detections)]
    atomic_file.write_json_atomically(os.path.join(directory, 'predictions.json'),
                                      {'annotations': rows}, indent=None)
    return FIFTYONE_FILES_LINE.format(dir=os.path.abspath(directory),
                                      name=dataset_name(directory))


def dataset_name(directory) -> str:
    return 'review-%s' % os.path.basename(os.path.dirname(os.path.dirname(
        os.path.abspath(directory)))).replace(' ', '-')


def fiftyone_dataset(fo, name, coco, photos, detections, names):
    """A persistent FiftyOne dataset `name` (replaced if it exists); returns the App's line."""
    if fo.dataset_exists(name):
        fo.delete_dataset(name)
    dataset = fo.Dataset(name, persistent=True)
    samples = []
    for image, photo in zip(coco['images'], photos):
        width, height = float(photo['width']), float(photo['height'])
        relative = lambda b: [b[0] / width, b[1] / height, b[2] / width, b[3] / height]
        truth = [fo.Detection(label=names[a['category_id']], bounding_box=relative(a['bbox']),
                              review=json.dumps(a['review']),
                              suspected=bool(a['review']['suspected']),
                              label_id=a['review'].get('label_id', ''))
                 for a in coco['annotations'] if a['image_id'] == image['id']]
        found = [fo.Detection(label=names[d['category_id']], bounding_box=relative(d['bbox']),
                              confidence=d['score'])
                 for d in detections if d['image_id'] == image['id']]
        samples.append(fo.Sample(
            filepath=os.path.abspath(os.path.join(photo['image_dir'], photo['file_name'])),
            ground_truth=fo.Detections(detections=truth),
            predictions=fo.Detections(detections=found), label_quality=image['review']['image']))
    dataset.add_samples(samples)
    return FIFTYONE_DATASET_LINE.format(name=name)


def fiftyone_export(directory, coco, photos, detections, names):
    """The FiftyOne dataset when FiftyOne imports, else its files; returns (what, the line)."""
    try:  # The optional extra `fiftyone`, which the test set does not install.
        fo = importlib.import_module('fiftyone')
    except ImportError:
        return 'files', fiftyone_files(directory, coco, photos, detections)
    return 'dataset', fiftyone_dataset(fo, dataset_name(directory), coco, photos, detections,
                                       names)
