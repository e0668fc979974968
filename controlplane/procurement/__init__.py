"""Procurement: make the instances the placement needs exist at the providers, and give
them back when they are no longer needed.

- `core`: the decisions, from plain data (what to launch, release, repair, back off).
- `store`: the SQL that loads what the core needs and records what happened.
- `facts`: what agents and providers report (spot notices, bad nodes, outages).
- `offers`: the catalog: each pool's best offer and spot price, into its status.
- `adapters`: provider adapters from `Provider` rows, `PoolRef` from `Pool` rows.
- `tasks`: the Celery tasks (load → decide → provider calls outside any transaction →
  record), registered on the worker's app by its composition root (`controlplane.tasks`).
"""
