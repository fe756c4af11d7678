"""Tenant scenario builder: deterministic legacy histories for tests, demo and benchmarks."""

from .builder import Lane, PackBuilder, TenantScenario, insert_rows, utcnow
from .histories import demo_tenant, drained_pack_history

__all__ = ["Lane", "PackBuilder", "TenantScenario", "demo_tenant", "drained_pack_history", "insert_rows", "utcnow"]
