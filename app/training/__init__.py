"""Training runs (jobs) outside the request, behind one interface (store.py `TrainingStore`) with two
places to live:

- embedded (the default): the runs folder (store.py `FolderStore`), the in-process scheduler that starts
  queued runs (scheduler.py) and the trainer process (worker.py, `python -m app.training.worker`);
- beyond one machine (EXPLORER_REDIS_URL): runs in Redis (redis_store.py; the trainer's lease and writes in
  redis_writer.py), trained by Celery workers (jobs.py, started by `python -m app.worker`).

Both train with the same loop (worker.py `train`, on core.train).

May import: `core` and `app.settings`. The service (app/service/) is what pages and the API call.
"""
