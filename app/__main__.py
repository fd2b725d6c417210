"""`python -m app`: serve with the host, port, workers and log level from the settings."""

import uvicorn

from app.http.bodylimit import HTTP_PROTOCOL
from app.settings import get_settings

# On SIGTERM uvicorn stops accepting, lets requests in flight finish for up to this long, then exits.
# docker-compose.yml's stop_grace_period must be longer, or Docker kills the process mid-drain.
GRACEFUL_SHUTDOWN_S = 10


def main() -> None:
    s = get_settings()
    uvicorn.run(
        "app.main:app",
        host=s.host,
        port=s.port,
        workers=s.workers,
        log_level=s.log_level,
        proxy_headers=True,
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
        http=HTTP_PROTOCOL,  # httptools, bounding the URL so an over-long one gets a JSON 414
        access_log=False,
    )  # app/http/observability.py writes one JSON line per request instead


if __name__ == "__main__":
    main()
