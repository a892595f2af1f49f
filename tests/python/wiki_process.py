"""Starting and stopping the wiki (`apps/wiki`) and its MariaDB for tests and benchmarks.

`WikiServer` runs the `shoal-wiki` binary on a free port against Shoal or MariaDB and
reads the address it prints; `MariaDb` starts a private MariaDB server through
`apps/wiki/mariadb.sh`. Both are context managers and always stop what they started.
"""

import os
import signal
import subprocess
import threading
from pathlib import Path

from shoal_process import REPO, free_port


def wiki_binary() -> str:
    target = os.environ.get("CARGO_TARGET_DIR", os.path.expanduser("~/.cache/shoal/target"))
    return os.path.join(target, "release", "shoal-wiki")


class MariaDb:
    """A MariaDB server with its files in `directory`, on 127.0.0.1 and a free port."""

    def __init__(self, directory):
        self.directory = Path(directory)
        self.port = free_port()
        self.pid = None

    @property
    def url(self) -> str:
        return f"mysql://root@127.0.0.1:{self.port}/wiki"

    def start(self):
        script = REPO / "apps" / "wiki" / "mariadb.sh"
        started = subprocess.run([str(script), str(self.directory), str(self.port)],
                                 capture_output=True, text=True, timeout=120)
        if started.returncode != 0:
            raise RuntimeError(f"MariaDB did not start: {started.stderr}")
        self.pid = int(started.stdout.strip().splitlines()[-1])
        return self

    def stop(self):
        if self.pid is None:
            return
        try:
            os.kill(self.pid, signal.SIGTERM)
        except ProcessLookupError:
            self.pid = None
            return
        # Not our child (the script started it): wait for it to be gone.
        for _ in range(600):
            try:
                os.kill(self.pid, 0)
            except ProcessLookupError:
                break
            threading.Event().wait(0.05)
        else:
            os.kill(self.pid, signal.SIGKILL)
        self.pid = None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()


class WikiServer:
    """One `shoal-wiki` process; `url` is where it serves."""

    def __init__(self, store_args, log_path):
        self.store_args = list(store_args)
        self.log_path = Path(log_path)
        self.process = None
        self.url = None

    @staticmethod
    def on_shoal(contact_points, keyspace, log_path, replication_factor=1):
        return WikiServer(["--shoal", ",".join(contact_points), "--keyspace", keyspace,
                           "--replication-factor", str(replication_factor)], log_path)

    @staticmethod
    def on_mariadb(url, log_path):
        return WikiServer(["--mariadb", url], log_path)

    def start(self, timeout=60):
        self.log = open(self.log_path, "w")
        self.process = subprocess.Popen([wiki_binary(), *self.store_args, "--listen", "127.0.0.1:0"],
                                        stdout=subprocess.PIPE, stderr=self.log, text=True)
        line = []
        reader = threading.Thread(target=lambda: line.append(self.process.stdout.readline()), daemon=True)
        reader.start()
        reader.join(timeout)
        if not line or "serving " not in line[0]:
            self.stop()
            raise RuntimeError(f"the wiki did not start: {self.log_path.read_text()[-2000:]}")
        self.url = line[0].split("serving ", 1)[1].strip().rstrip("/")
        # Anything else it prints is read and dropped, so the pipe never fills.
        self.drain = threading.Thread(target=lambda: [None for _ in self.process.stdout], daemon=True)
        self.drain.start()
        return self

    def stop(self):
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=30)
        if self.process is not None:
            if getattr(self, "drain", None) is not None:
                self.drain.join(timeout=10)
            self.process.stdout.close()
            self.log.close()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
