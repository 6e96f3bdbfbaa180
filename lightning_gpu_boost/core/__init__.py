"""Framework-free cores: usable without a Lightning ``Trainer`` and tested alone. No module here imports Lightning,
a callback or a DataModule; what needs the framework (the doctor's timed Trainer, Lightning's worker seeding) lives a
floor up and hands the cores plain functions (``broadcast``, ``seed_fn``)."""
