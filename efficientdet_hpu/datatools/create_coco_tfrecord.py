r"""Converts a COCO-format detection dataset (images + instances JSON) to sharded TFRecords.

    python -m dataset.create_coco_tfrecord --image_dir=/data/coco/val2017 \
        --object_annotations_file=/data/coco/annotations/instances_val2017.json \
        --output_file_prefix=/data/tfrecord/val --num_shards=32

Writes `<prefix>-00000-of-00032.tfrecord` ..., `<prefix>-label_map.json` (docs/CONTRACTS.md)
and `<prefix>-summary.json`. The JSON is validated completely before anything is written.
Shards are written under hidden temporary names and renamed only when all of them are
complete, so a failed run leaves an earlier run's output untouched and never a partial set;
stale shards of that earlier run (another shard count) are deleted after the rename.
User errors (ConversionError) print one line and exit with status 2.

Per annotation: boxes partly outside the image are clipped and kept; malformed, degenerate
(w or h <= 0) and entirely-outside boxes are dropped and counted by reason in the summary.
Images are stored as RGB JPEG: baseline RGB JPEGs byte for byte, all else re-encoded
(data/image_codec.py). Category and image ids may be any integers.

Labels (--label_layout): `contiguous` (default) numbers the categories 1..N in id order, for
any ids; `category_id` keeps each category id as its label with 90 classes, google/automl's
COCO layout, so automl's COCO checkpoints fit with their class head (ids 1..90 only).
"""
import dataclasses
import os
import re
import sys
import time

from efficientdet_hpu.core import tf_env  # noqa: F401  (before TensorFlow)

from absl import app  # pylint: disable=g-import-not-at-top
from absl import flags
import tensorflow as tf

from efficientdet_hpu.core import atomic_file
from efficientdet_hpu.core import command_help
from efficientdet_hpu.core import errors
from efficientdet_hpu.core import worker_pool
from efficientdet_hpu.data import label_map as label_map_lib
from efficientdet_hpu.data import tfrecord_format
from efficientdet_hpu.data.coco_annotations import ConversionError
from efficientdet_hpu.data.coco_annotations import read_dataset
from efficientdet_hpu.data.image_codec import encode_jpeg
from efficientdet_hpu.datatools import tiled_dataset

FLAGS = flags.FLAGS


def define_flags():
    """Defines the CLI flags (only when run as a program, so importing has no side effect)."""
    flags.DEFINE_string('image_dir', None, 'Directory the JSON "file_name"s are relative to.')
    flags.DEFINE_string('object_annotations_file', None, 'COCO instances JSON file.')
    flags.DEFINE_string('output_file_prefix', None,
                        'Output path prefix, e.g. /data/tfrecord/train (local file system).')
    flags.DEFINE_integer('num_shards', 32, 'Number of shards (capped at the number of images).',
                         lower_bound=1)
    flags.DEFINE_integer('num_threads', os.cpu_count() or 1,
                         'Worker processes that decode/encode images (1 = in this process).',
                         lower_bound=1)
    flags.DEFINE_bool('include_crowd', True,
                      'Write iscrowd=1 boxes with is_crowd=1 (ignored by the training loss, '
                      'crowd regions for evaluation); false drops them.')
    flags.DEFINE_bool('skip_empty', False,
                      'Drop images without boxes; by default they are kept as negatives.')
    flags.DEFINE_enum('label_layout', 'contiguous', label_map_lib.LAYOUTS,
                      'contiguous: labels 1..N in category-id order (any ids). category_id: '
                      'label = category id, 90 classes, as google/automl writes COCO (ids '
                      '1..90), so its COCO checkpoints keep their class head.')
    flags.DEFINE_integer('tile_size', 0, 'Cut each image into overlapping square tiles of this '
                         'many pixels (0: whole images); docs/data.md#tiles.', lower_bound=0)
    flags.DEFINE_integer('tile_overlap', 64, 'Pixels adjacent tiles share.', lower_bound=0)
    flags.DEFINE_float('tile_min_visible', 0.5, 'A clipped box is kept in a tile when at least '
                       'this fraction of its area is inside (and both sides >= 2 px).')
    flags.DEFINE_bool('verbose', False, 'Tracebacks with error messages.')
    flags.mark_flags_as_required(['image_dir', 'object_annotations_file', 'output_file_prefix'])


@dataclasses.dataclass
class OutputPaths:
    """Final and temporary file names for one conversion."""
    prefix: str
    shards: list
    temp_shards: list

    @classmethod
    def create(cls, prefix: str, num_shards: int) -> 'OutputPaths':
        shards = [f'{prefix}-{index:05d}-of-{num_shards:05d}.tfrecord'
                  for index in range(num_shards)]
        temp_shards = [os.path.join(os.path.dirname(path), f'.{os.path.basename(path)}'
                                    f'.tmp-{os.getpid()}') for path in shards]
        return cls(prefix, shards, temp_shards)

    @property
    def label_map(self) -> str:
        return self.prefix + label_map_lib.LABEL_MAP_SUFFIX

    @property
    def summary(self) -> str:
        return self.prefix + '-summary.json'

    def existing_shards(self) -> list:
        """Final-named shards of this prefix on disk, of any shard count."""
        directory = os.path.dirname(self.prefix) or '.'
        pattern = re.compile(re.escape(os.path.basename(self.prefix)) +
                             r'-\d{5}-of-\d{5}\.tfrecord$')
        return sorted(os.path.join(directory, name) for name in os.listdir(directory)
                      if pattern.match(name))


class ProgressBar:
    """'[##....] images 1200/118287  250.3 img/s  ETA 0:07:45' on stderr, <= 4 updates/s."""

    def __init__(self, total: int, stream=sys.stderr, enabled: bool = True):
        self._total, self._stream, self._enabled = total, stream, enabled
        self._start = self._last = time.monotonic()
        self._is_tty = enabled and hasattr(stream, 'isatty') and stream.isatty()

    def update(self, done: int, final: bool = False) -> None:
        now = time.monotonic()
        # A terminal gets a live line; a log file a line every 10 s.
        interval = 0.25 if self._is_tty else 10.0
        if not self._enabled or (not final and now - self._last < interval):
            return
        self._last = now
        elapsed = max(now - self._start, 1e-6)
        rate = done / elapsed
        if rate > 0:
            eta = (self._total - done) / rate
            eta_text = f'{int(eta // 3600)}:{int(eta % 3600 // 60):02d}:{int(eta % 60):02d}'
        else:
            eta_text = '?'
        width = 30
        filled = int(width * done / max(self._total, 1))
        line = (f'[{"#" * filled}{"." * (width - filled)}] images {done}/{self._total}  '
                f'{rate:.1f} img/s  ETA {eta_text}')
        end = '\n' if final or not self._is_tty else ''
        self._stream.write(('\r' if self._is_tty else '') + line + end)
        self._stream.flush()


def write_shard(job) -> int:
    """Encodes the images of one shard into its temporary file; returns the image count."""
    temp_path, records, json_path = job
    with tf.io.TFRecordWriter(temp_path) as writer:
        for record in records:
            if record.tile is None:
                jpeg = encode_jpeg(record.path, record.width, record.height, json_path)
            else:  # The photo's own size is checked; the tile is cut from it.
                photo_height, photo_width = record.photo_size
                jpeg = encode_jpeg(record.path, photo_width, photo_height, json_path,
                                   window=record.tile)
            example = tfrecord_format.build_example(
                jpeg, record.height, record.width, record.image_id, record.file_name,
                record.boxes, record.labels, record.names, record.is_crowd, record.areas,
                tile_origin=record.tile[:2] if record.tile else None,
                tile_source_id=record.source_id)
            writer.write(example.SerializeToString())
            worker_pool.tick()
    return len(records)


def _run_jobs(jobs: list, num_processes: int, progress: ProgressBar) -> None:
    """Runs write_shard over jobs on worker processes the code owns (core/worker_pool.py): the
    first worker error stops the others and is raised here within seconds."""
    for _ in worker_pool.run_unordered(write_shard, jobs, num_processes,
                                       on_progress=progress.update, name='converter worker'):
        pass


def _remove_quietly(paths) -> None:
    for path in paths:
        try:
            os.remove(path)
        except FileNotFoundError:
            pass


def _publish(paths: OutputPaths, categories: list, summary: dict, label_layout: str) -> None:
    """Renames complete temp shards to their final names, then drops stale shards."""
    for temp_path, final_path in zip(paths.temp_shards, paths.shards):
        atomic_file.commit(temp_path, final_path)
    _remove_quietly(set(paths.existing_shards()) - set(paths.shards))
    label_map_lib.write_label_map(paths.label_map, categories, label_layout)
    atomic_file.write_json_atomically(paths.summary, summary, indent=2)


def _select_records(records: list, skip_empty: bool) -> list:
    return [record for record in records if record.boxes or not skip_empty]


class _LabelIsCategoryId(dict):
    """category_id -> label of the category_id layout: the id itself."""

    def __missing__(self, category_id):
        return category_id


def _label_map(categories: list, label_layout: str):
    try:
        return label_map_lib.LabelMap.from_categories(categories, label_layout)
    except label_map_lib.LabelMapError as error:
        raise ConversionError(f'--label_layout={label_layout}: {error}') from None


def make_summary(records: list, all_records: list, categories: list, stats, paths,
                 label_layout: str = 'contiguous') -> dict:
    """Counts for `<prefix>-summary.json`: images, boxes, negatives, per class, skipped."""
    label_map = _label_map(categories, label_layout)
    per_class = {label: [0, 0] for label in sorted(label_map.label_to_category_id)}
    for record in records:
        for label, is_crowd in zip(record.labels, record.is_crowd):
            per_class[label][is_crowd] += 1
    return {
        'images_written': len(records),
        'boxes_written': sum(len(record.boxes) for record in records),
        'negative_images': sum(1 for record in records if not record.boxes),
        'skipped_empty_images': len(all_records) - len(records),
        'crowd_boxes': sum(sum(record.is_crowd) for record in records),
        'clipped_boxes': stats.clipped,
        'skipped_boxes': dict(stats.skipped),
        'per_class': [{'label': label, 'category_id': label_map.label_to_category_id[label],
                       'name': label_map.label_to_name[label], 'boxes': counts[0],
                       'crowd_boxes': counts[1]} for label, counts in per_class.items()],
        'label_layout': label_layout,
        'num_classes': label_map.num_classes,
        'num_shards': len(paths.shards),
        'shard_pattern': f'{paths.prefix}-?????-of-{len(paths.shards):05d}.tfrecord',
        'shards': paths.shards,
        'label_map': paths.label_map,
    }


def format_summary(summary: dict, seconds: float) -> str:
    """The human-readable block printed at the end of a conversion."""
    skipped = ', '.join(f'{reason} {count}' for reason, count in summary['skipped_boxes'].items())
    lines = [
        f'Wrote {summary["num_shards"]} shards {summary["shard_pattern"]} in {seconds:.1f} s',
        f'  images written : {summary["images_written"]} '
        f'(negatives without boxes: {summary["negative_images"]}, '
        f'skipped as empty: {summary["skipped_empty_images"]})',
        f'  boxes written  : {summary["boxes_written"]} (crowd: {summary["crowd_boxes"]}, '
        f'clipped to the image: {summary["clipped_boxes"]})',
        f'  boxes skipped  : {skipped}',
        f'  label map      : {summary["label_map"]}' + (
            f' (label = category id, {summary["num_classes"]} classes)'
            if summary.get('label_layout') == 'category_id' else ''),
        f'  {"label":>5}  {"category_id":>11}  {"name":<20} {"boxes":>8} {"crowd":>7}',
    ]
    for row in summary['per_class']:
        lines.append(f'  {row["label"]:>5}  {row["category_id"]:>11}  {row["name"]:<20} '
                     f'{row["boxes"]:>8} {row["crowd_boxes"]:>7}')
    if 'tiles' in summary:
        tiles = summary['tiles']
        lines.append(f'  tiles          : {tiles["tiles"]} of {tiles["photos"]} photos '
                     f'({tiles["tile_size"]} px, overlap {tiles["overlap"]}); boxes in no tile: '
                     f'{tiles["boxes_in_no_tile"]}; COCO JSON of the tiles: {tiles["coco_json"]}')
    return '\n'.join(lines)


def convert(image_dir: str, object_annotations_file: str, output_file_prefix: str,
            num_shards: int = 32, num_threads: int = 1, include_crowd: bool = True,
            skip_empty: bool = False, show_progress: bool = True,
            label_layout: str = 'contiguous', tile_size: int = 0, tile_overlap: int = 64,
            tile_min_visible: float = 0.5) -> dict:
    """Validates the dataset, writes shards + label map + summary; returns the summary dict.

    Raises:
        ConversionError: any problem with the input; nothing final-named is written then.
    """
    start = time.monotonic()
    if not os.path.basename(output_file_prefix):
        raise ConversionError(f'--output_file_prefix={output_file_prefix} names a directory; '
                              f'give a file name prefix such as {output_file_prefix}train.')
    # Absolute, so stale-shard matching compares like with like.
    output_file_prefix = os.path.abspath(output_file_prefix)
    if not os.path.isdir(image_dir):
        raise ConversionError(f'--image_dir={image_dir} is not a directory.')
    all_records, categories, stats = read_dataset(
        object_annotations_file, image_dir, include_crowd=include_crowd,
        category_id_to_label=_LabelIsCategoryId() if label_layout == 'category_id' else None)
    _label_map(categories, label_layout)  # Ids outside the layout: an error before any work.
    tiles = None
    if tile_size:
        all_records, tiles = tiled_dataset.tile_records(all_records, tile_size, tile_overlap,
                                                        tile_min_visible)
    records = _select_records(all_records, skip_empty)
    if not records:
        raise ConversionError(f'{object_annotations_file}: no images to write '
                              f'({len(all_records)} listed, --skip_empty={skip_empty}).')
    os.makedirs(os.path.dirname(output_file_prefix), exist_ok=True)
    paths = OutputPaths.create(output_file_prefix, min(num_shards, len(records)))
    num_shards = len(paths.shards)
    # Round-robin spreads big and small images (and classes) evenly over the shards.
    jobs = [(temp_path, records[index::num_shards], object_annotations_file)
            for index, temp_path in enumerate(paths.temp_shards)]
    progress = ProgressBar(len(records), enabled=show_progress)
    try:
        _run_jobs(jobs, min(num_threads, num_shards), progress)
        progress.update(len(records), final=True)
        summary = make_summary(records, all_records, categories, stats, paths, label_layout)
        if tiles is not None:
            tiles_json = paths.prefix + tiled_dataset.TILES_JSON_SUFFIX
            summary['tiles'] = dict(tiles, coco_json=tiles_json)
            atomic_file.write_json_atomically(tiles_json, tiled_dataset.coco_json(
                records, categories, _label_map(categories, label_layout)))
        _publish(paths, categories, summary, label_layout)
    finally:
        _remove_quietly(paths.temp_shards)  # No-op after a successful rename.
    summary['seconds'] = time.monotonic() - start
    return summary


def main(argv) -> None:
    if len(argv) > 1:
        raise app.UsageError(f'unexpected arguments: {argv[1:]}')
    try:
        summary = convert(FLAGS.image_dir, FLAGS.object_annotations_file,
                          FLAGS.output_file_prefix, FLAGS.num_shards, FLAGS.num_threads,
                          FLAGS.include_crowd, FLAGS.skip_empty,
                          show_progress=True, label_layout=FLAGS.label_layout,
                          tile_size=FLAGS.tile_size, tile_overlap=FLAGS.tile_overlap,
                          tile_min_visible=FLAGS.tile_min_visible)
    except (ConversionError, worker_pool.WorkerFailure) as error:
        sys.exit(errors.fail('create_coco_tfrecord', error, FLAGS.verbose))
    except Exception as error:  # pylint: disable=broad-except
        message = errors.disk_full_message(
            error, os.path.dirname(os.path.abspath(FLAGS.output_file_prefix)),
            fix='free space there or pass another --output_file_prefix, then rerun (unfinished '
                'shards were removed)')
        if message is None:
            raise  # A bug: keep the traceback.
        sys.exit(errors.fail('create_coco_tfrecord', message, FLAGS.verbose))
    print(format_summary(summary, summary.pop('seconds')))


def entry_point():
    """Parses the command line and runs the command (the module's `main`)."""
    define_flags()
    command_help.install(__name__)
    app.run(main, flags_parser=errors.parse_flags)


if __name__ == '__main__':
    entry_point()
