"""The loops every protocol shares: the training step and its checkpoints, feature extraction and
its cache, the few-shot ridge solve, scoring, input pipelines (DataLoader workers or on the
device), memory planning, data parallelism, and throughput measurement (`vitbench bench`).

May import: the store, the weights and below (reference, catalog, host, datasets, models,
provenance, files); never a protocol, execution, a view or the API."""
