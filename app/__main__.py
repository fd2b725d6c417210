"""`python -m app`: serve with the host, port, workers and log level from the settings."""

import uvicorn

from .settings import get_settings


def main() -> None:
    s = get_settings()
    uvicorn.run("app.main:app", host=s.host, port=s.port, workers=s.workers, log_level=s.log_level,
                proxy_headers=True, timeout_graceful_shutdown=10)


if __name__ == "__main__":
    main()
