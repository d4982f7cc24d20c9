"""The output every benchmark shares: a plain-text table, one `BENCHMARK {json}` line that
scripts (and the suite) parse, markdown tables for the reports, and the user-error class."""
import json
import os
import subprocess
import time

from efficientdet_hpu.core import compat
from efficientdet_hpu.core import processes
from efficientdet_hpu.core.errors import UserError

RESULT_PREFIX = 'BENCHMARK '
# The repository root: benchmark subprocesses (bench.py, main.py) run from here, as a user
# types them (the benchmarks run from a checkout).
REPO = compat.PACKAGE_PARENT
# The deadline of one benchmark command (a few hundred steps of a full-size model on a CPU
# take minutes; past this it is stuck, and is stopped with its whole process group).
STEP_SECONDS = 3 * 3600


class BenchError(UserError, ValueError):
    """A user mistake in the benchmark flags; the message names the fix."""


def run_step(command, env=None, what=None):
    """Runs one benchmark command (a list) from the repository root under STEP_SECONDS, its
    line `$ command` printed first; returns (wall seconds, its output). A command that fails
    or does not end: BenchError naming it (`what`, default the command) and its last output."""
    text = ' '.join(command)
    print('$ ' + text, flush=True)
    start = time.monotonic()
    try:
        result = processes.run(command, STEP_SECONDS, cwd=REPO, env=env)
    except subprocess.TimeoutExpired:
        raise BenchError('%s did not end in %d s and was stopped: %s' % (
            what or '`%s`' % text, STEP_SECONDS, text)) from None
    if result.returncode != 0:
        raise BenchError('%s failed (exit %d): %s\n%s' % (
            what or '`%s`' % text, result.returncode, text, result.stdout[-3000:]))
    return time.monotonic() - start, result.stdout


def cpu_description(cpuinfo='/proc/cpuinfo'):
    """'AMD EPYC 7B13, 2 logical cores, AVX2, AVX-512 (VNNI, BF16)': the CPU's model and the
    vector extensions TensorFlow's CPU kernels use (oneDNN is on by default only with
    AVX512-VNNI/BF16 or AMX), from /proc/cpuinfo's first processor."""
    model, flags = 'unknown CPU', set()
    try:
        with open(cpuinfo) as f:
            for line in f:
                key, _, value = line.partition(':')
                if key.strip() == 'model name' and model == 'unknown CPU':
                    model = value.strip()
                elif key.strip() == 'flags' and not flags:
                    flags = set(value.split())
    except OSError:
        pass
    parts = [model, '%d logical cores' % os.cpu_count(), 'AVX2' if 'avx2' in flags else 'no AVX2']
    if 'avx512f' in flags:
        extras = [name for flag, name in (('avx512_vnni', 'VNNI'), ('avx512_bf16', 'BF16'))
                  if flag in flags]
        parts.append('AVX-512' + (' (%s)' % ', '.join(extras) if extras else ''))
    else:
        parts.append('no AVX-512')
    if 'amx_bf16' in flags:
        parts.append('AMX')
    return ', '.join(parts)


def parse_batch_sizes(text, default):
    try:
        sizes = [int(v) for v in (text or default).split(',') if v.strip()]
    except ValueError:
        sizes = []
    if not sizes or min(sizes) < 1:
        raise BenchError('--batch_sizes=%s must be positive integers, e.g. 1,2,4,8' % text)
    return sizes


def format_table(rows, columns):
    """Plain-text table; columns are (header, key, format)."""
    cells = [[header for header, _, _ in columns]]
    for row in rows:
        cells.append([fmt % row[key] if row.get(key) is not None else '-'
                      for _, key, fmt in columns])
    widths = [max(len(line[i]) for line in cells) for i in range(len(columns))]
    lines = ['  '.join(cell.rjust(width) for cell, width in zip(line, widths)) for line in cells]
    lines.insert(1, '  '.join('-' * width for width in widths))
    return '\n'.join(lines)


def markdown_table(header, rows, text_columns=0):
    """A markdown table of str()-ed cells; the first text_columns columns are left-aligned,
    the rest right-aligned."""
    lines = ['| ' + ' | '.join(header) + ' |',
             '|' + '|'.join(':---' if i < text_columns else '---:'
                            for i in range(len(header))) + '|']
    return '\n'.join(lines + ['| ' + ' | '.join(str(c) for c in row) + ' |' for row in rows])


def emit(result, rows, columns):
    print(format_table(rows, columns))
    print(RESULT_PREFIX + json.dumps(result, sort_keys=True), flush=True)


def parse_result_lines(output):
    """The JSON objects of every `BENCHMARK {json}` line in a process's output. Text around
    the object (mpirun --tag-output's '[1,0]<stdout>:' tags) is ignored."""
    decoder, results = json.JSONDecoder(), []
    for line in output.splitlines():
        position = line.find(RESULT_PREFIX + '{')
        if position >= 0:
            result, _ = decoder.raw_decode(line, position + len(RESULT_PREFIX))
            results.append(result)
    return results
