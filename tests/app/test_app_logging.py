"""The applications configure logging (``--log-level``, kvoffload's warnings shown by default); the
library sets no handler of its own; ``demo-shared`` runs its replicas with an integrity key."""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

import pytest

from kvoffload.app.demo_shared import main as demo_shared
from kvoffload.testing.redis_server import free_port
from tests.redis_support import require_redis

ROOT = Path(__file__).resolve().parents[2]


def test_the_library_sets_no_handler() -> None:
    import kvoffload  # noqa: F401

    handlers = logging.getLogger("kvoffload").handlers
    assert all(isinstance(h, logging.NullHandler) for h in handlers)


@pytest.mark.parametrize("level, shown", [(None, True), ("error", False)])
def test_demo_shows_the_library_warnings_from_its_log_level(level: str | None, shown: bool) -> None:
    # a Redis tier without an integrity key warns at construction; nothing listens on the port
    url = f"redis://127.0.0.1:{free_port()}?socket_timeout=0.2&connect_timeout=0.2"
    cmd = [sys.executable, "-m", "kvoffload", "demo", "--tier", url, "--conversations", "1", "--no-progress"]
    cmd += [] if level is None else ["--log-level", level]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT, check=True)
    assert ("WARNING kvoffload.tiers.redis.tier" in out.stderr and "no integrity_key" in out.stderr) == shown


def test_bad_log_level_is_a_one_line_error() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "kvoffload", "info", "--log-level", "loud"], capture_output=True, text=True, cwd=ROOT
    )
    assert out.returncode == 2 and "--log-level" in out.stderr


def test_demo_shared_uses_an_integrity_key(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    require_redis("demo-shared")
    assert demo_shared(["--conversations", "2", "--keep", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "integrity key" in out and "refused by the integrity or format checks: 0 (replica 1), 0 (replica 2)" in out
    key = tmp_path / "integrity.key"
    assert key.stat().st_mode & 0o077 == 0 and len(key.read_text().strip()) == 64
