"""What more than one test module uses (the sandbox fixtures themselves are in tests/coord_fixtures.py)."""
