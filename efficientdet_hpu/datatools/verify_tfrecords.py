r"""Checks detection TFRecord shards before (or after) a long run trips over them.

    python -m dataset.verify_tfrecords '/data/tfrecord/train-*.tfrecord' [--num_workers=N]
        [--label_map=FILE | --val_json_file=instances.json | --num_classes=N]

Reads every record of every shard matching the pattern (a glob, or comma-separated globs as
main.py's --training_file_pattern): the record framing and both CRCs (a truncated or a
corrupted shard is named with the record index and byte offset), the record fields the input
pipeline requires, every image decoded with the pipeline's decoder, the width/height fields
against the decoded image, boxes normalised [ymin, xmin, ymax, xmax] within [0, 1] and label
ids within the label map. By default the label map is the converter's `<prefix>-label_map.json`
beside the shards. Prints a table per shard, the bad records and a one-line verdict.

Exit status: 0 all records good, 1 a shard or record is bad, 2 usage error (e.g. no file
matches the pattern).
"""
import os
import sys
import time

from efficientdet_hpu.core import tf_env  # noqa: F401  (before TensorFlow)
from absl import app  # pylint: disable=g-import-not-at-top
from absl import flags
import tensorflow as tf

from efficientdet_hpu.core import command_help
from efficientdet_hpu.core import errors
from efficientdet_hpu.core import worker_pool
from efficientdet_hpu.data import label_map as label_map_lib
from efficientdet_hpu.data import shard_check
from efficientdet_hpu.data import tfrecord_framing as framing
from efficientdet_hpu.data.coco_annotations import ConversionError
from efficientdet_hpu.data.coco_annotations import index_categories
from efficientdet_hpu.data.coco_annotations import load_coco_json
from efficientdet_hpu.data.record_check import LabelSpace
from efficientdet_hpu.datatools.create_coco_tfrecord import ProgressBar

FLAGS = flags.FLAGS
EXIT_OK, EXIT_BAD, EXIT_USAGE = 0, 1, 2
MAX_LISTED_PER_SHARD = 20
FIRST_ERROR_WIDTH = 72
_FIXES = (  # (kinds of bad record, what to do about the shards holding them)
    (('framing', 'crc'), 're-copy {shards} from the source, or re-convert them'),
    (('content',), 'fix the listed images or annotations and re-convert {shards} '
                   '(python -m dataset.create_coco_tfrecord)'),
)


class UsageError(errors.UserError):
    """A user mistake in the command line; the message names it and the fix."""


def define_flags() -> None:
    """Defines the CLI flags (only when run as a program, so importing has no side effect)."""
    flags.DEFINE_string('label_map', None, 'Label map JSON to check label ids against; default: '
                        '<prefix>-label_map.json beside the shards, if there.')
    flags.DEFINE_string('val_json_file', None, 'COCO instances JSON whose categories give the '
                        'labels 1..N (as the converter numbers them).')
    flags.DEFINE_integer('num_classes', None, 'Check labels against 1..num_classes.',
                         lower_bound=1)
    flags.DEFINE_integer('num_workers', os.cpu_count() or 1,
                         'Worker processes at most (1 = check in this process); each gets at '
                         f'least {shard_check.MIN_RECORDS_PER_WORKER} records, so a small set '
                         'uses fewer.', lower_bound=1)
    flags.DEFINE_float('box_tolerance', 0.01, 'How far outside [0, 1] a normalised box '
                       'coordinate may be (float rounding, other converters).', lower_bound=0)


def resolve_labels(file_pattern: str, label_map_path=None, val_json_file=None,
                   num_classes=None) -> LabelSpace:
    """The labels a record may carry: from exactly one of the three sources, or the label map
    beside the shards. Raises UsageError for two sources or an unreadable file."""
    given = [name for name, value in (('--label_map', label_map_path),
                                      ('--val_json_file', val_json_file),
                                      ('--num_classes', num_classes)) if value]
    if len(given) > 1:
        raise UsageError(f'pass only one of --label_map, --val_json_file and --num_classes '
                         f'(got {", ".join(given)}).')
    if num_classes:
        return LabelSpace(num_classes, f'--num_classes={num_classes}')
    if val_json_file:
        try:
            categories = index_categories(load_coco_json(val_json_file)['categories'],
                                          val_json_file)
        except ConversionError as error:
            raise UsageError(f'--val_json_file: {error}') from None
        return LabelSpace(len(categories), f'the categories of {val_json_file}')
    path = label_map_path or label_map_lib.label_map_path_for(file_pattern)
    if path is None:
        return LabelSpace(None, 'no label map beside the shards')
    try:
        label_map = label_map_lib.load_label_map(path)
    except (FileNotFoundError, label_map_lib.LabelMapError) as error:
        hint = ('' if label_map_path else ' (found beside the shards; pass --label_map or '
                '--num_classes to use another)')
        raise UsageError(f'{error}{hint}') from None
    return LabelSpace(label_map.num_classes, f'label map {path}')


def list_shards_or_fail(file_pattern: str) -> list:
    try:
        shards = framing.list_shards(file_pattern)
    except tf.errors.OpError as error:
        raise UsageError(f'cannot list {file_pattern!r}: {error.message}') from None
    if not shards:
        raise UsageError(f'no file matches {file_pattern!r}; check the path, and quote the '
                         f"pattern so the shell passes it unexpanded: "
                         f"python -m dataset.verify_tfrecords '/data/tfrecord/train-*.tfrecord'")
    return shards


# ----------------------------------------------------------------------------- report

def _shard_name(path: str, directory: str) -> str:
    return os.path.relpath(path, directory) if directory else path


def _common_directory(paths) -> str:
    directories = {os.path.dirname(path) for path in paths}
    return directories.pop() if len(directories) == 1 else ''


def _count(number: int, noun: str) -> str:
    return f'{number} {noun}{"s" * (number != 1)}'


def _shorten(text: str, width: int) -> str:
    return text if len(text) <= width else text[:width - 3] + '...'


def format_table(reports, directory: str) -> str:
    """One row per shard: records, images ok, bad records, the first error."""
    rows = [('shard', 'records', 'images ok', 'bad', 'first error')]
    for report in reports:
        first = report.bad[0] if report.bad else None
        first_error = (f'record {first.index} at byte {first.offset}: {first.error}'
                       if first else '-')
        rows.append((_shard_name(report.path, directory), str(report.records),
                     str(report.images_ok), str(len(report.bad)),
                     _shorten(first_error, FIRST_ERROR_WIDTH)))
    widths = [max(len(row[column]) for row in rows) for column in range(4)]
    lines = []
    for row in rows:
        cells = [row[0].ljust(widths[0])] + [cell.rjust(width)
                                             for cell, width in zip(row[1:4], widths[1:])]
        lines.append('  '.join(cells + [row[4]]).rstrip())
    return '\n'.join(lines)


def format_bad_records(reports, directory: str) -> str:
    """Every bad record (up to MAX_LISTED_PER_SHARD a shard) with where it is and why."""
    lines = []
    for report in reports:
        name = _shard_name(report.path, directory)
        for bad in report.bad[:MAX_LISTED_PER_SHARD]:
            who = ', '.join(part for part in (f'source_id {bad.source_id}' if bad.source_id else '',
                                              bad.filename) if part)
            lines.append(f'  {name}  record {bad.index}  byte {bad.offset}'
                         f'{"  " + who if who else ""}: {bad.error}')
        if report.unreadable_bytes:
            lines.append(f'  {name}: the last {report.unreadable_bytes} bytes (from byte '
                         f'{report.size - report.unreadable_bytes}) cannot be read')
        if len(report.bad) > MAX_LISTED_PER_SHARD:
            lines.append(f'  {name}: ... and {len(report.bad) - MAX_LISTED_PER_SHARD} more')
    return 'Bad records:\n' + '\n'.join(lines) if lines else ''


def verdict_line(reports, labels: LabelSpace) -> str:
    """'OK: ...' or 'FAILED: ...' with what to do."""
    records = sum(report.records for report in reports)
    bad_reports = [report for report in reports if not report.ok]
    if not bad_reports:
        checked = (f'labels within 1..{labels.num_classes} ({labels.source})'
                   if labels.num_classes else f'labels >= 1 ({labels.source}: pass --label_map, '
                   f'--val_json_file or --num_classes to check them against the classes)')
        return (f'OK: {_count(len(reports), "shard")}, {_count(records, "record")}: every record '
                f'reads, every image decodes, boxes within [0, 1], {checked}.')
    fixes = []
    for kinds, fix in _FIXES:
        names = [os.path.basename(report.path) for report in bad_reports
                 if any(bad.kind in kinds for bad in report.bad)]
        if names:
            fixes.append(fix.format(shards=_shorten(', '.join(names), 120)))
    num_bad = sum(len(report.bad) for report in bad_reports)
    return (f'FAILED: {_count(num_bad, "bad record")} in {len(bad_reports)} of '
            f'{_count(len(reports), "shard")}. To fix: ' + '; '.join(fixes) + '.')


# ----------------------------------------------------------------------------- CLI

class _Progress:
    """The totals line and a ProgressBar on stderr, started once the shards are framed."""

    def __init__(self, stream):
        self._stream = stream
        self._bar = None

    def start(self, layouts, workers: int) -> None:
        total = sum(len(layout.offsets) for layout in layouts)
        megabytes = sum(layout.size for layout in layouts) / 1e6
        self._stream.write(f'verify_tfrecords: {_count(len(layouts), "shard")} framed, '
                           f'{_count(total, "record")}, {megabytes:.1f} MB; checking with '
                           f'{_count(workers, "worker")}\n')
        self._bar = ProgressBar(total, stream=self._stream)

    def update(self, done: int, final: bool = False) -> None:
        if self._bar is not None:
            self._bar.update(done, final)


def run(shards: list, labels: LabelSpace, num_workers: int, box_tolerance: float,
        stream=sys.stdout, progress_stream=sys.stderr) -> int:
    """Checks the TFRecord files `shards`, prints the report; returns the exit status."""
    start = time.monotonic()
    progress = _Progress(progress_stream)
    reports = shard_check.verify_shards(shards, labels, box_tolerance, num_workers,
                                        progress.start, progress.update)
    records = sum(report.records for report in reports)
    seconds = time.monotonic() - start  # With the workers' start-up: seconds, once.
    progress.update(records, final=True)
    directory = _common_directory(shards)
    print(f'Checked {_count(len(shards), "shard")}{" in " + directory if directory else ""}: '
          f'{_count(records, "record")} in {seconds:.1f} s '
          f'({records / max(seconds, 1e-6):.0f} records/s); labels: {labels.source}', file=stream)
    print(format_table(reports, directory), file=stream)
    details = format_bad_records(reports, directory)
    if details:
        print(details, file=stream)
    print(verdict_line(reports, labels), file=stream)
    return EXIT_OK if all(report.ok for report in reports) else EXIT_BAD


def _usage_error(message: str) -> None:
    sys.exit(errors.fail('verify_tfrecords', message))


def main(argv) -> None:
    if len(argv) < 2:
        _usage_error("give the shards to check: python -m dataset.verify_tfrecords "
                     "'/data/tfrecord/train-*.tfrecord'")
    # Several arguments: the shell expanded an unquoted glob; check them all.
    file_pattern = ','.join(argv[1:])
    try:
        shards = list_shards_or_fail(file_pattern)
        labels = resolve_labels(file_pattern, FLAGS.label_map, FLAGS.val_json_file,
                                FLAGS.num_classes)
        status = run(shards, labels, FLAGS.num_workers, FLAGS.box_tolerance)
    except (UsageError, worker_pool.WorkerFailure) as error:
        _usage_error(str(error))
    sys.exit(status)


def entry_point():
    """Parses the command line and runs the command (the module's `main`)."""
    define_flags()
    command_help.install(__name__)
    app.run(main, flags_parser=errors.parse_flags)


if __name__ == '__main__':
    entry_point()
