"""How far a long loop has got, as training's step log shows it: the count done (of the total
when known), the rate and the time left.

`Meter` is the arithmetic, shared by training's step lines (engine/hooks.TrainLogHook) and
`Progress`: a rate measured from a mark, and the ETA at that rate.

`Progress` is what an evaluation or a prediction over a folder shows while it runs:

    evaluating model.ckpt-5000: 2250/5000 images (45%), 12.31 images/s, ETA 0:03:43

On a terminal it is one line rewritten in place (at most every REDRAW_SECONDS); anywhere
else (a log file, the fine-tune's runner reading a pipe, mpirun) it is whole lines: one when
another tenth is done (with a rate, at least MIN_LINE_SECONDS after the last line) or
LINE_SECONDS have passed without one, so a log gets a heartbeat and never a flood. The last
line, with the time taken, comes when the count reaches the total (or at close without one).

tqdm draws the terminal form but writes the same carriage-return updates into a file (it
offers only disabling there), and training's progress is log lines already: one small
implementation serves both forms and shares its arithmetic with training.

The rate counts from the first update on: the first batch carries the graph's warm-up and
the checkpoint's restore, as training's first step does, which its log leaves out too.
"""
import logging
import os
import shutil
import sys
import time

REDRAW_SECONDS = 0.5
LINE_SECONDS = 30.0
MIN_LINE_SECONDS = 5.0
_ERASE_TO_END = '\x1b[K'  # ANSI: erase from the cursor to the end of the line.


def format_seconds(seconds):
    """'H:MM:SS' of a duration in seconds (at least 0)."""
    seconds = max(0, int(seconds))
    return '%d:%02d:%02d' % (seconds // 3600, seconds % 3600 // 60, seconds % 60)


class Meter:
    """The rate of a count (steps, images) since a mark, and the time left to `total` at it."""

    def __init__(self, total=None):
        self.total = total
        self.marked_count = self.marked_time = None

    def mark(self, count, now):
        """Measures from `count` reached at `now` (seconds) on."""
        self.marked_count, self.marked_time = count, now

    def rate(self, count, now):
        """Per second since the mark (None before one)."""
        if self.marked_time is None:
            return None
        return (count - self.marked_count) / max(now - self.marked_time, 1e-9)

    def eta(self, count, now):
        """Seconds left to `total` at rate(count, now) (None without a total or a mark)."""
        rate = self.rate(count, now)
        if self.total is None or rate is None:
            return None
        return max(0, self.total - count) / max(rate, 1e-9)


def is_terminal(stream):
    """True when `stream` is a terminal that can rewrite a line."""
    try:
        return stream.isatty() and os.environ.get('TERM') != 'dumb'
    except (AttributeError, ValueError):  # No isatty, or a closed file.
        return False


class _ClearBeforeLogging(logging.Filter):
    """On a logging handler while a progress line is drawn: erases that line before a log
    record is written over it (the next update draws it again below the record)."""

    def __init__(self, progress):
        super().__init__()
        self._progress = progress

    def filter(self, record):
        self._progress.clear()
        return True


class Progress:
    """Counts done of a loop, shown as the module docstring says.

    what: the line's start ('evaluating model.ckpt-5000'); total: the count expected, or None;
    unit: what is counted ('images'); note: said beside the count ("rank 0's share of 5000");
    stream: where it is drawn (default sys.stderr); terminal: the form (None: whether stream
    is a terminal); log: writes one plain line (default: to stream); enabled: False makes
    every call a no-op (ranks other than 0); quiet_seconds: nothing is shown before this
    time (a loop quicker than that shows nothing); clock: seconds, monotonic."""

    def __init__(self, what, total=None, unit='images', note=None, stream=None, terminal=None,
                 log=None, enabled=True, quiet_seconds=0.0, clock=time.monotonic):
        self.what, self.unit, self.note, self.enabled = what, unit, note, enabled
        self.quiet_seconds = quiet_seconds
        self.stream = stream if stream is not None else sys.stderr
        self.terminal = is_terminal(self.stream) if terminal is None else terminal
        self._log, self._clock = log, clock
        self.done, self._updated = 0, None  # _updated: the last update's time.
        self.meter = Meter(total)
        self._start = self._last_shown = clock()
        self._shown_done, self._drawn, self._filters, self._ended = 0, False, [], False
        if enabled and self.terminal:
            self._clear_on_logging()

    @property
    def total(self):
        return self.meter.total

    def __enter__(self):
        return self

    def __exit__(self, error_type, error, traceback):
        self.close(finished=error_type is None)
        return False

    def update(self, count=1):
        """Adds `count` done; shows the line when it is time to."""
        if not self.enabled:
            return
        self.done += count
        now = self._updated = self._clock()
        if self.meter.marked_time is None:
            self.meter.mark(self.done, now)
        if self.total and self.done >= self.total and not self._ended:
            self._show(now, final=True)  # When the count is complete, not at close.
            self._ended = True
        elif self._due(now):
            self._show(now)

    def _due(self, now):
        since = now - self._last_shown
        if self.terminal:
            return not self._drawn or since >= REDRAW_SECONDS
        if since >= LINE_SECONDS:  # A heartbeat, even before a rate is known.
            return True
        if not self.total or since < MIN_LINE_SECONDS or not self._measured():
            return False
        return self.done * 10 // self.total > self._shown_done * 10 // self.total

    def line(self, now=None, final=False, short=False):
        """The progress line as it stands (no newline); final: with the time taken instead
        of the ETA, and the start-up in it (to the first update, which the rate leaves out)
        when it took a second or more; short: without the note and the start-up."""
        now = self._clock() if now is None else now
        total = self.total
        notes = (['%d%%' % (100 * self.done // total)] if total else []) + (
            [self.note] if self.note and not short else [])
        text = '%s: %s' % (self.what, '%d/%d %s' % (self.done, total, self.unit) if total
                           else '%d %s' % (self.done, self.unit))
        text += ' (%s)' % '; '.join(notes) if notes else ''
        if final:
            text += ' in %s' % format_seconds(now - self._start)
            startup = self.meter.marked_time - self._start if self._measured() else 0
            if startup >= 1 and not short:
                text += ' (start-up %s)' % format_seconds(startup)
        if self._measured():  # At the end, up to the last update (not what follows the loop).
            text += ', %.2f %s/s' % (self.meter.rate(self.done, self._updated if final else now),
                                     self.unit)
            if total and not final:
                text += ', ETA %s' % format_seconds(self.meter.eta(self.done, now))
        return text

    def _measured(self):
        """Whether a rate is known: counts done after the first update's."""
        return self.meter.marked_count is not None and self.done > self.meter.marked_count

    def _show(self, now, final=False):
        if now - self._start < self.quiet_seconds:
            return
        self._last_shown, self._shown_done = now, self.done
        line = self.line(now, final)
        if self.terminal:
            width = max(shutil.get_terminal_size().columns - 1, 20)
            if len(line) > width:  # A wrapped line cannot be rewritten in place.
                line = self.line(now, final, short=True)[:width]
            self.stream.write('\r' + line + _ERASE_TO_END + ('\n' if final else ''))
            self.stream.flush()
            self._drawn = not final
        elif self._log is not None:
            self._log(line)
        else:
            self.stream.write(line + '\n')
            self.stream.flush()

    def clear(self):
        """Erases the drawn line (terminal form), e.g. before other output."""
        if self._drawn:
            self.stream.write('\r' + _ERASE_TO_END)
            self.stream.flush()
            self._drawn = False

    def write(self, text, file=None):
        """Prints `text` as a line of its own (to `file`, default the stream) where the
        progress line was; the next update draws that below it."""
        self.clear()
        print(text, file=file if file is not None else self.stream, flush=True)

    def close(self, finished=True):
        """The last line: the count and the time it took (finished), or, on an error, the
        terminal line ended where it stood so the error starts a line of its own."""
        if not self.enabled:
            return
        for handler, found in self._filters:
            handler.removeFilter(found)
        self._filters, self.enabled = [], False  # Closed once.
        if finished and not self._ended:
            self._show(self._clock(), final=True)
        elif self._drawn:
            self.stream.write('\n')
            self.stream.flush()
            self._drawn = False

    def _clear_on_logging(self):
        """Python logging's handlers (absl's among them) erase the line before a record."""
        found = _ClearBeforeLogging(self)
        for handler in logging.getLogger().handlers:
            handler.addFilter(found)
            self._filters.append((handler, found))
