"""Names a user types, and what they stand for: models, datasets and suites (registry.py), the
suites as code (suites.py), and the plugins' entry-point groups read from installed metadata
(entry_points.py).

May import: vitbench.datasets, vitbench.models and below (files, provenance, errors); never the
engine, the protocols, the store or anything above."""
