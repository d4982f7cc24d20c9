"""What the suspected labels could mean for a fine-tune's validation AP: its whole-photo
detections (evaluation/detections.json) scored against the validation labels as they are and
against the same labels with the review's suggestions taken (a swap's class, a bad location's
box, an overlooked object added), by the fine-tune's own scorer (evaluation/photo_eval.py).

The difference is an upper bound of what the labels explain: the suggestions come from a
model, and where the model is wrong, taking them flatters it.
"""
import json
import os

from efficientdet_hpu.core import atomic_file
from efficientdet_hpu.evaluation import photo_eval
from efficientdet_hpu.review import exports


def corrected(val, fixes) -> dict:
    """val (COCO dict) with `fixes` taken: {'relabel': {annotation id: category id},
    'move': {annotation id: bbox}, 'add': [(image id, category id, bbox)]}."""
    annotations = []
    for annotation in val['annotations']:
        annotation = dict(annotation)
        if annotation['id'] in fixes['relabel']:
            annotation['category_id'] = fixes['relabel'][annotation['id']]
        if annotation['id'] in fixes['move']:
            box = fixes['move'][annotation['id']]
            annotation.update(bbox=box, area=box[2] * box[3])
        annotations.append(annotation)
    next_id = max([a['id'] for a in annotations] + [0]) + 1
    for number, (image_id, category_id, box) in enumerate(fixes['add']):
        annotations.append({'id': next_id + number, 'image_id': image_id,
                            'category_id': category_id, 'bbox': box, 'area': box[2] * box[3],
                            'iscrowd': 0})
    return dict(val, annotations=annotations)


def fixes_of(issues, photos, category_of) -> dict:
    """The suggestions of the validation photos' issues (photos of source 'val')."""
    fixes = {'relabel': {}, 'move': {}, 'add': []}
    for issue in issues:
        photo = photos[issue.photo]
        if photo['key'][0] != 'val':
            continue
        if issue.kind == 'overlooked':
            fixes['add'].append((photo['key'][1], category_of[issue.class_name],
                                 exports.coco_box(issue.box)))
        elif issue.kind == 'swap' and issue.suggested_class:
            fixes['relabel'][photo['annotations'][issue.label]['id']] = \
                category_of[issue.suggested_class]
        elif issue.kind == 'badloc' and issue.suggested_box:
            fixes['move'][photo['annotations'][issue.label]['id']] = \
                exports.coco_box(issue.suggested_box)
    return fixes


def validation_ap(detections_json, val_json, fixes, corrected_json) -> dict:
    """{'AP', 'AP50' as labelled; 'AP_fixed', 'AP50_fixed' with the fixes; 'share': the part
    of the AP lost (1 - AP) the fixes recover}; writes the corrected labels."""
    with open(val_json) as stream:
        val = json.load(stream)
    with open(detections_json) as stream:
        detections = json.load(stream)
    atomic_file.write_json_atomically(corrected_json, corrected(val, fixes), indent=None)
    before = photo_eval.evaluate(detections, val_json)
    after = photo_eval.evaluate(detections, corrected_json)
    lost = 1.0 - before['AP']
    return {'AP': before['AP'], 'AP50': before['AP50'], 'AP_fixed': after['AP'],
            'AP50_fixed': after['AP50'],
            'share': (after['AP'] - before['AP']) / lost if lost > 0 else 0.0,
            'fixes': {key: len(value) for key, value in fixes.items()},
            'corrected_labels': os.path.abspath(corrected_json)}
