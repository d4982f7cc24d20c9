"""Hand-made COCO-style cases shared by the analysis and scoring tests: one image's truth and
detections for analysis/tide, and a COCO file of one photo of many small trees."""
import json

import numpy as np

from efficientdet_hpu.analysis import tide


def tide_image(truth, dets):
    """truth: [(box, class, crowd)], dets: [(box, class, score)] -> (ImageTruth, ImageDetections)."""
    return (tide.ImageTruth(np.array([t[0] for t in truth], float).reshape(-1, 4),
                            np.array([t[1] for t in truth], np.int64),
                            np.array([t[2] for t in truth], bool)),
            tide.ImageDetections(np.array([d[0] for d in dets], float).reshape(-1, 4),
                                 np.array([d[1] for d in dets], np.int64),
                                 np.array([d[2] for d in dets], float)))



def write_photo_of_trees(path, image_id, file_name, count=150):
    """A COCO file of one 400 x 400 photo with `count` 10 px trees on a 20 px grid; returns
    their xywh boxes."""
    trees = [[20 * (i % 15), 20 * (i // 15), 10, 10] for i in range(count)]
    path.write_text(json.dumps({
        'images': [{'id': image_id, 'file_name': file_name, 'width': 400, 'height': 400}],
        'annotations': [{'id': i + 1, 'image_id': image_id, 'category_id': 1, 'bbox': box,
                         'area': 100, 'iscrowd': 0} for i, box in enumerate(trees)],
        'categories': [{'id': 1, 'name': 'tree'}]}))
    return trees
