"""Writing meshlab's output files: whole or not at all, and never over something that is not an output file.

Every file meshlab writes (a sweep's best plan, a profile, a plot, a model card) goes through `write_atomic`: a
temporary file beside the target, then a rename. `output_path` checks a target before any work is done for it:
its folder must exist, the target must be a regular file if it exists (not a folder or a device), and it must not
be one of the command's own inputs (``report runs.jsonl --plot runs.jsonl`` would replace the runs with a PNG).
A symbolic link is written through (the file it names is replaced, the link stays); a replaced file keeps its
permissions, a new one gets the umask's. Pure standard library.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from meshlab.core.errors import InputError, Location


def output_path(path: str | Path, inputs: Iterable[str | Path] = (), what: str = "the output") -> Path:
    """The file a write to `path` replaces (symbolic links followed), or an InputError saying why not."""
    given = Path(path)
    if not given.name or given.name in (".", ".."):
        raise InputError(f"{what} {str(path)!r} is not a file name", f"name a file for {what}")
    target = Path(os.path.realpath(given))
    if not target.parent.is_dir():
        raise InputError(f"{what} {given}: {target.parent} is not a folder", f"create {target.parent} first")
    try:
        mode = target.stat().st_mode
    except FileNotFoundError:
        mode = None
    except OSError as exc:
        raise InputError(f"{what} {given}: {exc.strerror}", f"name another file for {what}") from None
    if mode is not None and not stat.S_ISREG(mode):
        kind = "a folder" if stat.S_ISDIR(mode) else "not a regular file"
        raise InputError(f"{what} {given} is {kind}", f"name a file for {what}, e.g. {given}/out" if
                         stat.S_ISDIR(mode) else f"name a regular file for {what}")
    for source in inputs:
        if mode is not None and _same_file(target, Path(source)):
            raise InputError(f"{what} {given} is one of this command's inputs ({source}); writing it would "
                             f"replace that input", f"name a new file for {what}")
    return target


def output_folder(path: Path, what: str, where: Location | None = None) -> Path:
    """A folder outputs go into (made later where missing): refused if something other than a folder is there."""
    if path.exists() and not path.is_dir():
        raise InputError(f"{what} {path} is not a folder", f"give {what} a folder (made if missing)", where)
    return path


def cache_root() -> Path:
    """meshlab's own cache folder: $MESHLAB_CACHE, by default ~/.cache/meshlab."""
    return Path(os.environ.get("MESHLAB_CACHE", Path.home() / ".cache" / "meshlab"))


@contextmanager
def dump_folder(keep: Path | None, prefix: str) -> Iterator[Path]:
    """Where a check writes the compiler's programs: `keep` (``--dump-dir``, made where missing and kept), or a
    temporary folder removed afterwards."""
    if keep is None:
        import tempfile  # here, not at import: `meshlab try` reads strategies through this module

        with tempfile.TemporaryDirectory(prefix=prefix, ignore_cleanup_errors=True) as temporary:
            yield Path(temporary)
        return
    output_folder(keep, "--dump-dir")
    try:
        keep.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(f"cannot make --dump-dir {keep}: {exc.strerror}",
                         "give --dump-dir a folder in a writable place") from None
    yield keep.resolve()


def write_atomic(path: str | Path, text: str, inputs: Iterable[str | Path] = (),
                 what: str = "the output") -> Path:
    """Write `text` (UTF-8) to `path` whole or not at all; see `write_atomic_bytes`."""
    return write_atomic_bytes(path, text.encode("utf-8"), inputs, what)


def write_atomic_bytes(path: str | Path, data: bytes, inputs: Iterable[str | Path] = (),
                       what: str = "the output") -> Path:
    """Write `data` to `path` through a temporary file in the same folder and a rename: never half a file, and
    the old file intact if anything fails. Returns the file written (a link's target)."""
    import tempfile  # here, not at import: `meshlab try` reads strategies through this module

    target = output_path(path, inputs, what)
    try:
        mode = stat.S_IMODE(target.stat().st_mode)
    except OSError:
        mode = 0o666 & ~_umask()
    try:
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    except OSError as exc:
        raise InputError(f"cannot write {what} {path}: {exc.strerror}", "choose a path in a writable folder") \
            from None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())  # on disk before the rename, so a crash leaves the old file or the new one
        os.chmod(tmp, mode)  # mkstemp's 0600 would stick
        os.replace(tmp, target)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        raise InputError(f"cannot write {what} {path}: {exc.strerror}", "free space or choose a path in a "
                         "writable folder") from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target


def _same_file(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def is_device(path: Path) -> bool:
    """Is `path` a character or block device (/dev/zero, a terminal), which an input read would never finish?"""
    try:
        mode = path.stat().st_mode
    except OSError:
        return False
    return stat.S_ISCHR(mode) or stat.S_ISBLK(mode)


def file_stem(name: str) -> str:
    """A strategy's name as a file name: anything but letters, digits, '.', '_' and '-' becomes '_'."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", name).lstrip(".") or "strategy"
