"""Role processes: a system's roles (trainers, server shards, oracle) as processes in one RPC world.

:class:`Deployment` is the driver's handle on them (spawned on this machine, or attached from a
launcher's environment; how to use it: ``deployment``); :class:`RoleRef` calls an object living in
a role's process; :class:`Rendezvous` is where the members of one collective group meet.

Modules, one job each: ``deployment`` (the public handle), ``spawn`` (starting role processes,
joining and leaving the RPC world), ``watch`` (liveness), ``failures`` (which role failed and why),
``rendezvous`` (collective groups' stores, barriers), ``roleref`` (remote objects), ``quiet``
(TensorPipe's notices about connections closing, dropped while a world is left).
"""

from bagpipe.core.roles.deployment import Deployment, last_network_report, trainer_state_devices
from bagpipe.core.roles.failures import RoleFailedError
from bagpipe.core.roles.rendezvous import Rendezvous
from bagpipe.core.roles.roleref import RoleRef, construct
from bagpipe.core.roles.spawn import serve_role
from bagpipe.core.runtime import DRIVER

__all__ = [
    "DRIVER",
    "Deployment",
    "Rendezvous",
    "RoleFailedError",
    "RoleRef",
    "construct",
    "last_network_report",
    "serve_role",
    "trainer_state_devices",
]
