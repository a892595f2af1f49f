"""Starting and stopping real `shoal server` processes for tests.

Every node is a child process bound to a loopback address and a free port; `stop()` and
`kill()` always reap it, and `ShoalNode` is a context manager so a failing test still
cleans up.
"""

import os
import random
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def shoal_binary() -> str:
    if os.environ.get("SHOAL_BIN"):
        return os.environ["SHOAL_BIN"]
    target = os.environ.get("CARGO_TARGET_DIR", os.path.expanduser("~/.cache/shoal/target"))
    return os.path.join(target, "release", "shoal")


def _ephemeral_range_start() -> int:
    """The first port of the kernel's ephemeral range, from which it picks the local port of
    an outgoing connection (32768 unless the machine is configured otherwise)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as range_file:
            return int(range_file.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _port_candidates():
    """Every port from 10000 up to the ephemeral range once, starting at a random place."""
    floor, ceiling = 10000, max(_ephemeral_range_start(), 10001)
    start = random.randrange(ceiling - floor)
    for step in range(ceiling - floor):
        yield floor + (start + step) % (ceiling - floor)


_candidates = _port_candidates()


def free_port_on_all(addresses) -> int:
    """A port free right now on every one of `addresses`, never handed out before in this
    test run (so two picks always differ).

    It comes from below the kernel's ephemeral range: a port from that range, found free a
    moment ago, can be taken by any outgoing connection (a driver's, a node's internode one)
    before the node under test binds it, and the node then fails to start with "Address
    already in use". Below the range, only a process that asks for that very port takes it."""
    for port in _candidates:
        try:
            for address in addresses:
                with socket.socket() as probe:
                    probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                    probe.bind((address, port))
            return port
        except OSError:
            continue
    raise RuntimeError(f"no port free below the ephemeral range on {addresses}")


def free_port(address: str = "127.0.0.1") -> int:
    """A port free on `address` (see `free_port_on_all`)."""
    return free_port_on_all([address])


class ShoalNode:
    """One `shoal server` process."""

    def __init__(self, data_dir, address="127.0.0.1", port=None, commitlog_sync="periodic", config=None, extra_args=(),
                 internode_port=None, seeds=(), env=None):
        self.data_dir = Path(data_dir)
        self.address = address
        self.port = port or free_port(address)
        self.internode_port = internode_port or free_port(address)
        self.seeds = list(seeds)
        self.commitlog_sync = commitlog_sync
        self.config = config
        self.extra_args = list(extra_args)
        self.env = dict(env or {})
        self.process = None
        self.log_path = self.data_dir.parent / f"{self.data_dir.name}.log"

    def command(self):
        command = [
            shoal_binary(), "server",
            "--data-dir", str(self.data_dir),
            "--listen-address", self.address,
            "--cql-port", str(self.port),
            "--internode-port", str(self.internode_port),
            "--commitlog-sync", self.commitlog_sync,
        ]
        if self.seeds:
            command += ["--seeds", ",".join(self.seeds)]
        if self.config:
            command += ["--config", str(self.config)]
        return command + self.extra_args

    def start(self, timeout=30):
        self.launch()
        return self.wait_listening(timeout)

    def launch(self):
        """Starts the process without waiting for it to serve clients."""
        self.data_dir.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")
        self.process = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT,
                                        env={**os.environ, **self.env})
        log.close()
        return self

    def wait_for_log(self, text, timeout=30):
        """Waits until the node's log contains `text`."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            if text in self.log_path.read_text(errors="replace"):
                return
            if self.process is not None and self.process.poll() is not None:
                raise RuntimeError(f"shoal exited with {self.process.returncode}: {self.log()}")
            time.sleep(0.05)
        raise AssertionError(f"{text!r} never appeared in the log: {self.log()}")

    def wait_listening(self, timeout=30):
        """Waits until the node accepts CQL connections."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"shoal exited with {self.process.returncode}: {self.log()}")
            try:
                with socket.create_connection((self.address, self.port), timeout=0.5):
                    return self
            except OSError:
                time.sleep(0.05)
        self.kill()
        raise RuntimeError(f"shoal did not start listening within {timeout}s: {self.log()}")

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-4000:]
        except OSError:
            return ""

    def dump_stacks(self) -> str:
        """Every thread's stack, written next to the node's log (`gdb`, when installed):
        what a node that stopped making progress was doing. Returns where it went."""
        if self.process is None or self.process.poll() is not None or shutil.which("gdb") is None:
            return "no stacks (the node is not running, or gdb is not installed)"
        path = self.data_dir.parent / f"{self.data_dir.name}.stacks.txt"
        try:
            result = subprocess.run(["gdb", "-batch", "-p", str(self.process.pid), "-ex", "thread apply all bt"],
                                    capture_output=True, text=True, timeout=60)
            path.write_text(result.stdout + result.stderr)
        except (OSError, subprocess.TimeoutExpired) as error:
            return f"no stacks: {error}"
        return str(path)

    def stop(self, timeout=30) -> int:
        """SIGTERM and wait: a clean shutdown. Returns the exit code."""
        if self.process is None or self.process.poll() is not None:
            return self.process.returncode if self.process else 0
        self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise

    def kill(self):
        """SIGKILL: a crash."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=30)

    def pause(self, timeout=10):
        """SIGSTOP, and wait until every thread of the node has stopped.

        `kill()` returns once the signal is queued; the process stops when one of its
        threads takes the signal and stops the others. On a busy machine its threads can
        run on for milliseconds meanwhile, long enough to answer a request sent right
        after — so a test that needs the node silent waits for the stop itself."""
        self.process.send_signal(signal.SIGSTOP)
        deadline = time.time() + timeout
        while not self.all_threads_stopped():
            if time.time() > deadline:
                raise AssertionError(f"the node at {self.address} did not stop within {timeout}s")
            time.sleep(0.005)

    def all_threads_stopped(self) -> bool:
        tasks = Path(f"/proc/{self.process.pid}/task")
        for task in tasks.iterdir():
            try:
                # The state follows the command name, which is in parentheses.
                state = (task / "stat").read_text().rsplit(")", 1)[1].split()[0]
            except (OSError, IndexError):
                continue  # the thread ended meanwhile
            if state not in ("T", "t"):
                return False
        return True

    def resume(self):
        """SIGCONT: the paused node runs again."""
        self.process.send_signal(signal.SIGCONT)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.kill()
