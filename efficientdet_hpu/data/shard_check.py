"""Checks every record of a set of TFRecord shards on all cores, for dataset/verify_tfrecords.py.

Two passes. First each shard's framing is walked (data/tfrecord_framing.py: record offsets,
truncation, corrupt headers; milliseconds a shard). Then the intact records are cut into
chunks of consecutive records, so the cores share the work also when there are fewer shards
than cores, and each chunk is read with TF's CRC-checking reader and every record is checked
as the input pipeline will read it (data/record_check.py).
"""
import dataclasses
import math
from typing import Callable, Iterable, List, Optional

import tensorflow as tf

from efficientdet_hpu.core import worker_pool
from efficientdet_hpu.data import record_check
from efficientdet_hpu.data import tfrecord_framing as framing

MAX_CHUNK_RECORDS = 128  # About 0.4 s of a core on COCO-sized JPEGs: smooth progress.
CHUNKS_PER_WORKER = 8  # Small sets still spread over all workers.
MIN_RECORDS_PER_WORKER = 1000  # About as long to check as a worker takes to start.
CRC_MESSAGE = 'data CRC mismatch (the bytes changed after the shard was written)'


@dataclasses.dataclass
class BadRecord:
    """One unreadable or invalid record. kind: 'framing', 'crc' or 'content'."""
    index: int
    offset: int
    source_id: str
    filename: str
    error: str
    kind: str


@dataclasses.dataclass
class ShardReport:
    """What was found in one shard. records: records framed intact (all were checked)."""
    path: str
    size: int = 0
    records: int = 0
    images_ok: int = 0
    bad: List[BadRecord] = dataclasses.field(default_factory=list)
    unreadable_bytes: int = 0  # After a framing fault, to the end of the file.

    @property
    def ok(self) -> bool:
        return not self.bad


@dataclasses.dataclass(frozen=True)
class ChunkJob:
    path: str
    first_index: int
    offsets: tuple
    labels: record_check.LabelSpace
    box_tolerance: float


@dataclasses.dataclass
class ChunkResult:
    path: str
    checked: int
    images_ok: int
    bad: List[BadRecord]


def scan_shard(path: str):
    """framing.ShardLayout of `path`, or a ShardReport naming why it cannot be read."""
    try:
        return framing.scan_framing(path)
    except (OSError, tf.errors.OpError) as error:
        message = getattr(error, 'message', None) or str(error)
        return ShardReport(path, bad=[BadRecord(0, 0, '', '', f'cannot read the file: {message}',
                                                'framing')])


def report_from_layout(layout: framing.ShardLayout) -> ShardReport:
    """A ShardReport holding the layout's framing fault, before any record is checked."""
    report = ShardReport(layout.path, size=layout.size, records=len(layout.offsets))
    fault = layout.fault
    if fault is not None:
        report.bad.append(BadRecord(fault.record_index, fault.offset, '', '', fault.message,
                                    'framing'))
        report.unreadable_bytes = layout.size - fault.offset
    return report


def make_chunks(layouts: List[framing.ShardLayout], labels: record_check.LabelSpace,
                box_tolerance: float, num_workers: int) -> List[ChunkJob]:
    """Consecutive-record chunks of every shard, about CHUNKS_PER_WORKER per worker."""
    total = sum(len(layout.offsets) for layout in layouts)
    size = max(1, min(MAX_CHUNK_RECORDS, math.ceil(total / (num_workers * CHUNKS_PER_WORKER))))
    return [ChunkJob(layout.path, start, tuple(layout.offsets[start:start + size]), labels,
                     box_tolerance)
            for layout in layouts for start in range(0, len(layout.offsets), size)]


def check_chunk(job: ChunkJob) -> ChunkResult:
    """Reads (data CRC checked) and checks each record of one chunk."""
    result = ChunkResult(job.path, 0, 0, [])
    reader = framing.RecordReader(job.path)
    try:
        for index, offset in enumerate(job.offsets, start=job.first_index):
            result.checked += 1
            try:
                serialized = reader.read(offset)
            except framing.RecordCorruptError:  # TF's message names the data's offset.
                result.bad.append(BadRecord(index, offset, '', '', CRC_MESSAGE, 'crc'))
                continue
            verdict = record_check.check_record(serialized, job.labels, job.box_tolerance)
            result.images_ok += verdict.image_ok
            if verdict.errors:
                result.bad.append(BadRecord(index, offset, verdict.source_id, verdict.filename,
                                            '; '.join(verdict.errors), 'content'))
    finally:
        reader.close()
    return result


def _init_worker() -> None:
    # The workers are the parallelism: TF's own thread pools would only contend with them.
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)


def _merge(reports: dict, results: Iterable[ChunkResult], on_progress) -> None:
    done = 0
    for result in results:
        report = reports[result.path]
        report.images_ok += result.images_ok
        report.bad.extend(result.bad)
        done += result.checked
        on_progress(done)


def _run_chunks(jobs: List[ChunkJob], num_workers: int) -> Iterable[ChunkResult]:
    """check_chunk over jobs, in this process or on num_workers worker processes the code
    owns (core/worker_pool.py); any order."""
    initializer = _init_worker if num_workers > 1 else None
    yield from worker_pool.run_unordered(check_chunk, jobs, num_workers, initializer=initializer,
                                         name='record checker')


def verify_shards(paths: List[str], labels: record_check.LabelSpace, box_tolerance: float,
                  num_workers: int, on_start: Optional[Callable] = None,
                  on_progress: Optional[Callable[[int], None]] = None,
                  min_records_per_worker: int = MIN_RECORDS_PER_WORKER) -> List[ShardReport]:
    """Checks every record of the TFRecord files `paths` on up to `num_workers` processes.

    A worker takes seconds to start (it imports TensorFlow): each one gets at least
    `min_records_per_worker` records, so a small set is checked in this process.
    on_start(layouts, workers) is called after the framing pass (for the totals),
    on_progress(records checked so far) while records are checked.
    Returns one ShardReport per path, in order. With more than one worker the workers are
    spawned, so a calling script needs the `if __name__ == '__main__':` guard.
    """
    scanned = [scan_shard(path) for path in paths]
    layouts = [item for item in scanned if isinstance(item, framing.ShardLayout)]
    reports = {item.path: (report_from_layout(item)
                           if isinstance(item, framing.ShardLayout) else item)
               for item in scanned}
    total = sum(len(layout.offsets) for layout in layouts)
    workers = max(1, min(num_workers, total // max(min_records_per_worker, 1)))
    if on_start is not None:
        on_start(layouts, workers)
    jobs = make_chunks(layouts, labels, box_tolerance, workers)
    _merge(reports, _run_chunks(jobs, workers), on_progress or (lambda done: None))
    for report in reports.values():
        report.bad.sort(key=lambda bad: bad.index)
    return [reports[path] for path in paths]
