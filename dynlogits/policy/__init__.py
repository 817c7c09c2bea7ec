"""Request policy: which entries a request activates (roles, the operator config, text resolution, the
deployment's test hook, the engine as spec source). Torch-free."""
