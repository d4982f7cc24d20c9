"""Small real TFRecords of real encoded images with known boxes, for tests and benchmarks.

    specs = [ImageSpec(image_id=1, height=128, width=128, boxes=[[24, 24, 88, 88]], labels=[3])]
    pattern = write_shards(tmp_path, specs, num_files=2)     # -> '.../data-*.tfrecord'

Boxes are given in pixels [ymin, xmin, ymax, xmax] and stored normalised as the dataset
converter stores them (docs/CONTRACTS.md). Each box is painted as a flat colour rectangle on
a smooth background, so the image content agrees with the labels. read_source_ids and
decoded_images read records back; write_jpegs turns decoded images into a folder of JPEG files
(the input of `inference.py predict`).
"""
import dataclasses
import io
import os
from typing import List, Optional, Sequence

import numpy as np
import tensorflow as tf
from PIL import Image

from efficientdet_hpu.data import tfrecord_format as fmt

PALETTE = np.array([[230, 25, 75], [60, 180, 75], [0, 130, 200], [245, 130, 48],
                    [145, 30, 180], [70, 240, 240]], dtype=np.uint8)


@dataclasses.dataclass
class ImageSpec:
    """One image and its annotations. boxes: pixels [ymin, xmin, ymax, xmax]."""
    image_id: int
    height: int
    width: int
    boxes: Sequence[Sequence[float]] = ()
    labels: Sequence[int] = ()
    is_crowd: Optional[Sequence[int]] = None  # None: all 0.
    image_format: str = 'jpeg'  # 'jpeg' | 'png'.
    noise: float = 0.0  # Std of pixel noise (seeded by image_id): photo-like JPEG sizes.

    def normalized_boxes(self) -> np.ndarray:
        boxes = np.asarray(self.boxes, dtype=np.float64).reshape(-1, 4)
        return boxes / np.array([self.height, self.width, self.height, self.width])

    def crowd_flags(self) -> List[int]:
        return list(self.is_crowd) if self.is_crowd is not None else [0] * len(self.labels)


def render_pixels(spec: ImageSpec) -> np.ndarray:
    """uint8 [height, width, 3]: a gradient background with each box filled by its label's
    palette colour (boxes rounded to whole pixels)."""
    y = np.linspace(0, 1, spec.height)[:, None]
    x = np.linspace(0, 1, spec.width)[None, :]
    background = np.stack([96 + 64 * y + 0 * x, 96 + 64 * x + 0 * y,
                           128 + 32 * (y - x)], axis=-1)
    if spec.noise:
        rng = np.random.default_rng(spec.image_id)
        background = background + rng.normal(0, spec.noise, background.shape)
    pixels = np.clip(background, 0, 255).astype(np.uint8)
    for box, label in zip(spec.boxes, spec.labels):
        ymin, xmin, ymax, xmax = [int(round(v)) for v in box]
        pixels[max(ymin, 0):ymax, max(xmin, 0):xmax] = PALETTE[(label - 1) % len(PALETTE)]
    return pixels


def encode_pixels(pixels: np.ndarray, image_format: str = 'jpeg', quality: int = 92) -> bytes:
    buffer = io.BytesIO()
    if image_format == 'jpeg':
        Image.fromarray(pixels).save(buffer, format='JPEG', quality=quality)
    elif image_format == 'png':
        Image.fromarray(pixels).save(buffer, format='PNG')
    else:
        raise ValueError('image_format must be jpeg or png, got %r' % image_format)
    return buffer.getvalue()


def make_example(spec: ImageSpec, drop_keys: Sequence[str] = ()):
    """tf.train.Example of `spec` in the contract schema, without the keys in drop_keys."""
    pixels = render_pixels(spec)
    boxes = spec.normalized_boxes()
    areas = [(b[2] - b[0]) * (b[3] - b[1]) for b in np.asarray(spec.boxes).reshape(-1, 4)]
    example = fmt.build_example(
        encode_pixels(pixels, spec.image_format), spec.height, spec.width, spec.image_id,
        '%012d.%s' % (spec.image_id, 'jpg' if spec.image_format == 'jpeg' else 'png'), boxes,
        list(spec.labels), ['class_%d' % label for label in spec.labels], spec.crowd_flags(),
        areas)
    feature = example.features.feature
    feature[fmt.IMAGE_FORMAT].bytes_list.value[:] = [spec.image_format.encode()]
    for key in drop_keys:
        del feature[key]
    return example


def write_records(path: str, specs: Sequence[ImageSpec], drop_keys: Sequence[str] = ()) -> str:
    """Writes one TFRecord file holding `specs` in order; returns path."""
    with tf.io.TFRecordWriter(path) as writer:
        for spec in specs:
            writer.write(make_example(spec, drop_keys).SerializeToString())
    return path


def write_shards(directory, specs: Sequence[ImageSpec], num_files: int = 1,
                 prefix: str = 'data') -> str:
    """Splits specs into num_files contiguous shards `prefix-0000i-of-0000n.tfrecord`;
    returns the glob pattern matching them."""
    directory = str(directory)
    os.makedirs(directory, exist_ok=True)
    chunks = np.array_split(np.arange(len(specs)), num_files)
    for index, chunk in enumerate(chunks):
        write_records(os.path.join(directory, '%s-%05d-of-%05d.tfrecord'
                                   % (prefix, index, num_files)), [specs[i] for i in chunk])
    return os.path.join(directory, '%s-*.tfrecord' % prefix)


def random_specs(count: int, height: int = 480, width: int = 640, num_classes: int = 3,
                 max_boxes: int = 6, seed: int = 0, first_id: int = 1,
                 noise: float = 0.0) -> List[ImageSpec]:
    """`count` images with 1..max_boxes random boxes each (for shapes and benchmarks)."""
    rng = np.random.default_rng(seed)
    specs = []
    for index in range(count):
        num_boxes = int(rng.integers(1, max_boxes + 1))
        sizes = rng.uniform(0.08, 0.5, size=(num_boxes, 2)) * [height, width]
        corners = rng.uniform(0, 1, size=(num_boxes, 2)) * ([height, width] - sizes)
        boxes = np.concatenate([corners, corners + sizes], axis=1).round(1)
        specs.append(ImageSpec(first_id + index, height, width, boxes.tolist(),
                               rng.integers(1, num_classes + 1, size=num_boxes).tolist(),
                               noise=noise))
    return specs


def read_source_ids(pattern: str) -> List[int]:
    """The image/source_id of every record matching pattern, in sorted file order."""
    ids = []
    for path in sorted(tf.io.gfile.glob(pattern)):
        for raw in tf.data.TFRecordDataset(path).as_numpy_iterator():
            feature = tf.train.Example.FromString(raw).features.feature
            ids.append(int(feature[fmt.IMAGE_SOURCE_ID].bytes_list.value[0]))
    return ids


def decoded_images(pattern: str, count: int = 4) -> List[np.ndarray]:
    """uint8 [H, W, 3] pixels of the first `count` records matching pattern, in sorted file
    order."""
    images = []
    for path in sorted(tf.io.gfile.glob(pattern)):
        for raw in tf.data.TFRecordDataset(path).as_numpy_iterator():
            feature = tf.train.Example.FromString(raw).features.feature
            images.append(tf.io.decode_jpeg(feature[fmt.IMAGE_ENCODED].bytes_list.value[0],
                                            channels=3).numpy())
    return images[:count]


def write_jpegs(images: Sequence[np.ndarray], directory):
    """Writes uint8 [H, W, 3] images as directory/000001.jpg, 000002.jpg, ... (directory, a
    pathlib.Path, must not exist yet); returns directory."""
    directory.mkdir()
    for index, image in enumerate(images):
        (directory / ('%06d.jpg' % (index + 1))).write_bytes(tf.io.encode_jpeg(image).numpy())
    return directory
