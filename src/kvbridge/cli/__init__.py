"""The kvbridge command line: one small module per command, loaded lazily."""
