"""The vLLM plugin's tests (scripts/test_vllm.sh). As in python/tests, HANPU_TESTS_NO_SKIP=1 (which
scripts/test_vllm.sh sets after making the vLLM venv) turns any skipped test into a failed run."""

import os

import pytest


def _skipped(config):
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    return reporter.stats.get("skipped", []) if reporter is not None else []


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    skipped = _skipped(config)
    terminalreporter.write_line(f"vLLM plugin tests: skipped {len(skipped)}")
    for report in skipped:
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        terminalreporter.write_line(f"  skipped {report.nodeid}: {reason}")


def pytest_sessionfinish(session, exitstatus):
    if os.environ.get("HANPU_TESTS_NO_SKIP") == "1" and _skipped(session.config) and exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
