"""The token cache in the study's storage (`--cache s3://BUCKET/cache`, or any URI pyarrow.fs
opens): a copy of the files a node's local cache holds (the trained tokenizer, each split's token
array and its checksummed sidecar), each under the URI at its path below the cache root.

Whoever builds a file uploads it: the driver, which prepares the data before any trial starts, so a
search tokenises once per cluster. Every other node downloads each file once into its own local
cache (under that cache's lock), since the arrays are memory-mapped and need a file system. An
array's checksum is computed as it arrives, and a copy that fails it is never published locally:
the node rebuilds the split and uploads it over the bad copy.

An object store has no lock and no rename: each file is one upload stream (an object appears whole
when its stream closes), the sidecar after its array, so a reader that finds a sidecar finds the
array it describes. Two nodes that rebuild at once upload the same bytes (tokenising is
deterministic)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import pyarrow.fs as pafs

from benchmark.store import atomic_open, location

BLOCK = 1 << 24  # bytes per read and write: 16 MiB, a copy of a 20 GB split never held in memory


def checksum():
    """The token cache's checksum (blake2b, 16 bytes): ~0.1 s per 100 MB, cheap next to a trial,
    and it catches any corruption."""
    return hashlib.blake2b(digest_size=16)


@dataclass(frozen=True)
class Mirror:
    uri: str  # where the copy lives: s3://BUCKET/cache, file:///shared/cache, ...
    root: Path  # the node's local cache it mirrors

    def remote(self, path: Path) -> str:
        return location.join(self.uri, *path.relative_to(self.root).parts)

    def size(self, path: Path) -> int | None:
        """The size of the remote copy of `path`; None when there is none."""
        fs, where = location.resolve(self.remote(path))
        info = fs.get_file_info(where)
        return info.size if info.type == pafs.FileType.File else None

    def read(self, path: Path) -> bytes | None:
        """The remote copy of a small file (a sidecar); None when there is none."""
        if self.size(path) is None:
            return None
        return location.read_bytes(self.remote(path))

    def pull(self, path: Path, expected: str | None = None) -> bool:
        """Download the remote copy of `path` to it, whole; False when there is none.
        ChecksumError when `expected` is given and the bytes do not hash to it: then `path` is
        left as it was."""
        if self.size(path) is None:
            return False
        fs, where = location.resolve(self.remote(path))
        digest = checksum()
        with atomic_open(path, "wb") as f, fs.open_input_stream(where) as stream:
            while block := stream.read(BLOCK):
                digest.update(block)
                f.write(block)
            if expected is not None and digest.hexdigest() != expected:
                raise ChecksumError("checksum differs")  # atomic_open discards the download
        return True

    def push(self, path: Path) -> None:
        """Upload `path` over its remote copy, in blocks."""
        fs, where = location.resolve(self.remote(path))
        if fs.type_name not in location.OBJECT_STORES:  # a file system needs its folders made
            fs.create_dir(where.rpartition("/")[0], recursive=True)
        with path.open("rb") as f, fs.open_output_stream(where) as stream:
            while block := f.read(BLOCK):
                stream.write(block)


class ChecksumError(ValueError):
    """A downloaded file is not the one its sidecar describes."""
