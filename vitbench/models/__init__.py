"""A model family and what it needs to run: the backend interface and its model specs (backend.py),
the preprocessing recipes and PIL's resize on tensors (preprocessing.py, pil_resample.py), the
position-embedding variants (position_embeddings.py), FLOP counts (flop_counts.py) and any timm
architecture as `timm:<name>` (timm_models.py).

May import: vitbench.files and vitbench.errors (below it); never the datasets, the catalog or anything
above. The paper's families themselves are plugins (plugins/), registered as a third party's are."""
