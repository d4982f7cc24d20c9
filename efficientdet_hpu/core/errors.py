"""One error policy for every command (main.py, the launcher, inference.py, bench.py, the
dataset tools): a user or data error prints one line, `PROGRAM: error: MESSAGE`, where the
message names the input and the fix, and exits with status 2, without a traceback. `--verbose`
adds the traceback. Anything else is a bug and keeps Python's traceback.

Errors that are the user's to fix derive from UserError. A full disk is one too: it is turned
into one line naming the path, the free space and the space needed (`disk_full_message`).
Importing this module loads nothing heavy (the launcher imports it without TensorFlow).
"""
import difflib
import errno
import os
import re
import shutil
import sys
import traceback

EXIT_USER_ERROR = 2
_VERBOSE_SPELLINGS = ('--verbose', '--verbose=true', '--verbose=True', '--verbose=1')
_NO_SPACE = re.compile(r'No space left on device|Disk quota exceeded|ENOSPC', re.IGNORECASE)
_PATH_IN_TEXT = re.compile(r"(/[^\s:;,'\"\]\)]+)")


class UserError(Exception):
    """Base of the errors that are the user's to fix: flags, data, paths, devices."""


class InferenceError(UserError, ValueError):
    """A user mistake in prediction or export (missing model_dir files, bad paths or inputs);
    the message names the fix (serving/model_spec.py raises it; defined here, without
    TensorFlow, so that `except efficientdet_hpu.InferenceError` loads nothing)."""


def verbose_requested(argv=None):
    """--verbose on the command line; read before flags are parsed (TensorFlow's log level
    must be chosen before TensorFlow is imported)."""
    return any(arg in _VERBOSE_SPELLINGS for arg in (sys.argv[1:] if argv is None else argv))


def fail(program, message, verbose=False):
    """Prints the one error line (and with verbose the current traceback); returns 2."""
    sys.stdout.flush()
    print('%s: error: %s' % (program, message), file=sys.stderr, flush=True)
    if verbose:
        traceback.print_exc()
    return EXIT_USER_ERROR


def parse_flags(argv):
    """absl's parser for `app.run(main, flags_parser=errors.parse_flags)`: a flag error (a
    typo, a bad value) is the one error line, with absl's suggestion ('Did you mean: model_dir
    ?'), exit status 2. The help asked for (--help, --helpshort, --helpfull, --helpxml), which
    absl prints and ends with exit status 1, ends with 0, as the launcher's and GNU's --help."""
    from absl import flags  # pylint: disable=import-outside-toplevel
    try:
        return flags.FLAGS(argv)
    except flags.Error as error:
        sys.exit(fail(os.path.basename(argv[0]), '%s (see --helpshort)' % error))
    except SystemExit as stop:  # Parsing exits only for help: errors are flags.Error.
        if stop.code == 1:
            sys.exit(0)
        raise


def check_command(argv, commands):
    """For `PROGRAM COMMAND --flags`: a COMMAND not among `commands` (a typo, a name from
    another tool) is the one error line, with the closest command and the list, exit status
    2. No command, or more than one, is left to the caller's usage text."""
    if len(argv) == 2 and argv[1] not in commands:
        close = difflib.get_close_matches(argv[1], list(commands), n=1)
        sys.exit(fail(os.path.basename(argv[0]), 'no command %r%s; the commands are %s' % (
            argv[1], ' (did you mean %s?)' % close[0] if close else '', ', '.join(commands))))


def is_disk_full(error):
    """True for an OSError ENOSPC/EDQUOT or a TensorFlow error saying the same."""
    if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    return bool(_NO_SPACE.search(str(getattr(error, 'message', '') or error)))


def _megabytes(num_bytes):
    return '%.0f MB' % (num_bytes / 2.0 ** 20) if num_bytes >= 2 ** 20 else '%d bytes' % num_bytes


def _existing_directory(path):
    path = os.path.abspath(path)
    while path and not os.path.isdir(path):
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    return path or '/'


def _path_in_message(error, default_path):
    """A file named in `error`'s text under `default_path` (TensorFlow's messages also hold
    op names such as /SaveV2), else default_path itself."""
    root = os.path.abspath(default_path)
    for found in _PATH_IN_TEXT.findall(str(getattr(error, 'message', '') or error)):
        if os.path.abspath(found).startswith(root + os.sep):
            return found
    return default_path


def disk_full_message(error, default_path, needed_bytes=None, fix=None):
    """One line for an out-of-space `error` while writing under `default_path`, or None when
    `error` is something else. needed_bytes: what the write needs (e.g. the size of the last
    checkpoint), said when known; fix: the advice (default: free space or write elsewhere)."""
    if not is_disk_full(error):
        return None
    path = getattr(error, 'filename', None) or _path_in_message(error, default_path)
    free = shutil.disk_usage(_existing_directory(path)).free
    need = ', about %s needed' % _megabytes(needed_bytes) if needed_bytes else ''
    return ('no space left on the device writing %s (%s free%s); %s'
            % (path, _megabytes(free), need,
               fix or 'free some space there or write to another directory'))
