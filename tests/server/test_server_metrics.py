"""The worker's metric helpers."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Histogram

from pydflash.server.metrics import LATENCY_BUCKETS, observe_n


def _samples(registry) -> dict:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for m in registry.collect() for s in m.samples}


def test_observe_n_equals_n_observations():
    """An output of n tokens adds n inter-token gaps at once: buckets, count and sum as n observe() calls give."""
    ra, rb = CollectorRegistry(), CollectorRegistry()
    a = Histogram("itl_a", "", ["model"], buckets=LATENCY_BUCKETS, registry=ra).labels("m")
    b = Histogram("itl_a", "", ["model"], buckets=LATENCY_BUCKETS, registry=rb).labels("m")
    for gap, n in [(0.0004, 9), (0.003, 1), (0.02, 16), (0.02, 3), (99.0, 2), (LATENCY_BUCKETS[4], 5)]:
        for _ in range(n):
            a.observe(gap)
        observe_n(b, gap, n)
    sa, sb = _samples(ra), _samples(rb)
    assert sa.keys() == sb.keys()
    for k in (k for k in sa if not k[0].endswith("_created")):
        assert abs(sa[k] - sb[k]) < 1e-9, k
    assert sb[("itl_a_count", (("model", "m"),))] == 36
