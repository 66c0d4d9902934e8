"""A Ray Serve deployment of the serving engine (see api.py, replica.py, rollout.py)."""
