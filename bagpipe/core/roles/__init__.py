"""Role processes: a system's roles (trainers, server shards, oracle) as processes in one RPC world.

:class:`Deployment` is the driver's handle on them (spawned on this machine, or attached from a
launcher's environment); :class:`RoleRef` calls an object living in a role's process;
:class:`Rendezvous` is where the members of one collective group meet.
"""

from bagpipe.core.roles.deployment import (
    DRIVER,
    Deployment,
    Rendezvous,
    RoleFailedError,
    serve_role,
)
from bagpipe.core.roles.roleref import RoleRef, construct

__all__ = [
    "DRIVER",
    "Deployment",
    "Rendezvous",
    "RoleFailedError",
    "RoleRef",
    "construct",
    "serve_role",
]
