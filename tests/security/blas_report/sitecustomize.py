"""Loaded at interpreter start when this folder is on PYTHONPATH (tests/security/test_http_edge.py
puts it there for one server): when the process is told to stop (SIGTERM), it writes threadpoolctl's
view of its BLAS libraries (library, num_threads) as JSON to the file named by BLAS_REPORT_FILE, then
stops as it would have. This is how a test sees EXPLORER_BLAS_THREADS take effect inside a real
server process, with no endpoint for it.

uvicorn catches SIGTERM while it serves, shuts down gracefully, then restores the handler it found
(this one) and raises the signal again, so the report is written after the last request."""

import json
import os
import signal


def _report(signum, frame) -> None:
    import threadpoolctl

    with open(os.environ["BLAS_REPORT_FILE"], "w") as f:
        json.dump(threadpoolctl.threadpool_info(), f)
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


if os.environ.get("BLAS_REPORT_FILE"):
    signal.signal(signal.SIGTERM, _report)
