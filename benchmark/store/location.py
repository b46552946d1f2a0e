"""Where results live: a local folder, or a URI that pyarrow.fs understands (s3://bucket/prefix,
gs://bucket/prefix, ...). Every store function takes either.

A location stays the string its user wrote (a relative path stays relative, a URI keeps its scheme
and query), so whatever the store returns can be printed and handed back. pyarrow resolves a URI
to a filesystem with the credentials and endpoint the environment gives (AWS_ENDPOINT_URL,
AWS_ACCESS_KEY_ID, ...). Local files are written by store.atomic: a rename publishes a file whole.
An object store publishes an object whole when its upload stream closes, so one stream per file is
atomic there too; a file:// URI is a local path.
"""

from __future__ import annotations

import errno
import functools
import os
import re
import shutil
import threading
import uuid
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pyarrow as pa
import pyarrow.fs as pafs

from benchmark.store.atomic import atomic_open
from benchmark.store.errors import ResultsPathError

# Two letters at least: "C://x" is a Windows drive, not a scheme.
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]+://")
# The environment a filesystem is built from: a cached one is reused only while these are unchanged.
_ENV = ("AWS_", "GOOGLE_", "GCS_", "AZURE_", "HADOOP_")
# Object stores need no folders made before a file is written (and a "folder" costs a request).
OBJECT_STORES = ("s3", "gcs", "abfs")
FULL = (errno.ENOSPC, errno.EDQUOT)  # a write failed because the disk (or the quota) is full
_LOCAL = pafs.LocalFileSystem()

Where = str | os.PathLike
# The results root a search writes to and the leaderboard reads when none is named.
RESULTS_ROOT = "results"


def is_uri(where: Where) -> bool:
    return isinstance(where, str) and bool(_SCHEME.match(where))


def local_path(where: Where) -> str | None:
    """The local path a location names (a plain path, or a file:// URI), else None."""
    if not is_uri(where):
        return os.fspath(where)
    parts = urlsplit(where)
    return unquote(parts.path) if parts.scheme == "file" else None


def resolve(where: Where) -> tuple[pafs.FileSystem, str]:
    """(filesystem, path in it). A URI's filesystem is made once per bucket and environment."""
    local = local_path(where)
    if local is not None:
        return _LOCAL, os.path.abspath(local)
    parts = urlsplit(where)
    root = f"{parts.scheme}://{parts.netloc}" + (f"?{parts.query}" if parts.query else "")
    try:
        fs, base = _filesystem(
            root, tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith(_ENV)))
        )
    except (pa.ArrowException, ValueError, OSError):
        try:  # a filesystem whose root alone is no URI it accepts: the whole URI, uncached
            return pafs.FileSystem.from_uri(where)
        except (pa.ArrowException, ValueError) as err:
            raise ResultsPathError(
                f"{where}: not a location pyarrow.fs can open ({_first(err)})"
            ) from err
    return fs, (base.rstrip("/") + unquote(parts.path)).rstrip("/")


@functools.lru_cache(maxsize=32)
def _filesystem(root: str, env: tuple) -> tuple[pafs.FileSystem, str]:
    return pafs.FileSystem.from_uri(root)


def absolute(where: Where) -> str:
    """The same location from any working directory (a worker's, a later run's): a URI as it is,
    a local path resolved."""
    return where if is_uri(where) else str(Path(where).resolve())


def join(where: Where, *parts: str) -> str:
    """`where`/part/part..., a URI's ?query kept at the end."""
    if not is_uri(where):
        return os.path.join(os.fspath(where), *parts)
    base, sep, query = where.partition("?")
    return "/".join([base.rstrip("/"), *parts]) + sep + query


def basename(where: Where) -> str:
    """The last component: a study's name."""
    if not is_uri(where):
        return Path(os.path.abspath(where)).name
    parts = urlsplit(where)
    return parts.path.rstrip("/").rpartition("/")[2] or parts.netloc


def parent(where: Where) -> str:
    """The folder holding a location: a study's results root."""
    if not is_uri(where):
        path = os.path.normpath(os.fspath(where))
        if os.path.basename(path) in (".", ".."):
            return os.path.dirname(os.path.abspath(path))
        return os.path.dirname(path) or "."
    base, sep, query = where.partition("?")
    head, _, _ = base.rstrip("/").rpartition("/")
    return (head if not head.endswith(":/") else base) + sep + query


# ---- files: the few operations the store needs, the same on a path and a URI ---------------------


def write_bytes(where: Where, data: bytes) -> None:
    """The file appears whole or not at all (store.atomic locally; one upload stream on a URI).
    An OSError says why not (errno ENOSPC or EDQUOT: the disk is full)."""
    local = local_path(where)
    if local is not None:
        with atomic_open(local, "wb") as f:
            f.write(data)
        return
    fs, path = resolve(where)
    if fs.type_name not in OBJECT_STORES:
        fs.create_dir(path.rpartition("/")[0], recursive=True)
    # One write of bytes already in memory: the stream fails at close (and publishes nothing) or
    # publishes all of them.
    with fs.open_output_stream(path) as f:
        f.write(data)


def read_bytes(where: Where) -> bytes:
    local = local_path(where)
    if local is not None:
        with open(local, "rb") as f:
            return f.read()
    fs, path = resolve(where)
    with fs.open_input_stream(path) as f:
        return f.readall()


def files(where: Where) -> list[str]:
    """Names of the plain files directly in a folder; [] when there is no such folder."""
    return _names(where, pafs.FileType.File)


def folders(where: Where) -> list[str]:
    """Names of the folders directly in a folder; [] when there is no such folder."""
    return _names(where, pafs.FileType.Directory)


def _names(where: Where, kind: pafs.FileType) -> list[str]:
    local = local_path(where)
    if local is not None:
        try:
            with os.scandir(local) as entries:
                return [
                    e.name
                    for e in entries
                    if (e.is_file() if kind == pafs.FileType.File else e.is_dir())
                ]
        except (FileNotFoundError, NotADirectoryError):
            return []
    return [i.base_name for i in _listing(where) if i.type == kind]


def _listing(where: str) -> list[pafs.FileInfo]:
    fs, path = resolve(where)
    try:
        return fs.get_file_info(pafs.FileSelector(path, allow_not_found=True))
    except NotADirectoryError:
        return []


def is_dir(where: Where) -> bool:
    local = local_path(where)
    if local is not None:
        return os.path.isdir(local)
    fs, path = resolve(where)
    return fs.get_file_info(path).type == pafs.FileType.Directory


def exists(where: Where) -> bool:
    local = local_path(where)
    if local is not None:
        return os.path.lexists(local)
    fs, path = resolve(where)
    return fs.get_file_info(path).type != pafs.FileType.NotFound


def move(src: Where, dst: Where) -> None:
    """Within one location (a rename locally; copy and delete on an object store)."""
    local = local_path(src)
    if local is not None:
        os.makedirs(os.path.dirname(os.path.abspath(local_path(dst))), exist_ok=True)
        os.replace(local, local_path(dst))
        return
    fs, path = resolve(src)
    fs.move(path, resolve(dst)[1])


def remove(where: Where) -> None:
    local = local_path(where)
    if local is not None:
        os.unlink(local)
        return
    fs, path = resolve(where)
    fs.delete_file(path)


def free_bytes(where: Where) -> int | None:
    """Free space where a local location is (or would be made); None for a URI."""
    local = local_path(where)
    if local is None:
        return None
    path = os.path.abspath(local)
    while not os.path.exists(path):
        path = os.path.dirname(path)
    return shutil.disk_usage(path).free


# ---- is the results location usable? ---------------------------------------------------------


def check_results(where: Where, timeout_s: float = 20) -> None:
    """Before any training: makes the results folder if missing, then writes and deletes a hidden
    probe file in it. ResultsPathError("<where>: <reason>") within `timeout_s` when it cannot take
    results (a file, no permission, a read-only file system, a full disk, a missing bucket, an
    endpoint that does not answer): a search learns it now, not after its first trial."""
    result: list = []
    probe = threading.Thread(target=_run, args=(result, where), daemon=True, name="results-probe")
    probe.start()
    probe.join(timeout_s)  # a daemon: a probe hung on a dead endpoint never holds the process
    if probe.is_alive():
        hint = (
            "is the endpoint reachable?"
            if local_path(where) is None
            else "a network mount that hangs?"
        )
        raise ResultsPathError(f"{where}: no answer within {timeout_s:g} s ({hint})")
    if isinstance(result[0], BaseException):
        raise result[0]
    if result[0]:
        raise ResultsPathError(f"{where}: {result[0]}")


def _run(result: list, where: Where) -> None:
    try:
        result.append(_probe(where))
    except BaseException as err:  # noqa: BLE001 - raised again by the caller, in its thread
        result.append(err)


def _probe(where: Where) -> str | Exception | None:
    """Why the location cannot take results, or None; an exception to raise as it is."""
    try:
        fs, path = resolve(where)
        if fs.get_file_info(path).type == pafs.FileType.File:
            return "exists and is a file, not a directory"
        name = f".probe-{uuid.uuid4().hex[:12]}"
        if fs is _LOCAL:
            os.makedirs(path, exist_ok=True)
            fd = os.open(os.path.join(path, name), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            try:
                os.write(fd, b"probe")
            finally:
                os.close(fd)
            os.unlink(os.path.join(path, name))
            return None
        fs.create_dir(path, recursive=True)
        with fs.open_output_stream(f"{path}/{name}") as f:
            f.write(b"probe")
        fs.delete_file(f"{path}/{name}")
    except ResultsPathError as err:
        return err
    except (OSError, pa.ArrowException) as err:
        return reason(err)
    return None


_PLAIN = {
    errno.EROFS: "read-only file system",
    errno.EACCES: "permission denied",
    errno.EPERM: "not permitted",
    errno.ENOTDIR: "a parent is a file, not a directory",
    errno.ENOSPC: "the disk is full",
    errno.EDQUOT: "the disk quota is full",
    errno.EEXIST: "exists and is a file, not a directory",
}
# Object stores' errors (pyarrow's messages carry the provider's code), in plain words.
_CODES = {
    r"NO_SUCH_BUCKET|Bucket '[^']*' not found": "the bucket does not exist",
    r"ACCESS_DENIED|HTTP status 403": "access denied (check the credentials)",
    r"INVALID_ACCESS_KEY_ID": "the access key is not known to the endpoint",
    r"SIGNATURE_DOES_NOT_MATCH": "the secret key was refused",
    r"NETWORK_CONNECTION|curlCode": "cannot connect to the endpoint",
}


def disk_full(error: BaseException) -> bool:
    """Whether an error, or what caused it, is a write that found no space: an OSError ENOSPC or
    EDQUOT, or SQLite's "database or disk is full" under Optuna's StorageInternalError."""
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno in FULL:
            return True
        if "disk is full" in str(seen) or "No space left on device" in str(seen):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def reason(err: BaseException) -> str:
    """An OSError in plain words: what a person reads after the path."""
    if isinstance(err, OSError) and err.errno in _PLAIN:
        return _PLAIN[err.errno]
    text = str(err)
    found = next((words for code, words in _CODES.items() if re.search(code, text)), None)
    return found or _first(err)


def _first(err: BaseException) -> str:
    """The first sentence of an error, without the provider's request id."""
    text = re.sub(r"\s*\(Request ID: [^)]*\)", "", str(err)).strip()
    return text.splitlines()[0].split(". ")[0][:200] if text else type(err).__name__
