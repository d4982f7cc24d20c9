"""The images a model gets most wrong, drawn: ground truth in green, detections in red, each
box tagged with its class name (detections also with their score).

An image's count of wrong boxes is its unmatched truths (TIDE: missed, or reachable only by a
misclassified or mislocated detection) plus its false positives scoring at least the drawing
threshold; the N largest counts are the worst images (ties: the earlier image).
"""
import io

import numpy as np
from PIL import ImageDraw, ImageFont

TRUTH_COLOUR = (0, 200, 0)
DETECTION_COLOUR = (230, 20, 20)
_CORRECT = ('tp', 'ignored')
MAX_TAGGED = 60  # Boxes on one image beyond which their text tags are left out.


def wrong_boxes(outcome, dets, score_threshold):
    """(unmatched truths, false positives scoring >= score_threshold) of one image."""
    missed = sum(kind in ('missed', 'fixable') for kind in outcome.truth_kind)
    scores = dets.scores[outcome.det_order] if len(outcome.det_order) else np.zeros(0)
    false = sum(kind not in _CORRECT and score >= score_threshold
                for kind, score in zip(outcome.det_kind, scores.tolist()))
    return int(missed), int(false)


def worst(result, detections, count, score_threshold):
    """[(image position, missed, false positives)] of the `count` worst images with at
    least one wrong box, worst first."""
    ranked = []
    for position, (outcome, dets) in enumerate(zip(result.images, detections)):
        missed, false = wrong_boxes(outcome, dets, score_threshold)
        if missed + false:
            ranked.append((-(missed + false), position, missed, false))
    ranked.sort()
    return [(position, missed, false) for _, position, missed, false in ranked[:count]]


def _font(size):
    try:
        return ImageFont.load_default(size=size)
    except (TypeError, OSError, ImportError):
        return ImageFont.load_default()


def _box(draw, xywh, colour, text, width, font):
    x, y, w, h = xywh
    draw.rectangle([x, y, x + w, y + h], outline=colour, width=width)
    if text is None:
        return
    left, top, right, bottom = draw.textbbox((0, 0), text, font=font)
    tag_y = y - (bottom - top) - 2 if y - (bottom - top) - 2 >= 0 else y + width
    draw.rectangle([x, tag_y, x + right - left + 2, tag_y + bottom - top + 2], fill=colour)
    draw.text((x + 1 - left, tag_y + 1 - top), text, fill=(255, 255, 255), font=font)


def draw(image, truth, dets, names, score_threshold, max_tagged=MAX_TAGGED):
    """A copy of `image` (PIL) with truth (green, name) and detections scoring >=
    score_threshold (red, 'name 0.87'). Boxes xywh in the image's pixels; names: {class: name}.
    With more than `max_tagged` boxes in all (a dense photo: hundreds of trees), the tags would
    cover the photo: boxes are drawn without them, the colours still tell truth from
    detection."""
    canvas = image.convert('RGB')
    pen = ImageDraw.Draw(canvas)
    shown = np.flatnonzero(dets.scores >= score_threshold)
    tagged = len(truth.boxes) + len(shown) <= max_tagged
    width = max(1, int(round(min(canvas.size) / (200.0 if tagged else 500.0))))
    font = _font(max(10, int(round(min(canvas.size) / 30.0))))
    for box, cls in zip(truth.boxes.tolist(), truth.classes.tolist()):
        _box(pen, box, TRUTH_COLOUR, names.get(cls, str(cls)) if tagged else None, width, font)
    for index in shown[np.argsort(dets.scores[shown], kind='stable')]:
        cls = int(dets.classes[index])
        _box(pen, dets.boxes[index].tolist(), DETECTION_COLOUR,
             '%s %.2f' % (names.get(cls, str(cls)), dets.scores[index]) if tagged else None,
             width, font)
    return canvas


def png_bytes(image):
    buffer = io.BytesIO()
    image.save(buffer, format='PNG')
    return buffer.getvalue()
