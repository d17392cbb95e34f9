"""Runs one of PyTriton's examples as written: its server.py, then its client.py once the
server is ready (on PyTriton's default ports 8000 and 8001, so run it in a network namespace
of its own), then stops the server with SIGINT (Ctrl+C). Prints the client's output and exits
with the client's status (the server's if it failed)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

READY_TIMEOUT_S = 120.0


def ready() -> bool:
    try:
        with urllib.request.urlopen("http://127.0.0.1:8000/v2/health/ready", timeout=5) as reply:
            return bool(reply.status == 200)
    except OSError:
        return False


def main(example: str) -> int:
    # Ctrl+C reaches the server even when this was started with SIGINT ignored (a command run
    # in the background of a script inherits that): a handled signal is reset to its default
    # in the child, where Python then raises KeyboardInterrupt as usual.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    folder = Path(__file__).parent / example
    server = subprocess.Popen([sys.executable, str(folder / "server.py")])
    try:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not ready():
            if server.poll() is not None or time.monotonic() > deadline:
                print(f"server.py never became ready (status {server.poll()})")
                return 1
            time.sleep(0.1)
        client = subprocess.run(
            [sys.executable, str(folder / "client.py")],
            capture_output=True,
            text=True,
            timeout=READY_TIMEOUT_S,
        )
        print(client.stdout + client.stderr)
    finally:
        server.send_signal(signal.SIGINT)
        try:
            status = server.wait(READY_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
            print("server.py did not stop on SIGINT")
            status = 1
    return client.returncode or status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
