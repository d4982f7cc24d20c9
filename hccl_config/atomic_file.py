"""Writing small launch files (HCL config, hostfile) so no reader sees a partial file."""

import os
import tempfile


def write_text_atomically(path, text):
    """Writes `text` to `path` via a temporary file in the same directory and a rename.

    Ranks on other boxes may read the file over a shared file system while a previous launch's
    copy is being replaced; a rename is atomic there, an in-place rewrite is not.
    """
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    handle, temporary = tempfile.mkstemp(prefix=".tmp-", dir=directory)
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as stream:
            stream.write(text)
            stream.flush()
            os.fsync(stream.fileno())
        os.chmod(temporary, 0o644)
        os.replace(temporary, path)
    except BaseException:
        if os.path.exists(temporary):
            os.unlink(temporary)
        raise
