"""The one way this project writes a file that other processes or a later run read: the file
is either complete at its final name or absent, never half-written.

Used for run files (config.yaml, flags.json, label maps, metrics, predictions, plots, HCL
configs) and, through `commit`, for the converter's streamed shards. Ranks on other boxes may
read these over a shared file system while an earlier copy is replaced: a rename is atomic
there, an in-place rewrite is not. The data is fsynced before the rename so that a power cut
cannot leave a complete-looking name over empty blocks.
"""
import contextlib
import json
import os
import tempfile


def temporary_path_for(path, suffix=''):
    """A new, hidden, empty file beside `path` (same file system, so the rename is atomic)."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    handle, temporary = tempfile.mkstemp(
        prefix='.%s.tmp-' % os.path.basename(path), suffix=suffix, dir=directory)
    os.close(handle)
    return temporary


def commit(temporary, path):
    """fsyncs the finished `temporary` and renames it over `path`."""
    with open(temporary, 'rb') as stream:
        os.fsync(stream.fileno())
    os.chmod(temporary, 0o644)
    os.replace(temporary, path)
    try:
        directory = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(directory)
    except OSError:
        pass  # Some file systems refuse fsync on a directory; the rename itself is done.
    finally:
        os.close(directory)


def discard(temporary):
    try:
        os.remove(temporary)
    except FileNotFoundError:
        pass


@contextlib.contextmanager
def replacing(path, suffix=''):
    """Yields a temporary path to write; on a clean exit it replaces `path`, on an error
    (disk full included) it is removed and `path` keeps its previous content.

    suffix: for writers that pick the format from the name (matplotlib's savefig)."""
    temporary = temporary_path_for(path, suffix)
    try:
        yield temporary
        commit(temporary, path)
    except BaseException:
        discard(temporary)
        raise


def write_text_atomically(path, text):
    with replacing(path) as temporary:
        with open(temporary, 'w', encoding='utf-8') as stream:
            stream.write(text)


def write_json_atomically(path, obj, indent=1, **dump_options):
    """JSON of `obj` (one trailing newline) written atomically; dump_options go to json.dumps
    (e.g. allow_nan=False, sort_keys=True)."""
    write_text_atomically(path, json.dumps(obj, indent=indent, **dump_options) + '\n')
