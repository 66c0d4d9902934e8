"""Models served without their Python code: ``jax.export`` artifacts kept in the store.

See ``README.md`` beside this file for the modules. The package re-exports
nothing: its users import the module they need, so what reads only JSON
(``description``, ``listing``: ``treeguard store ls``) never imports JAX.
"""
