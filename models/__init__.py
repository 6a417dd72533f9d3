"""Formal models: the DGAP table composed with its environment, the named properties, the scopes. No torch."""
