"""Hypothesis profiles: "ci" (default, bounded), "deep", "smoke" (a few examples a test) and
"first-failure" (up to fifty, the first failing one reported as drawn, not shrunk), chosen by
HYPOTHESIS_PROFILE; ``--policy NAME`` (or PYDFCCL_POLICY) runs the tests of that
policy alone (``policy_choice.py``)."""

import os

import pytest
from hypothesis import HealthCheck, Phase, settings

import policy_choice

# Where CI is set, as CI services set it, "ci" draws the same examples every run, as
# Hypothesis' own profile of that name (which this one replaces) does: a CI run passes or
# fails alike each time, and random exploration is left to runs elsewhere and to "deep".
settings.register_profile(
    "ci", max_examples=200, deadline=None, print_blob=True,
    derandomize=bool(os.environ.get("CI")), suppress_health_check=[HealthCheck.too_slow])
settings.register_profile(
    "deep", max_examples=2000, deadline=None, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow])
settings.register_profile(
    "smoke", max_examples=10, deadline=None, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow])
# Whether a policy breaks an oracle at all, quickly: shrinking a schedule that livelocks
# runs the model's million quiet ticks again for every smaller schedule it tries (minutes).
settings.register_profile(
    "first-failure", max_examples=50, deadline=None, print_blob=True,
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
    suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def pytest_addoption(parser):
    parser.addoption("--policy", default=None, metavar="NAME",
                     help="run the property tests for this policy alone: a registered name, "
                          "an installed plugin's, or package.module:name (default: "
                          "PYDFCCL_POLICY, else every policy)")


def pytest_configure(config):
    spec = config.getoption("--policy") or os.environ.get("PYDFCCL_POLICY", "").strip()
    try:
        policy_choice.select(spec or None)
    except ValueError as exc:
        raise pytest.UsageError(f"--policy: {exc}") from None


def pytest_report_header(config):
    chosen = policy_choice.selected()
    return f"policy: {chosen[0]} alone" if chosen else None
