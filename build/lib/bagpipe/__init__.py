"""Bagpipe (SOSP'23) and the substrate that every system in this harness shares.

Packages: ``core`` (System interface, Meter, link model, roles), ``data`` (readers, synthetic
generator), ``models`` (DLRM, W&D, DeepFM, DCN), ``systems`` (the in-process reference ``local``),
``harness`` (Hydra runner, MLflow, mllog, reports).
"""

__version__ = "0.1.0"
