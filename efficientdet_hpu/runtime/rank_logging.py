"""Log lines a person reads: tagged '[rank r/size]' on non-main ranks, short unless --verbose."""
import logging as _py_logging
import sys

import tensorflow.compat.v1 as tf
from absl import logging

from efficientdet_hpu.runtime import ranks

rank_log_prefix = ranks.launcher_rank_prefix


class _RankTagFilter(_py_logging.Filter):
    """Prefixes each record's message with rank_log_prefix() (evaluated per record)."""

    def filter(self, record):
        prefix = rank_log_prefix()
        if prefix and not record.getMessage().startswith(prefix):  # select_device tags its own
            record.msg = prefix + str(record.msg)
        return True


class _ShortFormatter(_py_logging.Formatter):
    """'09:26:13 message', with the level named above INFO: the line a person reads. absl's
    own prefix (level, date, thread id, file:line) comes back with --verbose."""

    def format(self, record):
        level = '' if record.levelno <= _py_logging.INFO else record.levelname + ' '
        return '%s %s%s' % (self.formatTime(record, '%H:%M:%S'), level, record.getMessage())


def configure_logging(log_dir: str | None = None, program_name: str = 'efficientdet',
                      verbose: bool = True) -> None:
    """Tags non-main ranks' log lines with '[rank r/size]' and keeps their logging on stderr.

    Installs absl's handler on the root logger (as absl.app.run does). The main rank keeps
    absl's normal logging and, given `log_dir`, also writes absl's log file there; other ranks
    never write log files. tf.compat.v1.logging goes through absl's handler too. Idempotent.
    Without Horovod: only the main-rank behaviour. verbose=False: short lines (time, level
    above INFO, message) instead of absl's prefix.
    """
    logging.use_absl_handler()
    handler = logging.get_absl_handler()
    tf_logger = _py_logging.getLogger('tensorflow')
    # TF gives its logger a stderr handler when imported before absl's handler is installed;
    # its records also reach absl's handler on the root logger, so every line printed twice.
    for tf_handler in list(tf_logger.handlers):
        if type(tf_handler) is _py_logging.StreamHandler:  # pylint: disable=unidiomatic-typecheck
            tf_logger.removeHandler(tf_handler)
    for target in (handler, tf_logger):
        if not any(isinstance(f, _RankTagFilter) for f in target.filters):
            target.addFilter(_RankTagFilter())
    if not verbose:
        handler.python_handler.setFormatter(_ShortFormatter())
    if ranks.is_main():
        if log_dir:
            tf.io.gfile.makedirs(log_dir)
            handler.use_absl_log_file(program_name, log_dir)
    else:
        handler.python_handler.stream = sys.stderr
