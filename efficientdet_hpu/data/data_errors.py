"""One-line explanations of the input pipeline's data errors, naming the shard and the fix.

TF's TFRecord reader says "truncated record at 14997149" or "corrupted record at 4960859" and
not which of the shards it was reading. `describe_data_error` walks the framing of the shards
(12-byte headers only: about a second for COCO's 118k records) to find the one broken at that
offset, and points to dataset/verify_tfrecords.py for a full check. Errors it cannot place
(an image that does not decode, a failed record check) get the command that finds them.
`tf_error_text` takes the error itself out of TF's eager or graph-mode message.
"""
import re
from typing import List, Optional, Tuple

import tensorflow as tf

from efficientdet_hpu.data import tfrecord_framing as framing

# TF's record reader: the start of the record ('truncated', a bad length CRC) or of its data
# ('corrupted' by a bad data CRC, 12 bytes after the start).
_READER_ERROR = re.compile(r'(truncated|corrupted) record at (\d+)')
# Lines of a TF error message around the error itself: graph-mode headers, where the op was
# defined (a Python stack), the node names, the root-error count.
_DECORATION = re.compile(r'Graph execution error|Detected at node|File "|Node: |\[\[|'
                         r'Original stack trace|root error\(s\) found|successful operations|'
                         r'derived errors ignored')
_ERROR_PREFIX = re.compile(r'^\(\d+\)\s+[A-Z_]+:\s*')  # '(0) DATA_LOSS: ' of several roots.
_OP_NOISE = re.compile(r'\{\{[^}]*\}\}\s*|\s*\[Op:[^\]]*\].*$')  # Eager: op and device.


def tf_error_text(error) -> str:
    """The error itself out of a TF error message (an exception or its text), on one line:
    without graph-mode stack traces and node names, or eager-mode op decorations."""
    text = getattr(error, 'message', None) or str(error)
    for line in text.splitlines():
        if not line.strip() or line.startswith('    ') or _DECORATION.search(line):
            continue  # Indented four: source lines of a stack trace.
        return _OP_NOISE.sub('', _ERROR_PREFIX.sub('', line.strip())).strip()
    return ' '.join(text.split())


def _data_crc_fails(path: str, record_offset: int) -> bool:
    reader = framing.RecordReader(path)
    try:
        reader.read(record_offset)
    except framing.RecordCorruptError:
        return True
    finally:
        reader.close()
    return False


def _fault_at(layout: framing.ShardLayout, offset: int) -> Optional[str]:
    """How the shard is broken at TF's reported `offset`, or None if it is not."""
    fault = layout.fault
    if fault is not None and fault.offset == offset:
        return _where(fault.record_index, fault.offset, fault.message)
    record_offset = offset - framing.HEADER_BYTES
    if record_offset in layout.offsets and _data_crc_fails(layout.path, record_offset):
        return _where(layout.offsets.index(record_offset), record_offset, 'data CRC mismatch')
    return None


def _where(index: int, offset: int, message: str) -> str:
    return f'record {index} at byte {offset}: {message}'


def _broken_shards(paths: List[str], offset: int) -> List[Tuple[str, str]]:
    """(path, what is wrong) of the shards broken at `offset`; failing that, of all shards
    whose framing is broken anywhere."""
    at_offset, anywhere = [], []
    for path in paths:
        try:
            layout = framing.scan_framing(path)
        except (OSError, tf.errors.OpError) as error:
            anywhere.append((path, f'cannot read the file ({error})'))
            continue
        message = _fault_at(layout, offset)
        if message:
            at_offset.append((path, message))
        elif layout.fault is not None:
            fault = layout.fault
            anywhere.append((path, _where(fault.record_index, fault.offset, fault.message)))
    return at_offset or anywhere


def describe_data_error(error, file_pattern: str) -> str:
    """A one-line message for a tf.errors.DataLossError / InvalidArgumentError (or its text)
    raised while reading the shards of `file_pattern` (a glob or comma-separated globs)."""
    text = tf_error_text(error)
    check = f"run: python -m dataset.verify_tfrecords '{file_pattern}' to check all shards"
    shards = framing.list_shards(file_pattern)
    if not shards:
        return f'{text}; no file matches {file_pattern!r} now; {check}'
    match = _READER_ERROR.search(text)
    if match is None:
        return (f'a record of {file_pattern} cannot be used ({text}); {check} and name the '
                f'record; then fix its image or annotations and re-convert that shard')
    offset = int(match.group(2))
    broken = _broken_shards(shards, offset)
    if not broken:
        return (f'{text} in one of the {len(shards)} shards of {file_pattern}, but none is '
                f'broken at byte {offset} now (was a shard replaced?); {check}')
    where = '; '.join(f'{path}: {message}' for path, message in broken)
    names = ', '.join(path for path, _ in broken)
    return f'TFRecord shard broken ({text}): {where}. Re-copy or re-convert {names}; {check}'
