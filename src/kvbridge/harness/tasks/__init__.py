"""The built-in harness tasks (registered by ``kvbridge.builtin.tasks``)."""
