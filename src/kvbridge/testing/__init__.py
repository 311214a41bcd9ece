"""Test helpers for kvbridge and its plugins: a contract suite and pytest fixtures.

``from kvbridge.testing.contract import AdapterContract`` (subclass it) or the ``check_*``
functions. The pytest plugin (auto-loaded) provides the ``kvbridge_host`` fixture.
"""
