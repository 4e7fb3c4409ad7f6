"""Local Ray start-up on installs without the dashboard's packages (a bare GPU image)."""

import sys

from harnessrl.ray_runtime import dashboard_available


def test_dashboard_available_with_the_full_install():
    assert dashboard_available() is True  # ray[data,train,serve] brings the dashboard's packages


def test_dashboard_unavailable_when_a_package_is_missing(monkeypatch):
    # A None entry in sys.modules makes the import raise ImportError, as a missing package does.
    monkeypatch.delitem(sys.modules, "ray.dashboard.optional_deps", raising=False)
    monkeypatch.setitem(sys.modules, "aiohttp_cors", None)
    assert dashboard_available() is False
