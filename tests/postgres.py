"""A throwaway PostgreSQL server for the tests of a study shared through `--storage` (Debian's
`postgresql` package; .ci/run installs it): started in a temporary folder on 127.0.0.1, run as
the `postgres` user when the tests run as root (initdb refuses root), and stopped, restarted or
started again by the tests of a database that goes away (a failover, a maintenance restart)."""

from __future__ import annotations

import glob
import importlib.util
import os
import shutil
import socket
import subprocess
import tempfile
from dataclasses import dataclass


class Unavailable(Exception):
    """Why no server can run here (the tests that need one skip, saying so)."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _pg_bin(name: str) -> str | None:
    found = shutil.which(name) or sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    return found if isinstance(found, str) else (found[-1] if found else None)


@dataclass
class Server:
    folder: str
    port: int
    ctl: list[str]  # pg_ctl -D <data>, as the user that owns the data

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, *args: str) -> None:
        done = subprocess.run([*self.ctl, *args], capture_output=True, text=True, timeout=60)
        if done.returncode:
            raise RuntimeError(f"pg_ctl {' '.join(args)}: {done.stderr.strip()[-300:]}")

    def start(self) -> None:
        self._run(
            "-w",
            "-t",
            "30",
            "-l",
            os.path.join(self.folder, "log"),
            "-o",
            f"-p {self.port} -k {self.folder} -c listen_addresses=127.0.0.1 -c fsync=off",
            "start",
        )

    def stop(self) -> None:
        """As a maintenance stop does: every connection is ended (AdminShutdown), new ones refused."""
        self._run("-w", "-m", "fast", "stop")

    def restart(self) -> None:
        self.stop()
        self.start()

    def running(self) -> bool:
        return (
            subprocess.run([*self.ctl, "status"], capture_output=True, timeout=30).returncode == 0
        )

    def end(self) -> None:
        subprocess.run([*self.ctl, "-m", "immediate", "stop"], capture_output=True, timeout=60)
        shutil.rmtree(self.folder, ignore_errors=True)


def start_server() -> Server:
    """A running server, or Unavailable saying why none can run here."""
    if importlib.util.find_spec("psycopg") is None and importlib.util.find_spec("psycopg2") is None:
        raise Unavailable("no PostgreSQL driver: pip install -e '.[postgres]'")
    initdb, pg_ctl = _pg_bin("initdb"), _pg_bin("pg_ctl")
    if not (initdb and pg_ctl):
        raise Unavailable("no PostgreSQL server here (apt-get install postgresql)")
    as_user: list[str] = []
    folder = tempfile.mkdtemp(prefix="sbpg-")
    if os.geteuid() == 0:
        try:
            import pwd

            owner = pwd.getpwnam("postgres")
        except KeyError:
            raise Unavailable(
                "running as root and there is no `postgres` user to run the server as"
            ) from None
        os.chown(folder, owner.pw_uid, owner.pw_gid)
        as_user = ["runuser", "-u", "postgres", "--"]
    data = os.path.join(folder, "data")
    server = Server(folder, _free_port(), [*as_user, pg_ctl, "-D", data])
    done = subprocess.run(
        [*as_user, initdb, "-D", data, "-A", "trust", "-U", "postgres", "--no-sync"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    if done.returncode:
        shutil.rmtree(folder, ignore_errors=True)
        raise Unavailable(f"initdb failed: {done.stderr.strip()[-300:]}")
    try:
        server.start()
    except RuntimeError as e:
        server.end()
        raise Unavailable(f"PostgreSQL did not start: {e}") from None
    return server
