"""The `Trainer` + `TrainModule` face: ``Trainer(...).fit(module)`` runs the loop, hooks and callbacks."""
