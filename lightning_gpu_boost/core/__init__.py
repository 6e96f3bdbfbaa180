"""Framework-free cores: usable without a Lightning ``Trainer`` and tested alone."""
