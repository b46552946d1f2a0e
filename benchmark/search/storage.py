"""The Optuna study's database, reached patiently: a dropped connection, a server restart or a
failover does not stop a search, and a database that stays away stops it in one line.

Two layers, each a kept library's:
- SQLAlchemy's pool (`engine_kwargs`): a pooled connection the server has ended since its last use is
  replaced before it is used (`pool_pre_ping`), and none is kept long enough for a firewall or a
  load balancer to drop it silently (`pool_recycle`);
- a call that finds the server gone (a refused connection, AdminShutdown, a dropped socket:
  SQLAlchemy's OperationalError or InterfaceError, which Optuna wraps in StorageInternalError) is
  retried with a bounded exponential backoff (tenacity) for up to `wait_s`, each call of the
  storage on its own: what the driver and the searcher ask (ask, tell, user attributes, enqueue,
  the quota's reads) goes through it. Optuna retries only a new trial's creation, and only for a
  deadlock (RDBStorage._create_new_trial), so every other call needs this. (Optuna's heartbeat
  and RetryHeartbeatStaleTrialCallback are for trials whose process died, under study.optimize
  only; here the driver registry and resume.close_running do that.)

An enqueued trial (a grid point) is claimed for one driver by one conditional write (`_claim`),
where Optuna's read-then-write let two drivers on SQLite claim the same one.

A call that succeeds after a retry says one line (`say`). One that fails for `wait_s` raises
StorageUnavailable, whose message names the database (without its password) and what to do;
the search stops on it with exit code 3 (halt.py), keeping every row, and `--resume` tells the
study what it missed (resume.close_running). A full disk is never retried (location.disk_full),
nor a record the database no longer holds (`record_lost`): the search stops on it the same way,
as it does at once when a SQLite study's file is replaced by another (StorageReplaced, seen by its
inode before each call), saving the file the search wrote beside it.

A retried write whose first attempt was committed but not acknowledged (the connection dropped
in the one round trip between the two) is recognised where it matters: a tell that finds its
trial already told with the same state succeeds; a user attribute is written again, the same. A
trial created (asked or enqueued) twice that way is not: the extra one is never trained, and
close_running fails it on the next start (an enqueued point may then train twice, in two rows)."""

from __future__ import annotations

import contextlib
import functools
import os
import sqlite3
import sys
import threading
import time
import types
from datetime import datetime

from optuna.storages import RDBStorage

from benchmark.store import disk_full

STORAGE_WAIT_S = 120.0  # --storage-wait: a managed database's failover takes one to two minutes
BACKOFF_S = 0.5  # the first retry's wait, doubled (with jitter) up to BACKOFF_MAX_S
BACKOFF_MAX_S = 8.0
# A load balancer or NAT in front of the server drops a connection idle for a few minutes without
# telling either end (AWS NLB: 350 s); a pre-ping on such a socket would hang, so none is kept that long.
RECYCLE_S = 300
CONNECT_TIMEOUT_S = 10  # psycopg waits for the OS's TCP timeout (minutes) on an unreachable host


# what Optuna's RDBStorage says of a trial or study it has no row for (optuna.storages._rdb.models)
RECORD_LOST = "Record does not exist."


class StorageUnavailable(RuntimeError):
    """The study's database did not answer for the whole wait; the message is one line."""


class StorageReplaced(StorageUnavailable):
    """Another file is at the study's SQLite path than the one this search opened (`git checkout`
    or `git stash` of it, `mv` of a copy over it, removed; a `cp` over it writes into the same file,
    which only Optuna's "Record does not exist." can show). SQLite's open connections go on reading
    the file they opened and refuse to write to it ("attempt to write a readonly database",
    SQLITE_READONLY_DBMOVED), an OperationalError that looks like a database away: the search
    waited --storage-wait and said the database had not answered, and the file the search wrote,
    which no path names any more, went with the process."""


class HeldFile:
    """The study's SQLite file as this search opened it: held open, so that its contents outlive
    its path being taken by another file, and known by its inode, so that such a change is seen
    at the storage's next call (`check`). None for a database that is not a local file."""

    def __init__(self, path: str, identity: tuple[int, int], fd: int):
        self.path, self.identity, self.fd = path, identity, fd
        self.saved: str | None = None
        self.unsaved: str | None = None  # why it could not be saved
        self._lock = threading.Lock()

    @classmethod
    def of(cls, url: str) -> HeldFile | None:
        from sqlalchemy.engine import make_url

        url_ = make_url(url)
        path = url_.database
        if url_.get_backend_name() != "sqlite" or not path or path == ":memory:":
            return None
        path = os.path.abspath(path)
        held = _hold(path)
        return held and cls(path, *held)

    def check(self) -> None:
        """StorageReplaced, once this file's path names another file or none; the file this search
        wrote is saved beside it first (`saved`), once."""
        try:
            now = _identity(os.stat(self.path))
        except FileNotFoundError:
            now = None
        if now == self.identity:
            return
        with self._lock:
            if self.saved is None and self.unsaved is None:
                try:
                    self.saved = _save(self.fd, self.path)
                except (OSError, sqlite3.Error) as e:
                    self.unsaved = f"{type(e).__name__}: {e}"
        kept = (
            f"the database this search wrote is saved as {self.saved}. Move the other aside and put "
            f"that back (mv {self.path} {self.path}.other; mv {self.saved} {self.path}), then --resume: "
            "the other file would give out trial numbers whose rows exist"
            if self.saved
            else f"the database this search wrote could not be saved ({self.unsaved})"
        )
        raise StorageReplaced(
            f"the study's database {self.path} was replaced while the search ran (another file, or "
            f"none, is at its path: moved or checked out over it, or removed); finished rows are "
            f"kept, and {kept}"
        )


# Every SQLite file a storage of this process opened, held open for the process's life, one
# descriptor a file: closing any descriptor of a file drops every POSIX lock the process holds on
# it, SQLite's connections' included (sqlite.org, "How To Corrupt An SQLite Database File" 2.2).
_HELD: dict[tuple[int, int], int] = {}
_HELD_LOCK = threading.Lock()


def _hold(path: str) -> tuple[tuple[int, int], int] | None:
    with _HELD_LOCK:
        try:
            known = _identity(os.stat(path))
        except FileNotFoundError:
            return None
        if known not in _HELD:
            fd = os.open(path, os.O_RDONLY)
            known = _identity(os.fstat(fd))  # the file opened, should the path have changed since
            _HELD.setdefault(known, fd)  # (a second descriptor of one file stays open: see above)
        return known, _HELD[known]


def _save(fd: int, path: str, tries: int = 3) -> str:
    """A copy of the held file beside its path, checked by SQLite (another driver of the study may
    have been committing to it mid-copy: copied again). Not store.atomic_open, which makes the
    folder: a study folder removed is said, not made again."""
    target = f"{path}.this-search-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{os.getpid()}"
    part = target + ".part"
    try:
        for _ in range(tries):
            with open(part, "wb") as out:
                offset = 0
                while chunk := os.pread(fd, 1 << 20, offset):
                    out.write(chunk)
                    offset += len(chunk)
            with contextlib.closing(sqlite3.connect(part)) as db:
                if db.execute("PRAGMA quick_check").fetchone()[0] == "ok":
                    break
        else:
            raise sqlite3.DatabaseError(f"its copy failed SQLite's quick_check {tries} times")
        os.replace(part, target)
        return target
    finally:
        with contextlib.suppress(OSError):
            os.unlink(part)


def _identity(st: os.stat_result) -> tuple[int, int]:
    return st.st_dev, st.st_ino


def shown(url: str) -> str:
    """The storage URL as messages show it: without its password."""
    from sqlalchemy.engine import make_url

    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # noqa: BLE001  (not a URL SQLAlchemy reads: shown as given, up to its credentials)
        scheme, sep, rest = url.partition("://")
        return f"{scheme}{sep}{rest.rpartition('@')[2]}" if sep else url


def transient(error: BaseException) -> bool:
    """Whether an error is the database being away for a moment: a connection refused, ended or
    dropped (SQLAlchemy's OperationalError/InterfaceError, anywhere in the chain Optuna raises),
    not a full disk."""
    from sqlalchemy.exc import InterfaceError, OperationalError

    if disk_full(error):
        return False
    seen = 0
    while error is not None and seen < 8:
        if isinstance(error, (OperationalError, InterfaceError)):
            return True
        error, seen = error.__cause__ or error.__context__, seen + 1
    return False


def record_lost(error: BaseException) -> bool:
    """Whether Optuna found no record of a trial or study this search wrote before
    (RDBStorage's KeyError "Record does not exist."): its database was replaced under the search (a
    file copied or checked out over it, an older copy restored) or the study deleted. Not retried:
    waiting brings nothing back."""
    return isinstance(error, KeyError) and error.args[:1] == (RECORD_LOST,)


def reason(error: BaseException) -> str:
    """The database driver's own first line for an error (psycopg's 'connection refused'), from
    the first SQLAlchemy DBAPIError in the chain (which carries it as `orig`)."""
    from sqlalchemy.exc import DBAPIError

    inner, seen = error, 0
    while inner is not None and seen < 8 and not isinstance(inner, DBAPIError):
        inner, seen = inner.__cause__ or inner.__context__, seen + 1
    inner = getattr(inner, "orig", None) or inner or error
    first = next((line.strip() for line in str(inner).splitlines() if line.strip()), "")
    return f"{type(inner).__name__}: {first[:200]}" if first else type(inner).__name__


def _to_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def engine_kwargs(url: str) -> dict:
    kwargs = {"pool_pre_ping": True, "pool_recycle": RECYCLE_S}
    if url.startswith(("postgresql", "postgres")):
        kwargs["connect_args"] = {"connect_timeout": CONNECT_TIMEOUT_S}
    return kwargs


class PatientStorage(RDBStorage):
    """Optuna's RDBStorage whose every call rides through the database being away for up to
    `wait_s` seconds; `say` gets the one line of a call that succeeded after waiting."""

    def __init__(self, url: str, wait_s: float = STORAGE_WAIT_S, say=_to_stderr):
        self.wait_s, self.say = wait_s, say
        self._local, self._held = threading.local(), None
        self._patiently(RDBStorage.__init__, self, url, engine_kwargs=engine_kwargs(url))
        self._held = HeldFile.of(url)

    def __getstate__(self):  # Tune pickles the searcher, and with it this storage
        state = super().__getstate__()
        state.pop("_local", None)
        state.pop("_held", None)
        return state

    def __setstate__(self, state) -> None:
        self._local, self._held = threading.local(), None
        self.__dict__.update(wait_s=state["wait_s"], say=state["say"])
        self._patiently(RDBStorage.__setstate__, self, state)
        self._held = HeldFile.of(self.url)

    def set_trial_state_values(self, trial_id, state, values=None) -> bool:
        from optuna.trial import TrialState

        if state == TrialState.RUNNING and values is None:  # Study._pop_waiting_trial_id
            return self._patiently(self._claim, trial_id)
        retried = []

        def tell() -> bool:
            from optuna.exceptions import UpdateFinishedTrialError

            try:
                return RDBStorage.set_trial_state_values(self, trial_id, state, values)
            except UpdateFinishedTrialError:
                # the first attempt was committed, its answer lost with the connection
                if retried and RDBStorage.get_trial(self, trial_id).state == state:
                    return True
                raise
            finally:
                retried.append(True)

        return self._patiently(tell)

    def _claim(self, trial_id: int) -> bool:
        """An enqueued (WAITING) trial made RUNNING for this driver only; False when another has it.
        Optuna reads the state, then writes it (RDBStorage.set_trial_state_values): PostgreSQL
        locks the row between the two (SELECT ... FOR UPDATE), SQLite does not, and two drivers
        popping the queue at once both claimed one grid point and both trained it. One
        conditional UPDATE is atomic on both. A claim retried after its answer was lost finds the
        trial taken: it stays RUNNING untrained until close_running fails it and re-enqueues it."""
        from optuna.storages._rdb import models
        from optuna.storages._rdb.storage import _create_scoped_session
        from optuna.trial import TrialState
        from sqlalchemy import update

        trials = models.TrialModel
        with _create_scoped_session(self.scoped_session) as session:
            claimed = session.execute(
                update(trials)
                .where(trials.trial_id == trial_id, trials.state == TrialState.WAITING)
                .values(state=TrialState.RUNNING, datetime_start=datetime.now())
                .execution_options(synchronize_session=False)
            ).rowcount
        return claimed == 1

    def _patiently(self, call, *args, **kwargs):
        """`call`, retried while the database is away; only the outermost of nested calls retries."""
        import tenacity

        if getattr(self._local, "inside", False):
            return call(*args, **kwargs)
        self._local.inside = True
        start, failed = time.monotonic(), []
        try:
            for attempt in tenacity.Retrying(
                stop=tenacity.stop_before_delay(self.wait_s),  # never past it
                wait=(
                    tenacity.wait_exponential(multiplier=BACKOFF_S, max=BACKOFF_MAX_S)
                    + tenacity.wait_random(0, BACKOFF_S)
                ),  # jitter: drivers do not retry in step
                retry=tenacity.retry_if_exception(transient),
                reraise=True,
                before_sleep=lambda state: failed.append(state.outcome.exception()),
            ):
                with attempt:
                    if self._held is not None:  # before each try: a file replaced meanwhile
                        self._held.check()  # makes SQLite refuse to write, which looks transient
                    result = call(*args, **kwargs)
        except Exception as e:
            if not transient(e):
                raise
            raise StorageUnavailable(
                f"the study's database {shown(self.url)} has not answered within {self.wait_s:g} s "
                f"({reason(e)}); finished rows are kept. Check that the server is up and reachable from here "
                "(or wait longer with --storage-wait)"
            ) from None
        finally:
            self._local.inside = False
        if failed:
            self.say(
                f"the study's database {shown(self.url)} did not answer ({reason(failed[0])}); it answered "
                f"again after {time.monotonic() - start:.1f} s"
            )
        return result


def _patient(name: str):
    @functools.wraps(getattr(RDBStorage, name))
    def call(self, *args, **kwargs):
        return self._patiently(getattr(RDBStorage, name), self, *args, **kwargs)

    return call


# What the study asks of its storage: its public calls, and the private ones Optuna's cache in
# front of it makes (optuna.storages._cached_storage); not the helpers that run inside a session.
CACHED = (
    "_create_new_trial",
    "_set_trial_param",
    "_get_trials",
    "_get_best_trial_id",
    "_get_stale_trial_ids",
)
for _name, _method in list(vars(RDBStorage).items()):
    if (
        isinstance(_method, types.FunctionType)
        and (not _name.startswith("_") or _name in CACHED)
        and _name not in vars(PatientStorage)
    ):
        setattr(PatientStorage, _name, _patient(_name))
