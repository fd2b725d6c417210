import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "slow: builds the wheel and installs it into a fresh venv (about a minute)")
