"""Which images a set of detection TFRecords holds, read without decoding them: each record's
image id, file name and size, and the encoded bytes of chosen images.

Evaluation checks these against --val_json_file before it scores (`check_against_json`): a
record whose id is in the JSON under another file name or size means the records and the JSON
are from different splits, and its AP would be a meaningless 0.000.
"""
from typing import Dict, Iterable, List, NamedTuple, Optional

import tensorflow as tf

from efficientdet_hpu.core.errors import UserError
from efficientdet_hpu.data import tfrecord_format as fmt
from efficientdet_hpu.data import tfrecord_framing


class SplitMismatchError(UserError):
    """The evaluated records and the ground-truth JSON describe different images."""


class Identity(NamedTuple):
    image_id: int
    file_name: str
    height: int
    width: int


def _examples(file_pattern: str, max_records: Optional[int] = None):
    records = tf.data.TFRecordDataset(tfrecord_framing.list_shards(file_pattern))
    if max_records:
        records = records.take(max_records)
    for serialized in records.as_numpy_iterator():
        yield tf.train.Example.FromString(serialized).features.feature


def _first(feature, key, kind, default):
    values = getattr(feature[key], kind).value if key in feature else []
    return values[0] if len(values) else default


def read_identities(file_pattern: str, max_records: Optional[int] = None) -> List[Identity]:
    """Identity of every record in file order (ids that are not integers are skipped)."""
    identities = []
    for feature in _examples(file_pattern, max_records):
        source_id = _first(feature, fmt.IMAGE_SOURCE_ID, 'bytes_list', b'').decode('utf-8')
        if not source_id.lstrip('-').isdigit():
            continue
        identities.append(Identity(
            int(source_id), _first(feature, fmt.IMAGE_FILENAME, 'bytes_list', b'').decode('utf-8'),
            int(_first(feature, fmt.IMAGE_HEIGHT, 'int64_list', 0)),
            int(_first(feature, fmt.IMAGE_WIDTH, 'int64_list', 0))))
    return identities


def read_images(file_pattern: str, image_ids: Iterable[int]) -> Dict[int, bytes]:
    """{image id: encoded image bytes} of the wanted ids; stops once all are found."""
    wanted, found = {str(int(i)).encode() for i in image_ids}, {}
    for feature in _examples(file_pattern):
        source_id = _first(feature, fmt.IMAGE_SOURCE_ID, 'bytes_list', b'')
        if source_id in wanted:
            found[int(source_id)] = _first(feature, fmt.IMAGE_ENCODED, 'bytes_list', b'')
            if len(found) == len(wanted):
                break
    return found


def check_against_json(identities: List[Identity], json_images: Iterable[dict],
                       file_pattern: str, json_path: str) -> None:
    """Raises SplitMismatchError naming the first record whose image id is not in the JSON,
    or is there with another file name or size."""
    by_id = {image['id']: image for image in json_images}
    for index, record in enumerate(identities):
        image = by_id.get(record.image_id)
        if image is None:
            raise SplitMismatchError(
                f'image id {record.image_id} ({record.file_name!r}, record {index} of '
                f'{file_pattern}) is not in --val_json_file={json_path}: pass the JSON the '
                f'records were made from')
        json_name = str(image.get('file_name', ''))
        same_name = (not record.file_name or not json_name or
                     record.file_name.split('/')[-1] == json_name.split('/')[-1])
        same_size = (not record.height or 'height' not in image or
                     (record.height, record.width) == (image['height'], image['width']))
        if not (same_name and same_size):
            raise SplitMismatchError(
                f'image id {record.image_id} is {record.file_name!r} '
                f'{record.width}x{record.height} in record {index} of {file_pattern} but '
                f'{json_name!r} {image.get("width")}x{image.get("height")} in --val_json_file='
                f'{json_path}: the records and the JSON are from different splits; pass the '
                f'JSON the records were made from')
