"""The acceptance protocol behind ``treeguard verify`` (layer 3)."""
