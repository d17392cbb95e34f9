"""The supervisor's worker entry point: a worker stopped while it is still starting (the
supervisor sends SIGINT to every worker when one cannot start) exits quietly."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from inferd.workers.supervisor import INTERRUPTED_EXIT


def test_a_worker_interrupted_while_starting_exits_quietly(tmp_path: Path) -> None:
    script = textwrap.dedent(
        f"""
        from pathlib import Path

        from inferd.workers import supervisor
        from inferd.workers.peers import WorkerRole

        def interrupted(role):  # SIGINT lands while the server is importing
            raise KeyboardInterrupt

        supervisor._worker_main(interrupted, WorkerRole(0, 2, Path({str(tmp_path)!r})))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == INTERRUPTED_EXIT == 130
    assert "Traceback" not in done.stderr
    assert "KeyboardInterrupt" not in done.stderr
