"""Draws detections on an image: one outlined box per detection and a "name 0.87" tag.

The tag is a rectangle filled with the class colour and its text is black or white, whichever
contrasts more with that fill (WCAG contrast ratio), so the label stays readable on any
background: the text never sits on the photo itself. Line width and font size follow the
image size, so thumbnails and 4000-pixel photos both come out legible.
"""
import numpy as np
from PIL import ImageDraw, ImageFont

# Distinct, saturated colours (Tableau 10 + a few), cycled by class label.
PALETTE = ((31, 119, 180), (255, 127, 14), (44, 160, 44), (214, 39, 40), (148, 103, 189),
           (140, 86, 75), (227, 119, 194), (127, 127, 127), (188, 189, 34), (23, 190, 207),
           (255, 215, 0), (0, 128, 128), (128, 0, 0), (0, 0, 128), (170, 255, 195))
BLACK, WHITE = (0, 0, 0), (255, 255, 255)


def class_colour(label):
    """RGB tuple of an integer class label (same label, same colour)."""
    return PALETTE[int(label) % len(PALETTE)]


def _relative_luminance(rgb):
    channels = np.asarray(rgb, np.float64) / 255.0
    linear = np.where(channels <= 0.03928, channels / 12.92, ((channels + 0.055) / 1.055) ** 2.4)
    return float(np.dot(linear, [0.2126, 0.7152, 0.0722]))


def contrast_ratio(rgb_a, rgb_b):
    """WCAG 2 contrast ratio between two RGB colours, 1 (none) .. 21 (black on white)."""
    lighter, darker = sorted((_relative_luminance(rgb_a), _relative_luminance(rgb_b)),
                             reverse=True)
    return (lighter + 0.05) / (darker + 0.05)


def text_colour_for(fill):
    """Black or white: whichever reads better on `fill`."""
    return BLACK if contrast_ratio(BLACK, fill) >= contrast_ratio(WHITE, fill) else WHITE


def _font(size):
    try:
        return ImageFont.load_default(size=size)  # Scalable font (Pillow >= 10.1, FreeType).
    except (TypeError, OSError, ImportError):
        return ImageFont.load_default()


def _tag_position(box_xy, text_size, image_size, line_width):
    """Top-left corner of the tag: above the box when it fits, else just inside its top."""
    xmin, ymin = box_xy
    text_width, text_height = text_size
    width, height = image_size
    left = min(max(0, xmin), max(0, width - text_width))
    top = ymin - text_height if ymin - text_height >= 0 else ymin + line_width
    return left, min(max(0, top), max(0, height - text_height))


def draw_detections(image, boxes, scores, labels, label_names=None, min_score=0.0):
    """Returns a copy of `image` (PIL, any mode; drawn as RGB) with the detections drawn.

    Args:
      image: PIL.Image.
      boxes: float array [N, 4], [ymin, xmin, ymax, xmax] pixels of `image`.
      scores: float array [N].
      labels: int array [N] of class labels (contiguous 1..C or category ids: only used to
        pick a colour and look up the name).
      label_names: optional {label: name}; a missing label is drawn as its number.
      min_score: detections scoring below it are not drawn.
    """
    boxes = np.asarray(boxes, np.float64).reshape(-1, 4)
    canvas = image.convert('RGB')
    draw = ImageDraw.Draw(canvas)
    short_side = min(canvas.size)
    line_width = max(1, int(round(short_side / 250.0)))
    font = _font(max(10, int(round(short_side / 40.0))))
    label_names = label_names or {}
    # Lowest score first, so the most confident tag ends up on top.
    for index in np.argsort(np.asarray(scores, np.float64).reshape(-1)):
        score, label = float(scores[index]), int(labels[index])
        if score < min_score:
            continue
        ymin, xmin, ymax, xmax = boxes[index]
        colour = class_colour(label)
        draw.rectangle([xmin, ymin, xmax, ymax], outline=colour, width=line_width)
        text = '%s %.2f' % (label_names.get(label, str(label)), score)
        left, top, right, bottom = draw.textbbox((0, 0), text, font=font)
        pad = max(1, line_width)
        tag_size = (right - left + 2 * pad, bottom - top + 2 * pad)
        tag_x, tag_y = _tag_position((int(xmin), int(ymin)), tag_size, canvas.size, line_width)
        draw.rectangle([tag_x, tag_y, tag_x + tag_size[0], tag_y + tag_size[1]], fill=colour)
        draw.text((tag_x + pad - left, tag_y + pad - top), text, fill=text_colour_for(colour),
                  font=font)
    return canvas


def save_image(image, path):
    """Saves as the extension says; JPEG needs RGB, so other modes are converted first."""
    if path.lower().endswith(('.jpg', '.jpeg')) and image.mode != 'RGB':
        image = image.convert('RGB')
    image.save(path)
