"""Strategy presets and precision helpers."""

from lightning_gpu_boost.strategies.presets import (
    DDPBoostStrategy,
    configure_backends,
    recommended_precision,
    register,
)

register()

__all__ = ["DDPBoostStrategy", "configure_backends", "recommended_precision", "register"]
