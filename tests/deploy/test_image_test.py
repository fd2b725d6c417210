"""scripts/image_test.py (`make image-test`, run by .ci/run) must run the container as
docker-compose.yml does. The container itself needs an engine; here, without one, only that the
script reads every compose setting and turns it into the `run` options it means."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts"))
import image_test  # noqa: E402  (scripts/ is not a package)


@pytest.fixture(scope="module")
def service() -> image_test.Service:
    return image_test.read_compose(REPO / "docker-compose.yml")


def test_compose_settings_become_run_options(service):
    compose = yaml.safe_load((REPO / "docker-compose.yml").read_text())["services"]["explorer"]
    assert service.image == compose["image"]
    assert (service.context / service.dockerfile) == REPO / "Dockerfile"
    assert service.container_port == compose["environment"]["EXPLORER_PORT"]
    for key, value in compose["environment"].items():
        assert f"--env={key}={value}" in service.options
    assert "--read-only" in service.options and "--init" in service.options
    assert "--tmpfs=/tmp" in service.options
    assert service.grace_s == int(compose["stop_grace_period"].rstrip("s"))


def test_the_models_folder_is_the_one_replaced_by_the_fixture(service):
    """The smoke test mounts tests/fixtures/gpt2-tiny where compose mounts ./models, read-only."""
    [(source, target, mode)] = [v for v in service.volumes if v[0] == image_test.MODELS_SOURCE]
    assert target == "/models" and mode == "ro"
    assert (image_test.FIXTURE_CHECKPOINT / "config.json").is_file()


def test_a_compose_key_the_script_does_not_apply_stops_it(tmp_path):
    compose = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    compose["services"]["explorer"]["cap_drop"] = ["ALL"]
    (tmp_path / "docker-compose.yml").write_text(yaml.safe_dump(compose))
    with pytest.raises(ValueError, match="cap_drop"):
        image_test.read_compose(tmp_path / "docker-compose.yml")


@pytest.mark.parametrize("text, seconds", [("15s", 15), ("2m", 120), ("1m30s", 90), ("1.5s", 1.5)])
def test_compose_durations(text, seconds):
    assert image_test.seconds(text) == seconds
