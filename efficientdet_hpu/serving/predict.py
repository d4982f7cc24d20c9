"""Detections on image files (`python inference.py predict ...`): annotated copies of the
images and a COCO results JSON.

Any image PIL reads works: grayscale, palette, 16-bit, CMYK, PNG with alpha (composited on
black, as data/image_codec.py does for training data), and EXIF-rotated photos (boxes are
in the upright view people see). A file that cannot be decoded is reported and skipped; the
exit status is non-zero only when no image at all could be processed.

output_dir/detections.json is a COCO results list: {"image_id", "file_name", "category_id",
"bbox": [x, y, width, height] (pixels), "score"}. image_id is the file name's number when
the name is numeric (000000139.jpg -> 139, as in COCO), else the 1-based position in the
sorted input list.
"""
import glob
import os
import sys
import time

import numpy as np
from PIL import Image, ImageOps

from efficientdet_hpu.core import atomic_file
from efficientdet_hpu.core import progress
from efficientdet_hpu.data import image_codec
from efficientdet_hpu.data import label_map as label_map_lib
from efficientdet_hpu.serving import visualize

IMAGE_EXTENSIONS = ('.jpg', '.jpeg', '.png', '.bmp', '.gif', '.tif', '.tiff', '.webp',
                    '.ppm', '.pgm', '.pbm')
RESULTS_FILE = 'detections.json'


def category_names(label_map):
    """{category_id: name} (empty without a label map: numbers are drawn instead)."""
    if label_map is None:
        return {}
    return {label_map.label_to_category_id[label]: name
            for label, name in label_map.label_to_name.items()}


def category_names_of_saved_model(export_dir):
    path = os.path.join(export_dir, 'assets.extra', 'label_map.json')
    return category_names(label_map_lib.load_label_map(path)) if os.path.exists(path) else {}


def list_images(path):
    """The image files to process: `path` itself, a directory's image files or a glob's
    (sorted)."""
    if not os.path.exists(path) and glob.has_magic(path):
        files = sorted(name for name in glob.glob(path) if os.path.isfile(name))
        if not files:
            raise FileNotFoundError('--input=%s matches no file' % path)
        return files
    if os.path.isdir(path):
        names = sorted(name for name in os.listdir(path)
                       if name.lower().endswith(IMAGE_EXTENSIONS) and not name.startswith('.'))
        files = [os.path.join(path, name) for name in names]
        if not files:
            raise FileNotFoundError('no image files (%s) in --input=%s'
                                    % (', '.join(IMAGE_EXTENSIONS), path))
        return files
    if not os.path.exists(path):
        raise FileNotFoundError('--input=%s does not exist' % path)
    return [path]


def check_output_dir(input_path, output_dir):
    """The input's image files (list_images), once output_dir is made and would not take a
    drawn copy's place over one of them; raises FileNotFoundError naming the flag."""
    files = list_images(input_path)
    target = os.path.realpath(output_dir)
    for path in files:
        name = os.path.basename(path)
        if (os.path.realpath(os.path.dirname(path)) == target
                and annotated_name(name) == name):
            raise FileNotFoundError('--output_dir=%s holds the photos of --input, which the '
                                    'drawn copies would overwrite; give another --output_dir'
                                    % output_dir)
    try:
        os.makedirs(output_dir, exist_ok=True)
    except OSError as error:
        raise FileNotFoundError('--output_dir=%s cannot be made (%s); give a folder you can '
                                'write' % (output_dir, error.strerror or error)) from None
    return files


def read_rgb(path, any_size=False):
    """uint8 [H, W, 3] RGB pixels of any image file PIL can decode, upright per EXIF.
    any_size lifts PIL's decompression-bomb limit (image_codec.any_pixel_count)."""
    with image_codec.any_pixel_count(any_size), Image.open(path) as image:
        image.load()
        image = ImageOps.exif_transpose(image)
        return np.array(image_codec.to_rgb(image), dtype=np.uint8)


def image_id_for(path, position):
    stem = os.path.splitext(os.path.basename(path))[0]
    return int(stem) if stem.isdigit() else position


def coco_rows(image_id, file_name, outputs, names=None):
    """COCO result dicts of one image's outputs (batch of 1); with `names` ({category_id:
    name}) each row also carries its category_name."""
    rows = []
    count = int(outputs['num_detections'][0])
    for box, score, category in zip(outputs['detection_boxes'][0][:count],
                                    outputs['detection_scores'][0][:count],
                                    outputs['detection_classes'][0][:count]):
        ymin, xmin, ymax, xmax = (float(v) for v in box)
        rows.append({'image_id': image_id, 'file_name': file_name, 'category_id': int(category),
                     'bbox': [round(xmin, 2), round(ymin, 2), round(xmax - xmin, 2),
                              round(ymax - ymin, 2)], 'score': round(float(score), 6)})
        if names and int(category) in names:
            rows[-1]['category_name'] = names[int(category)]
    return rows


def annotated_name(file_name):
    """Same name for JPEG/PNG inputs; other formats are written as PNG (name + '.png')."""
    return file_name if file_name.lower().endswith(('.jpg', '.jpeg', '.png')) else (
        file_name + '.png')


def _predict_timed(predictor, pixels, repeat):
    latencies = []
    for _ in range(repeat):
        start = time.perf_counter()
        outputs = predictor.predict(pixels[None])
        latencies.append(time.perf_counter() - start)
    return outputs, latencies


def _annotate(pixels, outputs, names, min_score, path):
    count = int(outputs['num_detections'][0])
    image = visualize.draw_detections(
        Image.fromarray(pixels), outputs['detection_boxes'][0][:count],
        outputs['detection_scores'][0][:count], outputs['detection_classes'][0][:count],
        names, min_score=min_score)
    visualize.save_image(image, path)


class _TileProgress:
    """A TiledPredictor's on_tiles: the progress of one photo's tiles, shown when the photo
    takes 5 s or more (a whole orthophoto: thousands of tiles, minutes)."""

    def __init__(self, file_name):
        self.shown = progress.Progress('predicting %s' % file_name, unit='tiles',
                                       stream=sys.stdout,
                                       quiet_seconds=progress.MIN_LINE_SECONDS)

    def __call__(self, count, total):
        self.shown.meter.total = total  # Known from the first batch on.
        self.shown.update(count)

    def __enter__(self):
        return self

    def __exit__(self, error_type, error, traceback):
        self.shown.close(finished=error_type is None)
        return False


def _predict_shown(predictor, pixels, repeat, file_name):
    """_predict_timed, with a progress line of the photo's tiles when the predictor tiles."""
    if repeat != 1 or not hasattr(predictor, 'on_tiles'):
        return _predict_timed(predictor, pixels, repeat)
    with _TileProgress(file_name) as tiles:
        predictor.on_tiles = tiles
        try:
            return _predict_timed(predictor, pixels, repeat)
        finally:
            predictor.on_tiles = None


def _report_latency(latencies):
    if len(latencies) < 2:
        return
    ms = np.asarray(latencies[1:]) * 1e3  # The first run includes graph warm-up.
    print('latency per image (batch 1, %d runs after the first): mean %.1f ms, p50 %.1f ms, '
          'p90 %.1f ms' % (ms.size, ms.mean(), np.percentile(ms, 50), np.percentile(ms, 90)))


def predict_files(predictor, names, input_path, output_dir, repeat=1, min_score=0.3,
                  any_size=False, processed_names=None):
    """Runs `predictor` on every image of input_path; returns the exit status. any_size:
    photos of any pixel count are read (see read_rgb); processed_names: a list that gets the
    file name of each photo predicted (those without a detection too)."""
    files = check_output_dir(input_path, output_dir)
    results, skipped, latencies = [], [], []
    # A folder's progress (core/progress.py) on stdout, among the per-image lines.
    with progress.Progress('predicting', total=len(files), stream=sys.stdout,
                           enabled=len(files) > 1) as shown:
        for position, path in enumerate(files, start=1):
            file_name = os.path.basename(path)
            try:
                pixels = read_rgb(path, any_size)
            except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as error:
                shown.write('skipped %s: cannot decode it (%s: %s)' % (
                    path, type(error).__name__, error), file=sys.stderr)
                skipped.append(path)
                shown.update()
                continue
            outputs, timings = _predict_shown(predictor, pixels, repeat, file_name)
            latencies.extend(timings)
            rows = coco_rows(image_id_for(path, position), file_name, outputs, names)
            results.extend(rows)
            if processed_names is not None:
                processed_names.append(file_name)
            _annotate(pixels, outputs, names, min_score,
                      os.path.join(output_dir, annotated_name(file_name)))
            shown.write('%s: %dx%d, %d detections (%d >= %.2f)' % (
                file_name, pixels.shape[1], pixels.shape[0], len(rows),
                sum(r['score'] >= min_score for r in rows), min_score))
            shown.update()
    processed = len(files) - len(skipped)
    if not processed:
        raise FileNotFoundError('no photo of --input=%s could be read (%d skipped, above); '
                                'give photos PIL decodes' % (input_path, len(skipped)))
    atomic_file.write_json_atomically(os.path.join(output_dir, RESULTS_FILE), results,
                                      indent=None)
    _report_latency(latencies)
    print('processed %d image(s), skipped %d; wrote %s' % (
        processed, len(skipped), os.path.join(output_dir, RESULTS_FILE)))
    return 0
