"""Steering methods and behaviour scorers are plugin kinds: registered through the host, checked
against their protocol, unique by name, resolved by the steering code."""

from __future__ import annotations

import pytest

from kvbridge.hookspecs import hookimpl
from kvbridge.plugin_types import Scorer, SteeringMethod
from kvbridge.plugins import make_host
from kvbridge.steer.methods import ScaleMethod


def shouts(text):
    letters = [c for c in text if c.isalpha()]
    return len(letters) >= 10 and sum(c.isupper() for c in letters) > 0.8 * len(letters)


class Damp(ScaleMethod):
    """scale cached values down"""

    name = "v-damp"


class Plugin:
    @hookimpl
    def kvbridge_register_steering_methods(self, register):
        register(SteeringMethod("v-damp", "scale cached values down", Damp))

    @hookimpl
    def kvbridge_register_scorers(self, register):
        register(Scorer("shouting", "mostly upper-case letters", shouts))


def test_plugin_methods_and_scorers_are_registered_and_resolved():
    host = make_host(entry_points=False, extra=[("steer-plugin", Plugin())])
    assert host.owner("steering_method", "v-damp") == "steer-plugin"
    assert host.owner("scorer", "shouting") == "steer-plugin"
    assert host.owner("steering_method", "kv-vector") == "kvbridge.builtin.steering"
    assert isinstance(host.get("steering_method", "v-damp"), Damp)
    assert host.get("scorer", "shouting")("THIS IS VERY LOUD")
    record = host.record("steer-plugin")
    assert record.error is None and record.registers == {"steering_method": ["v-damp"], "scorer": ["shouting"]}


def test_a_method_class_registered_directly_is_wrapped():
    class Direct:
        @hookimpl
        def kvbridge_register_steering_methods(self, register):
            register(Damp)

    host = make_host(entry_points=False, extra=[("direct", Direct())])
    assert host.registry("steering_method").items["v-damp"].description == "scale cached values down"


def test_protocol_violations_and_duplicates_are_refused():
    class NoPlan:
        name = "broken"
        Options = ScaleMethod.Options

    class Bad:
        @hookimpl
        def kvbridge_register_steering_methods(self, register):
            register(SteeringMethod("broken", "no plan", NoPlan))

        @hookimpl
        def kvbridge_register_scorers(self, register):
            register(Scorer("not-callable", "a string", 42))

    host = make_host(entry_points=False, extra=[("bad", Bad())])
    assert "broken" not in host.registry("steering_method").items
    assert "missing member 'plan'" in host.record("bad").error

    class Dup:
        @hookimpl
        def kvbridge_register_scorers(self, register):
            register(Scorer("bullets", "mine", shouts))

    from kvbridge.errors import PluginError

    with pytest.raises(PluginError, match="duplicate scorer 'bullets'"):
        make_host(entry_points=False, extra=[("dup", Dup())]).registry("scorer")
    with pytest.raises(PluginError, match="unknown steering method"):
        make_host(entry_points=False).get("steering_method", "kv-vectr")
