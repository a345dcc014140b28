"""A deterministic stand-in for kube-apiserver (apiserver.py, handlers.py, objects.py,
fields.py), reached through the product's transport seam, with the conformance suite
that holds it to a real one (test_conformance.py) and the engines run on it
(test_engines.py)."""
