"""Data faults met while a run reads its shards: named by shard and record, or left out.

A truncated or corrupt shard makes TensorFlow's reader say only "truncated record at N"; an
image that does not decode, "Unknown image file format". `named_data_errors` turns either into
one line naming the shard, the record index and its source_id, and the fix. With
--skip_bad_records, `find_bad_records` checks every shard before the run (the same checks as
`python -m dataset.verify_tfrecords`) and the input pipeline leaves those records out
(`dataloader.InputReader(skip=...)`); the run reports how many it skipped and where.
"""
import contextlib
import dataclasses
import os
import re
import time

import tensorflow as tf
from absl import logging

from efficientdet_hpu.core.errors import UserError
from efficientdet_hpu.data import data_errors
from efficientdet_hpu.data import record_check
from efficientdet_hpu.data import shard_check
from efficientdet_hpu.data import tfrecord_framing as framing

# InvalidArgumentError texts that come from a record's content, not from the model.
_CONTENT_ERROR = re.compile(
    r'Unknown image file format|Invalid JPEG|jpeg|png|decode|Input to reshape|'
    r'a record in |Invalid PNG|Corrupt|truncated', re.IGNORECASE)
BOX_TOLERANCE = 0.01  # dataset.verify_tfrecords' default: the same records are bad.


class DataError(UserError):
    """A record or a shard the run cannot read; the message names it and the fix."""


@dataclasses.dataclass(frozen=True)
class SkipList:
    """Records to leave out. bad: {shard path: sorted record indices}; readable: {shard path:
    records framed intact} for shards cut short or broken (reading stops there)."""
    bad: dict
    readable: dict

    @property
    def count(self):
        return sum(len(v) for v in self.bad.values())

    def describe(self, limit=8):
        items = ['%s#%d' % (os.path.basename(path), index)
                 for path, indices in sorted(self.bad.items()) for index in indices]
        shown = ', '.join(items[:limit]) + (' ...' if len(items) > limit else '')
        return '%d bad record(s) in %d shard(s): %s' % (len(items), len(self.bad), shown)

    def as_json(self):
        return {'count': self.count, 'records': {path: list(indices)
                                                for path, indices in sorted(self.bad.items())}}


def _is_data_error(error):
    if isinstance(error, tf.errors.DataLossError):
        return True
    return isinstance(error, tf.errors.InvalidArgumentError) and bool(
        _CONTENT_ERROR.search(error.message or ''))


def _bad_records(file_pattern, num_classes):
    """[(shard path, shard_check.BadRecord)] of every bad record of the shards, in order."""
    labels = record_check.LabelSpace(num_classes, 'num_classes=%s' % num_classes)
    reports = shard_check.verify_shards(framing.list_shards(file_pattern), labels,
                                        BOX_TOLERANCE, num_workers=os.cpu_count() or 1)
    return [(report.path, bad) for report in reports for bad in report.bad]


def _record_message(path, bad):
    names = ', '.join(part for part in (
        'source_id %s' % bad.source_id if bad.source_id else '',
        'file %s' % bad.filename if bad.filename else '') if part)
    return '%s record %d at byte %d%s: %s' % (path, bad.index, bad.offset,
                                             ' (%s)' % names if names else '', bad.error)


def describe(error, file_pattern, num_classes):
    """One line for a data error while reading `file_pattern`: the shard and the record."""
    if isinstance(error, tf.errors.DataLossError):
        return data_errors.describe_data_error(error, file_pattern)
    bad = _bad_records(file_pattern, num_classes)
    check = "python -m dataset.verify_tfrecords '%s'" % file_pattern
    if not bad:
        return ('a record of %s cannot be used (%s); %s finds no bad record now, so the '
                'shards may have changed during the run' % (file_pattern, error.message, check))
    first = _record_message(*bad[0])
    more = ' and %d more (see %s)' % (len(bad) - 1, check) if len(bad) > 1 else ''
    return ('cannot use %s%s. Fix or drop that image and re-convert the shard, or rerun with '
            '--skip_bad_records to leave bad records out' % (first, more))


@contextlib.contextmanager
def named_data_errors(file_pattern, num_classes):
    """Re-raises TensorFlow's reading/decoding errors of `file_pattern` as a DataError."""
    try:
        yield
    except (tf.errors.DataLossError, tf.errors.InvalidArgumentError) as error:
        if not file_pattern or not _is_data_error(error):
            raise
        raise DataError(describe(error, file_pattern, num_classes)) from None


def find_bad_records(file_pattern, num_classes):
    """The SkipList of `file_pattern` (checks every record on all cores)."""
    start = time.time()
    bad, readable = {}, {}
    for path, record in _bad_records(file_pattern, num_classes):
        if record.kind in ('framing', 'crc'):
            # TensorFlow's reader stops at the first broken frame or CRC of a shard: the
            # records before it are whole, the rest of the shard cannot be read.
            readable[path] = min(readable.get(path, record.index), record.index)
        else:
            bad.setdefault(path, []).append(record.index)
    skips = SkipList({path: sorted(indices) for path, indices in bad.items()}, readable)
    logging.info('--skip_bad_records: checked the shards of %s in %.1f s: %s%s', file_pattern,
                 time.time() - start, skips.describe() if skips.count else 'no bad record',
                 '; shards cut short (read up to the break): %s' % ', '.join(
                     '%s after %d records' % (os.path.basename(p), n)
                     for p, n in sorted(readable.items())) if readable else '')
    return skips
