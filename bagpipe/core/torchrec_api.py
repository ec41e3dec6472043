"""torchrec's batch types and two of its modules, from torchrec where it imports, else from
:mod:`bagpipe.core.torchrec_subset`.

Every module of the harness takes these names from here, never from torchrec directly, so that
Bagpipe, sync_ps, FAE, HET and ``local`` train on a machine without torchrec (a bare GPU machine)
and on every other machine use torchrec's own classes. ``TORCHREC`` says which one this process
got; the GPU check records it.
"""

from __future__ import annotations

try:
    from torchrec.datasets.utils import Batch
    from torchrec.models.dlrm import InteractionArch
    from torchrec.modules.crossnet import LowRankCrossNet
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    TORCHREC = True
except ImportError:  # torchrec absent, or present without the fbgemm-gpu it needs to import
    from bagpipe.core.torchrec_subset import (  # type: ignore[assignment]
        Batch,
        InteractionArch,
        KeyedJaggedTensor,
        LowRankCrossNet,
    )

    TORCHREC = False

__all__ = ["TORCHREC", "Batch", "InteractionArch", "KeyedJaggedTensor", "LowRankCrossNet"]
