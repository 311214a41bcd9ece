"""Test helpers for kvbridge and its plugins: contract suites, planted pairs and pytest fixtures.

- :class:`AdapterContract`, :class:`RopeVariantContract` (:mod:`kvbridge.testing.contract`),
  :class:`FitterContract` (:mod:`kvbridge.testing.fitter_contract`) and
  :class:`MetricContract` (:mod:`kvbridge.testing.metric_contract`), :class:`SteeringMethodContract`
  and :class:`ScorerContract` (:mod:`kvbridge.testing.steer_contract`): subclass one in your
  tests, or call its ``check_*`` functions;
- :func:`planted_pair` (:mod:`kvbridge.testing.planted`): a target model whose cache is a
  known linear map of its source's, for fitter tests;
- the pytest plugin (auto-loaded) provides the ``kvbridge_host`` fixture.

Importing this package imports nothing heavy.
"""

from kvbridge.testing.contract import AdapterContract, NotApplicable, RopeVariantContract
from kvbridge.testing.fitter_contract import FitterContract
from kvbridge.testing.metric_contract import MetricContract
from kvbridge.testing.planted import planted_pair, tiny_llama, token_ids
from kvbridge.testing.steer_contract import ScorerContract, SteeringMethodContract

__all__ = [
    "AdapterContract",
    "RopeVariantContract",
    "FitterContract",
    "MetricContract",
    "SteeringMethodContract",
    "ScorerContract",
    "NotApplicable",
    "planted_pair",
    "tiny_llama",
    "token_ids",
]
