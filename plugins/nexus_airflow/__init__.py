"""Thin Airflow adapters over :mod:`nexus_cutover` (hooks, triggers, sensors, operators, views).

Nothing here holds cutover logic: every rule lives in the domain package.
"""
