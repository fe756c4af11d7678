"""Tenant scenario builder: deterministic legacy histories for tests, demo and benchmarks."""

from .builder import Lane, PackBuilder, TenantScenario, insert_rows, utcnow
from .histories import demo_tenant, drained_pack_history
from .production import Planted, ProductionTenant, build_production_tenant, production_tenant

__all__ = [
    "Lane",
    "PackBuilder",
    "Planted",
    "ProductionTenant",
    "TenantScenario",
    "build_production_tenant",
    "demo_tenant",
    "drained_pack_history",
    "insert_rows",
    "production_tenant",
    "utcnow",
]
