"""Training runs (jobs) outside the request: the store that keeps each run on disk
(store.py), the scheduler that starts queued runs in worker processes (scheduler.py), and the worker
process itself (worker.py, `python -m app.training.worker`), which trains with core.train.

May import: `core` and `app.settings`. The service (app/service/) is what pages and the API call.
"""
