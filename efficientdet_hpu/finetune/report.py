"""What a fine-tune hands back: detections.png (a validation photo's ground truth beside the
detections), summary.json and the table printed at the end."""
import json
import os

from PIL import Image, ImageDraw

from efficientdet_hpu.core import atomic_file

MAX_PANEL = 1000  # px: the long side of each half of the picture.
DEFAULT_THRESHOLD = 0.3  # Without the analysis' best-F1 threshold: inference.py's drawing one.
SUMMARY_KEYS = ('AP', 'AP50', 'recall_iou40', 'minutes', 'export')


def best_f1_threshold(analysis_json):
    """The score threshold of the best F1 at IoU 0.5 the error analysis chose, or None."""
    try:
        with open(analysis_json) as stream:
            report = json.load(stream)
    except (OSError, ValueError):
        return None
    value = report.get('score_threshold')
    return float(value) if isinstance(value, (int, float)) else None


def _panel(image, boxes, colour, title, scale):
    panel = image.resize((max(1, round(image.width * scale)), max(1, round(image.height * scale))))
    draw = ImageDraw.Draw(panel)
    for x, y, w, h in boxes:
        draw.rectangle([x * scale, y * scale, (x + w) * scale, (y + h) * scale], outline=colour,
                       width=2)
    draw.rectangle([0, 0, 8 * len(title) + 12, 18], fill=(0, 0, 0))
    draw.text((6, 3), title, fill=(255, 255, 255))
    return panel


def draw_picture(val_coco, image_dir, detections, threshold, path):
    """Writes the validation photo with the most boxes, ground truth (green) left, the
    detections scoring at least `threshold` (red) right; returns its file name or None."""
    if not val_coco['images']:
        return None
    counts = {image['id']: 0 for image in val_coco['images']}
    for annotation in val_coco['annotations']:
        counts[annotation['image_id']] += 1
    image = max(val_coco['images'], key=lambda entry: (counts[entry['id']], -entry['id']))
    name = os.path.basename(image['file_name'])
    truth = [a['bbox'] for a in val_coco['annotations'] if a['image_id'] == image['id']]
    found = [d['bbox'] for d in detections
             if os.path.basename(str(d.get('file_name'))) == name and d['score'] >= threshold]
    with Image.open(os.path.join(image_dir, image['file_name'])) as photo:
        photo = photo.convert('RGB')
        scale = min(1.0, MAX_PANEL / float(max(photo.size)))
        left = _panel(photo, truth, (0, 255, 0), 'ground truth: %d' % len(truth), scale)
        right = _panel(photo, found, (255, 0, 0), 'detections >= %.2f: %d' % (threshold,
                                                                             len(found)), scale)
    picture = Image.new('RGB', (left.width * 2 + 10, left.height), 'white')
    picture.paste(left, (0, 0))
    picture.paste(right, (left.width + 10, 0))
    with atomic_file.replacing(path, suffix='.png') as temporary:
        picture.save(temporary)
    return name


def summary(metrics, training, plan, layout, exported, minutes) -> dict:
    """summary.json: the whole-photo scores, the time, the export, and where things are."""
    return {
        'AP': metrics.get('AP'), 'AP50': metrics.get('AP50'),
        'recall_iou40': metrics.get('recall_iou0.4'), 'minutes': round(minutes, 1),
        'export': exported.get('saved_model'), 'tflite': exported.get('tflite'),
        'tflite_error': exported.get('tflite_error'),
        'photos': metrics.get('photos'), 'annotations': metrics.get('annotations'),
        'detections': metrics.get('detections'),
        'tta': bool(metrics.get('tta')), 'views': metrics.get('views'),
        'checkpoint': training.get('checkpoint'), 'best_step': training.get('best_step'),
        'steps_trained': training.get('step'), 'steps_planned': plan.steps,
        'training_ended': training.get('ended'),
        'images_per_second': {'planned': round(plan.images_per_second, 2),
                              'measured': training.get('images_per_second')},
        'model': plan.model_name, 'image_size': plan.image_size, 'tile_size': plan.tile_size,
        'plan': layout.plan_yaml, 'model_dir': layout.model_dir,
        'analysis': layout.analysis, 'picture': layout.picture,
    }


def _number(value, digits=3):
    return '-' if value is None else ('%.*f' % (digits, value))


def _flips(record):
    """The table's row on the flips at test time (the scores above are the kept view's)."""
    views = record.get('views') or {}
    if 'flips fused' not in views:
        return '-'
    other = views['as they are' if record.get('tta') else 'flips fused']
    if record.get('tta'):
        return ('fused (AP %s as the photos are); Detector(%r) fuses them, the SavedModel and '
                'TFLite run one view: inference.py predict --tta' % (
                    _number(other['AP']), os.path.dirname(record['model_dir'])))
    return 'not kept (AP %s with them fused)' % _number(other['AP'])


def table(record) -> list:
    """The summary as the lines printed at the end."""
    rows = [
        ('whole validation photos', '%s photos, %s boxes, %s detections' % (
            record['photos'], record['annotations'], record['detections'])),
        ('AP / AP50 / recall@IoU0.4', '%s / %s / %s' % (
            _number(record['AP']), _number(record['AP50']), _number(record['recall_iou40']))),
        ('test-time flips', _flips(record)),
        ('training', '%s of %s steps (%s); best checkpoint: step %s' % (
            record['steps_trained'], record['steps_planned'], record['training_ended'],
            record['best_step'] if record['best_step'] is not None else '-')),
        ('images/s', 'planned %s, measured %s' % (
            record['images_per_second']['planned'],
            _number(record['images_per_second']['measured'], 2))),
        ('time', '%.1f min' % record['minutes']),
        ('SavedModel', record['export'] or '-'),
        ('TFLite', record['tflite'] or 'not written: %s' % record['tflite_error']),
        ('error analysis', record['analysis']),
        ('picture', record['picture']),
        ('from Python', "Detector(%r).predict(photos)" % os.path.dirname(record['model_dir'])),
        ('rerun the training', 'python main.py --hparams=%s --model_dir=%s' % (
            record['plan'], record['model_dir'])),
    ]
    width = max(len(name) for name, _ in rows)
    return ['  %-*s  %s' % (width, name, value) for name, value in rows]


def write_summary(path, record):
    atomic_file.write_json_atomically(path, record, indent=1)
