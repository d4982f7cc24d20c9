"""Checks one serialized detection record as the input pipeline will read it, in plain Python.

Rejects what data/record_parser.py rejects (its feature spec, required fields, list lengths,
labels in 1..num_classes) and decodes the image with the TF ops of record_parser.decode_image,
called eagerly one by one: its in-graph tf.case costs about 1 ms an image more. On top, what
the pipeline would take silently: boxes outside [0, 1] or inverted, and image/height, width
fields that disagree with the decoded image. tests/datatools/test_verify_tfrecords.py holds the parity
with record_parser on malformed records and images.
"""
import dataclasses
import math
import re
from typing import List, Optional, Tuple

import tensorflow as tf
from google.protobuf.message import DecodeError

from efficientdet_hpu.data import record_parser
from efficientdet_hpu.data import tfrecord_format as fmt
from efficientdet_hpu.data.data_errors import tf_error_text

_KIND_OF_DTYPE = {tf.string: 'bytes_list', tf.float32: 'float_list', tf.int64: 'int64_list'}
_BOX_KEYS = (fmt.OBJECT_BBOX_YMIN, fmt.OBJECT_BBOX_XMIN, fmt.OBJECT_BBOX_YMAX,
             fmt.OBJECT_BBOX_XMAX)
_SOURCE_ID = re.compile(rb'-?[0-9]+')  # record_parser's regex_full_match.
_JPEG_SIGNATURE = b'\xff\xd8\xff'  # What tf.io.is_jpeg tests.
_PNG_SIGNATURE = record_parser._PNG_SIGNATURE  # pylint: disable=protected-access


@dataclasses.dataclass(frozen=True)
class LabelSpace:
    """Valid labels are 1..num_classes; num_classes None: only >= 1 is checked.
    source: where num_classes comes from, for messages ('label map /data/train-label_map.json')."""
    num_classes: Optional[int]
    source: str


@dataclasses.dataclass
class RecordVerdict:
    """source_id and filename as stored ('' if absent); errors empty when the record is good."""
    source_id: str = ''
    filename: str = ''
    image_ok: bool = False
    errors: List[str] = dataclasses.field(default_factory=list)


def decoded_size(encoded: bytes) -> Tuple[int, int]:
    """(height, width) of the image as record_parser.decode_image decodes it.

    Raises:
        tf.errors.OpError (InvalidArgumentError for bad bytes): the pipeline fails on it too.
    """
    if encoded[:3] == _JPEG_SIGNATURE:
        image = tf.io.decode_jpeg(encoded, channels=3)
    elif encoded[:len(_PNG_SIGNATURE)] == _PNG_SIGNATURE:
        image = tf.io.decode_png(encoded, channels=4)
    else:
        image = tf.io.decode_image(encoded, channels=3, expand_animations=False)
    height, width = image.shape[:2]
    return int(height), int(width)


def _values(feature) -> list:
    kind = feature.WhichOneof('kind')
    return list(getattr(feature, kind).value) if kind else []


def _spec_errors(features) -> List[str]:
    """What tf.io.parse_single_example with record_parser's spec would fail on."""
    errors = []
    for key, spec in record_parser._RECORD_FEATURES.items():  # pylint: disable=protected-access
        if key not in features or features[key].WhichOneof('kind') is None:
            continue  # Absent: VarLen gives [], FixedLen its default.
        kind, expected = features[key].WhichOneof('kind'), _KIND_OF_DTYPE[spec.dtype]
        if kind != expected:
            errors.append(f"'{key}' is a {kind}, the input pipeline reads a {expected}")
        elif isinstance(spec, tf.io.FixedLenFeature) and len(_values(features[key])) != 1:
            errors.append(f"'{key}' holds {len(_values(features[key]))} values, "
                          f"the input pipeline reads exactly 1")
    return errors


def _optional_list(features, key) -> list:
    return _values(features[key]) if key in features else []


def _required_errors(features) -> List[str]:
    """record_parser.parse_record's required fields: an image and an integer source id."""
    errors = []
    encoded = _optional_list(features, fmt.IMAGE_ENCODED)
    if not encoded or not encoded[0]:
        errors.append(f"no '{fmt.IMAGE_ENCODED}' (required)")
    source_id = _optional_list(features, fmt.IMAGE_SOURCE_ID)
    if not source_id or not _SOURCE_ID.fullmatch(source_id[0]):
        errors.append(f"'{fmt.IMAGE_SOURCE_ID}' is not an integer (required, the COCO image "
                      f"id): {source_id[0] if source_id else 'absent'!r}")
    return errors


def _object_errors(features, labels: LabelSpace) -> List[str]:
    """record_parser.parse_record's object checks: one entry per label in every box list
    (and in is_crowd and area, which may be empty), labels within 1..num_classes."""
    errors = []
    label_values = _optional_list(features, fmt.OBJECT_CLASS_LABEL)
    lengths = {key: len(_optional_list(features, key)) for key in _BOX_KEYS}
    for key in (fmt.OBJECT_IS_CROWD, fmt.OBJECT_AREA):
        if _optional_list(features, key):
            lengths[key] = len(_optional_list(features, key))
    if any(length != len(label_values) for length in lengths.values()):
        errors.append(f"{len(label_values)} labels but list lengths "
                      + ', '.join(f"'{key}' {length}" for key, length in lengths.items()))
    upper = labels.num_classes
    bad = [label for label in label_values if label < 1 or (upper is not None and label > upper)]
    if bad:
        allowed = (f'1..{upper} ({labels.source})' if upper is not None
                   else '1.. (labels start at 1)')
        errors.append(f'label {bad[0]} outside {allowed}; labels: {label_values[:10]}')
    return errors


def box_errors(features, tolerance: float) -> List[str]:
    """Boxes must be [ymin, xmin, ymax, xmax] normalised: finite, min <= max, in [0, 1]
    up to `tolerance`. Reports the first bad box."""
    columns = [_optional_list(features, key) for key in _BOX_KEYS]
    for index, box in enumerate(zip(*columns)):
        ymin, xmin, ymax, xmax = box
        shown = '[' + ', '.join(f'{value:.4g}' for value in box) + ']'
        if not all(math.isfinite(value) for value in box):
            problem = 'is not finite'
        elif ymin > ymax or xmin > xmax:
            problem = 'has ymin > ymax' if ymin > ymax else 'has xmin > xmax'
        elif min(box) < -tolerance or max(box) > 1 + tolerance:
            problem = (f'is outside [0, 1] (tolerance {tolerance}); boxes must be normalised '
                       f'by the image size')
        else:
            continue
        return [f'box {index} [ymin, xmin, ymax, xmax] = {shown} {problem}']
    return []


def _size_errors(features, height: int, width: int) -> List[str]:
    stored = [_optional_list(features, key) for key in (fmt.IMAGE_HEIGHT, fmt.IMAGE_WIDTH)]
    if all(len(values) == 1 for values in stored) and (stored[0][0], stored[1][0]) != (height,
                                                                                        width):
        return [f"'{fmt.IMAGE_HEIGHT}', '{fmt.IMAGE_WIDTH}' say {stored[0][0]}x{stored[1][0]} "
                f"but the image decodes to {height}x{width} (height x width)"]
    return []


def _text(features, key) -> str:
    values = _optional_list(features, key)
    if len(values) != 1 or not isinstance(values[0], bytes):
        return ''
    return values[0].decode('utf-8', 'replace')


def check_record(serialized: bytes, labels: LabelSpace, box_tolerance: float) -> RecordVerdict:
    """All checks of one serialized tf.train.Example; see the module docstring."""
    try:
        example = tf.train.Example.FromString(serialized)
    except DecodeError as error:
        return RecordVerdict(errors=[f'not a tf.train.Example ({error})'])
    features = example.features.feature
    verdict = RecordVerdict(source_id=_text(features, fmt.IMAGE_SOURCE_ID),
                            filename=_text(features, fmt.IMAGE_FILENAME))
    verdict.errors = _spec_errors(features)
    if verdict.errors:  # Values of the wrong type: the other checks would only echo them.
        return verdict
    verdict.errors = (_required_errors(features) + _object_errors(features, labels)
                      + box_errors(features, box_tolerance))
    encoded = _optional_list(features, fmt.IMAGE_ENCODED)
    if encoded and encoded[0]:
        try:
            height, width = decoded_size(encoded[0])
        except tf.errors.OpError as error:  # InvalidArgumentError for corrupt bytes.
            verdict.errors.insert(0, f'image does not decode: {tf_error_text(error)}')
        else:
            verdict.image_ok = True
            verdict.errors += _size_errors(features, height, width)
    return verdict
