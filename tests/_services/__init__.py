"""Real services the tests start themselves (a PostgreSQL server), shared by every test package."""
