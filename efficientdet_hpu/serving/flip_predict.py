"""Test-time augmentation by a left-right flip (`inference.py predict --tta`,
`Detector.predict(tta=True)`), as Ultralytics' `predict(augment=True)` flips, without its
rescaled views: EfficientDet is trained at one input size.

Each batch runs through the predictor twice, as it is and mirrored; the mirrored view's boxes
are mirrored back, and the two views' detections of each image are fused by weighted box
fusion (Solovyev et al. 2021; `ensemble-boxes`' `weighted_boxes_fusion`, its IoU 0.55): per
class, in score order, a box joins the cluster whose fused box it overlaps most with IoU >
`iou_thresh`, else starts one; a cluster's box is its members' score-weighted mean, its score
their sum over the 2 views. Each view votes once in a cluster: the model's soft-NMS keeps
overlapping lower-scored boxes of one object, and those stay apart as the model gave them
rather than count as agreement (so one view alone is the predictor's output unchanged). An
object both views find keeps its mean score and gets a box averaged over them; one only one
view finds keeps half its score: agreement ranks first, which is where the AP comes from.
Wrapped inside the tiles (tiled_predict.py), each tile is flipped on its own and the seams are
merged after. Twice the network time; any predictor (graph, SavedModel, TFLite, ONNX), at its
own batch size.
"""
import numpy as np

from efficientdet_hpu.ops import host_postprocess

IOU_THRESH = 0.55  # ensemble-boxes' weighted_boxes_fusion default.


def mirror(boxes, width):
    """[ymin, xmin, ymax, xmax] boxes of an image `width` pixels wide, mirrored left-right."""
    boxes = np.asarray(boxes, np.float32).reshape(-1, 4)
    return np.stack([boxes[:, 0], width - boxes[:, 3], boxes[:, 2], width - boxes[:, 1]], axis=1)


def _fuse_class(boxes, scores, views, count, iou_thresh):
    """Fused boxes and scores of one class's detections of `count` views, best first."""
    size = len(scores)
    weighted, weights = np.zeros((size, 4)), np.zeros(size)
    fused, voted = np.zeros((size, 4)), np.zeros((size, count), bool)
    clusters = 0
    for index in np.argsort(-scores, kind='stable').tolist():
        box, score, view = boxes[index], float(scores[index]), int(views[index])
        target = clusters
        if clusters:
            overlaps = host_postprocess.iou_one_to_many(box, fused[:clusters])
            overlaps[voted[:clusters, view]] = -1.0  # One vote a view.
            best = int(np.argmax(overlaps))
            target = best if overlaps[best] > iou_thresh else clusters
        weighted[target] += score * box
        weights[target] += score
        # A cluster of one keeps its box as the view gave it.
        fused[target] = box if target == clusters else weighted[target] / weights[target]
        voted[target, view] = True
        clusters += int(target == clusters)
    return fused[:clusters].astype(np.float32), (weights[:clusters] / count).astype(np.float32)


def fuse(views, iou_thresh=IOU_THRESH, max_detections=None):
    """One image's detections of its views, [(boxes [K, 4], scores [K], classes [K]), ...] in
    the image's pixels, fused (module docstring); (boxes, scores, classes), best first, at
    most max_detections (None: all)."""
    boxes = np.concatenate([np.asarray(v[0], np.float32).reshape(-1, 4) for v in views])
    scores = np.concatenate([np.asarray(v[1], np.float32).reshape(-1) for v in views])
    classes = np.concatenate([np.asarray(v[2]).reshape(-1) for v in views]).astype(np.int64)
    view_of = np.concatenate([np.full(len(np.asarray(v[1]).reshape(-1)), index)
                              for index, v in enumerate(views)])
    out_boxes, out_scores, out_classes = [], [], []
    for category in np.unique(classes).tolist():
        mine = classes == category
        fused_boxes, fused_scores = _fuse_class(boxes[mine], scores[mine], view_of[mine],
                                                len(views), iou_thresh)
        out_boxes.append(fused_boxes)
        out_scores.append(fused_scores)
        out_classes.append(np.full(len(fused_scores), category, np.int64))
    if not out_scores:
        return np.zeros((0, 4), np.float32), np.zeros(0, np.float32), np.zeros(0, np.int64)
    boxes, scores, classes = (np.concatenate(out_boxes), np.concatenate(out_scores),
                              np.concatenate(out_classes))
    order = np.argsort(-scores, kind='stable')[:max_detections]
    return boxes[order], scores[order], classes[order]


def _detections(outputs, index):
    count = int(outputs['num_detections'][index])
    return (outputs['detection_boxes'][index][:count], outputs['detection_scores'][index][:count],
            outputs['detection_classes'][index][:count])


class FlipPredictor:
    """Wraps a predictor so predict(images) returns its two views fused (module docstring):
    the same keys, [B, N, ...], each image's detections padded to the batch's most (at most
    the model's cap, nms_configs.max_output_size, per image, as the predictor gives)."""

    def __init__(self, predictor, iou_thresh=IOU_THRESH):
        self._predictor = predictor
        self._iou_thresh = iou_thresh

    def predict(self, images):
        images = np.asarray(images)
        width = images.shape[2]
        plain = self._predictor.predict(images)
        mirrored = self._predictor.predict(np.ascontiguousarray(images[:, :, ::-1]))
        cap = max(1, int(np.asarray(plain['detection_scores']).shape[1]))
        fused = []
        for index in range(len(images)):
            boxes, scores, classes = _detections(mirrored, index)
            fused.append(fuse([_detections(plain, index), (mirror(boxes, width), scores,
                                                            classes)],
                              self._iou_thresh, cap))
        most = max(1, max(len(scores) for _, scores, _ in fused))
        out = {'detection_boxes': np.zeros((len(images), most, 4), np.float32),
               'detection_scores': np.zeros((len(images), most), np.float32),
               'detection_classes': np.zeros((len(images), most), np.int64),
               'num_detections': np.zeros(len(images), np.int32)}
        for index, (boxes, scores, classes) in enumerate(fused):
            out['detection_boxes'][index, :len(scores)] = boxes
            out['detection_scores'][index, :len(scores)] = scores
            out['detection_classes'][index, :len(scores)] = classes
            out['num_detections'][index] = len(scores)
        return out

    def close(self):
        self._predictor.close()
