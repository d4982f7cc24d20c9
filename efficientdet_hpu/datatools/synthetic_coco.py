r"""Deterministic synthetic COCO-format detection dataset: the project's embedded demo data.

    python -m dataset.synthetic_coco --output_dir=/tmp/shapes --num_train=800 --num_val=100

writes DIR/train/*.jpg, DIR/val/*.jpg and DIR/annotations/instances_{train,val}.json.
`--elongated` adds a fifth class, 'bar': axis-aligned bars whose box is 3 to 5 times longer
than wide (`--elongated_aspect=4,6` for others), half lying, half standing: the elongated
objects default anchors cover badly (see dataset/doctor.py). Without it the output is
unchanged, byte for byte.

Four classes told apart only by shape (ellipse, rectangle, triangle, cross). Colour, size,
aspect ratio, rotation and position are drawn independently of the class, on textured
backgrounds (gradients, low-frequency noise, stripe/checker patches, clutter lines), so neither
colour nor edges alone give the answer. Objects may overlap, but no object is hidden by more
than MAX_HIDDEN_FRACTION of its area. Category ids (3, 17, 42, 90) and image ids are
deliberately non-contiguous so the id <-> label mapping is exercised end to end.
The same seed gives byte-identical files. Boxes are the tight pixel box of each drawn shape,
COCO [x, y, width, height].
"""
import dataclasses
import json
import math
import os


import numpy as np  # pylint: disable=g-import-not-at-top
from PIL import Image, ImageDraw

from efficientdet_hpu.core import atomic_file

CATEGORIES = (
    {'id': 3, 'name': 'ellipse', 'supercategory': 'shape'},
    {'id': 17, 'name': 'rectangle', 'supercategory': 'shape'},
    {'id': 42, 'name': 'triangle', 'supercategory': 'shape'},
    {'id': 90, 'name': 'cross', 'supercategory': 'shape'},
)
ELONGATED_CATEGORY = {'id': 64, 'name': 'bar', 'supercategory': 'shape'}
ELONGATED_ASPECT_RANGE = (3.0, 5.0)  # Longer / shorter side of a bar.
ELONGATED_SIZE_RANGE = (0.35, 0.9)  # Longer side / shorter image side: keeps bars visible.
IMAGE_SIDE_RANGE = (160, 320)  # Width and height drawn independently, pixels.
OBJECT_SIZE_RANGE = (0.1, 0.6)  # Longer box side / shorter image side.
ASPECT_RANGE = (0.5, 2.0)
MAX_OBJECTS = 5
NEGATIVE_FRACTION = 0.05
MAX_HIDDEN_FRACTION = 0.3
MIN_COLOUR_DISTANCE = 70.0  # RGB distance between an object and the background under it.
FIRST_IMAGE_ID = {'train': 1000, 'val': 900000}
# More than four classes: each shape in these colours (class k: shape k % 4, colour k // 4).
PALETTE = (('red', (220, 40, 40)), ('green', (40, 190, 60)), ('blue', (40, 70, 220)),
           ('yellow', (230, 210, 40)), ('white', (245, 245, 245)))
_SPLIT_CODE = {'train': 1, 'val': 2}


def _rotate(points: np.ndarray, degrees: float) -> np.ndarray:
    angle = math.radians(degrees)
    rotation = np.array([[math.cos(angle), -math.sin(angle)], [math.sin(angle), math.cos(angle)]])
    return points @ rotation.T


def _bar_outline(rng: np.random.Generator, aspect_range) -> np.ndarray:
    """Unit-scale axis-aligned bar [4, 2] (x, y), lying or standing with equal odds; its
    longer / shorter side log-uniform in aspect_range."""
    aspect = math.exp(rng.uniform(*np.log(aspect_range)))
    half_long, half_short = math.sqrt(aspect), 1.0 / math.sqrt(aspect)
    if rng.random() < 0.5:
        half_long, half_short = half_short, half_long
    return np.array([[-half_long, -half_short], [half_long, -half_short],
                     [half_long, half_short], [-half_long, half_short]])


def _shape_outline(rng: np.random.Generator, name: str,
                   bar_aspect=ELONGATED_ASPECT_RANGE) -> np.ndarray:
    """Unit-scale outline [K, 2] (x, y) of one shape, centred near 0, before sizing."""
    if name == ELONGATED_CATEGORY['name']:
        return _bar_outline(rng, bar_aspect)
    aspect = math.exp(rng.uniform(math.log(ASPECT_RANGE[0]), math.log(ASPECT_RANGE[1])))
    half_w, half_h = math.sqrt(aspect), 1.0 / math.sqrt(aspect)
    if name == 'ellipse':
        angles = np.linspace(0.0, 2.0 * math.pi, 48, endpoint=False)
        points = np.stack([half_w * np.cos(angles), half_h * np.sin(angles)], axis=1)
        return _rotate(points, rng.uniform(-90, 90))
    if name == 'rectangle':
        points = np.array([[-half_w, -half_h], [half_w, -half_h], [half_w, half_h],
                           [-half_w, half_h]])
        return _rotate(points, rng.uniform(-30, 30))
    if name == 'triangle':
        apex_x = rng.uniform(-half_w, half_w)
        points = np.array([[apex_x, -half_h], [half_w, half_h], [-half_w, half_h]])
        return _rotate(points, 90 * rng.integers(4) + rng.uniform(-15, 15))
    # Cross: a plus sign whose arms are 25-45% as thick as the shorter side.
    half_w, half_h = math.sqrt(aspect) ** 0.5, 1.0 / math.sqrt(aspect) ** 0.5
    arm = rng.uniform(0.25, 0.45) * min(half_w, half_h)
    points = np.array([[-arm, -half_h], [arm, -half_h], [arm, -arm], [half_w, -arm],
                       [half_w, arm], [arm, arm], [arm, half_h], [-arm, half_h], [-arm, arm],
                       [-half_w, arm], [-half_w, -arm], [-arm, -arm]])
    return _rotate(points, rng.uniform(-30, 30))


def _place_outline(rng, outline: np.ndarray, width: int, height: int,
                   size_range=OBJECT_SIZE_RANGE) -> np.ndarray:
    """Scales the outline to a random size and moves it to a random spot fully inside."""
    extent = outline.max(axis=0) - outline.min(axis=0)
    size = rng.uniform(*size_range) * min(width, height)
    points = (outline - outline.min(axis=0)) * (size / extent.max())
    room = np.array([width - 1, height - 1]) - points.max(axis=0)
    return points + rng.uniform(0, 1, size=2) * np.maximum(room, 0)


def _polygon_mask(points: np.ndarray, width: int, height: int) -> np.ndarray:
    mask = Image.new('L', (width, height), 0)
    ImageDraw.Draw(mask).polygon([tuple(point) for point in points], fill=255)
    return np.asarray(mask) > 0


def _smooth_noise(rng, width: int, height: int, cells: int) -> np.ndarray:
    """Low-frequency noise [H, W, 3] float in about [-1, 1] (bicubic upsampled random grid)."""
    grid = rng.uniform(0, 255, size=(cells, cells, 3)).astype(np.uint8)
    resized = Image.fromarray(grid, 'RGB').resize((width, height), Image.BICUBIC)
    return np.asarray(resized, dtype=np.float32) / 127.5 - 1.0


def _pattern_patch(rng, canvas: np.ndarray) -> None:
    """Adds stripes or a checkerboard to a random rectangle of canvas [H, W, 3], in place."""
    height, width = canvas.shape[:2]
    patch_h, patch_w = (int(rng.uniform(0.2, 0.6) * side) for side in (height, width))
    top, left = rng.integers(0, height - patch_h + 1), rng.integers(0, width - patch_w + 1)
    yy, xx = np.mgrid[0:patch_h, 0:patch_w].astype(np.float32)
    period = rng.uniform(6, 24)
    if rng.random() < 0.6:
        angle = rng.uniform(0, math.pi)
        wave = np.sin(2 * math.pi * (xx * math.cos(angle) + yy * math.sin(angle)) / period)
    else:
        wave = np.where((xx // period + yy // period) % 2 == 0, 1.0, -1.0)
    colour = rng.uniform(-1, 1, size=3) * rng.uniform(15, 40)
    canvas[top:top + patch_h, left:left + patch_w] += wave[..., None] * colour


def _background(rng, width: int, height: int) -> np.ndarray:
    """Textured background [H, W, 3] float32: gradient + noise + patterns (0..255 scale)."""
    start, end = rng.uniform(30, 225, size=(2, 3))
    angle = rng.uniform(0, 2 * math.pi)
    yy, xx = np.mgrid[0:height, 0:width].astype(np.float32)
    ramp = xx * math.cos(angle) + yy * math.sin(angle)
    ramp = (ramp - ramp.min()) / max(float(np.ptp(ramp)), 1.0)
    canvas = start + (end - start) * ramp[..., None]
    canvas += _smooth_noise(rng, width, height, int(rng.integers(3, 9))) * rng.uniform(10, 45)
    for _ in range(int(rng.integers(0, 3))):
        _pattern_patch(rng, canvas)
    return canvas.astype(np.float32)


def _draw_clutter_lines(rng, image: Image.Image) -> None:
    draw = ImageDraw.Draw(image)
    width, height = image.size
    for _ in range(int(rng.integers(2, 9))):
        start = rng.uniform(0, 1, size=2) * (width, height)
        end = start + rng.normal(0, 0.35, size=2) * (width, height)
        colour = tuple(int(value) for value in rng.integers(0, 256, size=3))
        draw.line([tuple(start), tuple(end)], fill=colour, width=int(rng.integers(1, 4)))


def _object_colour(rng, background_mean: np.ndarray) -> np.ndarray:
    """A random colour clearly (but not extremely) different from the background under it."""
    for _ in range(50):
        colour = rng.uniform(0, 255, size=3)
        if np.linalg.norm(colour - background_mean) >= MIN_COLOUR_DISTANCE:
            return colour
    return 255.0 - background_mean  # Unreachable in practice; keeps the object visible.


def _covered(other, mask):
    """(other's visible crop window, mask's same window): the pixels a new mask may hide of
    a placed object, which keeps its visible pixels only inside its own box (big photos: no
    full-size arrays per object)."""
    y0, x0 = other['origin']
    height, width = other['visible'].shape
    return other['visible'], mask[y0:y0 + height, x0:x0 + width]


def _fits(mask: np.ndarray, placed: list) -> bool:
    """True if drawing `mask` on top leaves every placed object >= 70% visible."""
    for other in placed:
        visible, under = _covered(other, mask)
        still_visible = other['visible_area'] - np.count_nonzero(visible & under)
        if still_visible < (1.0 - MAX_HIDDEN_FRACTION) * other['area']:
            return False
    return True


def _paint(rng, canvas: np.ndarray, mask: np.ndarray, base=None) -> np.ndarray:
    """Fills mask with a shaded colour, random or near `base` (RGB); returns the colour [3]
    (before shading)."""
    colour = (_object_colour(rng, canvas[mask].mean(axis=0)) if base is None
              else np.clip(np.asarray(base, np.float64) + rng.uniform(-20, 20, size=3), 0, 255))
    height, width = mask.shape
    shade = _smooth_noise(rng, width, height, 3)[..., :1] * rng.uniform(0, 15)
    canvas[mask] = np.clip(colour + shade[mask], 0, 255)
    return colour


def render_image(rng: np.random.Generator, width: int, height: int, num_objects: int,
                 categories=CATEGORIES, bar_aspect=ELONGATED_ASPECT_RANGE,
                 size_range=OBJECT_SIZE_RANGE, palette=None):
    """Draws one image. Returns (uint8 [H, W, 3] RGB, objects).

    Each object is a dict with class_index (into `categories`), bbox (COCO [x, y, w, h]
    pixels, the tight box of the whole shape), area (shape pixels), visible_area (pixels not
    covered by later shapes) and colour (RGB [3] float). Fewer than num_objects are drawn when
    no placement satisfies the occlusion limit. bar_aspect: the 'bar' class's aspect range;
    size_range: the longer box side over the shorter image side; palette: {class index: RGB}
    for classes told apart by colour too (None: colours independent of the class).
    """
    canvas = _background(rng, width, height)
    base = Image.fromarray(np.clip(canvas, 0, 255).astype(np.uint8), 'RGB')
    _draw_clutter_lines(rng, base)
    canvas = np.asarray(base, dtype=np.float32).copy()
    placed = []
    for _ in range(num_objects):
        class_index = int(rng.integers(len(categories)))
        name = categories[class_index]['name']
        outline = _shape_outline(rng, name, bar_aspect)
        sizes = ELONGATED_SIZE_RANGE if name == ELONGATED_CATEGORY['name'] else size_range
        for _attempt in range(30):
            mask = _polygon_mask(_place_outline(rng, outline, width, height, sizes),
                                 width, height)
            if mask.any() and _fits(mask, placed):
                break
        else:
            continue
        for other in placed:
            visible, under = _covered(other, mask)
            other['visible_area'] -= int(np.count_nonzero(visible & under))
            visible &= ~under
        colour = _paint(rng, canvas, mask, None if palette is None else palette[class_index])
        x_min, y_min, x_max, y_max = Image.fromarray(mask).getbbox()
        area = int(np.count_nonzero(mask))
        placed.append({'class_index': class_index, 'colour': colour, 'origin': (y_min, x_min),
                       'visible': mask[y_min:y_max, x_min:x_max].copy(), 'area': area,
                       'visible_area': area, 'bbox': [x_min, y_min, x_max - x_min, y_max - y_min]})
    canvas += rng.normal(0, rng.uniform(1, 5), size=canvas.shape)  # Sensor noise.
    pixels = np.clip(np.round(canvas), 0, 255).astype(np.uint8)
    for obj in placed:
        del obj['visible'], obj['origin']
    return pixels, placed


def _image_ids(rng, count: int, first_id: int) -> list:
    """Increasing, non-contiguous ids: first_id, then gaps of 1-4."""
    gaps = rng.integers(1, 5, size=count)
    return (first_id - gaps[:1].sum() + np.cumsum(gaps)).tolist()


def _negative_indices(rng, count: int) -> set:
    num_negatives = max(1, round(NEGATIVE_FRACTION * count)) if count >= 2 else 0
    return set(rng.choice(count, size=num_negatives, replace=False).tolist())


@dataclasses.dataclass(frozen=True)
class Look:
    """What the photos look like: width and height drawn in `image_sides` (px), objects' longer
    side over the shorter image side in `object_sizes`, 1..max_objects a photo, grey or colour;
    the defaults are the demo's photos."""
    image_sides: tuple = IMAGE_SIDE_RANGE
    object_sizes: tuple = OBJECT_SIZE_RANGE
    max_objects: int = MAX_OBJECTS
    grey: bool = False


def categories_for(num_classes, elongated=False):
    """(categories, palette or None): the four shapes, fewer, or more as shapes in PALETTE's
    colours (class k: shape k % 4 in colour k // 4), then 'bar' with elongated."""
    if num_classes == len(CATEGORIES):
        categories, palette = CATEGORIES, None
    elif num_classes < len(CATEGORIES):
        categories, palette = CATEGORIES[:max(1, num_classes)], None
    elif num_classes <= len(CATEGORIES) * len(PALETTE) and not elongated:
        categories = tuple({'id': 3 + 7 * k, 'supercategory': 'shape', 'name': '%s-%s' % (
            CATEGORIES[k % 4]['name'], PALETTE[k // 4][0])} for k in range(num_classes))
        palette = {k: PALETTE[k // 4][1] for k in range(num_classes)}
    else:
        raise ValueError('num_classes=%d: give 1 to %d (and 4 with elongated bars)' % (
            num_classes, len(CATEGORIES) * len(PALETTE)))
    if elongated:
        categories += (ELONGATED_CATEGORY,)
    return categories, palette


def _generate_split(output_dir: str, split: str, count: int, seed: int,
                    categories=CATEGORIES, bar_aspect=ELONGATED_ASPECT_RANGE, look=Look(),
                    palette=None) -> str:
    """Writes the images and the JSON of one split; returns the JSON path."""
    split_rng = np.random.default_rng([seed, _SPLIT_CODE[split], 0])
    image_ids = _image_ids(split_rng, count, FIRST_IMAGE_ID[split])
    negatives = _negative_indices(split_rng, count)
    os.makedirs(os.path.join(output_dir, split), exist_ok=True)
    images, annotations = [], []
    for index, image_id in enumerate(image_ids):
        rng = np.random.default_rng([seed, _SPLIT_CODE[split], index + 1])
        width, height = (int(side) for side in rng.integers(look.image_sides[0],
                                                            look.image_sides[1] + 1, size=2))
        num_objects = 0 if index in negatives else int(rng.integers(1, look.max_objects + 1))
        pixels, objects = render_image(rng, width, height, num_objects, categories,
                                       bar_aspect, look.object_sizes, palette)
        file_name = f'{image_id:06d}.jpg'
        photo = Image.fromarray(pixels, 'RGB')
        (photo.convert('L') if look.grey else photo).save(
            os.path.join(output_dir, split, file_name), format='JPEG',
            quality=int(rng.integers(75, 96)))
        images.append({'id': image_id, 'file_name': file_name, 'width': width, 'height': height})
        for obj in objects:
            annotations.append({'id': len(annotations) + 1, 'image_id': image_id,
                                'category_id': categories[obj['class_index']]['id'],
                                'bbox': obj['bbox'], 'area': obj['area'], 'iscrowd': 0})
    json_path = os.path.join(output_dir, 'annotations', f'instances_{split}.json')
    os.makedirs(os.path.dirname(json_path), exist_ok=True)
    description = f'synthetic shapes, seed {seed}'
    if ELONGATED_CATEGORY in categories:
        description += ', elongated bars'
    content = {'info': {'description': description, 'version': '1.0'},
               'licenses': [], 'images': images, 'annotations': annotations,
               'categories': [dict(category) for category in categories]}
    with open(json_path, 'w', encoding='utf-8') as handle:
        json.dump(content, handle)
    return json_path


def generate(output_dir: str, num_train: int = 800, num_val: int = 100, seed: int = 0,
             elongated: bool = False, elongated_aspect=ELONGATED_ASPECT_RANGE,
             num_classes: int = len(CATEGORIES), look: Look = Look()) -> dict:
    """Writes the dataset; returns {'train_image_dir', 'val_image_dir', 'train_annotations',
    'val_annotations'} paths. elongated: add the 'bar' class (ELONGATED_CATEGORY), whose
    longer / shorter side is log-uniform in elongated_aspect (low, high); num_classes and
    look: categories_for and Look (the defaults give the demo's data, byte for byte)."""
    categories, palette = categories_for(num_classes, elongated)
    paths = {}
    for split, count in (('train', num_train), ('val', num_val)):
        paths[f'{split}_annotations'] = _generate_split(output_dir, split, count, seed,
                                                        categories, tuple(elongated_aspect),
                                                        look, palette)
        paths[f'{split}_image_dir'] = os.path.join(output_dir, split)
    return paths


def generated_once(directory: str, key, make) -> dict:
    """make() into `directory` once for `key` (what the set is made of: flags, seed): its dict of
    paths is kept in directory/generated.json with the key, relative to the directory (a folder
    copied or moved reads its own files). A rerun with the same key reuses the set, its files
    untouched (a rerun check that reads file times sees the same input); a set half made (no
    marker yet) or of another key is made again."""
    marker = os.path.join(directory, 'generated.json')
    try:
        with open(marker, encoding='utf-8') as stream:
            saved = json.load(stream)
        if saved['key'] == json.loads(json.dumps(key)):
            return {name: os.path.normpath(os.path.join(directory, path))
                    for name, path in saved['paths'].items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        pass
    paths = make()
    atomic_file.write_json_atomically(marker, {'key': key, 'paths': {
        name: os.path.relpath(path, directory) for name, path in paths.items()}})
    return paths


def main(argv) -> None:
    from absl import flags  # pylint: disable=g-import-not-at-top
    del argv
    options = flags.FLAGS
    look = Look(tuple(int(v) for v in options.image_sides),
                tuple(float(v) for v in options.object_sizes), options.max_objects, options.grey)
    paths = generate(options.output_dir, options.num_train, options.num_val, options.seed,
                     options.elongated, [float(v) for v in options.elongated_aspect],
                     options.num_classes, look)
    for name, path in sorted(paths.items()):
        print(f'{name}: {path}')


def entry_point():
    """Parses the command line and runs the command (the module's `main`)."""
    from absl import app, flags  # pylint: disable=g-import-not-at-top
    from efficientdet_hpu.core import command_help  # pylint: disable=g-import-not-at-top
    from efficientdet_hpu.core import errors  # pylint: disable=g-import-not-at-top
    flags.DEFINE_string('output_dir', None, 'Directory to write train/, val/, annotations/ to.')
    flags.DEFINE_integer('num_train', 800, 'Training images.', lower_bound=0)
    flags.DEFINE_integer('num_val', 100, 'Validation images.', lower_bound=0)
    flags.DEFINE_integer('seed', 0, 'Random seed; the same seed gives byte-identical files.')
    flags.DEFINE_bool('elongated', False, "Add the class 'bar': boxes 3-5 times longer than "
                      'wide, which default anchors cover badly.')
    flags.DEFINE_list('elongated_aspect', list(map(str, ELONGATED_ASPECT_RANGE)),
                      "With --elongated: the bars' range of longer / shorter side.")
    flags.DEFINE_integer('num_classes', len(CATEGORIES), 'Classes: 1-4 shapes, or up to 20 as '
                         'the shapes in 5 colours.', lower_bound=1)
    flags.DEFINE_list('image_sides', list(map(str, IMAGE_SIDE_RANGE)), 'Range of the photos\' '
                      'width and height, px.')
    flags.DEFINE_list('object_sizes', list(map(str, OBJECT_SIZE_RANGE)), 'Range of an object\'s '
                      'longer side over the photo\'s shorter side.')
    flags.DEFINE_integer('max_objects', MAX_OBJECTS, 'Objects a photo: 1 to this.', lower_bound=1)
    flags.DEFINE_bool('grey', False, 'Grey photos (one channel JPEG).')
    flags.mark_flag_as_required('output_dir')
    command_help.install(__name__)
    app.run(main, flags_parser=errors.parse_flags)


if __name__ == '__main__':
    entry_point()
