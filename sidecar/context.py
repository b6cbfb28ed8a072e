"""What the routers share: settings, control plane, store, engine proxy, auth, metrics registry."""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry

from .auth import Auth
from .control import ControlPlane
from .engine_proxy import EngineProxy
from .settings import Settings
from .store import Store


@dataclass
class Sidecar:
    settings: Settings
    cp: ControlPlane
    store: Store
    engine: EngineProxy
    auth: Auth
    registry: CollectorRegistry
