"""Every benchmark still runs: ``python -m bench --smoke NAME``, as ``make bench`` starts it.

Each benchmark runs once at its smallest size (seconds, not minutes) against the real
stack it always uses. Its tables are printed for whoever reads the test's output and
never asserted: this host is shared and its figures mean nothing. What fails the test
is a benchmark that cannot start or stops half-way, so the figures the README quotes
can always be measured again.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from bench.__main__ import BENCHMARKS
from tests.support.e2e import REPO_ROOT

pytestmark = pytest.mark.integration

SMOKE_TIMEOUT_S = 600


@pytest.mark.timeout(SMOKE_TIMEOUT_S + 30)
@pytest.mark.parametrize("name", BENCHMARKS)
def test_a_benchmark_runs_to_its_tables(name: str) -> None:
    completed = subprocess.run(
        [sys.executable, "-m", "bench", "--smoke", name],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=SMOKE_TIMEOUT_S,
    )

    print(completed.stdout)  # the tables, for the reader; never asserted
    assert completed.returncode == 0, completed.stderr[-4000:]
    assert f"({name}: " in completed.stdout, completed.stdout[-2000:]
